"""The `anthropic:` adapter: the Messages API through the official `anthropic` SDK.

The request is built as a plain dict exactly from the `ModelRequest`, like the
OpenAI adapter: `tool_choice=None` sends no `tool_choice`, and nothing the
forcing ladder did not ask for is added. Mapping choices:

- System messages, wherever they stand, are joined (blank line between) into
  the top-level `system` string.
- Consecutive messages that land on the same Anthropic role are merged into one
  message of content blocks: the results of several tool calls of one turn must
  travel in the one user message that follows the `tool_use` turn. Empty text is
  never sent as a block (the API refuses empty text blocks).
- An assistant tool call becomes a `tool_use` block whose `input` is the parsed
  arguments; arguments that do not parse as a JSON object are sent as `{}`.
- A tool result is a `tool_result` block, with `is_error: true` when its
  content is a JSON object with an `"error"` key (see `is_error_result`).
- An assistant's reasoning is sent back as a `thinking` block only when it has
  its signature; unsigned reasoning (from another provider) is dropped, since
  the API refuses a thinking block without one.
- Thinking sends the request's `thinking_switch` `thinking` field (the
  profile's: `enabled` with its budget, or `adaptive` on models that take it),
  or `{"type": "enabled"}` for a bare `thinking=True`. `enabled` without a
  `budget_tokens` gets `thinking_budget`; `max_tokens` must exceed the budget,
  so when it does not the budget is added on top of it (the answer keeps the
  room it asked for). An extra body's own `thinking` field is dropped: thinking
  is the request's.
- `response_schema` strict or loose sends `output_config.format` (json_schema;
  Anthropic enforces the schema either way); `json_object` has no Anthropic
  equivalent and raises `SCHEMA_UNSUPPORTED` before any call.
- `parallel_tool_calls=False` sets `disable_parallel_tool_use` on the
  `tool_choice` that is sent; with `tool_choice=None` or `"none"` there is no
  object to carry it and nothing is sent.

The SDK's own retries are off by default: the engine owns retries and budgets.
The call is async (`anthropic.AsyncAnthropic`, one client per event loop,
`engine.providers.loops`), so a worker holds many calls on one loop.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import replace
from typing import Any

import anthropic
import httpx2

from engine.core.errors import Code
from engine.core.model_errors import ErrorFields, ModelError, Shape, error_message, failure, refusable
from engine.core.model_interface import (
    FinishReason,
    Message,
    ModelRequest,
    ModelResponse,
    ReasoningBlock,
    ToolCall,
    ToolSpec,
    Usage,
)
from engine.providers.deadline import bounded
from engine.providers.loops import Clients
from engine.providers.transport import (
    EVENT_HOOKS,
    LIMITS,
    Endpoint,
    answered,
    connection_failed,
    json_object,
    no_credentials,
)

_STOP: dict[str, FinishReason] = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "tool_use": "tool_calls",
    "max_tokens": "length",
    "model_context_window_exceeded": "length",
    "refusal": "content_filter",
}


def is_error_result(content: str) -> bool:
    """The convention marking a tool result as failed: a JSON object with an `"error"` key."""
    try:
        doc = json.loads(content)
    except ValueError:
        return False
    return isinstance(doc, dict) and "error" in doc


class AnthropicAdapter:
    """A `ModelAdapter` for Anthropic's Messages API."""

    provider = "anthropic"

    def __init__(
        self,
        model: str,
        *,
        base_url: str | None = None,
        api_key: str | None = None,
        timeout: float = 60.0,
        stream: bool = False,
        max_retries: int = 0,
        max_tokens_default: int = 4096,
        thinking_budget: int = 2048,
        extra_body: dict[str, Any] | None = None,
        retries: int = 2,
    ) -> None:
        self.model = model
        self.base_url = base_url
        self.timeout = timeout
        self.stream = stream
        self.max_retries = max_retries
        #: Merged into every request body (fields the engine does not know), like the OpenAI adapter's; except
        #: `thinking`, which is the request's own (`--thinking`), so the recorded `thinking_switch` is what was sent.
        self.extra_body = ({k: v for k, v in extra_body.items() if k != "thinking"} or None) if extra_body else None
        #: The engine's retries of RATE_LIMITED and PROVIDER_TIMEOUT (`AgentRunner`); `max_retries` are the SDK's.
        self.retries = retries
        self.max_tokens_default = max_tokens_default
        self.thinking_budget = thinking_budget
        self._api_key = api_key
        self._clients: Clients[anthropic.AsyncAnthropic] = Clients(self._new_client)
        self._endpoint = Endpoint("/v1/messages")

    async def complete(self, request: ModelRequest) -> ModelResponse:
        """Send one request; return the answer or raise `ModelError`."""
        if not request.model:
            request = replace(request, model=self.model)
        payload = build_payload(
            request,
            stream=self.stream,
            max_tokens_default=self.max_tokens_default,
            thinking_budget=self.thinking_budget,
        )
        sent = refusable(request)
        client = self._clients.here()
        url = self._endpoint.of(client)
        try:
            async with bounded(None if self.max_retries else self.timeout):  # a trickle is cut too
                if self.stream:
                    events = await client.messages.create(**payload, extra_body=self.extra_body)
                    async with events:  # closed however the reading ends
                        return _read_stream([e.to_dict() async for e in events], sent)
                body = {**payload, **self.extra_body} if self.extra_body else payload  # as the SDK merges it
                answer = await client.post(url, body=body, cast_to=object)
            return parse_message(json_object(answer), sent)
        except ModelError:
            raise
        except anthropic.APITimeoutError as exc:
            code = Code.PROVIDER_ERROR if connection_failed(exc) else Code.PROVIDER_TIMEOUT
            raise ModelError(code, exc.message, transient=True) from None
        except anthropic.APIConnectionError as exc:
            raise ModelError(Code.PROVIDER_ERROR, exc.message, transient=True) from None
        except anthropic.APIStatusError as exc:
            # An `event: error` inside a 200 stream arrives here too, with status_code 200: its type decides.
            message = error_message(exc.body, exc.api_message or exc.message)
            fields = ErrorFields.of(exc.body, exc.status_code)
            raise failure(fields, sent, message, exc.status_code, exc.response.headers) from None
        except anthropic.APIError as exc:
            message = error_message(exc.body, exc.message)
            raise failure(ErrorFields.of(exc.body), sent, message) from None
        except anthropic.AnthropicError as exc:
            code = Code.PROVIDER_AUTH if isinstance(exc, anthropic.CredentialsError) else Code.PROVIDER_ERROR
            raise ModelError(code, f"{type(exc).__name__}: {exc}") from None
        except httpx2.TimeoutException:
            # The SDK's stream reads the body without wrapping transport errors.
            raise ModelError(Code.PROVIDER_TIMEOUT, "timed out reading the response") from None
        except httpx2.HTTPError as exc:  # the connection failed while the body was read (a reset, a hang-up)
            raise ModelError(Code.PROVIDER_ERROR, f"{type(exc).__name__}", transient=True) from None
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            if "authentication method" in str(exc):  # the SDK's TypeError when no credentials resolve
                raise no_credentials("anthropic", str(exc)) from None
            raise ModelError(Code.PROVIDER_ERROR, f"malformed response: {type(exc).__name__}") from None

    def _new_client(self) -> anthropic.AsyncAnthropic:
        # Built on first use, inside the call: without credentials the SDK refuses here or at the request.
        try:
            return anthropic.AsyncAnthropic(
                api_key=self._api_key,
                base_url=self.base_url,
                timeout=self.timeout,
                max_retries=self.max_retries,
                http_client=anthropic.DefaultAioHttpClient(
                    timeout=self.timeout, limits=LIMITS, event_hooks=EVENT_HOOKS
                ),
            )
        except (anthropic.AnthropicError, ValueError) as exc:
            raise no_credentials("anthropic", str(exc)) from None


# -- request --------------------------------------------------------------


def build_payload(
    request: ModelRequest, *, stream: bool = False, max_tokens_default: int = 4096, thinking_budget: int = 2048
) -> dict[str, Any]:
    """The Messages API body for `request`, as keyword arguments of `messages.create`."""
    max_tokens = request.max_output_tokens if request.max_output_tokens is not None else max_tokens_default
    payload: dict[str, Any] = {"model": request.model, "max_tokens": max_tokens}
    system = [m.content for m in request.messages if m.role == "system" and m.content]
    if system:
        payload["system"] = "\n\n".join(system)
    payload["messages"] = _messages(m for m in request.messages if m.role != "system")
    if request.tools:
        payload["tools"] = [_tool(t) for t in request.tools]
    if request.tool_choice is not None:
        payload["tool_choice"] = _tool_choice(request.tool_choice, request.parallel_tool_calls)
    if request.response_schema is not None:
        if request.response_schema.mode == "json_object":
            raise ModelError(Code.SCHEMA_UNSUPPORTED, "Anthropic has no json_object mode; send a schema")
        payload["output_config"] = {"format": {"type": "json_schema", "schema": request.response_schema.schema}}
    thinking = request.thinking_switch.get("thinking") or ({"type": "enabled"} if request.thinking else None)
    if thinking:
        payload["thinking"] = dict(thinking)
        if thinking.get("type") == "enabled":
            payload["thinking"].setdefault("budget_tokens", thinking_budget)
            if max_tokens <= payload["thinking"]["budget_tokens"]:
                payload["max_tokens"] = payload["thinking"]["budget_tokens"] + max_tokens
    if stream:
        payload["stream"] = True
    return payload


def _messages(messages: Iterable[Message]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for message in messages:
        role = "assistant" if message.role == "assistant" else "user"
        blocks = _blocks(message)
        if not blocks:
            continue
        if out and out[-1]["role"] == role:
            out[-1]["content"].extend(blocks)
        else:
            out.append({"role": role, "content": blocks})
    return out


def _blocks(message: Message) -> list[dict[str, Any]]:
    if message.role == "tool":
        block: dict[str, Any] = {
            "type": "tool_result",
            "tool_use_id": message.tool_call_id or "",
            "content": message.content,
        }
        if is_error_result(message.content):
            block["is_error"] = True
        return [block]
    blocks: list[dict[str, Any]] = []
    if message.role == "assistant":
        for r in message.reasoning_blocks:
            if r.redacted:
                blocks.append({"type": "redacted_thinking", "data": r.redacted})
            elif r.signature:
                blocks.append({"type": "thinking", "thinking": r.text, "signature": r.signature})
    if message.content:
        blocks.append({"type": "text", "text": message.content})
    blocks.extend(
        {"type": "tool_use", "id": c.id, "name": c.name, "input": _input(c.arguments)}
        for c in message.tool_calls
        if message.role == "assistant"
    )
    return blocks


def _input(arguments: str) -> dict[str, Any]:
    try:
        doc = json.loads(arguments)
    except ValueError:
        return {}
    return doc if isinstance(doc, dict) else {}


def _tool(tool: ToolSpec) -> dict[str, Any]:
    out: dict[str, Any] = {"name": tool.name, "description": tool.description, "input_schema": tool.parameters}
    if tool.strict:
        out["strict"] = True
    return out


def _tool_choice(choice: str, parallel: bool | None) -> dict[str, Any]:
    out: dict[str, Any]
    if choice == "none":
        return {"type": "none"}
    if choice == "auto":
        out = {"type": "auto"}
    elif choice == "required":
        out = {"type": "any"}
    else:
        out = {"type": "tool", "name": choice}
    if parallel is False:
        out["disable_parallel_tool_use"] = True
    return out


# -- response -------------------------------------------------------------


def parse_message(body: dict[str, Any], sent: frozenset[Shape] = frozenset()) -> ModelResponse:
    """A non-streamed `message` body as a `ModelResponse`, or the `ModelError` it amounts to."""
    if body.get("type") == "error" or body.get("error"):
        message = error_message(body, "error object in a 200 response")
        raise failure(ErrorFields.of(body, 200), sent, message, 200)
    return answered(_finish(body.get("content") or [], body.get("stop_reason"), body.get("usage")), body)


def _read_stream(events: Iterable[dict[str, Any]], sent: frozenset[Shape] = frozenset()) -> ModelResponse:
    """Accumulate stream events (content_block_start/delta/stop, message_delta) into one answer."""
    blocks: dict[int, dict[str, Any]] = {}
    partial_json: dict[int, list[str]] = {}
    usage: dict[str, Any] = {}
    stop_reason: str | None = None
    stopped = False
    started: dict[str, Any] = {}  # the message_start event's message: its model and id
    for event in events:
        kind = event.get("type")
        if kind == "error" or event.get("error"):
            # The SDK raises on `event: error`; this catches an error object under any other event name.
            message = error_message(event, "error event in a 200 stream")
            raise failure(ErrorFields.of(event, 200), sent, message, 200)
        if kind == "message_start":
            started = dict(event.get("message") or {})
            usage.update(started.get("usage") or {})
        elif kind == "content_block_start":
            blocks[event["index"]] = dict(event.get("content_block") or {})
        elif kind == "content_block_delta":
            block = blocks.setdefault(event["index"], {})
            delta = event.get("delta") or {}
            dtype = delta.get("type")
            if dtype == "text_delta":
                block["text"] = block.get("text", "") + (delta.get("text") or "")
            elif dtype == "thinking_delta":
                block["thinking"] = block.get("thinking", "") + (delta.get("thinking") or "")
            elif dtype == "signature_delta":
                block["signature"] = block.get("signature", "") + (delta.get("signature") or "")
            elif dtype == "input_json_delta":
                partial_json.setdefault(event["index"], []).append(delta.get("partial_json") or "")
        elif kind == "message_delta":
            stop_reason = (event.get("delta") or {}).get("stop_reason") or stop_reason
            usage.update({k: v for k, v in (event.get("usage") or {}).items() if v is not None})
        elif kind == "message_stop":
            stopped = True
    content = []
    for index in sorted(blocks):
        block = blocks[index]
        if index in partial_json:
            block["arguments"] = "".join(partial_json[index])
        content.append(block)
    if not content and stop_reason is None:
        raise ModelError(Code.EMPTY_RESPONSE, "the stream ended without any content")
    if not stopped and stop_reason is None:
        # Something arrived, but never the end: a dropped stream must not pass for a short answer.
        raise ModelError(Code.PROVIDER_ERROR, "the stream ended without a stop_reason", transient=True)
    return answered(_finish(content, stop_reason, usage), started)


def _finish(content: list[dict[str, Any]], stop_reason: str | None, usage: dict[str, Any] | None) -> ModelResponse:
    text: list[str] = []
    thinking: list[str] = []
    reasoning_blocks: list[ReasoningBlock] = []
    calls: list[ToolCall] = []
    for block in content:
        kind = block.get("type")
        if kind == "text":
            text.append(block.get("text") or "")
        elif kind == "thinking":
            thinking.append(block.get("thinking") or "")
            reasoning_blocks.append(ReasoningBlock(block.get("thinking") or "", block.get("signature") or None))
        elif kind == "redacted_thinking":
            reasoning_blocks.append(ReasoningBlock(redacted=str(block.get("data") or "")))
        elif kind == "tool_use":
            arguments = block.get("arguments")  # the raw streamed JSON, when streamed
            if arguments is None or arguments == "":
                arguments = json.dumps(block.get("input") or {})
            calls.append(ToolCall(str(block.get("id") or ""), str(block.get("name") or ""), arguments))
    spent = _usage(usage)  # counted even when the answer fails: the provider charged for it
    reason: FinishReason = _STOP.get(stop_reason or "", "other")
    if reason == "content_filter":
        raise ModelError(Code.CONTENT_FILTERED, f"stop_reason {stop_reason}", usage=spent)
    if reason == "length" and not any(_usable(c) for c in calls):
        code = Code.CONTEXT_OVERFLOW if stop_reason == "model_context_window_exceeded" else Code.TRUNCATED
        raise ModelError(code, f"stop_reason {stop_reason} with no complete tool call", usage=spent)
    joined = "".join(text)
    if not joined.strip() and not calls:
        raise ModelError(Code.EMPTY_RESPONSE, f"no text and no tool calls (stop_reason {stop_reason})", usage=spent)
    return ModelResponse(
        tool_calls=tuple(calls),
        text=joined,
        reasoning="".join(thinking) or None,
        reasoning_blocks=tuple(reasoning_blocks),
        finish_reason=reason,
        usage=spent,
    )


def _usable(call: ToolCall) -> bool:
    """A tool call that came out whole: a name and arguments that parse as a JSON object."""
    try:
        return bool(call.name) and isinstance(json.loads(call.arguments), dict)
    except ValueError:
        return False


def _usage(usage: dict[str, Any] | None) -> Usage:
    if not usage:
        return Usage()
    # Anthropic counts cached prompt tokens apart; the neutral input count is the whole prompt, as OpenAI's is.
    # It reports no separate count of thinking tokens: they are in `output_tokens`.
    parts = [usage.get(k) for k in ("input_tokens", "cache_read_input_tokens", "cache_creation_input_tokens")]
    counts = [p for p in parts if isinstance(p, int) and not isinstance(p, bool) and p >= 0]
    output, cached = usage.get("output_tokens"), usage.get("cache_read_input_tokens")
    return Usage(
        input_tokens=sum(counts) if isinstance(parts[0], int) else None,
        output_tokens=output if isinstance(output, int) and not isinstance(output, bool) else None,
        cached_tokens=cached if isinstance(cached, int) and not isinstance(cached, bool) else None,
    )
