"""The application: `create_app(engine, tokens)`, what stands in front of its routes, its error handlers, the
server's settings and `serve`.

`create_app` builds the FastAPI application in-process, so tests need no
server. The JSON API lives under /api (its OpenAPI document at
/api/openapi.json); the pages are everything else. Both raise the engine's
`RailyardError`s; the handlers here turn them into the JSON error body (API) or
an error page (pages) with the status `schemas.STATUS_BY_CODE` gives (412 for a
failed If-Match).

In front of them all, two pure ASGI middlewares (Starlette's BaseHTTPMiddleware
would buffer). `SecurityHeaders` sets the security headers on every response,
pages and API alike: the Content-Security-Policy allows scripts, styles and
images only from this server and no inline script at all, so text a model or a
tool produced cannot run even if an escaping mistake ever let markup through.
`RequestLimits` decides what the server reads of a request: nothing of an
unauthenticated API call's body, and never more than the limit.

1. An `/api` request (but the OpenAPI document) without a valid bearer token is
   answered 401 ACTOR_REQUIRED from its headers alone: its body is never read.
2. A `Content-Length` over the limit is answered 413 without reading the body.
3. A body without one (chunked) is read here, counting, at most the limit plus
   one chunk; once past the limit the answer is 413 and the rest is never read.
   A body within the limit is handed on as it was received.

Page form posts get the same limit (their 413 is the error page). A response
given without reading the body closes the connection (`Connection: close`), so
the server does not go on receiving what the client keeps sending.

Beside the API and the pages, the probes an orchestrator and Prometheus call,
outside /api and so without a token (they name no task and change nothing):
`/healthz` (the process answers), `/readyz` (the database answers and its
schema is at head, else 503) and `/metrics` (`engine.observability.metrics`).

The server's own settings come from the environment (the engine's are in
`engine.runtime.config`); `serve` checks every one of them before it opens
anything.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import sys
from collections import deque
from typing import Any
from urllib.parse import urlencode

from fastapi import FastAPI, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, RedirectResponse, Response
from fastapi.staticfiles import StaticFiles
from starlette.datastructures import Headers, MutableHeaders
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from engine.api import routes
from engine.api.auth import Context, LoginRequired, Signer, authenticate, bearer_token
from engine.api.identity import Directory
from engine.api.schemas import error_body, status_for, status_of, validation_body
from engine.api.tokens import TokenTable, load_tokens
from engine.api.views import STATIC, refused_command, render
from engine.core.errors import Code, RailyardError, Refused
from engine.observability import health, hooks
from engine.runtime import config
from engine.runtime.engine import Engine
from engine.store import migrations
from engine.store.database import check_url, require_database

log = logging.getLogger("railyard.api")

#: The largest request body the server reads, in bytes, unless RAILYARD_API_MAX_BODY says otherwise: 1 MiB.
DEFAULT_MAX_BODY = 1024 * 1024

API_PREFIX = "/api"
OPENAPI_URL = f"{API_PREFIX}/openapi.json"
#: API paths served without a token.
PUBLIC = frozenset({OPENAPI_URL})


def is_api(path: str) -> bool:
    return path == API_PREFIX or path.startswith(API_PREFIX + "/")


def create_app(
    engine: Engine,
    tokens: TokenTable,
    *,
    session_secret: str | None = None,
    secure_cookies: bool = False,
    max_body: int = DEFAULT_MAX_BODY,
) -> FastAPI:
    """The application over `engine`. Its authoriser becomes the directory of `tokens` and of the database's
    people and tokens (`engine.api.identity.Directory`, over the authoriser it had, which answers for the names
    none of them knows), so the roles the engine checks are the roles the caller signed in with. `session_secret`
    signs the login form's cookie
    (its CSRF token; a random one per process if None: a login form opened before a restart must be reloaded).
    Sessions are rows in the database and outlive a restart; `max_body` is the largest
    request body read, in bytes (`railyard serve` takes it from RAILYARD_API_MAX_BODY)."""
    if max_body < 1:
        raise ValueError(f"max_body must be a positive number of bytes, not {max_body}")
    app = FastAPI(
        title="Railyard",
        version="1",
        description="Tasks as versioned state machines over a hash-chained log: start, signal, approve, audit.",
        docs_url=None,  # Swagger UI loads scripts from a CDN and runs inline script: not under this CSP
        redoc_url=None,
        openapi_url=OPENAPI_URL,
    )
    ctx = Context(engine, tokens, Signer(session_secret), secure_cookies)
    app.state.railyard = ctx
    app.add_middleware(RequestLimits, directory=ctx.directory, max_body=max_body)
    app.add_middleware(SecurityHeaders)  # added last, so outermost: on the limits' own answers too
    for router in routes.ROUTERS:
        app.include_router(router)
    app.mount("/static", StaticFiles(directory=STATIC), name="static")
    _handlers(app)
    _probes(app, engine)
    return app


def _probes(app: FastAPI, engine: Engine) -> None:
    """/healthz, /readyz and /metrics: see the module's docstring and docs/api.md."""
    from engine.observability import metrics

    registry = hooks.enable_metrics().registry_for(engine.store)

    @app.get("/healthz", include_in_schema=False)
    async def healthz() -> Response:
        return JSONResponse({"status": "ok"})

    @app.get("/readyz", include_in_schema=False)
    async def readyz() -> Response:
        answer = await run_in_threadpool(health.readiness, engine.store)
        return JSONResponse(answer.to_dict(), status_code=200 if answer.ready else 503)

    @app.get("/metrics", include_in_schema=False)
    async def scrape() -> Response:
        body = await run_in_threadpool(metrics.exposition, registry)
        return Response(body, media_type=metrics.CONTENT_TYPE)


def _handlers(app: FastAPI) -> None:
    @app.exception_handler(RailyardError)
    async def refused(request: Request, error: RailyardError) -> Response:
        status = status_for(error)
        if status >= 500:
            log.error("%s %s: %s", request.method, request.url.path, error)
        if is_api(request.url.path):
            headers = {"WWW-Authenticate": "Bearer"} if error.code is Code.ACTOR_REQUIRED else None
            return JSONResponse(error_body(error), status_code=status, headers=headers)
        return render(request, "error.html", status, session=None, code=str(error.code), message=error.message)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> Response:
        body = validation_body(exc)
        if is_api(request.url.path):
            return JSONResponse(body, status_code=422)
        message = "; ".join(f"{'.'.join(e['loc'])}: {e['msg']}" for e in body["details"]["errors"])
        return refused_command(request, body["code"], message) or render(
            request, "error.html", 422, session=None, code=body["code"], message=message
        )

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> Response:
        message = str(exc.detail)
        if exc.status_code == 400:  # a body that does not even decode (bad UTF-8): as invalid as bad JSON
            error = Refused(f"the request body cannot be read: {message}", code=Code.PAYLOAD_INVALID)
            return await refused(request, error)
        if is_api(request.url.path):
            return JSONResponse(
                {"code": None, "message": message, "details": {}}, status_code=exc.status_code, headers=exc.headers
            )
        return render(request, "error.html", exc.status_code, session=None, code=None, message=message)

    @app.exception_handler(LoginRequired)
    async def login_required(request: Request, _exc: LoginRequired) -> Response:
        # A page asked for comes back after the login (a POST's address is no page to come back to).
        asked = request.url.path + (f"?{request.url.query}" if request.url.query else "")
        back = f"/login?{urlencode({'next': asked})}" if request.method == "GET" and asked != "/" else "/login"
        return RedirectResponse(back, status_code=303)

    @app.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception) -> Response:
        log.exception("%s %s failed", request.method, request.url.path)
        body = {"code": str(Code.INTERNAL_ERROR), "message": "internal error; see the server log", "details": {}}
        return JSONResponse(body, status_code=500)


# -- in front of the routes ------------------------------------------------------------------------
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
    "form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)

HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    # Not no-referrer: under it browsers send `Origin: null` on every form POST, and the pages check Origin.
    "Referrer-Policy": "same-origin",
    "Cross-Origin-Opener-Policy": "same-origin",
    "Cache-Control": "no-store",
}


class SecurityHeaders:
    """Pure ASGI middleware: sets the headers on the response start, whatever produced the response."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                for name, value in HEADERS.items():
                    headers[name] = value
            await send(message)

        await self.app(scope, receive, send_with_headers)


class RequestLimits:
    """Authenticate /api requests before their body is read, and refuse any body over `max_body` bytes."""

    def __init__(self, app: ASGIApp, *, directory: Directory, max_body: int) -> None:
        if max_body < 1:
            raise ValueError("max_body must be at least 1 byte")
        self.app = app
        self.directory = directory
        self.max_body = max_body

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        pending = _has_body(headers)
        path = scope.get("path", "")
        if is_api(path) and path not in PUBLIC:
            try:
                # A token the tokens file does not hold is looked up in the database: not on the event loop.
                await run_in_threadpool(authenticate, self.directory, bearer_token(headers.get("authorization")))
            except RailyardError as unknown:
                if unknown.code is Code.ACTOR_REQUIRED:
                    await self._refuse(
                        scope, receive, send, 401, unknown, close=pending, extra={"WWW-Authenticate": "Bearer"}
                    )
                    return
                # The database did not answer who this is (it is down, or has no schema): the route's own
                # dependency asks again, and its error handler answers as for any request the database failed.
        declared = headers.get("content-length")
        if declared is not None:
            length = declared.strip()
            if not (length.isascii() and length.isdigit()):
                bad = Refused("the Content-Length header is not a number of bytes", code=Code.PAYLOAD_INVALID)
                await self._refuse(scope, receive, send, status_of(bad.code), bad, close=True)
                return
            if int(length) > self.max_body:
                await self._refuse(scope, receive, send, 413, self._too_large(int(length)), close=True)
                return
            # The server frames the body by its Content-Length: no more than that reaches the application.
            await self.app(scope, receive, send)
            return
        if not pending:
            await self.app(scope, receive, send)
            return
        # No length given (chunked): read it here, counting, and never hold more than the limit.
        chunks: list[Message] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":  # the client went away: nobody to answer
                return
            size += len(message.get("body", b""))
            if size > self.max_body:
                await self._refuse(scope, receive, send, 413, self._too_large(None), close=True)
                return
            chunks.append(message)
            if not message.get("more_body", False):
                break
        await self.app(scope, _replay(chunks, receive), send)

    def _too_large(self, declared: int | None) -> Refused:
        details: dict[str, Any] = {"limit": self.max_body}
        if declared is not None:
            details["content_length"] = declared
        return Refused(
            f"the request body is larger than this server reads ({self.max_body} bytes)",
            code=Code.PAYLOAD_INVALID,
            **details,
        )

    async def _refuse(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        status: int,
        refusal: RailyardError,
        *,
        close: bool,
        extra: dict[str, str] | None = None,
    ) -> None:
        headers = dict(extra or {})
        if close:
            headers["Connection"] = "close"
        if is_api(scope.get("path", "")):
            body = json.dumps(error_body(refusal), ensure_ascii=False).encode("utf-8")
            await send(
                {
                    "type": "http.response.start",
                    "status": status,
                    "headers": [
                        (b"content-type", b"application/json"),
                        (b"content-length", str(len(body)).encode()),
                        *((k.lower().encode(), v.encode()) for k, v in headers.items()),
                    ],
                }
            )
            await send({"type": "http.response.body", "body": body, "more_body": False})
            return
        page = render(
            Request(scope), "error.html", status, session=None, code=str(refusal.code), message=refusal.message
        )
        page.headers.update(headers)
        await page(scope, _no_body, send)


def _has_body(headers: Headers) -> bool:
    """Whether the request says a body follows (HTTP/1.1: a non-zero Content-Length, or a Transfer-Encoding)."""
    length = headers.get("content-length")
    if length is not None:
        return length.strip() not in ("", "0")
    return "transfer-encoding" in headers


def _replay(chunks: list[Message], receive: Receive) -> Receive:
    """The body as it was received, then the connection's own messages (a disconnect) after it."""
    queue = deque(chunks)

    async def replayed() -> Message:
        if queue:
            return queue.popleft()
        return await receive()

    return replayed


async def _no_body() -> Message:
    return {"type": "http.disconnect"}


# -- settings and serve ----------------------------------------------------------------------------
def tokens_file() -> str:
    """RAILYARD_TOKENS_FILE: required, since a server nobody can authenticate to is a misconfiguration."""
    path = os.environ.get("RAILYARD_TOKENS_FILE") or ""
    if not path:
        raise RailyardError("set RAILYARD_TOKENS_FILE to a tokens file (see docs/api.md)", code=Code.CONFIG_INVALID)
    return path


def session_secret() -> str | None:
    """RAILYARD_SESSION_SECRET signs the login form's cookie; unset, each process makes its own (a login form opened
    before a restart, or served by another process, must be reloaded). Sessions themselves are database rows."""
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


#: What `serve` refuses to start on: a URL or a file that can never be a Railyard database (a setting to fix).
_UNUSABLE = frozenset({Code.DATABASE_URL_INVALID, Code.DATABASE_FILE_INVALID})


def _check_database(url: str) -> None:
    """Refuse a database setting that can never work; say on stderr, and serve anyway, what may yet be fixed.

    A PostgreSQL server that is not up yet, or a schema whose migration has not run yet, is the state of a
    rollout, not of this process's configuration: `/readyz` answers 503 until it is fixed, so a load balancer holds
    traffic meanwhile, and the operator reads why here, in one coded line (never the password).
    """
    checked = check_url(url)
    require_database(checked)  # never a new, empty SQLite file at a mistyped path
    try:
        problem = None if migrations.current(checked) is not None else Code.SCHEMA_MISSING
        message = "the database has no Railyard schema; run `railyard db upgrade`"
    except RailyardError as error:
        if error.code in _UNUSABLE:
            raise
        problem, message = error.code, error.message
    if problem is not None:
        sys.stderr.write(f"{problem}: {message} (serving anyway: /readyz answers 503 until it is fixed)\n")


def listening_socket(host: str, port: int) -> socket.socket:
    """The server's socket, bound before anything else is opened: a port another process holds (or an interface
    this machine does not have) is CONFIG_INVALID, one line, exit 2, not uvicorn's log lines after a start."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn does: a restart reuses the port
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise RailyardError(
            f"cannot serve on {host}:{port}: {exc.strerror or exc} (another process may hold the port: choose"
            " another with --port)",
            code=Code.CONFIG_INVALID,
            host=host,
            port=port,
        ) from None
    sock.set_inheritable(True)
    return sock


def serve(host: str = "127.0.0.1", port: int = 8080) -> None:
    import uvicorn

    tokens = load_tokens(tokens_file())
    limit = max_body()  # every setting is checked before anything is opened
    sock = listening_socket(host, port)
    with sock:
        _check_database(config.database_url())
        with Engine(config.database_url(), authoriser=tokens) as engine:
            app = create_app(
                engine,
                tokens,
                session_secret=session_secret(),
                secure_cookies=secure_cookies(),
                max_body=limit,
            )
            server = uvicorn.Server(
                uvicorn.Config(app, host=host, port=port, log_level="info", proxy_headers=False, server_header=False)
            )
            shown = f"[{host}]" if ":" in host else host
            sys.stderr.write(f"serving on http://{shown}:{port} (Ctrl-C to stop)\n")
            server.run(sockets=[sock])
