"""Configuration from the environment: the one place that reads RAILYARD_* variables."""

from __future__ import annotations

import os

DEFAULT_DATABASE_URL = "sqlite:///railyard.db"
DEFAULT_WORKFLOW_MODULES = ("workflows",)
DEFAULT_SNAPSHOT_EVERY = 10
DEFAULT_ARCHIVE_DIR = "archive"


def database_url() -> str:
    return os.environ.get("RAILYARD_DATABASE_URL") or DEFAULT_DATABASE_URL


def workflow_modules() -> list[str]:
    raw = os.environ.get("RAILYARD_WORKFLOWS", "")
    names = [m.strip() for m in raw.split(",") if m.strip()]
    return names or list(DEFAULT_WORKFLOW_MODULES)


def roles_file() -> str | None:
    return os.environ.get("RAILYARD_ROLES_FILE") or None


def model_spec() -> str | None:
    """RAILYARD_MODEL: `scripted:PATH`, `openai:MODEL` or `anthropic:MODEL`."""
    return os.environ.get("RAILYARD_MODEL") or None


def archive_dir() -> str:
    """RAILYARD_ARCHIVE_DIR: where `railyard archive` writes, and replay reads, archived task logs."""
    return os.environ.get("RAILYARD_ARCHIVE_DIR") or DEFAULT_ARCHIVE_DIR
