"""Configuration from the environment: the one place that reads RAILYARD_* variables."""

from __future__ import annotations

import os

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
