"""The server's own settings from the environment (the engine's are in `engine.config`)."""

from __future__ import annotations

import os

from engine.errors import Code, RailyardError


def tokens_file() -> str:
    """RAILYARD_TOKENS_FILE: required, since a server nobody can authenticate to is a misconfiguration."""
    path = os.environ.get("RAILYARD_TOKENS_FILE") or ""
    if not path:
        raise RailyardError("set RAILYARD_TOKENS_FILE to a tokens file (see docs/api.md)", code=Code.CONFIG_INVALID)
    return path


def session_secret() -> str | None:
    """RAILYARD_SESSION_SECRET signs page sessions; unset, each process makes its own (sessions end on restart)."""
    return os.environ.get("RAILYARD_SESSION_SECRET") or None


def secure_cookies() -> bool:
    """RAILYARD_SECURE_COOKIES=1 when the server is reached over HTTPS (behind a TLS proxy): Secure cookies."""
    return os.environ.get("RAILYARD_SECURE_COOKIES", "").lower() in {"1", "true", "yes"}
