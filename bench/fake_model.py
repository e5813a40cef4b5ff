"""A fake model provider for `llm_bound.py`: answers every request on the OpenAI Chat Completions or the Anthropic
Messages wire after a latency drawn from a distribution, and counts how many requests it holds at once.

It is a process of its own (`python bench/fake_model.py --port 0 --latency fixed:1`), so its CPU is measured
apart from the worker's, and it is asyncio on raw HTTP/1.1 with keep-alive, so holding thousands of requests
costs it little: what the benchmark measures is the worker, not this.

Every answer proposes the first action it is offered: a tool call when tools are offered (the named one when
`tool_choice` names one), else the structured envelope `{"action": ..., "arguments": {}}` the forcing ladder's
JSON rungs ask for. `GET /stats` returns what it counted (requests, in flight now, most and mean in flight,
its own CPU seconds); `POST /stats/reset` starts counting again.

Latency: `fixed:SECONDS`, or `lognormal:MEDIAN:P99` (seconds).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import random
import resource
import sys
import time
from typing import Any


class Counts:
    def __init__(self) -> None:
        self.inflight = 0
        self.reset()

    def reset(self) -> None:
        """Count afresh from now; the requests held now are still held."""
        self.requests = 0
        self.most = self.inflight
        self.area = 0.0  # in-flight integrated over time, for the mean
        self.since = self.last = time.monotonic()

    def change(self, by: int) -> None:
        now = time.monotonic()
        self.area += self.inflight * (now - self.last)
        self.last = now
        self.inflight += by
        self.most = max(self.most, self.inflight)

    def to_dict(self) -> dict[str, Any]:
        self.change(0)
        usage = resource.getrusage(resource.RUSAGE_SELF)
        elapsed = max(self.last - self.since, 1e-9)
        return {
            "requests": self.requests,
            "inflight": self.inflight,
            "most_inflight": self.most,
            "mean_inflight": round(self.area / elapsed, 1),
            "cpu_s": round(usage.ru_utime + usage.ru_stime, 3),
            "seconds": round(elapsed, 3),
        }


def latency_of(spec: str) -> Any:
    kind, _, rest = spec.partition(":")
    if kind == "fixed":
        seconds = float(rest)
        return lambda: seconds
    if kind == "lognormal":
        median, p99 = (float(x) for x in rest.split(":"))
        mu, sigma = math.log(median), (math.log(p99) - math.log(median)) / 2.326
        return lambda: random.lognormvariate(mu, sigma)
    raise SystemExit(f"latency {spec!r}: fixed:SECONDS or lognormal:MEDIAN:P99")


def answer(path: str, body: dict[str, Any]) -> dict[str, Any]:
    """The reply a provider would send, proposing the first action offered."""
    if path.endswith("/messages"):  # Anthropic
        tools = body.get("tools") or []
        chosen = body.get("tool_choice") or {}
        name = chosen.get("name") if isinstance(chosen, dict) else None
        if tools:
            name = name or tools[0]["name"]
            content: list[dict[str, Any]] = [{"type": "tool_use", "id": "toolu_1", "name": name, "input": {}}]
            stop = "tool_use"
        else:
            content = [{"type": "text", "text": json.dumps({"action": "finish", "arguments": {}})}]
            stop = "end_turn"
        return {
            "id": "msg_1",
            "type": "message",
            "role": "assistant",
            "model": body.get("model", "fake"),
            "content": content,
            "stop_reason": stop,
            "stop_sequence": None,
            "usage": {"input_tokens": 120, "output_tokens": 12},
        }
    tools = body.get("tools") or []
    chosen = body.get("tool_choice")
    named = chosen.get("function", {}).get("name") if isinstance(chosen, dict) else None
    message: dict[str, Any] = {"role": "assistant", "content": None}
    if tools:
        name = named or tools[0]["function"]["name"]
        message["tool_calls"] = [{"id": "call_1", "type": "function", "function": {"name": name, "arguments": "{}"}}]
        finish = "tool_calls"
    else:
        action = "finish"
        schema = (body.get("response_format") or {}).get("json_schema", {}).get("schema", {})
        enum = schema.get("properties", {}).get("action", {}).get("enum")
        if enum:
            action = enum[0]
        message["content"] = json.dumps({"action": action, "arguments": {}})
        finish = "stop"
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": body.get("model", "fake"),
        "choices": [{"index": 0, "message": message, "finish_reason": finish}],
        "usage": {"prompt_tokens": 120, "completion_tokens": 12, "total_tokens": 132},
    }


async def serve(port: int, latency: Any) -> None:
    counts = Counts()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                line = await reader.readline()
                if not line:
                    return
                method, path, _ = line.decode("latin-1").split(" ", 2)
                length = 0
                while (header := await reader.readline()) not in (b"\r\n", b"\n", b""):
                    name, _, value = header.decode("latin-1").partition(":")
                    if name.strip().lower() == "content-length":
                        length = int(value.strip())
                raw = await reader.readexactly(length) if length else b""
                if path.startswith("/stats"):
                    if method == "POST":
                        counts.reset()
                    payload = json.dumps(counts.to_dict()).encode()
                else:
                    counts.requests += 1
                    counts.change(+1)
                    try:
                        await asyncio.sleep(latency())
                    finally:
                        counts.change(-1)
                    payload = json.dumps(answer(path, json.loads(raw or b"{}"))).encode()
                writer.write(
                    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: "
                    + str(len(payload)).encode()
                    + b"\r\n\r\n"
                    + payload
                )
                await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError, ValueError):
            return
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", port, backlog=4096)
    print(server.sockets[0].getsockname()[1], flush=True)  # the port, for the parent
    async with server:
        await server.serve_forever()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--latency", default="fixed:1")
    args = parser.parse_args()
    try:
        asyncio.run(serve(args.port, latency_of(args.latency)))
    except KeyboardInterrupt:
        sys.exit(0)


if __name__ == "__main__":
    main()
