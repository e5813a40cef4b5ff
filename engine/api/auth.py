"""Who is calling: the bearer token of an API request, or the page session a login opened.

The actor written to the log is always the one this module returns, never a
field of the request; a caller holding the `auditor` role may read but every
write it attempts is refused (FORBIDDEN). Who holds which token, person and role
is the directory's (`engine.api.identity`: the tokens file, and the database's
tokens and people).

A person logs in to the pages once, with their name and password (a person of
the people table) or with a bearer token. The server opens a session in the
database (`Store.open_session`) and the cookie holds only a random id, whose
SHA-256 is the row's key; the password or token never leaves the login form.
The row names what signed in (`token:<sha256>` or `user:<name>`), never a copy
of its roles: every request reads them again, so a grant, a revocation or a
disabled person takes effect on the next request. Logout deletes the row, so a
copied cookie stops working at once, on every server process. The session holds
the CSRF token every form must echo and the one flash message the next page
shows.

A page POST passes two checks before its form is even validated, so a forged
one is 403 whatever else it lacks: the `Origin` (or, without one, the
`Referer`) must be this server, and the form's `csrf` field must match the
session's. SameSite=Strict already keeps other sites' forms from sending the
cookie; these cover browsers that do not honour it. Failed logins are counted
per account and per client address separately (`LoginThrottle`: an account's
repeated failures count once for its address): past a limit, logins are
refused with LOGIN_THROTTLED (429) until the window has passed.
"""

from __future__ import annotations

import hmac
import json
import math
import secrets
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Annotated, Any
from urllib.parse import urlsplit

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from itsdangerous import BadSignature, URLSafeTimedSerializer

from engine.api.identity import Directory
from engine.api.oidc import OidcClient
from engine.api.tokens import Principal, TokenTable, hash_token
from engine.core.access import AUDITOR
from engine.core.canonical import now
from engine.core.errors import Code, Refused
from engine.runtime.engine import Engine
from engine.store.protocol import PageSession as StoredSession
from engine.store.protocol import Store

# -- the session cookies ---------------------------------------------------------------------------
SESSION_COOKIE = "railyard_session"
LOGIN_COOKIE = "railyard_login"
SESSION_SECONDS = 8 * 3600
LOGIN_SECONDS = 3600
#: An OpenID Connect sign-in's cookie (its state, nonce and PKCE verifier): from the redirect to the provider until
#: the provider sends the browser back (`engine.api.oidc`).
OIDC_COOKIE = "railyard_oidc"
OIDC_SECONDS = 600


class Signer:
    """Signs and checks the login form's cookie; a new random secret per process unless one is configured."""

    def __init__(self, secret: str | None = None) -> None:
        key = secret or secrets.token_urlsafe(32)
        self._login = URLSafeTimedSerializer(key, salt="railyard.login")
        self._oidc = URLSafeTimedSerializer(key, salt="railyard.oidc")

    def login(self) -> tuple[str, str]:
        """A cookie and the CSRF token the login form must echo: no session exists yet to hold one."""
        csrf = secrets.token_urlsafe(24)
        return self._login.dumps({"c": csrf}), csrf

    def read_login(self, cookie: str | None) -> str | None:
        doc = _loads(self._login, cookie, LOGIN_SECONDS)
        value = doc.get("c") if doc is not None else None
        return value if isinstance(value, str) else None

    def oidc(self, flow: dict[str, str]) -> str:
        """The cookie that carries an OpenID Connect sign-in's secrets (state, nonce, PKCE verifier) to its callback."""
        return self._oidc.dumps(flow)

    def read_oidc(self, cookie: str | None) -> dict[str, Any] | None:
        """The sign-in `oidc` signed, if this server signed it within OIDC_SECONDS (else None)."""
        return _loads(self._oidc, cookie, OIDC_SECONDS)


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
# -- failed logins -----------------------------------------------------------------------------------
#: Failed logins allowed per account, and per client address, within `LOGIN_WINDOW_SECONDS`.
LOGIN_FAILURES_PER_ACCOUNT = 5
LOGIN_FAILURES_PER_ADDRESS = 20
LOGIN_WINDOW_SECONDS = 15 * 60


class LoginThrottle:
    """Failed logins per client address, and per account from that address, over a sliding window, kept by the
    store.

    Past a limit, logins from that address (for that account) are refused with LOGIN_THROTTLED, a valid token
    included, until the oldest failure that counts leaves the window. The account's count is kept per address
    so that a stranger who knows a name cannot lock its owner out from everywhere: failures from one address
    only ever stop that address. Tokens are random, so guessing is stopped by the address limit, not by naming
    an account. A success clears that account's failures from that address, not the address's. The failures
    are rows in the database (`Store.note_login_failure`), so every server process over it applies the same
    limit and a restart does not reset it; within a process the check and the count are taken together, so a
    burst of logins sent at once cannot slip past it (across processes a burst may overshoot by the number of
    processes).
    """

    def __init__(
        self,
        store: Store,
        *,
        per_account: int = LOGIN_FAILURES_PER_ACCOUNT,
        per_address: int = LOGIN_FAILURES_PER_ADDRESS,
        window_seconds: float = LOGIN_WINDOW_SECONDS,
        clock: Callable[[], datetime] = now,
    ) -> None:
        self._store = store
        self._limits = {"account": per_account, "address": per_address}
        self._window = timedelta(seconds=window_seconds)
        self._clock = clock
        #: Held by a login from its check to its count (`routes.login`): one at a time in this process.
        self.lock = threading.Lock()

    def retry_after(self, *, address: str | None, account: str | None) -> int | None:
        """Seconds until a login from `address` for `account` may be tried again (None: it may be now)."""
        at = self._clock()
        keys = _keys(address, account)
        found = self._store.login_failures(list(keys), at - self._window)
        waits = [
            (failures[len(failures) - limit] + self._window - at).total_seconds()
            for key, kind in keys.items()
            if len(failures := found.get(key, [])) >= (limit := self._limits[kind])
        ]
        return max(1, math.ceil(max(waits))) if waits else None

    def failed(self, *, address: str | None, account: str | None) -> None:
        """Count a failed login. A named account's failures count against it every time, and against the address
        once per window: one person's typos lock out that person, never everyone behind the same address (an
        office's proxy); an address is stopped by many accounts failing, or by unnamed guesses, each counted."""
        at = self._clock()
        keys = _keys(address, account)
        if account and address:
            named = _account_key(account, address)
            if self._store.login_failures([named], at - self._window).get(named):
                keys.pop(f"address:{address}", None)  # this account's failures have counted for the address once
        self._store.note_login_failure(list(keys), at, forget_before=at - self._window)

    def succeeded(self, *, address: str | None, account: str) -> None:
        self._store.clear_login_failures(_account_key(account, address))


def _account_key(account: str, address: str | None) -> str:
    """An account's failures from one address; a name in any letter case is the same account."""
    return f"account:{account.casefold()}@{address or '-'}"


def _keys(address: str | None, account: str | None) -> dict[str, str]:
    """The keys a login's failures count against, and the kind of each."""
    keys = {f"address:{address}": "address"} if address else {}
    if account:
        keys[_account_key(account, address)] = "account"
    return keys


def throttled(retry_after: int) -> Refused:
    return Refused(
        f"too many failed logins: try again in {retry_after} seconds",
        code=Code.LOGIN_THROTTLED,
        retry_after=retry_after,
    )


# -- page sessions ---------------------------------------------------------------------------------
class Sessions:
    """Page sessions kept by the store: the cookie is a random id, the row is keyed by its SHA-256."""

    def __init__(self, engine: Engine, seconds: int = SESSION_SECONDS) -> None:
        self._store = engine.store
        self.seconds = seconds

    def open(self, principal: Principal) -> tuple[str, StoredSession]:
        """A new session for `principal`: the cookie value to set, and the row kept. The row names the principal's
        credential (`Principal.credential`), never its roles: `current_session` reads those on every request."""
        cookie = secrets.token_urlsafe(32)
        at = now()
        row = StoredSession(
            hash_token(cookie),
            principal.credential,
            principal.actor,
            secrets.token_urlsafe(24),
            at,
            at + timedelta(seconds=self.seconds),
        )
        self._store.open_session(row)
        return cookie, row

    def open_person(self, name: str) -> tuple[str, StoredSession]:
        """A new session for the person `name` of the people table (however they proved who they are: a password
        here, or their OpenID Connect provider): the cookie value to set (as `SESSION_COOKIE`, the way
        `routes.login` sets it), and the row kept, whose credential is `user:<name>`. Every request made with it
        reads the person again (`current_session`): their roles and tenants as they are then, and no session at
        all once they are disabled or gone. The caller has checked that the person exists and is enabled."""
        return self.open(Principal(name, frozenset(), "", kind="person"))

    def read(self, cookie: str | None) -> StoredSession | None:
        if not cookie or len(cookie) > 200:
            return None
        return self._store.page_session(hash_token(cookie), now())

    def end(self, row: StoredSession) -> None:
        self._store.end_session(row.id_hash)

    def flash(self, row: StoredSession, message: Flash) -> None:
        self._store.set_flash(row.id_hash, json.dumps(message.to_dict()))

    def take_flash(self, row: StoredSession) -> Flash | None:
        raw = self._store.take_flash(row.id_hash)
        return Flash.from_json(raw) if raw else None


@dataclass(frozen=True, slots=True)
class Flash:
    """The one message the next page shows: what a POST did (`done`) or why it was refused (`refused`, with the
    code), so the POST can answer with a redirect and a reload never sends it again."""

    kind: str
    text: str
    code: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "text": self.text, "code": self.code}

    @classmethod
    def from_json(cls, raw: str) -> Flash | None:
        try:
            doc = json.loads(raw)
        except ValueError:
            return None
        if not isinstance(doc, dict) or not isinstance(doc.get("text"), str):
            return None
        code = doc.get("code")
        return cls(str(doc.get("kind", "done")), doc["text"], code if isinstance(code, str) else None)


@dataclass(frozen=True, slots=True)
class Context:
    """What every request handler needs, held once on the application: the engine, the tokens, the directory of
    tokens and people over them, the login cookie signer, the page sessions and the failed-login throttle."""

    engine: Engine
    tokens: TokenTable
    signer: Signer
    #: Set the cookies' Secure flag: on whenever the server is reached over HTTPS (a proxy in front of it).
    secure_cookies: bool = False
    #: Sign-in through OpenID Connect (None: not configured, and /login/oidc is 404).
    oidc: OidcClient | None = None
    sessions: Sessions = field(init=False)
    throttle: LoginThrottle = field(init=False)
    directory: Directory = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "sessions", Sessions(self.engine))
        object.__setattr__(self, "throttle", LoginThrottle(self.engine.store))
        object.__setattr__(self, "directory", directory_over(self.engine, self.tokens))


def directory_over(engine: Engine, tokens: TokenTable) -> Directory:
    """The directory over `tokens` and `engine`'s database, made the engine's authoriser too (the roles it checks
    when a command is fired are the people table's, the tokens file's and the database tokens'; its authoriser
    before answers for the names none of them knows)."""
    if isinstance(engine.authoriser, Directory) and engine.authoriser.tokens is tokens:
        return engine.authoriser
    previous = engine.authoriser.fallback if isinstance(engine.authoriser, Directory) else engine.authoriser
    directory = Directory(tokens, engine.people, previous)
    engine.authoriser = directory
    return directory


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


def authenticate(directory: Directory, token: str | None) -> Principal:
    """The principal of a presented bearer token, or ACTOR_REQUIRED. The request-limits middleware calls this
    before any body is read, and the route dependencies below again: one answer for both."""
    if token is None:
        raise _no_actor("a bearer token is required (Authorization: Bearer TOKEN)")
    principal = directory.authenticate(token)
    if principal is None:
        raise _no_actor("the bearer token is not one this server knows")
    return principal


def api_principal(
    ctx: Annotated[Context, Depends(context)],
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)],
) -> Principal:
    token = credentials.credentials.strip() if credentials is not None else ""
    return authenticate(ctx.directory, token or None)


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
    """A page was asked for without a valid session: the browser is sent to the login page (and back after)."""


class Session:
    """A page request's principal, the CSRF token its forms must carry, and its flash message."""

    def __init__(self, principal: Principal, row: StoredSession, sessions: Sessions) -> None:
        self.principal = principal
        self.row = row
        self.csrf = row.csrf
        self._sessions = sessions

    def flash(self, message: Flash) -> None:
        self._sessions.flash(self.row, message)

    def take_flash(self) -> Flash | None:
        # The session's read brought the flash along: most pages have none and then cost no write.
        return self._sessions.take_flash(self.row) if self.row.flash is not None else None


def current_session(request: Request) -> Session | None:
    """The request's session, if its cookie names a live one and what signed in still may: the token is still in
    the file or the database (unexpired, unrevoked), or the person is still there and enabled, with their roles
    and tenants as they are now."""
    ctx = context(request)
    row = ctx.sessions.read(request.cookies.get(SESSION_COOKIE))
    principal = ctx.directory.by_credential(row.credential) if row is not None else None
    if row is None or principal is None:
        return None
    return Session(principal, row, ctx.sessions)


def page_session(request: Request) -> Session:
    session = current_session(request)
    if session is None:
        raise LoginRequired()
    return session


def forbidden_origin(request: Request) -> str | None:
    """The foreign origin a POST came from (None: this server, or a client that names none). `Origin` decides
    when sent; otherwise `Referer`. `Origin: null` (an opaque origin: a sandboxed frame, a data: URL) is foreign.
    Same origin is the same host and port as the request's `Host` (a proxy in front must pass Host through)."""
    host = request.headers.get("host", "")
    origin = request.headers.get("origin")
    claimed = origin if origin is not None else request.headers.get("referer")
    if claimed is None:
        return None
    parts = urlsplit(claimed.strip())
    if parts.scheme in ("http", "https") and parts.netloc and parts.netloc.lower() == host.lower():
        return None
    return claimed[:200]


def refuse_foreign(request: Request) -> None:
    foreign = forbidden_origin(request)
    if foreign is not None:
        raise Refused(
            "this form was not sent from this server's pages: refused",
            code=Code.FORBIDDEN,
            reason="origin",
            origin=foreign,
        )


async def page_post(request: Request) -> Session:
    """A page POST from this server's own form: same origin, a live session, and the session's CSRF token.

    Checked before the form's fields are validated, so a forged post is 403 even when it lacks every field."""
    refuse_foreign(request)
    session = page_session(request)
    presented = (await request.form()).get("csrf")
    if not same_token(session.csrf, presented if isinstance(presented, str) else None):
        raise Refused(
            "the form's CSRF token is missing or stale: reload the page and try again",
            code=Code.FORBIDDEN,
            reason="csrf",
        )
    return session


Reader = Annotated[Principal, Depends(api_principal)]
Writer = Annotated[Principal, Depends(api_writer)]
PageSession = Annotated[Session, Depends(page_session)]
#: A page POST that passed the origin and CSRF checks.
PagePost = Annotated[Session, Depends(page_post)]
Ctx = Annotated[Context, Depends(context)]
