"""A fake model provider for `llm_bound.py`: answers every request on the OpenAI Chat Completions or the Anthropic
Messages wire after a latency drawn from a distribution, and counts how many requests it holds at once.

It is a process of its own (`python bench/fake_model.py --port 0 --latency fixed:1`), so its CPU is measured
apart from the worker's, and it is asyncio on raw HTTP/1.1 with keep-alive, so holding thousands of requests
costs it little: what the benchmark measures is the worker, not this.

What it answers is `POLICY`: the first rule whose action is offered and whose condition holds on what the request
shows (the task's input in `<task_context>`, the order in the newest `query_order` result) gives the action and
its arguments; with none, the first action offered, without arguments (the one-turn workflow's `finish`). A
`tool_choice` naming one tool offers only that one. The answer takes the shape the request asks for: a tool call
(`tool_calls` on the OpenAI wire, a `tool_use` block on the Anthropic one) when tools are sent, else the
structured envelope `{"action": ..., "arguments": {...}}` of the forcing ladder's JSON rungs.

`POST /v1/chat/completions` is the OpenAI wire, `POST /v1/messages` the Anthropic one (the paths the official SDKs
call under `OPENAI_BASE_URL` = `http://HOST:PORT/v1` and `ANTHROPIC_BASE_URL` = `http://HOST:PORT`). `GET /stats`
returns what it counted in the window (model requests received and answered, in flight now, most and mean in
flight), its own CPU seconds, and since it started every request and the actions it answered; `POST /stats/reset`
starts the window again.

Latency: `fixed:SECONDS`, or `lognormal:MEDIAN:P99` (seconds).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import random
import re
import resource
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

CONTEXT = re.compile(r"<task_context>\n(.*?)\n</task_context>", re.DOTALL)
LOOKED_UP = re.compile(r'<tool_result name="query_order" status="succeeded">(.*?)</tool_result>', re.DOTALL)


@dataclass(frozen=True)
class Seen:
    """What one request shows the fake: the actions offered, the task's input, and the customer's own order as the
    newest `query_order` result gave it (empty before the lookup, or if the order is someone else's)."""

    offered: tuple[str, ...]
    input: dict[str, Any]
    order: dict[str, Any]

    @classmethod
    def of(cls, offered: tuple[str, ...], texts: Iterator[str]) -> Seen:
        task_input: dict[str, Any] = {}
        order: dict[str, Any] = {}
        for text in texts:
            if found := CONTEXT.search(text):
                task_input = dict(json.loads(found.group(1)).get("input") or {})
            for result in LOOKED_UP.finditer(text):
                order = dict(json.loads(result.group(1)))  # the newest lookup wins
        own = order if order.get("customer_id") == task_input.get("customer_id") else {}
        return cls(offered, task_input, own)

    @property
    def refundable(self) -> int:
        return int(self.order.get("refundable", 0))


@dataclass(frozen=True)
class Rule:
    action: str
    when: Callable[[Seen], bool]
    arguments: Callable[[Seen], dict[str, Any]]


#: The refund workflow's path, in order of preference: propose to refund what is left of the looked-up order once it
#: was found eligible (or reject the request when nothing is), find it eligible once it was looked up, look
#: up the order the customer named. Each answer satisfies its action's schema and domain guards.
POLICY = (
    Rule(
        "propose_refund",
        lambda s: s.refundable >= 1,
        lambda s: {
            "order_id": s.order["order_id"],
            "amount": s.refundable,
            "currency": s.order["currency"],
            "reason": "Arrived damaged, as the customer reported.",
            "evidence_ids": list(s.order["evidence_ids"][:1]),
        },
    ),
    Rule(
        "reject",
        lambda s: bool(s.order) and s.refundable < 1,
        lambda s: {"reason": "Nothing is left to refund on this order."},
    ),
    Rule(
        "assess_eligibility",
        lambda s: bool(s.order),
        lambda s: {"order_id": s.order["order_id"], "finding": "The customer's own order, looked up."},
    ),
    Rule(
        "query_order",
        lambda s: bool(s.input.get("order_id")),
        lambda s: {"order_id": s.input["order_id"]},
    ),
)


def decide(seen: Seen) -> tuple[str, dict[str, Any]]:
    """The action this fake proposes, and its arguments."""
    for rule in POLICY:
        if rule.action in seen.offered and rule.when(seen):
            return rule.action, rule.arguments(seen)
    return (seen.offered[0] if seen.offered else "finish"), {}


class Counts:
    def __init__(self) -> None:
        self.inflight = 0
        self.requests_total = 0
        self.answers: Counter[str] = Counter()  # since the start: the actions answered
        self.reset()

    def reset(self) -> None:
        """Count afresh from now; the requests held now are still held."""
        self.requests = 0
        self.answered = 0  # requests answered: the turns that ended in the window, whenever they began
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
            "answered": self.answered,
            "inflight": self.inflight,
            "most_inflight": self.most,
            "mean_inflight": round(self.area / elapsed, 1),
            "cpu_s": round(usage.ru_utime + usage.ru_stime, 3),
            "seconds": round(elapsed, 3),
            "requests_total": self.requests_total,
            "answers": dict(self.answers),
        }


def latency_of(spec: str) -> Callable[[], float]:
    kind, _, rest = spec.partition(":")
    if kind == "fixed":
        seconds = float(rest)
        return lambda: seconds
    if kind == "lognormal":
        median, p99 = (float(x) for x in rest.split(":"))
        mu, sigma = math.log(median), (math.log(p99) - math.log(median)) / 2.326
        return lambda: random.lognormvariate(mu, sigma)
    raise SystemExit(f"latency {spec!r}: fixed:SECONDS or lognormal:MEDIAN:P99")


def _envelope_actions(schema: dict[str, Any]) -> tuple[str, ...]:
    return tuple(schema.get("properties", {}).get("action", {}).get("enum") or ())


def _anthropic(body: dict[str, Any]) -> tuple[dict[str, Any], str]:
    tools = tuple(t["name"] for t in body.get("tools") or [])
    chosen = body.get("tool_choice") or {}
    if chosen.get("type") == "tool":
        tools = (chosen["name"],)
    schema = ((body.get("output_config") or {}).get("format") or {}).get("schema") or {}

    def texts() -> Iterator[str]:
        if isinstance(body.get("system"), str):
            yield body["system"]
        for message in body.get("messages") or []:
            content = message.get("content")
            if isinstance(content, str):
                yield content
            for block in content if isinstance(content, list) else []:
                if block.get("type") == "text":
                    yield block.get("text") or ""

    action, arguments = decide(Seen.of(tools or _envelope_actions(schema), texts()))
    if tools:
        content: list[dict[str, Any]] = [{"type": "tool_use", "id": "toolu_1", "name": action, "input": arguments}]
        stop = "tool_use"
    else:
        content = [{"type": "text", "text": json.dumps({"action": action, "arguments": arguments})}]
        stop = "end_turn"
    reply = {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "model": body.get("model", "fake"),
        "content": content,
        "stop_reason": stop,
        "stop_sequence": None,
        "usage": {"input_tokens": 120, "output_tokens": 12},
    }
    return reply, action


def _openai(body: dict[str, Any]) -> tuple[dict[str, Any], str]:
    tools = tuple(t["function"]["name"] for t in body.get("tools") or [])
    chosen = body.get("tool_choice")
    if isinstance(chosen, dict) and chosen.get("function", {}).get("name"):
        tools = (chosen["function"]["name"],)
    schema = (body.get("response_format") or {}).get("json_schema", {}).get("schema", {})

    def texts() -> Iterator[str]:
        for message in body.get("messages") or []:
            content = message.get("content")
            if isinstance(content, str):
                yield content
            for part in content if isinstance(content, list) else []:
                if part.get("type") == "text":
                    yield part.get("text") or ""

    action, arguments = decide(Seen.of(tools or _envelope_actions(schema), texts()))
    message: dict[str, Any] = {"role": "assistant", "content": None}
    if tools:
        call = {"id": "call_1", "type": "function", "function": {"name": action, "arguments": json.dumps(arguments)}}
        message["tool_calls"] = [call]
        finish = "tool_calls"
    else:
        message["content"] = json.dumps({"action": action, "arguments": arguments})
        finish = "stop"
    reply = {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": body.get("model", "fake"),
        "choices": [{"index": 0, "message": message, "finish_reason": finish}],
        "usage": {"prompt_tokens": 120, "completion_tokens": 12, "total_tokens": 132},
    }
    return reply, action


def answer(path: str, body: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """The reply a provider would send on the wire `path` names, and the action it proposes."""
    return _anthropic(body) if path.endswith("/messages") else _openai(body)


async def serve(port: int, latency: Callable[[], float]) -> None:
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
                    counts.requests_total += 1
                    counts.change(+1)
                    try:
                        await asyncio.sleep(latency())
                    finally:
                        counts.change(-1)
                    reply, action = answer(path, json.loads(raw or b"{}"))
                    counts.answered += 1
                    counts.answers[action] += 1
                    payload = json.dumps(reply).encode()
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
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--latency", default="fixed:1")
    args = parser.parse_args()
    try:
        asyncio.run(serve(args.port, latency_of(args.latency)))
    except KeyboardInterrupt:
        sys.exit(0)


if __name__ == "__main__":
    main()
