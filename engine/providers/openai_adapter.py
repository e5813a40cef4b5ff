"""The `openai:` adapter: the Chat Completions API through the official `openai` SDK.

Chat Completions is the one wire format every OpenAI-compatible provider
serves (Gemini, DeepSeek, Qwen/DashScope, GLM, MiniMax, Mistral, Ollama, ...),
so this adapter is also the way to reach those: point `base_url` (or
`OPENAI_BASE_URL`) at the provider and pass its key (or `OPENAI_API_KEY`).

The request is built as a plain dict exactly from the `ModelRequest`: a field
the request leaves unset (`tool_choice=None`, `parallel_tool_calls=None`) is not
sent at all, because the forcing ladder decided it and a provider that refuses
a field must not see it. The request's thinking switch (the profile's fields:
DeepSeek/GLM `thinking`, Qwen `enable_thinking`, OpenAI `reasoning_effort`,
Gemini's `extra_body.google.thinking_config`) is merged into the adapter's own
`extra_body` and wins on every field it sets (`profiles.with_switch`), so the
turn's recorded `thinking_switch` is what the body carried.

The SDK's own retries are off by default: the engine owns retries and budgets.
Every failure becomes a `ModelError`; its raw text is the provider's error
message only, never the request body.

The call is async (`openai.AsyncOpenAI`, one client per event loop,
`engine.providers.loops`) and goes through the SDK's `post` with the body
already built, not `chat.completions.create`: `create` walks the whole body
against its TypedDicts before sending and builds pydantic models of the answer,
which a profile of a worker at 256 calls in flight put at over a third of its
CPU per turn (issue #18). The SDK still does the HTTP, the auth headers, the
timeouts, the error classes and the SSE stream; the body is the one
`build_payload` makes, and the answer is read as the JSON it is.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import replace
from typing import Any, Literal

import httpx2
import openai

from engine.core.errors import Code
from engine.core.model_errors import ErrorFields, ModelError, Shape, error_message, failure, refusable
from engine.core.model_interface import (
    FinishReason,
    Message,
    ModelRequest,
    ModelResponse,
    ResponseSchema,
    ToolCall,
    ToolSpec,
    Usage,
)
from engine.core.profiles import with_switch
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

_FINISH: dict[str, FinishReason] = {
    "stop": "stop",
    "tool_calls": "tool_calls",
    "function_call": "tool_calls",
    "length": "length",
    "max_tokens": "length",
    "content_filter": "content_filter",
    "sensitive": "content_filter",  # GLM
}
#: Finish reasons some compatible providers use to say generation failed server-side.
_FINISH_FAILED = frozenset({"error", "network_error", "insufficient_system_resource"})  # -, GLM, DeepSeek

MaxTokensParam = Literal["max_tokens", "max_completion_tokens"]


class OpenAIAdapter:
    """A `ModelAdapter` for OpenAI and every provider serving Chat Completions."""

    provider = "openai"

    def __init__(
        self,
        model: str,
        *,
        base_url: str | None = None,
        api_key: str | None = None,
        timeout: float = 60.0,
        stream: bool = False,
        max_retries: int = 0,
        extra_body: dict[str, Any] | None = None,
        max_tokens_param: MaxTokensParam = "max_tokens",
        retries: int = 2,
    ) -> None:
        self.model = model
        self.base_url = base_url
        self.timeout = timeout
        self.stream = stream
        self.max_retries = max_retries
        #: The engine's retries of RATE_LIMITED and PROVIDER_TIMEOUT (`AgentRunner`); `max_retries` are the SDK's.
        self.retries = retries
        self.extra_body = dict(extra_body) if extra_body else None
        self.max_tokens_param: MaxTokensParam = max_tokens_param
        self._api_key = api_key
        self._clients: Clients[openai.AsyncOpenAI] = Clients(self._new_client)
        self._endpoint = Endpoint("/chat/completions")

    # -- the call ---------------------------------------------------------

    async def complete(self, request: ModelRequest) -> ModelResponse:
        """Send one request; return the answer or raise `ModelError`."""
        if not request.model:
            request = replace(request, model=self.model)
        payload = build_payload(request, stream=self.stream, max_tokens_param=self.max_tokens_param)
        extra_body = with_switch(self.extra_body, request.thinking_switch)
        body = {**payload, **extra_body} if extra_body else payload  # the SDK merges `extra_body` the same way
        sent = refusable(request)
        client = self._clients.here()
        url = self._endpoint.of(client)
        try:
            async with bounded(None if self.max_retries else self.timeout):  # a trickle is cut too
                if self.stream:
                    stream = openai.AsyncStream[object]
                    chunks = await client.post(url, body=body, cast_to=object, stream=True, stream_cls=stream)
                    async with chunks:  # closed however the reading ends
                        return _read_stream([json_object(c) async for c in chunks], sent)
                answer = await client.post(url, body=body, cast_to=object)
            return parse_completion(json_object(answer), sent)
        except ModelError:
            raise
        except openai.APITimeoutError as exc:
            code = Code.PROVIDER_ERROR if connection_failed(exc) else Code.PROVIDER_TIMEOUT
            raise ModelError(code, exc.message, transient=True) from None
        except openai.APIConnectionError as exc:
            raise ModelError(Code.PROVIDER_ERROR, exc.message, transient=True) from None
        except openai.APIStatusError as exc:
            message = error_message(exc.body, exc.message)
            fields = ErrorFields.of(exc.body, exc.status_code)
            raise failure(fields, sent, message, exc.status_code, exc.response.headers) from None
        except openai.APIError as exc:
            # Raised by the SDK for a `data: {"error": ...}` chunk inside a 200 stream.
            message = error_message(exc.body, exc.message)
            raise failure(ErrorFields.of(exc.body, 200), sent, message, 200) from None
        except openai.OpenAIError as exc:
            raise ModelError(Code.PROVIDER_ERROR, f"{type(exc).__name__}: {exc}") from None
        except httpx2.TimeoutException:
            raise ModelError(Code.PROVIDER_TIMEOUT, "timed out reading the response") from None
        except httpx2.HTTPError as exc:  # the connection failed while the body was read (a reset, a hang-up)
            raise ModelError(Code.PROVIDER_ERROR, f"{type(exc).__name__}", transient=True) from None
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            # A body that is not the shape Chat Completions promises (malformed JSON, wrong types).
            raise ModelError(Code.PROVIDER_ERROR, f"malformed response: {type(exc).__name__}") from None

    def _new_client(self) -> openai.AsyncOpenAI:
        # Built on first use, inside the call: without credentials the SDK refuses here (`no_credentials`).
        try:
            return openai.AsyncOpenAI(
                api_key=self._api_key,
                base_url=self.base_url,
                timeout=self.timeout,
                max_retries=self.max_retries,
                http_client=openai.DefaultAioHttpClient(timeout=self.timeout, limits=LIMITS, event_hooks=EVENT_HOOKS),
            )
        except openai.OpenAIError as exc:
            raise no_credentials("openai", str(exc)) from None


# -- request --------------------------------------------------------------


def build_payload(
    request: ModelRequest, *, stream: bool = False, max_tokens_param: MaxTokensParam = "max_tokens"
) -> dict[str, Any]:
    """The Chat Completions body for `request`, as keyword arguments of `chat.completions.create`."""
    payload: dict[str, Any] = {
        "model": request.model,
        "messages": [_message(m) for m in request.messages],
    }
    if request.tools:
        payload["tools"] = [_tool(t) for t in request.tools]
    if request.tool_choice is not None:
        payload["tool_choice"] = _tool_choice(request.tool_choice)
    if request.parallel_tool_calls is not None:
        payload["parallel_tool_calls"] = request.parallel_tool_calls
    if request.response_schema is not None:
        payload["response_format"] = _response_format(request.response_schema)
    if request.max_output_tokens is not None:
        payload[max_tokens_param] = request.max_output_tokens
    if stream:
        payload["stream"] = True
    return payload


def _message(message: Message) -> dict[str, Any]:
    if message.role == "tool":
        return {"role": "tool", "tool_call_id": message.tool_call_id or "", "content": message.content}
    if message.role != "assistant":
        return {"role": message.role, "content": message.content}
    out: dict[str, Any] = {"role": "assistant"}
    # An assistant turn that only calls tools carries `content: null`, the shape Chat Completions itself returns.
    out["content"] = message.content if message.content or not message.tool_calls else None
    if message.tool_calls:
        out["tool_calls"] = [
            {**(c.extra or {}), "id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
            for c in message.tool_calls
        ]
    if message.reasoning is not None:
        # DeepSeek (thinking mode with tools) requires the reasoning of the turn to be sent back.
        out["reasoning_content"] = message.reasoning
    return out


def _call_extra(call: dict[str, Any]) -> dict[str, Any] | None:
    """Provider fields on a tool call beyond the standard ones (Gemini's `extra_content` with its
    thought signature): kept so they go back unchanged on the next turn."""
    extra = {k: v for k, v in call.items() if k not in ("id", "type", "function", "index")}
    return extra or None


def _tool(tool: ToolSpec) -> dict[str, Any]:
    function: dict[str, Any] = {"name": tool.name, "description": tool.description, "parameters": tool.parameters}
    if tool.strict:
        function["strict"] = True
    return {"type": "function", "function": function}


def _tool_choice(choice: str) -> str | dict[str, Any]:
    if choice in ("auto", "none", "required"):
        return choice
    return {"type": "function", "function": {"name": choice}}


def _response_format(schema: ResponseSchema) -> dict[str, Any]:
    if schema.mode == "json_object":
        return {"type": "json_object"}
    return {
        "type": "json_schema",
        "json_schema": {"name": schema.name, "schema": schema.schema, "strict": schema.mode == "strict"},
    }


# -- response -------------------------------------------------------------


def parse_completion(body: dict[str, Any], sent: frozenset[Shape] = frozenset()) -> ModelResponse:
    """A non-streamed `chat.completion` body as a `ModelResponse`, or the `ModelError` it amounts to."""
    if body.get("error"):
        # Some gateways answer 200 with an error object instead of a completion.
        error = error_message(body["error"], "error object in a 200 response")
        raise failure(ErrorFields.of(body["error"], 200), sent, error, 200)
    choices = body.get("choices") or []
    if not choices:
        raise ModelError(Code.EMPTY_RESPONSE, "no choices in the response")
    choice = choices[0]
    message = choice.get("message") or {}
    calls = tuple(
        ToolCall(
            id=str(c.get("id") or ""),
            name=str((c.get("function") or {}).get("name") or ""),
            arguments=str((c.get("function") or {}).get("arguments") or ""),
            extra=_call_extra(c),
        )
        for c in message.get("tool_calls") or ()
    )
    return answered(
        _finish(
            calls=calls,
            text=message.get("content") or "",
            reasoning=_reasoning(message),
            refusal=message.get("refusal"),
            finish=choice.get("finish_reason"),
            usage=body.get("usage"),
        ),
        body,
    )


def _read_stream(chunks: Iterable[dict[str, Any]], sent: frozenset[Shape] = frozenset()) -> ModelResponse:
    """Accumulate `chat.completion.chunk`s (text, reasoning, tool-call fragments by index) into one answer."""
    text: list[str] = []
    reasoning: list[str] = []
    refusal: list[str] = []
    calls: dict[int, dict[str, str]] = {}
    finish: str | None = None
    usage: dict[str, Any] | None = None
    named: dict[str, Any] = {}  # the model and id the chunks carry (each carries them; the first is kept)
    for chunk in chunks:
        for key in ("model", "id"):
            if not named.get(key) and chunk.get(key):
                named[key] = chunk[key]
        if chunk.get("error"):
            message = error_message(chunk["error"], "error chunk in a 200 stream")
            raise failure(ErrorFields.of(chunk["error"], 200), sent, message, 200)
        if chunk.get("usage"):
            usage = chunk["usage"]
        for choice in chunk.get("choices") or ():
            if choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta") or {}
            if delta.get("content"):
                text.append(delta["content"])
            if part := _reasoning(delta):
                reasoning.append(part)
            if delta.get("refusal"):
                refusal.append(delta["refusal"])
            for fragment in delta.get("tool_calls") or ():
                _add_fragment(calls, fragment)
            if choice.get("finish_reason"):
                finish = choice["finish_reason"]
    if not (text or reasoning or refusal or calls or finish):
        raise ModelError(Code.EMPTY_RESPONSE, "the stream ended without any content")
    if finish is None:
        # Something arrived, but never the end: a dropped stream must not pass for a short answer.
        raise ModelError(Code.PROVIDER_ERROR, "the stream ended without a finish_reason", transient=True)
    return answered(
        _finish(
            calls=tuple(ToolCall(c["id"], c["name"], c["arguments"]) for _, c in sorted(calls.items())),
            text="".join(text),
            reasoning="".join(reasoning) or None,
            refusal="".join(refusal) or None,
            finish=finish,
            usage=usage,
        ),
        named,
    )


def _add_fragment(calls: dict[int, dict[str, str]], fragment: dict[str, Any]) -> None:
    index = fragment.get("index")
    if not isinstance(index, int):
        # Some compatible servers omit the index: a new id starts a new call, otherwise it continues the last one.
        last = max(calls) if calls else -1
        new_id = fragment.get("id")
        index = last + 1 if last < 0 or (new_id and new_id != calls[last]["id"]) else last
    call = calls.setdefault(index, {"id": "", "name": "", "arguments": ""})
    if fragment.get("id"):
        call["id"] = fragment["id"]
    function = fragment.get("function") or {}
    if function.get("name"):
        call["name"] += function["name"]
    if function.get("arguments"):
        call["arguments"] += function["arguments"]


def _finish(
    *,
    calls: tuple[ToolCall, ...],
    text: str,
    reasoning: str | None,
    refusal: str | None,
    finish: str | None,
    usage: dict[str, Any] | None,
) -> ModelResponse:
    """The checks shared by both read paths: filtered, truncated, failed and empty answers raise."""
    spent = _usage(usage)  # counted even when the answer fails: the provider charged for it
    reason: FinishReason = _FINISH.get(finish or "", "other")
    if reason == "content_filter":
        raise ModelError(Code.CONTENT_FILTERED, f"finish_reason {finish}", usage=spent)
    if finish in _FINISH_FAILED:
        raise ModelError(Code.PROVIDER_ERROR, f"finish_reason {finish}", usage=spent)
    if refusal and not calls:
        raise ModelError(Code.CONTENT_FILTERED, f"refusal: {refusal}", usage=spent)
    if reason == "length" and not any(_usable(c) for c in calls):
        raise ModelError(Code.TRUNCATED, "finish_reason length with no complete tool call", usage=spent)
    if not text.strip() and not calls:
        raise ModelError(Code.EMPTY_RESPONSE, f"no text and no tool calls (finish_reason {finish})", usage=spent)
    return ModelResponse(
        tool_calls=calls,
        text=text,
        reasoning=reasoning,
        finish_reason=reason,
        usage=spent,
    )


def _usable(call: ToolCall) -> bool:
    """A tool call that came out whole: a name and arguments that parse as a JSON object."""
    try:
        return bool(call.name) and isinstance(json.loads(call.arguments), dict)
    except ValueError:
        return False


def _reasoning(message: dict[str, Any]) -> str | None:
    # `reasoning_content` (DeepSeek, Qwen, GLM, vLLM); `reasoning` on a few other compatible servers.
    value = message.get("reasoning_content")
    if not isinstance(value, str):
        value = message.get("reasoning")
    return value if isinstance(value, str) and value else None


def _usage(usage: dict[str, Any] | None) -> Usage:
    """The counts the provider reported: cached prompt tokens from `prompt_tokens_details` (DeepSeek:
    `prompt_cache_hit_tokens`), reasoning tokens from `completion_tokens_details`."""
    if not usage:
        return Usage()
    prompt = usage.get("prompt_tokens_details") or {}
    completion = usage.get("completion_tokens_details") or {}
    cached = prompt.get("cached_tokens") if isinstance(prompt, dict) else None
    return Usage(
        input_tokens=_count(usage.get("prompt_tokens")),
        output_tokens=_count(usage.get("completion_tokens")),
        cached_tokens=_count(cached if cached is not None else usage.get("prompt_cache_hit_tokens")),
        reasoning_tokens=_count(completion.get("reasoning_tokens") if isinstance(completion, dict) else None),
    )


def _count(value: object) -> int | None:
    """A token count as reported, or None for a missing or malformed one (never a guessed 0)."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None
