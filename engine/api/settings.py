"""The server's own settings from the environment (the engine's are in `engine.runtime.config`)."""

from __future__ import annotations

import os

from engine.core.errors import Code, RailyardError

#: The largest request body the server reads, in bytes, unless RAILYARD_API_MAX_BODY says otherwise: 1 MiB.
DEFAULT_MAX_BODY = 1024 * 1024


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


def max_body() -> int:
    """RAILYARD_API_MAX_BODY: the largest request body (API and page forms) the server reads, in bytes (a positive
    integer; default 1 MiB). A larger one is answered 413 before it is parsed."""
    raw = os.environ.get("RAILYARD_API_MAX_BODY", "").strip()
    if not raw:
        return DEFAULT_MAX_BODY
    if not (raw.isascii() and raw.isdigit()) or int(raw) < 1:
        raise RailyardError(
            f"RAILYARD_API_MAX_BODY must be a positive number of bytes, not {raw!r}", code=Code.CONFIG_INVALID
        )
    return int(raw)
