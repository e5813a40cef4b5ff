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
from tests.support.raw_server import Raw, completion
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
    assert TIMEOUT <= took < TIMEOUT + 1.0, f"the call took {took:.1f} s against a {TIMEOUT} s timeout"
    assert srv.requests == 1
