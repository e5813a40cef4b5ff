"""`create_app(engine, tokens)`: the FastAPI application, built in-process so tests need no server.

The JSON API lives under /api (its OpenAPI document at /api/openapi.json); the
pages are everything else. Both raise the engine's `RailyardError`s; the
handlers here turn them into the JSON error body (API) or an error page (pages)
with the status `http_errors.STATUS_BY_CODE` gives (412 for a failed If-Match).
In front of them all, `limits.RequestLimits` authenticates API calls before
their body is read and refuses bodies over `max_body` bytes (413).
"""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, RedirectResponse, Response
from fastapi.staticfiles import StaticFiles
from starlette.exceptions import HTTPException as StarletteHTTPException

from engine.api import approval_routes, routes, task_routes, workflow_routes
from engine.api.auth import LoginRequired
from engine.api.context import Context
from engine.api.headers import SecurityHeaders
from engine.api.http_errors import error_body, status_for, validation_body
from engine.api.limits import OPENAPI_URL, RequestLimits, is_api
from engine.api.session import Signer
from engine.api.settings import DEFAULT_MAX_BODY
from engine.api.templating import STATIC, render
from engine.api.tokens import TokenTable
from engine.core.errors import Code, RailyardError, Refused
from engine.runtime.engine import Engine

log = logging.getLogger("railyard.api")


def create_app(
    engine: Engine,
    tokens: TokenTable,
    *,
    session_secret: str | None = None,
    secure_cookies: bool = False,
    max_body: int = DEFAULT_MAX_BODY,
) -> FastAPI:
    """The application over `engine`. Its authoriser should be `tokens` (what `railyard serve` builds), so the
    roles the engine checks are the roles the tokens file gives; `session_secret` signs the page cookies (a
    random one per process if None: sessions then end when the server restarts); `max_body` is the largest
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
    app.state.railyard = Context(engine, tokens, Signer(session_secret), secure_cookies)
    app.add_middleware(RequestLimits, tokens=tokens, max_body=max_body)
    app.add_middleware(SecurityHeaders)  # added last, so outermost: on the limits' own answers too
    app.include_router(task_routes.router)
    app.include_router(approval_routes.router)
    app.include_router(workflow_routes.router)
    app.include_router(routes.router)
    app.mount("/static", StaticFiles(directory=STATIC), name="static")
    _handlers(app)
    return app


def _is_api(request: Request) -> bool:
    return is_api(request.url.path)


def _handlers(app: FastAPI) -> None:
    @app.exception_handler(RailyardError)
    async def refused(request: Request, error: RailyardError) -> Response:
        status = status_for(error)
        if status >= 500:
            log.error("%s %s: %s", request.method, request.url.path, error)
        headers = {"WWW-Authenticate": "Bearer"} if error.code is Code.ACTOR_REQUIRED and _is_api(request) else None
        if _is_api(request):
            return JSONResponse(error_body(error), status_code=status, headers=headers)
        return render(request, "error.html", status, session=None, code=str(error.code), message=error.message)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> Response:
        body = validation_body(exc)
        if _is_api(request):
            return JSONResponse(body, status_code=422)
        return render(
            request,
            "error.html",
            422,
            session=None,
            code=body["code"],
            message="; ".join(f"{'.'.join(e['loc'])}: {e['msg']}" for e in body["details"]["errors"]),
        )

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> Response:
        message = str(exc.detail)
        if exc.status_code == 400:  # a body that does not even decode (bad UTF-8): as invalid as bad JSON
            error = Refused(f"the request body cannot be read: {message}", code=Code.PAYLOAD_INVALID)
            return await refused(request, error)
        if _is_api(request):
            return JSONResponse(
                {"code": None, "message": message, "details": {}}, status_code=exc.status_code, headers=exc.headers
            )
        return render(request, "error.html", exc.status_code, session=None, code=None, message=message)

    @app.exception_handler(LoginRequired)
    async def login_required(request: Request, _exc: LoginRequired) -> Response:
        return RedirectResponse("/login", status_code=303)

    @app.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception) -> Response:
        log.exception("%s %s failed", request.method, request.url.path)
        body = {"code": str(Code.INTERNAL_ERROR), "message": "internal error; see the server log", "details": {}}
        return JSONResponse(body, status_code=500)
