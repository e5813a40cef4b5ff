"""Signed session cookies for the back-office pages, and the CSRF token each session carries.

A person logs in once with their bearer token; the cookie then names the token
by its hash (the token itself never leaves the login form) and is signed, so it
cannot be forged or edited. Every form carries the session's CSRF token and a
POST without the matching one is refused: SameSite=Strict already keeps other
sites' forms from sending the cookie, the token covers browsers that do not.
"""

from __future__ import annotations

import hmac
import secrets
from dataclasses import dataclass
from typing import Any

from itsdangerous import BadSignature, URLSafeTimedSerializer

SESSION_COOKIE = "railyard_session"
LOGIN_COOKIE = "railyard_login"
SESSION_SECONDS = 8 * 3600
LOGIN_SECONDS = 3600


@dataclass(frozen=True, slots=True)
class SessionData:
    token_hash: str
    csrf: str


class Signer:
    """Signs and checks the two cookies; a new random secret per process unless one is configured."""

    def __init__(self, secret: str | None = None) -> None:
        key = secret or secrets.token_urlsafe(32)
        self._session = URLSafeTimedSerializer(key, salt="railyard.session")
        self._login = URLSafeTimedSerializer(key, salt="railyard.login")

    def session(self, token_hash: str) -> tuple[str, SessionData]:
        data = SessionData(token_hash, secrets.token_urlsafe(24))
        return self._session.dumps({"h": data.token_hash, "c": data.csrf}), data

    def read_session(self, cookie: str | None) -> SessionData | None:
        doc = _loads(self._session, cookie, SESSION_SECONDS)
        if doc is None or not isinstance(doc.get("h"), str) or not isinstance(doc.get("c"), str):
            return None
        return SessionData(doc["h"], doc["c"])

    def login(self) -> tuple[str, str]:
        """A cookie and the CSRF token the login form must echo: no session exists yet to hold one."""
        csrf = secrets.token_urlsafe(24)
        return self._login.dumps({"c": csrf}), csrf

    def read_login(self, cookie: str | None) -> str | None:
        doc = _loads(self._login, cookie, LOGIN_SECONDS)
        value = doc.get("c") if doc is not None else None
        return value if isinstance(value, str) else None


def _loads(serializer: URLSafeTimedSerializer, cookie: str | None, max_age: int) -> dict[str, Any] | None:
    if not cookie:
        return None
    try:
        doc = serializer.loads(cookie, max_age=max_age)
    except BadSignature:  # also SignatureExpired
        return None
    return doc if isinstance(doc, dict) else None


def same_token(expected: str | None, presented: str | None) -> bool:
    """Constant-time comparison of CSRF tokens; a missing one never matches."""
    if not expected or not presented:
        return False
    return hmac.compare_digest(expected.encode(), presented.encode())
