"""Who is calling: the bearer token of an API request, or the signed session cookie of a page.

The actor written to the log is always the one this module returns, never a
field of the request; a token holding the `auditor` role may read but every
write it attempts is refused (FORBIDDEN). Who holds which token and role is
the tokens file's (`engine.api.tokens`).

A person logs in to the pages once with their bearer token; the cookie then
names the token by its hash (the token itself never leaves the login form) and
is signed, so it cannot be forged or edited. Every form carries the session's
CSRF token and a POST without the matching one is refused: SameSite=Strict
already keeps other sites' forms from sending the cookie, the token covers
browsers that do not.
"""

from __future__ import annotations

import hmac
import secrets
from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from itsdangerous import BadSignature, URLSafeTimedSerializer

from engine.api.tokens import AUDITOR, Principal, TokenTable
from engine.core.errors import Code, Refused
from engine.runtime.engine import Engine

# -- the session cookies ---------------------------------------------------------------------------
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


# -- what every handler needs ----------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Context:
    """What every request handler needs, held once on the application: the engine, the tokens, the cookie signer."""

    engine: Engine
    tokens: TokenTable
    signer: Signer
    #: Set the cookies' Secure flag: on whenever the server is reached over HTTPS (a proxy in front of it).
    secure_cookies: bool = False


def context(request: Request) -> Context:
    ctx: Context = request.app.state.railyard
    return ctx


# -- who is calling --------------------------------------------------------------------------------
#: Declares the bearer scheme in the OpenAPI document; missing or malformed headers are refused below, not here.
bearer = HTTPBearer(auto_error=False, description="A token from the tokens file (RAILYARD_TOKENS_FILE).")


def _no_actor(message: str) -> Refused:
    return Refused(message, code=Code.ACTOR_REQUIRED)


def bearer_token(authorization: str | None) -> str | None:
    """The token of an `Authorization: Bearer TOKEN` header; None if there is none, or another scheme, or blank."""
    if not authorization:
        return None
    scheme, _, param = authorization.partition(" ")
    token = param.strip()
    return token if scheme.lower() == "bearer" and token else None


def authenticate(tokens: TokenTable, token: str | None) -> Principal:
    """The principal of a presented bearer token, or ACTOR_REQUIRED. The request-limits middleware calls this
    before any body is read, and the route dependencies below again: one answer for both."""
    if token is None:
        raise _no_actor("a bearer token is required (Authorization: Bearer TOKEN)")
    principal = tokens.authenticate(token)
    if principal is None:
        raise _no_actor("the bearer token is not one this server knows")
    return principal


def api_principal(
    ctx: Annotated[Context, Depends(context)],
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)],
) -> Principal:
    token = credentials.credentials.strip() if credentials is not None else ""
    return authenticate(ctx.tokens, token or None)


def require_writer(principal: Principal) -> Principal:
    if principal.read_only:
        raise Refused(
            f"{principal.actor!r} holds the {AUDITOR!r} role: reads only",
            code=Code.FORBIDDEN,
            actor=principal.actor,
            reason="read_only",
        )
    return principal


def api_writer(principal: Annotated[Principal, Depends(api_principal)]) -> Principal:
    return require_writer(principal)


class LoginRequired(Exception):
    """A page was asked for without a valid session: the browser is sent to the login page."""


class Session:
    """A page request's principal and the CSRF token its forms must carry."""

    def __init__(self, principal: Principal, data: SessionData) -> None:
        self.principal = principal
        self.csrf = data.csrf


def page_session(request: Request, ctx: Annotated[Context, Depends(context)]) -> Session:
    data = ctx.signer.read_session(request.cookies.get(SESSION_COOKIE))
    principal = ctx.tokens.by_hash(data.token_hash) if data is not None else None
    if data is None or principal is None:
        raise LoginRequired()
    return Session(principal, data)


Reader = Annotated[Principal, Depends(api_principal)]
Writer = Annotated[Principal, Depends(api_writer)]
PageSession = Annotated[Session, Depends(page_session)]
Ctx = Annotated[Context, Depends(context)]
