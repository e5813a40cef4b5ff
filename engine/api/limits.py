"""What the server reads of a request: nothing of an unauthenticated API call's body, and never more than the limit.

A pure ASGI middleware (Starlette's BaseHTTPMiddleware would buffer), in front
of everything that parses a body:

1. An `/api` request (but the OpenAPI document) without a valid bearer token is
   answered 401 ACTOR_REQUIRED from its headers alone: its body is never read.
2. A `Content-Length` over the limit is answered 413 without reading the body.
3. A body without one (chunked) is read here, counting, at most the limit plus
   one chunk; once past the limit the answer is 413 and the rest is never read.
   A body within the limit is handed on as it was received.

Page form posts get the same limit (their 413 is the error page). A response
given without reading the body closes the connection (`Connection: close`), so
the server does not go on receiving what the client keeps sending.
"""

from __future__ import annotations

import json
from collections import deque
from typing import Any

from starlette.datastructures import Headers
from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from engine.api.auth import authenticate, bearer_token
from engine.api.http_errors import error_body, status_of
from engine.api.templating import render
from engine.api.tokens import TokenTable
from engine.core.errors import Code, RailyardError, Refused

API_PREFIX = "/api"
OPENAPI_URL = f"{API_PREFIX}/openapi.json"
#: API paths served without a token.
PUBLIC = frozenset({OPENAPI_URL})


def is_api(path: str) -> bool:
    return path == API_PREFIX or path.startswith(API_PREFIX + "/")


class RequestLimits:
    """Authenticate /api requests before their body is read, and refuse any body over `max_body` bytes."""

    def __init__(self, app: ASGIApp, *, tokens: TokenTable, max_body: int) -> None:
        if max_body < 1:
            raise ValueError("max_body must be at least 1 byte")
        self.app = app
        self.tokens = tokens
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
                authenticate(self.tokens, bearer_token(headers.get("authorization")))
            except RailyardError as unknown:
                await self._refuse(
                    scope, receive, send, 401, unknown, close=pending, extra={"WWW-Authenticate": "Bearer"}
                )
                return
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
