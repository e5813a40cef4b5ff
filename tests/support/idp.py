"""A small OpenID provider for the tests: discovery, JWKS, an authorization endpoint, a token endpoint with PKCE.

It runs on a real port (uvicorn in a thread, as `tests.support.api.live_server`)
and answers what a provider such as Keycloak answers for the authorization
code flow, no more:

- `/.well-known/openid-configuration`, `/jwks` (its RSA key, RS256);
- `/authorize` checks the client, the redirect URI, `response_type=code`, the
  `openid` scope and a PKCE S256 challenge, then shows a one-field form (the
  person's name: no password) whose post sends the browser back with a code;
  `auto_user` skips the form for tests without a browser;
- `/token` exchanges a code once, for its client (basic or post secret, or
  none for a public client), its redirect URI and the PKCE verifier whose
  S256 is the challenge, and answers an ID token with the person's claims and
  groups, the nonce, `at_hash`, `iss`, `aud` and `exp`.

What the next ID token should get wrong (`tamper`: another `aud`, an `exp` in
the past, another `nonce`, a signature by a key it does not publish) lets a
test take the whole flow to a bad token; `id_token(...)` makes one directly.
Every request it saw is kept (`seen`), so a test can check what the server sent.
"""

from __future__ import annotations

import base64
import hashlib
import html
import secrets
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlencode

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from joserfc import jwt
from joserfc.jwk import KeySet, RSAKey

from tests.support.api import free_port


def s256(verifier: str) -> str:
    return base64.urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest()).rstrip(b"=").decode()


def at_hash(access_token: str) -> str:
    return base64.urlsafe_b64encode(hashlib.sha256(access_token.encode()).digest()[:16]).rstrip(b"=").decode()


def new_key(kid: str) -> RSAKey:
    return RSAKey.generate_key(2048, parameters={"kid": kid, "use": "sig", "alg": "RS256"})


@dataclass
class Client:
    redirect_uris: list[str]
    secret: str | None = None


@dataclass
class Grant:
    client_id: str
    redirect_uri: str
    user: str
    nonce: str | None
    challenge: str
    scope: str
    used: bool = False


@dataclass
class IdP:
    """The provider's state; `app` serves it. Set `issuer` before the first request (`running` does)."""

    issuer: str = ""
    clients: dict[str, Client] = field(default_factory=dict)
    #: name -> claims of that person (their `sub`, `groups`, and anything else the ID token should carry).
    users: dict[str, dict[str, Any]] = field(default_factory=dict)
    key: RSAKey = field(default_factory=lambda: new_key("key-1"))
    #: The person `/authorize` signs in without showing its form (None: the form asks).
    auto_user: str | None = None
    #: Claims the next ID token from `/token` gets instead of the right ones (then cleared).
    tamper: dict[str, Any] = field(default_factory=dict)
    #: A key the next ID token from `/token` is signed with instead of the published one (then cleared).
    sign_with: RSAKey | None = None
    #: Discovery's extra or changed fields (code_challenge_methods_supported, ...).
    discovery_extra: dict[str, Any] = field(default_factory=dict)
    seen: list[tuple[str, dict[str, str]]] = field(default_factory=list)
    _grants: dict[str, Grant] = field(default_factory=dict)

    def discovery(self) -> dict[str, Any]:
        return {
            "issuer": self.issuer,
            "authorization_endpoint": f"{self.issuer}/authorize",
            "token_endpoint": f"{self.issuer}/token",
            "jwks_uri": f"{self.issuer}/jwks",
            "response_types_supported": ["code"],
            "subject_types_supported": ["public"],
            "id_token_signing_alg_values_supported": ["RS256"],
            "code_challenge_methods_supported": ["S256"],
            "token_endpoint_auth_methods_supported": ["client_secret_basic", "client_secret_post", "none"],
            "scopes_supported": ["openid", "profile", "email"],
            **self.discovery_extra,
        }

    def jwks(self) -> dict[str, Any]:
        return KeySet([self.key]).as_dict(private=False)  # type: ignore[return-value]

    def id_token(
        self, user: str, *, aud: str | list[str], nonce: str | None, key: RSAKey | None = None, **claims: Any
    ) -> str:
        """An ID token for `user` as this provider signs it; `claims` override or add (`exp=0` expired it)."""
        at = int(time.time())
        body: dict[str, Any] = {
            "iss": self.issuer,
            "aud": aud,
            "iat": at,
            "exp": at + 300,
            "auth_time": at,
            **self.users[user],
        }
        if nonce is not None:
            body["nonce"] = nonce
        body.update(claims)
        signer = key or self.key
        return jwt.encode({"alg": "RS256", "kid": signer.kid}, body, signer)

    def requests(self, path: str) -> list[dict[str, str]]:
        return [params for seen, params in self.seen if seen == path]

    # -- the endpoints' logic --------------------------------------------------------------------------
    def authorize_problem(self, params: dict[str, str]) -> str | None:
        client = self.clients.get(params.get("client_id", ""))
        if client is None:
            return "unknown client_id"
        if params.get("redirect_uri") not in client.redirect_uris:
            return "redirect_uri not registered for this client"
        if params.get("response_type") != "code":
            return "response_type must be code"
        if "openid" not in params.get("scope", "").split():
            return "scope must include openid"
        if params.get("code_challenge_method") != "S256" or not params.get("code_challenge"):
            return "PKCE with S256 is required"
        return None

    def grant(self, params: dict[str, str], user: str) -> str:
        """The redirect back to the client, with a fresh code for `user` (or an error if there is no such user)."""
        back = params["redirect_uri"]
        if user not in self.users:
            return f"{back}?{urlencode({'error': 'access_denied', 'state': params.get('state', '')})}"
        code = secrets.token_urlsafe(24)
        self._grants[code] = Grant(
            params["client_id"],
            params["redirect_uri"],
            user,
            params.get("nonce"),
            params["code_challenge"],
            params.get("scope", ""),
        )
        return f"{back}?{urlencode({'code': code, 'state': params.get('state', '')})}"

    def exchange(self, form: dict[str, str], authorization: str | None) -> tuple[int, dict[str, Any]]:
        client_id, secret = form.get("client_id"), form.get("client_secret")
        if authorization and authorization.lower().startswith("basic "):
            decoded = base64.b64decode(authorization[6:]).decode()
            client_id, _, secret = decoded.partition(":")
        client = self.clients.get(client_id or "")
        if client is None or (client.secret is not None and secret != client.secret):
            return 401, {"error": "invalid_client"}
        if form.get("grant_type") != "authorization_code":
            return 400, {"error": "unsupported_grant_type"}
        grant = self._grants.get(form.get("code", ""))
        if grant is None or grant.used or grant.client_id != client_id:
            return 400, {"error": "invalid_grant", "error_description": "unknown or used code"}
        grant.used = True
        if form.get("redirect_uri") != grant.redirect_uri:
            return 400, {"error": "invalid_grant", "error_description": "redirect_uri differs"}
        verifier = form.get("code_verifier", "")
        if not verifier or s256(verifier) != grant.challenge:
            return 400, {"error": "invalid_grant", "error_description": "PKCE verifier does not match"}
        access = secrets.token_urlsafe(24)
        overrides = dict(self.tamper)
        key, self.sign_with, self.tamper = self.sign_with, None, {}
        aud = overrides.pop("aud", client_id)
        nonce = overrides.pop("nonce", grant.nonce)
        token = self.id_token(grant.user, aud=aud, nonce=nonce, key=key, at_hash=at_hash(access), **overrides)
        return 200, {"access_token": access, "token_type": "Bearer", "expires_in": 300, "id_token": token}

    # -- the application ---------------------------------------------------------------------------------
    def app(self) -> FastAPI:
        app = FastAPI()

        @app.get("/.well-known/openid-configuration")
        def discovery() -> Response:
            self.seen.append(("discovery", {}))
            return JSONResponse(self.discovery())

        @app.get("/jwks")
        def jwks() -> Response:
            self.seen.append(("jwks", {}))
            return JSONResponse(self.jwks())

        @app.get("/authorize")
        def authorize(request: Request) -> Response:
            params = dict(request.query_params)
            self.seen.append(("authorize", params))
            problem = self.authorize_problem(params)
            if problem is not None:
                return HTMLResponse(f"<p id=problem>{html.escape(problem)}</p>", status_code=400)
            if self.auto_user is not None:
                return RedirectResponse(self.grant(params, self.auto_user), status_code=302)
            hidden = "".join(
                f'<input type="hidden" name="{html.escape(k)}" value="{html.escape(v)}">' for k, v in params.items()
            )
            return HTMLResponse(
                "<!doctype html><title>Test IdP</title><h1>Test IdP: sign in</h1>"
                f'<form method="post" action="/authorize">{hidden}'
                '<label for="username">Username</label><input id="username" name="username">'
                '<button type="submit">Sign in</button></form>'
            )

        @app.post("/authorize")
        async def approve(request: Request) -> Response:
            form = {k: str(v) for k, v in (await request.form()).items()}
            user = form.pop("username", "")
            problem = self.authorize_problem(form)
            if problem is not None:
                return HTMLResponse(f"<p id=problem>{html.escape(problem)}</p>", status_code=400)
            return RedirectResponse(self.grant(form, user), status_code=302)

        @app.post("/token")
        async def token(request: Request) -> Response:
            form = {k: str(v) for k, v in (await request.form()).items()}
            self.seen.append(("token", {**form, "authorization": request.headers.get("authorization", "")}))
            status, body = self.exchange(form, request.headers.get("authorization"))
            return JSONResponse(body, status_code=status, headers={"Cache-Control": "no-store"})

        return app


@contextmanager
def running(idp: IdP, host: str = "localhost") -> Iterator[IdP]:
    """`idp` served on a free port of this machine, its issuer `http://<host>:<port>` (localhost by default: another
    site than the server under test at 127.0.0.1, as a real provider is)."""
    port = free_port()
    idp.issuer = f"http://{host}:{port}"
    server = uvicorn.Server(uvicorn.Config(idp.app(), host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("the test IdP did not start")
        time.sleep(0.02)
    try:
        yield idp
    finally:
        server.should_exit = True
        thread.join(timeout=10)
