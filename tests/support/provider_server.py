"""A real local HTTP server speaking the OpenAI Chat Completions and Anthropic Messages wire formats.

The provider adapters run their official SDKs against it unchanged (only
`base_url` points here), so a test sees exactly the bytes that went on the wire
and the SDK parses exactly the bytes a provider would send. Nothing is mocked
and nothing leaves 127.0.0.1.

A test scripts the replies in order (`server.reply(...)`); each POST takes the
next one. A server that behaves like a model, answering from what it was sent
(one that ignores `response_format`, one that obeys only system messages), is a
function of the request body (`server.respond_with(...)`), used once the
scripted replies run out. Every request is recorded (`server.requests`,
`server.bodies`).
"""

from __future__ import annotations

import contextlib
import json
import threading
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from engine.runtime.offload import run_sync

# -- replies --------------------------------------------------------------


@dataclass(frozen=True)
class Reply:
    """One scripted HTTP answer: a JSON body, or (with `events`) a `text/event-stream`."""

    status: int = 200
    body: Any = None
    #: SSE events as (event name or None, data text); the stream is sent in this order.
    events: tuple[tuple[str | None, str], ...] | None = None
    #: Raw text instead of JSON (an HTML error page from a gateway, a malformed body).
    text: str | None = None
    #: Seconds to wait before answering (timeouts), and between SSE events.
    delay: float = 0.0
    event_delay: float = 0.0
    headers: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Recorded:
    method: str
    path: str
    headers: dict[str, str]
    body: Any


# -- OpenAI Chat Completions shapes ---------------------------------------


def openai_completion(
    *,
    text: str | None = None,
    tool_calls: tuple[tuple[str, str, str], ...] = (),
    reasoning: str | None = None,
    finish_reason: str | None = "stop",
    usage: tuple[int, int] | None = (11, 7),
    refusal: str | None = None,
) -> Reply:
    """A `chat.completion` body; `tool_calls` are (id, name, raw arguments)."""
    message: dict[str, Any] = {"role": "assistant", "content": text}
    if reasoning is not None:
        message["reasoning_content"] = reasoning
    if refusal is not None:
        message["refusal"] = refusal
    if tool_calls:
        message["tool_calls"] = [
            {"id": i, "type": "function", "function": {"name": n, "arguments": a}} for i, n, a in tool_calls
        ]
    body: dict[str, Any] = {
        "id": "chatcmpl-test",
        "object": "chat.completion",
        "created": 1700000000,
        "model": "test-model",
        "choices": [{"index": 0, "message": message, "finish_reason": finish_reason}],
    }
    if usage is not None:
        body["usage"] = {"prompt_tokens": usage[0], "completion_tokens": usage[1], "total_tokens": sum(usage)}
    return Reply(body=body)


def openai_error(status: int, message: str, *, type: str = "invalid_request_error", code: str | None = None) -> Reply:
    """An error in the OpenAI shape: `{"error": {"message", "type", "param", "code"}}`."""
    return Reply(status=status, body={"error": {"message": message, "type": type, "param": None, "code": code}})


def openai_chunk(delta: dict[str, Any] | None = None, *, finish_reason: str | None = None, usage: Any = None) -> str:
    """The data of one `chat.completion.chunk` event."""
    chunk: dict[str, Any] = {
        "id": "chatcmpl-test",
        "object": "chat.completion.chunk",
        "created": 1700000000,
        "model": "test-model",
        "choices": [] if delta is None else [{"index": 0, "delta": delta, "finish_reason": finish_reason}],
    }
    if usage is not None:
        chunk["usage"] = usage
    return json.dumps(chunk)


def openai_stream(*chunks: str, done: bool = True, event_delay: float = 0.0) -> Reply:
    """An SSE stream of chunk data (see `openai_chunk`), ended by `data: [DONE]` unless `done=False`."""
    events = [(None, c) for c in chunks]
    if done:
        events.append((None, "[DONE]"))
    return Reply(events=tuple(events), event_delay=event_delay)


# -- Anthropic Messages shapes --------------------------------------------


def anthropic_message(
    *content: dict[str, Any], stop_reason: str | None = "end_turn", usage: tuple[int, int] = (13, 5)
) -> Reply:
    """A `message` body with the given content blocks."""
    return Reply(
        body={
            "id": "msg_test",
            "type": "message",
            "role": "assistant",
            "model": "test-model",
            "content": list(content),
            "stop_reason": stop_reason,
            "stop_sequence": None,
            "usage": {"input_tokens": usage[0], "output_tokens": usage[1]},
        }
    )


def text_block(text: str) -> dict[str, Any]:
    return {"type": "text", "text": text}


def thinking_block(thinking: str, signature: str) -> dict[str, Any]:
    return {"type": "thinking", "thinking": thinking, "signature": signature}


def tool_use_block(id: str, name: str, input: dict[str, Any]) -> dict[str, Any]:
    return {"type": "tool_use", "id": id, "name": name, "input": input}


def anthropic_error(status: int, message: str, *, type: str = "invalid_request_error") -> Reply:
    """An error in the Anthropic shape: `{"type": "error", "error": {"type", "message"}}`."""
    return Reply(status=status, body={"type": "error", "error": {"type": type, "message": message}})


def anthropic_event(kind: str, **fields: Any) -> tuple[str, str]:
    """One named SSE event whose data carries its `type`, as the Messages stream sends them."""
    return kind, json.dumps({"type": kind, **fields})


def anthropic_stream(*events: tuple[str, str], event_delay: float = 0.0) -> Reply:
    return Reply(events=tuple(events), event_delay=event_delay)


def anthropic_stream_of(
    *content: dict[str, Any], stop_reason: str | None = "end_turn", usage: tuple[int, int] = (13, 5)
) -> Reply:
    """The event sequence a Messages stream sends for `content`, cut into deltas the way the API cuts them."""
    events = [
        anthropic_event(
            "message_start",
            message={
                "id": "msg_test",
                "type": "message",
                "role": "assistant",
                "model": "test-model",
                "content": [],
                "stop_reason": None,
                "stop_sequence": None,
                "usage": {"input_tokens": usage[0], "output_tokens": 1},
            },
        )
    ]
    for index, block in enumerate(content):
        events.extend(_block_events(index, block))
    events.append(
        anthropic_event(
            "message_delta",
            delta={"stop_reason": stop_reason, "stop_sequence": None},
            usage={"output_tokens": usage[1]},
        )
    )
    events.append(anthropic_event("message_stop"))
    return Reply(events=tuple(events))


def _block_events(index: int, block: dict[str, Any]) -> Iterator[tuple[str, str]]:
    kind = block["type"]
    if kind == "text":
        yield anthropic_event("content_block_start", index=index, content_block={"type": "text", "text": ""})
        for piece in _halves(block["text"]):
            yield anthropic_event("content_block_delta", index=index, delta={"type": "text_delta", "text": piece})
    elif kind == "thinking":
        start: dict[str, Any] = {"type": "thinking", "thinking": "", "signature": ""}
        yield anthropic_event("content_block_start", index=index, content_block=start)
        for piece in _halves(block["thinking"]):
            delta = {"type": "thinking_delta", "thinking": piece}
            yield anthropic_event("content_block_delta", index=index, delta=delta)
        delta = {"type": "signature_delta", "signature": block["signature"]}
        yield anthropic_event("content_block_delta", index=index, delta=delta)
    elif kind == "tool_use":
        start = {"type": "tool_use", "id": block["id"], "name": block["name"], "input": {}}
        yield anthropic_event("content_block_start", index=index, content_block=start)
        for piece in _halves(json.dumps(block["input"])):
            delta = {"type": "input_json_delta", "partial_json": piece}
            yield anthropic_event("content_block_delta", index=index, delta=delta)
    yield anthropic_event("content_block_stop", index=index)


def _halves(text: str) -> list[str]:
    middle = len(text) // 2
    return [p for p in (text[:middle], text[middle:]) if p]


# -- the server -----------------------------------------------------------


class ProviderServer:
    """A threaded HTTP server on 127.0.0.1 (a free port) answering scripted replies in order.

    Use as a context manager, or call `close()`. With no reply scripted, a POST
    gets a 599 whose body says so, which the adapters surface as a provider error.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._replies: deque[Reply] = deque()
        self._responder: Callable[[Any], Reply] | None = None
        self.requests: list[Recorded] = []
        self._closing = threading.Event()
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.0"  # every response ends by closing: plain for SSE

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length)
                try:
                    body: Any = json.loads(raw)
                except ValueError:
                    body = raw.decode("utf-8", "replace")
                reply = server._record(Recorded("POST", self.path, dict(self.headers.items()), body))
                # A client that gave up (a timeout test) has nobody left to answer.
                with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                    server._send(self, reply)

            def log_message(self, format: str, *args: Any) -> None:
                pass  # keep test output quiet

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        # A short poll interval: `close()` waits up to one interval for the serving loop to notice.
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.01}, name="provider-server", daemon=True
        )
        self._thread.start()

    @property
    def url(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host!s}:{port}"

    @property
    def openai_base_url(self) -> str:
        return f"{self.url}/v1"

    @property
    def anthropic_base_url(self) -> str:
        return self.url

    def reply(self, *replies: Reply) -> None:
        """Queue replies: the next POSTs get them, in order."""
        with self._lock:
            self._replies.extend(replies)

    def respond_with(self, responder: Callable[[Any], Reply] | None) -> None:
        """Answer each POST with `responder(body)` once the scripted replies run out (None: stop)."""
        with self._lock:
            self._responder = responder

    def reset(self) -> None:
        """Forget every request, unused reply and responder: a server shared by several tests starts each clean."""
        with self._lock:
            self.requests.clear()
            self._replies.clear()
            self._responder = None

    @property
    def bodies(self) -> list[Any]:
        """The JSON bodies of every request received, in order."""
        with self._lock:
            return [r.body for r in self.requests]

    @property
    def last_body(self) -> Any:
        with self._lock:
            return self.requests[-1].body

    def close(self) -> None:
        self._closing.set()
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)

    def __enter__(self) -> ProviderServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- internals --

    def _record(self, request: Recorded) -> Reply:
        with self._lock:
            self.requests.append(request)
            if self._replies:
                return self._replies.popleft()
            responder = self._responder
        if responder is not None:
            return responder(request.body)
        return Reply(status=599, body={"error": {"message": "no reply scripted", "type": "test_error"}})

    def _send(self, handler: BaseHTTPRequestHandler, reply: Reply) -> None:
        if reply.delay and self._closing.wait(reply.delay):
            return
        handler.send_response(reply.status)
        for name, value in reply.headers.items():
            handler.send_header(name, value)
        if reply.events is not None:
            handler.send_header("Content-Type", "text/event-stream")
            handler.send_header("Cache-Control", "no-cache")
            handler.end_headers()
            for event, data in reply.events:
                if reply.event_delay and self._closing.wait(reply.event_delay):
                    return
                frame = (f"event: {event}\n" if event else "") + f"data: {data}\n\n"
                handler.wfile.write(frame.encode())
                handler.wfile.flush()
            return
        if reply.text is not None:
            payload, content_type = reply.text.encode(), "text/html; charset=utf-8"
        else:
            payload, content_type = json.dumps(reply.body).encode(), "application/json"
        handler.send_header("Content-Type", content_type)
        handler.send_header("Content-Length", str(len(payload)))
        handler.end_headers()
        handler.wfile.write(payload)


async def no_sleep(_seconds: float) -> None:
    """A `RetryPolicy.sleep` that does not wait: the backoff's delays are asserted, not served."""


def sync(adapter: Any) -> Any:
    """`adapter` with a blocking `complete`, for tests that call an adapter directly (the engine awaits it)."""
    return _Sync(adapter)


class _Sync:
    def __init__(self, adapter: Any) -> None:
        self._adapter = adapter

    def __getattr__(self, name: str) -> Any:
        return getattr(self._adapter, name)

    def complete(self, request: Any) -> Any:
        return run_sync(self._adapter.complete(request))
