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
#: How long a parent waits for its child before a worker looks again though no child's end woke it.
DEFAULT_CHILD_RECHECK_SECONDS = 300.0


def child_recheck_seconds() -> float:
    """RAILYARD_CHILD_RECHECK_SECONDS: how often a worker looks at a parent waiting on a child when no wake-up came
    (a wake-up is lost only to a crash at the wrong moment: this bounds what that costs). Default 300."""
    raw = os.environ.get("RAILYARD_CHILD_RECHECK_SECONDS")
    if not raw:
        return DEFAULT_CHILD_RECHECK_SECONDS
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise RailyardError(
            f"RAILYARD_CHILD_RECHECK_SECONDS must be a number of seconds > 0, not {raw!r}", code=Code.CONFIG_INVALID
        )
    return value


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


#: Flow control's environment (`engine.core.flow`): the breaker's settings one variable each; the quotas and the
#: workflows' priorities as JSON objects of the profiles file's shape.
FLOW_VARIABLES = {
    "failures": "RAILYARD_BREAKER_FAILURES",
    "cool_down_seconds": "RAILYARD_BREAKER_COOL_DOWN",
    "probe_seconds": "RAILYARD_BREAKER_PROBE_SECONDS",
}


def flow_settings() -> dict[str, Any]:
    """What the environment says of flow control, in the profiles file's shape (`breaker`, `quotas`,
    `priorities`); CONFIG_INVALID names the variable whose text is not a number or a JSON object."""
    found: dict[str, Any] = {}
    breaker: dict[str, Any] = {}
    for name, variable in FLOW_VARIABLES.items():
        raw = os.environ.get(variable, "").strip()
        if not raw:
            continue
        try:
            breaker[name] = int(raw) if name == "failures" else float(raw)
        except ValueError:
            raise RailyardError(
                f"{variable}={raw!r} is not a number", code=Code.CONFIG_INVALID, setting=variable
            ) from None
    if breaker:
        found["breaker"] = breaker
    for name, variable in (("quotas", "RAILYARD_QUOTAS"), ("priorities", "RAILYARD_PRIORITIES")):
        raw = os.environ.get(variable, "").strip()
        if not raw:
            continue
        try:
            value = json.loads(raw)
        except ValueError:
            value = None
        if not isinstance(value, dict):
            raise RailyardError(
                f"{variable} must be a JSON object ({name} as the profiles file's [{name}] tables)",
                code=Code.CONFIG_INVALID,
                setting=variable,
            )
        found[name] = value
    return found


#: The webhook settings by environment variable, with their defaults (`webhook_settings`).
WEBHOOK_VARIABLES: dict[str, tuple[str, float]] = {
    # How often a process reads the subscriptions again: a new subscription is matched within this long.
    "RAILYARD_WEBHOOK_REFRESH_SECONDS": ("refresh_seconds", 2.0),
    # The first pause after a failed attempt; it doubles after each one (with jitter), up to the next one.
    "RAILYARD_WEBHOOK_BACKOFF_SECONDS": ("base_seconds", 5.0),
    "RAILYARD_WEBHOOK_BACKOFF_MAX_SECONDS": ("max_seconds", 300.0),
    # How long after its first attempt a message is still tried (then marked failed, for `webhooks replay`).
    "RAILYARD_WEBHOOK_GIVE_UP_SECONDS": ("give_up_seconds", 86400.0),
    # How long one attempt may take (connect and answer), and how long a sender's lease on a message lasts.
    "RAILYARD_WEBHOOK_TIMEOUT_SECONDS": ("timeout_seconds", 10.0),
    "RAILYARD_WEBHOOK_LEASE_SECONDS": ("lease_seconds", 30.0),
    # How often a worker looks for messages when none were due, and for deadlines coming near.
    "RAILYARD_WEBHOOK_POLL_SECONDS": ("poll_seconds", 1.0),
    "RAILYARD_WEBHOOK_SWEEP_SECONDS": ("sweep_seconds", 60.0),
}


def webhook_settings() -> dict[str, float]:
    """The RAILYARD_WEBHOOK_* variables set (each a number of seconds > 0), with the defaults of the others."""
    values: dict[str, float] = {}
    for variable, (name, default) in WEBHOOK_VARIABLES.items():
        raw = os.environ.get(variable, "").strip()
        if not raw:
            values[name] = default
            continue
        try:
            value = float(raw)
        except ValueError:
            value = -1.0
        if not value > 0 or value == float("inf"):
            raise RailyardError(f"{variable} must be a number of seconds > 0, not {raw!r}", code=Code.CONFIG_INVALID)
        values[name] = value
    if values["lease_seconds"] <= values["timeout_seconds"]:
        raise RailyardError(
            "RAILYARD_WEBHOOK_LEASE_SECONDS must be longer than RAILYARD_WEBHOOK_TIMEOUT_SECONDS (a lease must outlast"
            " the attempt it covers)",
            code=Code.CONFIG_INVALID,
        )
    return values
