"""A raw TCP server whose reply per connection is a scripted callable (sock) -> None, for transport probes."""

from __future__ import annotations

import contextlib
import json
import socket
import threading
from collections.abc import Callable


class Raw:
    def __init__(self, handler: Callable[[socket.socket, bytes], None]) -> None:
        self.handler = handler
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(512)
        self.port = self.sock.getsockname()[1]
        self.conns: list[socket.socket] = []
        self.requests = 0
        threading.Thread(target=self._serve, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def _serve(self) -> None:
        while True:
            try:
                c, _ = self.sock.accept()
            except OSError:
                return
            self.conns.append(c)
            threading.Thread(target=self._one, args=(c,), daemon=True).start()

    def _one(self, c: socket.socket) -> None:
        """Each request on the connection in turn, as a keep-alive client sends them (an SDK client reuses its
        connection: a second request left unread waited out the client's timeout), until either side closes it."""
        data = b""
        with contextlib.suppress(OSError):  # the handler closed the connection, or the client did
            while True:
                while b"\r\n\r\n" not in data:
                    chunk = c.recv(65536)
                    if not chunk:
                        return
                    data += chunk
                head, _, rest = data.partition(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":")[1])
                while len(rest) < length:
                    chunk = c.recv(65536)
                    if not chunk:
                        return
                    rest += chunk
                body, data = rest[:length], rest[length:]
                self.requests += 1
                self.last_body = body
                with contextlib.suppress(OSError):
                    self.handler(c, body)

    def close(self) -> None:
        self.sock.close()
        for c in self.conns:
            with contextlib.suppress(OSError):
                c.close()


def http(status: int, body: bytes, ctype: str = "application/json", extra: str = "") -> bytes:
    return (
        f"HTTP/1.1 {status} X\r\nContent-Type: {ctype}\r\nContent-Length: {len(body)}\r\n{extra}\r\n"
    ).encode() + body


def completion(name: str = "finish", args: dict[str, object] | None = None) -> bytes:
    return json.dumps(
        {
            "id": "c1",
            "object": "chat.completion",
            "model": "m",
            "choices": [
                {
                    "index": 0,
                    "message": {
                        "role": "assistant",
                        "content": None,
                        "tool_calls": [
                            {
                                "id": "t1",
                                "type": "function",
                                "function": {"name": name, "arguments": json.dumps(args or {})},
                            }
                        ],
                    },
                    "finish_reason": "tool_calls",
                }
            ],
            "usage": {"prompt_tokens": 3, "completion_tokens": 2},
        }
    ).encode()
