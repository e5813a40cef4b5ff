"""A model call's timeout is the call's deadline, whatever the provider sends meanwhile (issue #16's known limit, found
again in #18's review): a stream held open by keep-alives (SSE comments on the OpenAI wire, `ping` events on the
Anthropic one, which the SDKs read and never hand over) or a non-streamed body that trickles a byte at a time,
each just inside the read timeout. Before, a stream was cut only at its next chunk after the deadline (a 1 s call
held by keep-alives lasted 31 s) and a trickling body was bounded per read only. A raw socket server plays the
provider (`tests/support/raw_server.py`)."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable

import pytest

from engine.core.errors import Code
from engine.core.model_errors import ModelError
from engine.providers.anthropic_adapter import AnthropicAdapter
from engine.providers.openai_adapter import OpenAIAdapter
from tests.support.raw_server import Raw, completion, http
from tests.test_worker_loop import call

TIMEOUT = 1.0
EVERY = 0.25  # each read is answered well inside the timeout
FOR = 8.0  # for far longer than the timeout


def _trickle(head: bytes, piece: bytes, stop: float = FOR) -> Callable[[socket.socket, bytes], None]:
    def answer(c: socket.socket, _body: bytes) -> None:
        c.sendall(head)
        until = time.monotonic() + stop
        while time.monotonic() < until:
            c.sendall(piece)
            time.sleep(EVERY)

    return answer


SSE = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n"
BODY = completion()
JSON_HEAD = f"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {len(BODY)}\r\n\r\n".encode()

CASES = {
    "openai stream, keep-alive comments": ("openai", True, _trickle(SSE, b": keep-alive\n\n")),
    "anthropic stream, ping events": ("anthropic", True, _trickle(SSE, b'event: ping\ndata: {"type": "ping"}\n\n')),
    "openai, a body a byte at a time": ("openai", False, _trickle(JSON_HEAD, b" ")),
    "anthropic, a body a byte at a time": ("anthropic", False, _trickle(JSON_HEAD, b" ")),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_timeout_ends_the_call_whatever_arrives_meanwhile(case: str) -> None:
    wire, stream, answer = CASES[case]
    srv = Raw(answer)
    try:
        if wire == "openai":
            adapter: OpenAIAdapter | AnthropicAdapter = OpenAIAdapter(
                "m", base_url=srv.url, api_key="k", timeout=TIMEOUT, stream=stream
            )
        else:
            adapter = AnthropicAdapter(
                "claude", base_url=srv.url.removesuffix("/v1"), api_key="k", timeout=TIMEOUT, stream=stream
            )
        began = time.monotonic()
        with pytest.raises(ModelError) as caught:
            call(adapter)
        took = time.monotonic() - began
    finally:
        srv.close()
    assert caught.value.code == Code.PROVIDER_TIMEOUT
    assert TIMEOUT <= took < TIMEOUT + 3.0, f"the call took {took:.1f} s against a {TIMEOUT} s timeout"  # not FOR
    assert srv.requests == 1


def test_the_sdks_own_retries_each_get_a_timeout() -> None:
    """An adapter built with the SDK's retries (`max_retries`, Python only) and a provider that says 429 with
    `retry-after: 5`: the SDK waits and retries inside the call, as long as the provider says, so the call has no
    overall deadline; a deadline cut the wait at 3 s and reported a timeout (attacker reviews: at timeout x (1 +
    max_retries) too, with timeout 2, one retry and retry-after 5)."""
    sent = {"n": 0}

    def answer(c: socket.socket, _body: bytes) -> None:
        sent["n"] += 1
        if sent["n"] == 1:
            slow_down = b'{"error": {"message": "slow down"}}'
            c.sendall(http(429, slow_down, extra="retry-after: 5\r\nConnection: close\r\n"))
        else:
            c.sendall(http(200, completion(), extra="Connection: close\r\n"))
        c.close()

    srv = Raw(answer)
    try:
        adapter = OpenAIAdapter("m", base_url=srv.url, api_key="k", timeout=2.0, max_retries=1)
        assert call(adapter).tool_calls[0].name == "finish"
    finally:
        srv.close()
    assert srv.requests == 2
