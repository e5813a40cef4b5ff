"""Configuration from the environment: the one place that reads RAILYARD_* variables."""

from __future__ import annotations

import json
import os
from typing import Any

from engine.core.errors import Code, RailyardError
from engine.core.model_settings import check_setting

DEFAULT_DATABASE_URL = "sqlite:///railyard.db"
#: With RAILYARD_WORKFLOWS unset, the user's own `workflows` package, if the process can import one (the CLI
#: looks in its working directory first). Railyard installs none: a process that finds none has an empty registry.
DEFAULT_WORKFLOWS_PACKAGE = "workflows"
DEFAULT_SNAPSHOT_EVERY = 10
DEFAULT_ARCHIVE_DIR = "archive"


def database_url() -> str:
    return os.environ.get("RAILYARD_DATABASE_URL") or DEFAULT_DATABASE_URL


def workflow_modules() -> list[str]:
    """The modules RAILYARD_WORKFLOWS names; empty when it is unset (see `DEFAULT_WORKFLOWS_PACKAGE`)."""
    raw = os.environ.get("RAILYARD_WORKFLOWS", "")
    return [m.strip() for m in raw.split(",") if m.strip()]


def roles_file() -> str | None:
    return os.environ.get("RAILYARD_ROLES_FILE") or None


def model_spec() -> str | None:
    """RAILYARD_MODEL: `scripted:PATH`, `openai:MODEL` or `anthropic:MODEL`."""
    return os.environ.get("RAILYARD_MODEL") or None


def metrics_host() -> str:
    """RAILYARD_METRICS_HOST: the interface `railyard worker --metrics-port` listens on (0.0.0.0 for a scraper on
    another host); default 127.0.0.1."""
    return os.environ.get("RAILYARD_METRICS_HOST") or "127.0.0.1"


def archive_dir() -> str:
    """RAILYARD_ARCHIVE_DIR: where `railyard archive` writes, and replay reads, archived task logs."""
    return os.environ.get("RAILYARD_ARCHIVE_DIR") or DEFAULT_ARCHIVE_DIR


DEFAULT_CHECKPOINT_DIR = "checkpoints"


def signing_key() -> str | None:
    """RAILYARD_SIGNING_KEY: the Ed25519 private key file `railyard checkpoint` signs with."""
    return os.environ.get("RAILYARD_SIGNING_KEY") or None


def checkpoint_dir() -> str:
    """RAILYARD_CHECKPOINT_DIR: where signed checkpoints are written, one file each (keep it off the database host)."""
    return os.environ.get("RAILYARD_CHECKPOINT_DIR") or DEFAULT_CHECKPOINT_DIR


#: The environment variables of the model settings (`engine.core.model_settings`), by setting.
MODEL_SETTING_VARIABLES = {
    "timeout_seconds": "RAILYARD_MODEL_TIMEOUT",
    "retries": "RAILYARD_MODEL_RETRIES",
    "stream": "RAILYARD_MODEL_STREAM",
    "extra_body": "RAILYARD_MODEL_EXTRA_BODY",
}
_TRUE, _FALSE = frozenset({"1", "true", "yes", "on"}), frozenset({"0", "false", "no", "off"})


def model_thinking() -> bool | None:
    """RAILYARD_MODEL_THINKING: ask the model to think (reasoning on) unless `--thinking/--no-thinking` says; None
    when unset. CONFIG_INVALID for a text that is neither true nor false."""
    raw = os.environ.get("RAILYARD_MODEL_THINKING", "").strip().lower()
    if not raw:
        return None
    if raw not in _TRUE | _FALSE:
        raise RailyardError(
            f"RAILYARD_MODEL_THINKING={raw!r} is not true or false",
            code=Code.CONFIG_INVALID,
            setting="RAILYARD_MODEL_THINKING",
        )
    return raw in _TRUE


def model_settings() -> dict[str, Any]:
    """The model settings the environment sets, as values (unset variables are left out); CONFIG_INVALID names the
    variable whose text is not one, or whose value is out of the setting's range."""
    found: dict[str, Any] = {}
    for name, variable in MODEL_SETTING_VARIABLES.items():
        raw = os.environ.get(variable, "").strip()
        if not raw:
            continue
        try:
            if name == "timeout_seconds":
                found[name] = float(raw)
            elif name == "retries":
                found[name] = int(raw)
            elif name == "stream":
                if raw.lower() not in _TRUE | _FALSE:
                    raise ValueError(raw)
                found[name] = raw.lower() in _TRUE
            else:
                found[name] = json.loads(raw)
            found[name] = check_setting(name, found[name], variable)
        except ValueError:
            raise RailyardError(
                f"{variable}={raw!r} is not a valid {name}", code=Code.CONFIG_INVALID, setting=variable
            ) from None
    return found
