"""The scripted model: deterministic answers from a file or a list, for tests, the demo and dry runs.

A script is `{"turns": [...]}` (consumed in order) or `{"by_state": {"STATE": [...]}}`
(consumed in order per agent state). A turn is one of:

    {"tool_calls": [{"name": N, "arguments": {...}}]}   # arguments may also be a raw string
    {"text": "..."}
    {"json": {...}}                                     # native structured output
    {"error": {"status": 400, "message": "..."}}        # a provider error, classified like a real one
                                                        # (by status, and `type`, `code`, `param` if given)

A turn may carry `"usage": {"input_tokens": N, "output_tokens": M}` (also `cached_tokens`,
`reasoning_tokens`): the counts a provider would report with it.
When the turns run out the model answers EMPTY_RESPONSE. Optional keys: `"profile"`
(whose capabilities the script pretends to have, default `openai`) and `"model"`;
on a turn, `"delay_seconds"` makes the answer take that long, like a slow provider
(the demo's and the worker tests' long steps).
Every request received is kept in `requests`, so tests assert what was sent.
"""

from __future__ import annotations

import asyncio
import json
import re
import threading
from dataclasses import replace
from pathlib import Path
from typing import Any

from engine.core.errors import Code, RailyardError
from engine.core.model_errors import ErrorFields, ModelError, failure, refusable
from engine.core.model_interface import ModelRequest, ModelResponse, ToolCall, Usage

_STATE_OF_PROMPT = re.compile(r"in state '([^']+)'")


def call(name: str, **arguments: Any) -> dict[str, Any]:
    """A script turn whose answer calls tool `name` with `arguments`."""
    return {"tool_calls": [{"name": name, "arguments": arguments}]}


class ScriptedModel:
    """A `ModelAdapter` that answers from a script."""

    provider = "scripted"

    def __init__(
        self, script: dict[str, Any] | list[dict[str, Any]], *, model: str | None = None, profile: str | None = None
    ) -> None:
        if isinstance(script, list):
            script = {"turns": script}
        if not isinstance(script, dict) or not ({"turns", "by_state"} & set(script)):
            raise RailyardError(
                'a scripted model needs {"turns": [...]} or {"by_state": {...}}', code=Code.CONFIG_INVALID
            )
        self.model = model or str(script.get("model", "scripted"))
        self.profile = profile or str(script.get("profile", "openai"))
        self._turns = list(script.get("turns", []))
        self._by_state = {k: list(v) for k, v in script.get("by_state", {}).items()}
        self._lock = threading.Lock()
        self.requests: list[ModelRequest] = []

    @classmethod
    def from_file(cls, path: str | Path) -> ScriptedModel:
        try:
            doc = json.loads(Path(path).read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as exc:
            raise RailyardError(f"cannot read scripted model {path}: {exc}", code=Code.CONFIG_INVALID) from None
        return cls(doc)

    async def complete(self, request: ModelRequest) -> ModelResponse:
        with self._lock:
            self.requests.append(request)
            turn = self._next(request)
        if turn is None:
            raise ModelError(Code.EMPTY_RESPONSE, "the script has no more turns")
        delay = float(turn.get("delay_seconds", 0))
        if delay > 0:
            await asyncio.sleep(delay)
        return _answer(turn, len(self.requests), request)

    def _next(self, request: ModelRequest) -> dict[str, Any] | None:
        if self._by_state:
            system = request.messages[0].content if request.messages else ""
            found = _STATE_OF_PROMPT.search(system)
            queue = self._by_state.get(found.group(1), []) if found else []
            return queue.pop(0) if queue else None
        return self._turns.pop(0) if self._turns else None


def _answer(turn: dict[str, Any], n: int, request: ModelRequest) -> ModelResponse:
    answer = _content(turn, n, request)
    reported = turn.get("usage")
    if isinstance(reported, dict):  # the token counts a provider would report with this answer
        counts = {k: v for k, v in reported.items() if k in Usage.__slots__ and isinstance(v, int)}
        answer = replace(answer, usage=Usage(**counts))
    return answer


def _content(turn: dict[str, Any], n: int, request: ModelRequest) -> ModelResponse:
    if "error" in turn:
        error = turn["error"]
        status, message = error.get("status"), str(error.get("message", ""))
        # `retry_after` stands for the header a real provider would send with the error.
        headers = {"retry-after": str(error["retry_after"])} if "retry_after" in error else None
        raise failure(ErrorFields.of(error, status), refusable(request), message, status, headers)
    if "tool_calls" in turn:
        calls = tuple(
            ToolCall(
                f"call_{n}_{i}",
                str(c.get("name", "")),
                c["arguments"] if isinstance(c.get("arguments"), str) else json.dumps(c.get("arguments", {})),
            )
            for i, c in enumerate(turn["tool_calls"])
        )
        return ModelResponse(tool_calls=calls, text=str(turn.get("text", "")), finish_reason="tool_calls")
    if "json" in turn:
        return ModelResponse(text=json.dumps(turn["json"]))
    if "text" in turn:
        return ModelResponse(text=str(turn["text"]))
    raise ModelError(Code.EMPTY_RESPONSE, "an empty scripted turn")
