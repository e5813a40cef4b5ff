"""What the server reads of a request: an unauthenticated API call's body not at all, and no body past the limit.

The ASGI application is called directly with a `receive` that produces the body
chunk by chunk and counts how many chunks were pulled, so "not read" is
measured, not inferred; a live uvicorn server shows the same over a socket.
"""

from __future__ import annotations

import asyncio
import json
import socket
import tracemalloc
from collections.abc import Iterator, MutableMapping
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from engine import Code, Engine, RailyardError, Registry
from engine.api import create_app
from engine.api.app import DEFAULT_MAX_BODY, max_body
from tests.support.api import bearer, documented, live_server, make_api_engine, token_table

CHUNK = 64 * 1024
HUNDRED_MB = 100 * 1024 * 1024
ORDER = {"workflow": "refund", "input": {"customer": "c1", "balance": 500}}


@pytest.fixture
def engine(db_url: str, tmp_path: Path) -> Iterator[Engine]:
    with make_api_engine(db_url, tmp_path) as eng:
        yield eng


def app_over(engine: Engine, max_body: int = DEFAULT_MAX_BODY) -> FastAPI:
    return create_app(engine, token_table(), session_secret="test-secret", max_body=max_body)


class Body:
    """A request body of `total` bytes, made chunk by chunk as the application pulls it (each chunk a new object,
    so whatever the server keeps shows in its memory), counting what was pulled."""

    def __init__(self, total: int, chunk: int = CHUNK) -> None:
        self.left, self.chunk = total, chunk
        self.pulled_chunks = 0
        self.pulled_bytes = 0

    async def receive(self) -> dict[str, Any]:
        if self.left <= 0 and self.pulled_chunks:
            await asyncio.sleep(3600)  # the body is over: only a disconnect would come now
        size = min(self.chunk, self.left)
        self.left -= size
        self.pulled_chunks += 1
        self.pulled_bytes += size
        return {"type": "http.request", "body": b"x" * size, "more_body": self.left > 0}


def call(app: FastAPI, path: str, body: Body, headers: dict[str, str], method: str = "POST") -> dict[str, Any]:
    """One request straight into the ASGI application; the response's status, headers and body."""
    scope = {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.4"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "client": ("127.0.0.1", 50000),
        "server": ("testserver", 80),
        "headers": [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in headers.items()],
    }
    sent: list[dict[str, Any]] = []

    async def send(message: MutableMapping[str, Any]) -> None:
        sent.append(dict(message))

    asyncio.run(asyncio.wait_for(app(scope, body.receive, send), timeout=60))
    start = next(m for m in sent if m["type"] == "http.response.start")
    content = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return {
        "status": start["status"],
        "content": content,
        "headers": {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in start["headers"]},
    }


def error_of(answer: dict[str, Any], status: int, code: Code) -> dict[str, Any]:
    assert answer["status"] == status, answer
    doc: dict[str, Any] = json.loads(answer["content"])
    assert doc["code"] == str(code) and doc["message"] and isinstance(doc["details"], dict), doc
    return doc


def no_tasks(engine: Engine) -> bool:
    return engine.store.recent(limit=10) == []


# -- authentication before the body ---------------------------------------------------------------------
@pytest.mark.parametrize("declared", [True, False], ids=["content-length", "chunked"])
@pytest.mark.parametrize("auth", [None, "Bearer nope", "Basic dG9rLWFubg=="], ids=["none", "unknown", "basic"])
def test_a_100_mb_post_without_a_valid_token_is_401_and_its_body_is_never_read(
    engine: Engine, declared: bool, auth: str | None
) -> None:
    body = Body(HUNDRED_MB)
    headers = {
        "content-type": "application/json",
        **({"content-length": str(HUNDRED_MB)} if declared else {"transfer-encoding": "chunked"}),
        **({"authorization": auth} if auth else {}),
    }
    tracemalloc.start()
    try:
        answer = call(app_over(engine), "/api/tasks", body, headers)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    error_of(answer, 401, Code.ACTOR_REQUIRED)
    assert answer["headers"]["www-authenticate"] == "Bearer"
    assert answer["headers"]["connection"] == "close"  # the server does not go on receiving the rest
    assert "default-src 'none'" in answer["headers"]["content-security-policy"]
    assert (body.pulled_chunks, body.pulled_bytes) == (0, 0)
    assert peak < 4 * 1024 * 1024, peak
    assert no_tasks(engine)


def test_the_401_before_the_body_is_the_one_the_routes_give(engine: Engine) -> None:
    with TestClient(app_over(engine)) as client:
        documented(client)
        for headers in ({}, {"Authorization": "Bearer "}, {"Authorization": "Bearer nope"}):
            early = client.post("/api/tasks", json=ORDER, headers=headers)
            assert early.status_code == 401 and early.json()["code"] == str(Code.ACTOR_REQUIRED)
            assert early.headers["WWW-Authenticate"] == "Bearer"
        # Unknown API paths are behind the token too; the OpenAPI document is not.
        assert client.get("/api/nothing-here").status_code == 401
        assert client.get("/api/nothing-here", headers=bearer("ann")).status_code == 404
        assert client.get("/api/openapi.json").status_code == 200
        assert client.get("/login").status_code == 200  # pages authenticate by their session, later


# -- the size limit -----------------------------------------------------------------------------------------
def test_an_oversized_body_with_a_valid_token_is_413_unread_and_starts_nothing(engine: Engine) -> None:
    body = Body(HUNDRED_MB)
    answer = call(
        app_over(engine),
        "/api/tasks",
        body,
        {"content-type": "application/json", "content-length": str(HUNDRED_MB), **bearer("ann")},
    )
    doc = error_of(answer, 413, Code.PAYLOAD_INVALID)
    assert doc["details"] == {"limit": DEFAULT_MAX_BODY, "content_length": HUNDRED_MB}
    assert answer["headers"]["connection"] == "close"
    assert body.pulled_chunks == 0
    assert no_tasks(engine)


def test_a_chunked_body_is_refused_as_soon_as_it_passes_the_limit(engine: Engine) -> None:
    body = Body(HUNDRED_MB)
    tracemalloc.start()
    try:
        answer = call(
            app_over(engine),
            "/api/tasks",
            body,
            {"content-type": "application/json", "transfer-encoding": "chunked", **bearer("ann")},
        )
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert error_of(answer, 413, Code.PAYLOAD_INVALID)["details"] == {"limit": DEFAULT_MAX_BODY}
    assert body.pulled_bytes == DEFAULT_MAX_BODY + CHUNK  # the chunk that passed the limit, and not one more
    assert peak < 3 * DEFAULT_MAX_BODY, peak  # at most the limit was held, never the 100 MB
    assert no_tasks(engine)


def padded(doc: dict[str, Any], size: int) -> bytes:
    """`doc` as JSON of exactly `size` bytes (trailing whitespace is still JSON)."""
    raw = json.dumps(doc).encode()
    assert len(raw) <= size
    return raw + b" " * (size - len(raw))


def test_a_body_at_the_limit_is_read_and_one_byte_more_is_413(engine: Engine) -> None:
    limit = 4096
    with TestClient(app_over(engine, max_body=limit)) as client:
        documented(client)
        headers = {**bearer("ann"), "Content-Type": "application/json"}
        over = client.post("/api/tasks", content=padded(ORDER, limit + 1), headers=headers)
        assert over.status_code == 413 and over.json()["code"] == str(Code.PAYLOAD_INVALID)
        assert over.json()["details"] == {"limit": limit, "content_length": limit + 1}
        assert no_tasks(engine)
        at = client.post("/api/tasks", content=padded(ORDER, limit), headers=headers)
        assert at.status_code == 201, at.text
        under = client.post("/api/tasks", content=padded(ORDER, limit - 1), headers=headers)
        assert under.status_code == 201, under.text
    assert len(engine.store.recent(limit=10)) == 2


def test_a_chunked_body_within_the_limit_reaches_the_route_whole(engine: Engine) -> None:
    raw = padded(ORDER, 3000)
    chunks = [raw[i : i + 700] for i in range(0, len(raw), 700)]

    class Chunks(Body):
        async def receive(self) -> dict[str, Any]:
            self.pulled_chunks += 1
            return {"type": "http.request", "body": chunks.pop(0), "more_body": bool(chunks)}

    answer = call(
        app_over(engine, max_body=4096),
        "/api/tasks",
        Chunks(0),
        {"content-type": "application/json", "transfer-encoding": "chunked", **bearer("ann")},
    )
    assert answer["status"] == 201, answer
    assert json.loads(answer["content"])["state"] == "assessing" and answer["headers"]["etag"] == '"1"'


def test_a_content_length_that_is_not_a_number_is_refused(engine: Engine) -> None:
    body = Body(10)
    answer = call(app_over(engine), "/api/tasks", body, {"content-length": "ten", **bearer("ann")})
    error_of(answer, 422, Code.PAYLOAD_INVALID)
    assert body.pulled_chunks == 0


def test_page_form_posts_have_the_same_limit(engine: Engine) -> None:
    with TestClient(app_over(engine, max_body=2048), follow_redirects=False) as client:
        big = client.post("/login", data={"token": "x" * 3000, "csrf": "c"})
        assert big.status_code == 413 and big.headers["content-type"].startswith("text/html")
        assert "PAYLOAD_INVALID" in big.text and "2048 bytes" in big.text
        assert "default-src 'none'" in big.headers["Content-Security-Policy"]
        small = client.post("/login", data={"token": "x", "csrf": "c"})
        assert small.status_code == 403  # read, and refused for its (missing) login cookie


# -- the same over a socket, against uvicorn ------------------------------------------------------------------
def raw_exchange(url: str, request: bytes, then: bytes = b"") -> bytes:
    """Send the request head (and `then`), stop sending, and read the whole answer until the server closes."""
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=20) as sock:
        sock.sendall(request + then)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    return answer


@pytest.mark.parametrize("token", [None, "tok-ann"], ids=["no-token", "token"])
def test_a_live_server_answers_a_huge_declared_body_at_once_and_closes(engine: Engine, token: str | None) -> None:
    with live_server(app_over(engine)) as url:
        head = (
            b"POST /api/tasks HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n"
            + (f"Authorization: Bearer {token}\r\n".encode() if token else b"")
            + f"Content-Length: {HUNDRED_MB}\r\n\r\n".encode()
        )
        # 64 KiB of the 100 MB, then silence: the answer comes anyway, and the server closes the connection.
        answer = raw_exchange(url, head, b"x" * CHUNK)
    status_line, _, rest = answer.partition(b"\r\n")
    headers, _, content = rest.partition(b"\r\n\r\n")
    expected, code = (b"401", Code.ACTOR_REQUIRED) if token is None else (b"413", Code.PAYLOAD_INVALID)
    assert status_line.split()[1] == expected, answer[:300]
    assert b"connection: close" in headers.lower()
    assert json.loads(content)["code"] == str(code)
    assert no_tasks(engine)


def test_a_live_server_refuses_a_chunked_body_past_the_limit(engine: Engine) -> None:
    limit = 32 * 1024
    with live_server(app_over(engine, max_body=limit)) as url:
        head = (
            b"POST /api/tasks HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n"
            b"Authorization: Bearer tok-ann\r\nTransfer-Encoding: chunked\r\n\r\n"
        )
        piece = b"x" * 4096
        chunks = (f"{len(piece):x}\r\n".encode() + piece + b"\r\n") * (limit // len(piece) + 1)
        answer = raw_exchange(url, head, chunks)  # one chunk past the limit, and no end of body
    assert answer.split(b"\r\n", 1)[0].split()[1] == b"413", answer[:300]
    assert json.loads(answer.partition(b"\r\n\r\n")[2])["details"] == {"limit": limit}
    assert no_tasks(engine)


# -- the setting ----------------------------------------------------------------------------------------------
def test_the_limit_comes_from_railyard_api_max_body(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RAILYARD_API_MAX_BODY", raising=False)
    assert max_body() == DEFAULT_MAX_BODY == 1024 * 1024
    monkeypatch.setenv("RAILYARD_API_MAX_BODY", "65536")
    assert max_body() == 65536
    for bad in ("0", "-1", "1MB", "1.5", "٣"):
        monkeypatch.setenv("RAILYARD_API_MAX_BODY", bad)
        with pytest.raises(RailyardError) as refused:
            max_body()
        assert refused.value.code is Code.CONFIG_INVALID
    with Engine("sqlite://", Registry([]), authoriser=token_table()) as bare, pytest.raises(ValueError):
        create_app(bare, token_table(), max_body=0)
