"""Who is calling: the bearer token of an API request, or the session cookie of a page.

The actor written to the log is always the one this module returns, never a
field of the request; a token holding the `auditor` role may read but every
write it attempts is refused (FORBIDDEN).
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from engine.api.context import Context, context
from engine.api.session import SESSION_COOKIE, SessionData
from engine.api.tokens import AUDITOR, Principal, TokenTable
from engine.core.errors import Code, Refused

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
