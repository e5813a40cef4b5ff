"""The OpenAI and Anthropic adapters against a real local HTTP server speaking each wire format.

The official SDKs run unchanged, pointed at `tests/provider_server.py`; each test
asserts on the JSON body that went on the wire, or on what a scripted provider
answer (including failures) becomes.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from typing import Any

import pytest

from engine import Code, RailyardError
from engine.core.model_errors import ModelError
from engine.core.model_interface import Message, ModelRequest, ReasoningBlock, ResponseSchema, ToolCall, ToolSpec
from engine.providers.anthropic_adapter import AnthropicAdapter
from engine.providers.openai_adapter import OpenAIAdapter
from tests.support.provider_server import (
    ProviderServer,
    Reply,
    anthropic_error,
    anthropic_event,
    anthropic_message,
    anthropic_stream,
    anthropic_stream_of,
    openai_chunk,
    openai_completion,
    openai_error,
    openai_stream,
    sync,
    text_block,
    thinking_block,
    tool_use_block,
)

SECRET = "customer-ssn-123-45-6789"
APPROVE = ToolSpec(
    "approve_refund",
    "Approve the refund.",
    {"type": "object", "properties": {"amount": {"type": "number"}}, "required": ["amount"]},
)
ESCALATE = ToolSpec("escalate", "Hand the case to a human.", {"type": "object", "properties": {}}, strict=True)
SCHEMA = {"type": "object", "properties": {"action": {"type": "string"}}, "required": ["action"]}
FAST = 0.2  # seconds: the timeout of the timeout tests


def request(**fields: Any) -> ModelRequest:
    fields.setdefault("model", "test-model")
    fields.setdefault("messages", (Message("system", "You are a clerk."), Message("user", f"Refund for {SECRET}")))
    return ModelRequest(**fields)


@pytest.fixture(scope="module")
def shared_server() -> Iterator[ProviderServer]:
    with ProviderServer() as s:
        yield s


@pytest.fixture
def server(shared_server: ProviderServer) -> ProviderServer:
    shared_server.reset()
    return shared_server


# An SDK client costs ~20 ms to build (TLS context): tests reuse one adapter per configuration.
_adapters: dict[str, Any] = {}


def openai(server: ProviderServer, **options: Any) -> Any:
    options.setdefault("api_key", "test-key")
    key = repr(("openai", server.url, sorted(options.items())))
    if key not in _adapters:
        _adapters[key] = OpenAIAdapter("test-model", base_url=server.openai_base_url, **options)
    return sync(_adapters[key])


def anthropic(server: ProviderServer, **options: Any) -> Any:
    options.setdefault("api_key", "test-key")
    key = repr(("anthropic", server.url, sorted(options.items())))
    if key not in _adapters:
        _adapters[key] = AnthropicAdapter("test-model", base_url=server.anthropic_base_url, **options)
    return sync(_adapters[key])


def fails(call: Any, *args: Any) -> ModelError:
    with pytest.raises(ModelError) as caught:
        call(*args)
    assert SECRET not in caught.value.raw and SECRET not in str(caught.value)
    return caught.value


OK_OPENAI = openai_completion(text="done")
OK_ANTHROPIC = anthropic_message(text_block("done"))


# == OpenAI: the request on the wire ======================================


def test_openai_sends_only_model_and_messages_when_nothing_else_is_asked(server: ProviderServer) -> None:
    server.reply(OK_OPENAI)
    openai(server).complete(request())
    assert server.requests[0].path == "/v1/chat/completions"
    assert server.last_body == {
        "model": "test-model",
        "messages": [
            {"role": "system", "content": "You are a clerk."},
            {"role": "user", "content": f"Refund for {SECRET}"},
        ],
    }


def test_openai_tool_choice_none_omits_the_field_even_with_tools(server: ProviderServer) -> None:
    server.reply(OK_OPENAI)
    openai(server).complete(request(tools=(APPROVE,)))
    assert "tool_choice" not in server.last_body
    assert "parallel_tool_calls" not in server.last_body


@pytest.mark.parametrize("choice", ["auto", "none", "required"])
def test_openai_tool_choice_keywords_are_sent_as_strings(server: ProviderServer, choice: str) -> None:
    server.reply(OK_OPENAI)
    openai(server).complete(request(tools=(APPROVE,), tool_choice=choice))
    assert server.last_body["tool_choice"] == choice


def test_openai_a_tool_name_forces_that_function(server: ProviderServer) -> None:
    server.reply(OK_OPENAI)
    openai(server).complete(request(tools=(APPROVE,), tool_choice="approve_refund", parallel_tool_calls=False))
    assert server.last_body["tool_choice"] == {"type": "function", "function": {"name": "approve_refund"}}
    assert server.last_body["parallel_tool_calls"] is False


def test_openai_tools_are_strict_only_when_the_spec_says_so(server: ProviderServer) -> None:
    server.reply(OK_OPENAI)
    openai(server).complete(request(tools=(APPROVE, ESCALATE)))
    assert server.last_body["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "approve_refund",
                "description": "Approve the refund.",
                "parameters": APPROVE.parameters,
            },
        },
        {
            "type": "function",
            "function": {
                "name": "escalate",
                "description": "Hand the case to a human.",
                "parameters": ESCALATE.parameters,
                "strict": True,
            },
        },
    ]


@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        ("strict", {"type": "json_schema", "json_schema": {"name": "proposal", "schema": SCHEMA, "strict": True}}),
        ("loose", {"type": "json_schema", "json_schema": {"name": "proposal", "schema": SCHEMA, "strict": False}}),
        ("json_object", {"type": "json_object"}),
    ],
)
def test_openai_response_format_shapes(server: ProviderServer, mode: Any, expected: dict[str, Any]) -> None:
    server.reply(OK_OPENAI)
    openai(server).complete(request(response_schema=ResponseSchema("proposal", SCHEMA, mode)))
    assert server.last_body["response_format"] == expected


def test_openai_max_output_tokens_is_max_tokens_unless_configured(server: ProviderServer) -> None:
    server.reply(OK_OPENAI, OK_OPENAI)
    openai(server).complete(request(max_output_tokens=256))
    openai(server, max_tokens_param="max_completion_tokens").complete(request(max_output_tokens=256))
    first, second = server.bodies
    assert first["max_tokens"] == 256 and "max_completion_tokens" not in first
    assert second["max_completion_tokens"] == 256 and "max_tokens" not in second


def test_openai_history_carries_tool_calls_results_and_reasoning_back(server: ProviderServer) -> None:
    server.reply(OK_OPENAI)
    history = (
        Message("user", "refund order 7"),
        Message(
            "assistant",
            "",
            tool_calls=(ToolCall("call_1", "approve_refund", '{"amount": 5}'),),
            reasoning="The order qualifies.",
            reasoning_blocks=(ReasoningBlock("The order qualifies.", "ignored"),),
        ),
        Message("tool", '{"error": "OUTPUT_SCHEMA_INVALID"}', tool_call_id="call_1"),
        Message("assistant", "Let me retry."),
    )
    openai(server).complete(request(messages=history))
    assert server.last_body["messages"] == [
        {"role": "user", "content": "refund order 7"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "approve_refund", "arguments": '{"amount": 5}'},
                }
            ],
            "reasoning_content": "The order qualifies.",
        },
        {"role": "tool", "tool_call_id": "call_1", "content": '{"error": "OUTPUT_SCHEMA_INVALID"}'},
        {"role": "assistant", "content": "Let me retry."},
    ]


def test_openai_thinking_sends_nothing_unless_extra_body_asks(server: ProviderServer) -> None:
    server.reply(OK_OPENAI, OK_OPENAI)
    openai(server).complete(request(thinking=True))
    openai(server, extra_body={"thinking": {"type": "enabled"}}).complete(request(thinking=True))
    plain, deepseek = server.bodies
    assert "thinking" not in plain and "reasoning_effort" not in plain
    assert deepseek["thinking"] == {"type": "enabled"}


def test_openai_stream_mode_asks_for_a_stream(server: ProviderServer) -> None:
    server.reply(openai_stream(openai_chunk({"content": "ok"}, finish_reason="stop")))
    openai(server, stream=True).complete(request())
    assert server.last_body["stream"] is True
    assert "stream_options" not in server.last_body


# == OpenAI: answers ======================================================


def test_openai_answer_with_tool_calls_text_reasoning_and_usage(server: ProviderServer) -> None:
    server.reply(
        openai_completion(
            text="Approving.",
            tool_calls=(("call_1", "approve_refund", '{"amount": 5}'), ("call_2", "escalate", "{}")),
            reasoning="It qualifies.",
            finish_reason="tool_calls",
            usage=(120, 30),
        )
    )
    answer = openai(server).complete(request(tools=(APPROVE, ESCALATE)))
    assert answer.tool_calls == (
        ToolCall("call_1", "approve_refund", '{"amount": 5}'),
        ToolCall("call_2", "escalate", "{}"),
    )
    assert answer.text == "Approving."
    assert answer.reasoning == "It qualifies."
    assert answer.finish_reason == "tool_calls"
    assert (answer.usage.input_tokens, answer.usage.output_tokens) == (120, 30)


@pytest.mark.parametrize(("wire", "neutral"), [("stop", "stop"), ("function_call", "tool_calls"), ("weird", "other")])
def test_openai_finish_reasons_are_normalized(server: ProviderServer, wire: str, neutral: str) -> None:
    server.reply(openai_completion(text="ok", finish_reason=wire))
    assert openai(server).complete(request()).finish_reason == neutral


def test_openai_length_with_a_whole_tool_call_is_an_answer(server: ProviderServer) -> None:
    server.reply(openai_completion(tool_calls=(("c", "approve_refund", '{"amount": 1}'),), finish_reason="length"))
    assert openai(server).complete(request()).finish_reason == "length"


@pytest.mark.parametrize(
    ("reply", "code"),
    [
        (openai_completion(text="The refund is appro", finish_reason="length"), Code.TRUNCATED),
        (openai_completion(tool_calls=(("c", "approve_refund", '{"amou'),), finish_reason="length"), Code.TRUNCATED),
        (openai_completion(text="", finish_reason="content_filter"), Code.CONTENT_FILTERED),
        (openai_completion(text=None, refusal="I can't help with that."), Code.CONTENT_FILTERED),
        (openai_completion(text=None), Code.EMPTY_RESPONSE),
        (openai_completion(text="  \n"), Code.EMPTY_RESPONSE),
        (openai_completion(text=None, reasoning="thought only"), Code.EMPTY_RESPONSE),
        (Reply(body={"id": "x", "object": "chat.completion", "choices": []}), Code.EMPTY_RESPONSE),
        (openai_completion(text="partial", finish_reason="network_error"), Code.PROVIDER_ERROR),
        (Reply(body={"error": {"message": "Rate limit reached", "type": "requests"}}), Code.RATE_LIMITED),
    ],
)
def test_openai_unusable_answers_raise(server: ProviderServer, reply: Reply, code: Code) -> None:
    server.reply(reply)
    assert fails(openai(server).complete, request()).code == code


def test_openai_stream_accumulates_text_reasoning_and_tool_call_fragments(server: ProviderServer) -> None:
    server.reply(
        openai_stream(
            openai_chunk({"role": "assistant", "content": "", "reasoning_content": "It "}),
            openai_chunk({"reasoning_content": "qualifies."}),
            openai_chunk({"content": "Approv"}),
            openai_chunk({"content": "ing."}),
            openai_chunk(
                {
                    "tool_calls": [
                        {"index": 0, "id": "call_1", "function": {"name": "approve_refund", "arguments": ""}},
                    ]
                }
            ),
            openai_chunk(
                {
                    "tool_calls": [
                        {"index": 1, "id": "call_2", "function": {"name": "escalate", "arguments": "{"}},
                    ]
                }
            ),
            openai_chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"amount"'}}]}),
            openai_chunk({"tool_calls": [{"index": 1, "function": {"arguments": "}"}}]}),
            openai_chunk({"tool_calls": [{"index": 0, "function": {"arguments": ": 5}"}}]}, finish_reason="tool_calls"),
            openai_chunk(None, usage={"prompt_tokens": 40, "completion_tokens": 9, "total_tokens": 49}),
        )
    )
    answer = openai(server, stream=True).complete(request())
    assert answer.tool_calls == (
        ToolCall("call_1", "approve_refund", '{"amount": 5}'),
        ToolCall("call_2", "escalate", "{}"),
    )
    assert (answer.text, answer.reasoning, answer.finish_reason) == ("Approving.", "It qualifies.", "tool_calls")
    assert (answer.usage.input_tokens, answer.usage.output_tokens) == (40, 9)


@pytest.mark.parametrize(
    ("error", "code"),
    [
        ({"message": "Internal error while generating", "type": "server_error"}, Code.PROVIDER_ERROR),
        ({"message": "Rate limit exceeded, slow down", "type": "rate_limit_exceeded"}, Code.RATE_LIMITED),
        (
            {"message": "Thinking mode does not support this tool_choice", "type": "invalid_request_error"},
            Code.PROVIDER_ERROR,  # a refused request, but this one forced nothing: its wording does not decide
        ),
    ],
)
def test_openai_error_chunk_inside_a_200_stream_is_an_error_not_an_answer(
    server: ProviderServer, error: dict[str, Any], code: Code
) -> None:
    server.reply(openai_stream(openai_chunk({"content": "Approving the"}), json.dumps({"error": error})))
    failure = fails(openai(server, stream=True).complete, request())
    assert (failure.code, failure.status, failure.raw) == (code, 200, error["message"])
    assert len(server.requests) == 1


@pytest.mark.parametrize(
    "reply",
    [
        openai_stream(),  # only `data: [DONE]`
        openai_stream(done=False),  # no event at all
        openai_stream(openai_chunk(None, usage={"prompt_tokens": 3, "completion_tokens": 0, "total_tokens": 3})),
    ],
    ids=["done-only", "no-events", "usage-only"],
)
def test_openai_stream_with_nothing_in_it_is_empty(server: ProviderServer, reply: Reply) -> None:
    server.reply(reply)
    assert fails(openai(server, stream=True).complete, request()).code == Code.EMPTY_RESPONSE


def test_openai_stream_cut_before_its_end_is_an_error_not_a_short_answer(server: ProviderServer) -> None:
    server.reply(openai_stream(openai_chunk({"content": "Approving the"}), done=False))
    assert fails(openai(server, stream=True).complete, request()).code == Code.PROVIDER_ERROR


def test_openai_stream_cut_at_the_token_limit_is_truncated(server: ProviderServer) -> None:
    server.reply(openai_stream(openai_chunk({"content": "Approving the"}, finish_reason="length")))
    assert fails(openai(server, stream=True).complete, request()).code == Code.TRUNCATED


# == Anthropic: the request on the wire ===================================


def test_anthropic_joins_system_messages_and_defaults_max_tokens(server: ProviderServer) -> None:
    server.reply(OK_ANTHROPIC)
    messages = (Message("system", "You are a clerk."), Message("user", "hi"), Message("system", "Reminder: one tool."))
    anthropic(server).complete(request(messages=messages))
    assert server.requests[0].path == "/v1/messages"
    assert server.last_body == {
        "model": "test-model",
        "max_tokens": 4096,
        "system": "You are a clerk.\n\nReminder: one tool.",
        "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
    }


@pytest.mark.parametrize(
    ("choice", "parallel", "expected"),
    [
        (None, None, None),
        (None, False, None),
        ("auto", None, {"type": "auto"}),
        ("none", False, {"type": "none"}),
        ("required", None, {"type": "any"}),
        ("required", False, {"type": "any", "disable_parallel_tool_use": True}),
        ("approve_refund", None, {"type": "tool", "name": "approve_refund"}),
    ],
)
def test_anthropic_tool_choice_mapping(
    server: ProviderServer, choice: str | None, parallel: bool | None, expected: dict[str, Any] | None
) -> None:
    server.reply(OK_ANTHROPIC)
    anthropic(server).complete(request(tools=(APPROVE,), tool_choice=choice, parallel_tool_calls=parallel))
    if expected is None:
        assert "tool_choice" not in server.last_body
    else:
        assert server.last_body["tool_choice"] == expected


def test_anthropic_tools_use_input_schema_and_strict_only_when_asked(server: ProviderServer) -> None:
    server.reply(OK_ANTHROPIC)
    anthropic(server).complete(request(tools=(APPROVE, ESCALATE)))
    assert server.last_body["tools"] == [
        {"name": "approve_refund", "description": "Approve the refund.", "input_schema": APPROVE.parameters},
        {
            "name": "escalate",
            "description": "Hand the case to a human.",
            "input_schema": ESCALATE.parameters,
            "strict": True,
        },
    ]


def test_anthropic_history_maps_thinking_tool_use_and_merged_tool_results(server: ProviderServer) -> None:
    server.reply(OK_ANTHROPIC)
    history = (
        Message("user", "refund order 7"),
        Message(
            "assistant",
            "Checking.",
            tool_calls=(ToolCall("tu_1", "approve_refund", '{"amount": 5}'), ToolCall("tu_2", "escalate", "{bad")),
            reasoning="The order qualifies.",
            reasoning_blocks=(ReasoningBlock("The order qualifies.", "sig-abc"), ReasoningBlock(redacted="opaque")),
        ),
        Message("tool", '{"ok": true}', tool_call_id="tu_1"),
        Message("tool", '{"error": "OUTPUT_NOT_JSON"}', tool_call_id="tu_2"),
        Message("user", "Try again."),
        Message("assistant", "", reasoning="unsigned reasoning from another provider"),
    )
    anthropic(server).complete(request(messages=history))
    assert server.last_body["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": "refund order 7"}]},
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": "The order qualifies.", "signature": "sig-abc"},
                {"type": "redacted_thinking", "data": "opaque"},
                {"type": "text", "text": "Checking."},
                {"type": "tool_use", "id": "tu_1", "name": "approve_refund", "input": {"amount": 5}},
                {"type": "tool_use", "id": "tu_2", "name": "escalate", "input": {}},
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "tu_1", "content": '{"ok": true}'},
                {
                    "type": "tool_result",
                    "tool_use_id": "tu_2",
                    "content": '{"error": "OUTPUT_NOT_JSON"}',
                    "is_error": True,
                },
                {"type": "text", "text": "Try again."},
            ],
        },
    ]


@pytest.mark.parametrize(("asked", "sent"), [(None, 4096), (8000, 8000), (1000, 3048)])
def test_anthropic_thinking_sends_the_budget_and_room_above_it(
    server: ProviderServer, asked: int | None, sent: int
) -> None:
    server.reply(OK_ANTHROPIC)
    anthropic(server).complete(request(thinking=True, max_output_tokens=asked))
    assert server.last_body["thinking"] == {"type": "enabled", "budget_tokens": 2048}
    assert server.last_body["max_tokens"] == sent


def test_anthropic_without_thinking_sends_no_thinking(server: ProviderServer) -> None:
    server.reply(OK_ANTHROPIC)
    anthropic(server).complete(request(max_output_tokens=100))
    assert "thinking" not in server.last_body and server.last_body["max_tokens"] == 100


@pytest.mark.parametrize("mode", ["strict", "loose"])
def test_anthropic_schema_goes_to_output_config(server: ProviderServer, mode: Any) -> None:
    server.reply(anthropic_message(text_block('{"action": "approve"}')))
    anthropic(server).complete(request(response_schema=ResponseSchema("proposal", SCHEMA, mode)))
    assert server.last_body["output_config"] == {"format": {"type": "json_schema", "schema": SCHEMA}}


def test_anthropic_json_object_mode_is_refused_before_any_call(server: ProviderServer) -> None:
    failure = fails(anthropic(server).complete, request(response_schema=ResponseSchema("p", {}, "json_object")))
    assert failure.code == Code.SCHEMA_UNSUPPORTED
    assert server.requests == []


# == Anthropic: answers ===================================================


def test_anthropic_answer_with_thinking_text_tool_use_and_usage(server: ProviderServer) -> None:
    server.reply(
        Reply(
            body={
                "id": "msg_1",
                "type": "message",
                "role": "assistant",
                "model": "test-model",
                "content": [
                    thinking_block("It qualifies.", "sig-1"),
                    text_block("Approving."),
                    tool_use_block("tu_1", "approve_refund", {"amount": 5}),
                ],
                "stop_reason": "tool_use",
                "stop_sequence": None,
                "usage": {"input_tokens": 100, "cache_read_input_tokens": 20, "output_tokens": 30},
            }
        )
    )
    answer = anthropic(server).complete(request(tools=(APPROVE,)))
    assert answer.tool_calls == (ToolCall("tu_1", "approve_refund", '{"amount": 5}'),)
    assert (answer.text, answer.reasoning) == ("Approving.", "It qualifies.")
    assert answer.reasoning_blocks == (ReasoningBlock("It qualifies.", "sig-1"),)
    assert answer.finish_reason == "tool_calls"
    assert (answer.usage.input_tokens, answer.usage.output_tokens) == (120, 30)


@pytest.mark.parametrize(
    ("wire", "neutral"), [("end_turn", "stop"), ("stop_sequence", "stop"), ("pause_turn", "other")]
)
def test_anthropic_stop_reasons_are_normalized(server: ProviderServer, wire: str, neutral: str) -> None:
    server.reply(anthropic_message(text_block("ok"), stop_reason=wire))
    assert anthropic(server).complete(request()).finish_reason == neutral


@pytest.mark.parametrize(
    ("reply", "code"),
    [
        (anthropic_message(text_block("The refund is appro"), stop_reason="max_tokens"), Code.TRUNCATED),
        (anthropic_message(text_block("partial"), stop_reason="model_context_window_exceeded"), Code.CONTEXT_OVERFLOW),
        (anthropic_message(stop_reason="refusal"), Code.CONTENT_FILTERED),
        (anthropic_message(), Code.EMPTY_RESPONSE),
        (anthropic_message(thinking_block("thought only", "s")), Code.EMPTY_RESPONSE),
    ],
)
def test_anthropic_unusable_answers_raise(server: ProviderServer, reply: Reply, code: Code) -> None:
    server.reply(reply)
    assert fails(anthropic(server).complete, request()).code == code


def test_anthropic_stream_accumulates_blocks(server: ProviderServer) -> None:
    server.reply(
        anthropic_stream_of(
            thinking_block("It qualifies.", "sig-1"),
            text_block("Approving."),
            tool_use_block("tu_1", "approve_refund", {"amount": 5}),
            stop_reason="tool_use",
            usage=(50, 12),
        )
    )
    answer = anthropic(server, stream=True).complete(request())
    assert server.last_body["stream"] is True
    assert answer.tool_calls == (ToolCall("tu_1", "approve_refund", '{"amount": 5}'),)
    assert (answer.text, answer.reasoning) == ("Approving.", "It qualifies.")
    assert answer.reasoning_blocks == (ReasoningBlock("It qualifies.", "sig-1"),)
    assert (answer.finish_reason, answer.usage.input_tokens, answer.usage.output_tokens) == ("tool_calls", 50, 12)


MESSAGE_START = anthropic_event(
    "message_start",
    message={
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "model": "test-model",
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": {"input_tokens": 10, "output_tokens": 1},
    },
)
TEXT_SO_FAR = (
    anthropic_event("content_block_start", index=0, content_block={"type": "text", "text": ""}),
    anthropic_event("content_block_delta", index=0, delta={"type": "text_delta", "text": "Approving the"}),
)


@pytest.mark.parametrize(
    ("error_type", "message", "code"),
    [
        ("overloaded_error", "Overloaded", Code.RATE_LIMITED),
        ("api_error", "Internal server error", Code.PROVIDER_ERROR),
        ("rate_limit_error", "Number of requests has exceeded your limit", Code.RATE_LIMITED),
    ],
)
def test_anthropic_error_event_inside_a_200_stream_is_an_error_not_an_answer(
    server: ProviderServer, error_type: str, message: str, code: Code
) -> None:
    error = ("error", json.dumps({"type": "error", "error": {"type": error_type, "message": message}}))
    server.reply(anthropic_stream(MESSAGE_START, *TEXT_SO_FAR, error))
    failure = fails(anthropic(server, stream=True).complete, request())
    assert (failure.code, failure.status, failure.raw) == (code, 200, message)
    assert len(server.requests) == 1


@pytest.mark.parametrize(
    "reply",
    [
        anthropic_stream(),
        anthropic_stream(MESSAGE_START, anthropic_event("message_stop")),
        anthropic_stream_of(),
    ],
    ids=["no-events", "start-stop", "no-blocks"],
)
def test_anthropic_stream_with_nothing_in_it_is_empty(server: ProviderServer, reply: Reply) -> None:
    server.reply(reply)
    assert fails(anthropic(server, stream=True).complete, request()).code == Code.EMPTY_RESPONSE


def test_anthropic_stream_cut_before_its_end_is_an_error_not_a_short_answer(server: ProviderServer) -> None:
    server.reply(anthropic_stream(MESSAGE_START, *TEXT_SO_FAR))
    assert fails(anthropic(server, stream=True).complete, request()).code == Code.PROVIDER_ERROR


def test_anthropic_stream_cut_at_the_token_limit_is_truncated(server: ProviderServer) -> None:
    server.reply(anthropic_stream_of(text_block("Approving the"), stop_reason="max_tokens"))
    assert fails(anthropic(server, stream=True).complete, request()).code == Code.TRUNCATED


# == Errors: both providers ===============================================

FORCED = {"tools": (APPROVE,), "tool_choice": "required"}
WITH_SCHEMA = {"response_schema": ResponseSchema("p", SCHEMA, "strict")}

#: (status, message, the error's type / code / param, what the request carried, the code). The message never decides.
HTTP_ERRORS = [
    (
        400,
        "Thinking mode does not support this tool_choice",
        "invalid_request_error",
        None,
        None,
        FORCED,
        Code.TOOL_CHOICE_UNSUPPORTED,
    ),
    (
        400,
        "Thinking may not be enabled when tool_choice forces tool use.",
        "invalid_request_error",
        None,
        None,
        FORCED,
        Code.TOOL_CHOICE_UNSUPPORTED,
    ),
    (400, "Invalid value", "invalid_request_error", None, "tool_choice", {}, Code.TOOL_CHOICE_UNSUPPORTED),
    (400, "tool_choice is not supported", "invalid_request_error", None, None, {}, Code.PROVIDER_ERROR),
    (401, "Incorrect API key provided", "invalid_request_error", "invalid_api_key", None, FORCED, Code.PROVIDER_AUTH),
    (403, "Your account is not permitted", "permission_error", None, None, {}, Code.PROVIDER_AUTH),
    (429, "Too many requests, please slow down", "rate_limit_error", None, None, {}, Code.RATE_LIMITED),
    (429, "Rate limit reached", "requests", "rate_limit_exceeded", None, {}, Code.RATE_LIMITED),
    (500, "The server had an error while processing your request", "server_error", None, None, {}, Code.PROVIDER_ERROR),
    (503, "upstream overloaded", "api_error", None, None, {}, Code.PROVIDER_ERROR),
    (504, "Gateway timeout", None, None, None, {}, Code.PROVIDER_TIMEOUT),
    (
        400,
        "This model's maximum context length is 128000 tokens",
        "invalid_request_error",
        "context_length_exceeded",
        "messages",
        FORCED,
        Code.CONTEXT_OVERFLOW,
    ),
    (
        413,
        "Request exceeds the maximum allowed number of bytes",
        "request_too_large",
        None,
        None,
        {},
        Code.CONTEXT_OVERFLOW,
    ),
    (
        400,
        "Invalid parameter",
        "invalid_request_error",
        None,
        "response_format.json_schema",
        {},
        Code.SCHEMA_UNSUPPORTED,
    ),
    (
        400,
        "output_config.format: Extra inputs are not permitted",
        "invalid_request_error",
        None,
        None,
        WITH_SCHEMA,
        Code.SCHEMA_UNSUPPORTED,
    ),
    (
        400,
        "Invalid value for messages[1].role",
        "invalid_request_error",
        None,
        "messages[1].role",
        FORCED,
        Code.PROVIDER_ERROR,
    ),
    (400, "Invalid value for messages[1].role", "invalid_request_error", None, None, {}, Code.PROVIDER_ERROR),
]


def error_body(message: str, type: str | None, code: str | int | None = None, param: str | None = None) -> Any:
    """An error object carrying only the fields given (the shape both wires share under `error`)."""
    fields = {"type": type, "code": code, "param": param}
    return {"message": message, **{k: v for k, v in fields.items() if v is not None}}


@pytest.mark.parametrize(("status", "message", "type", "code", "param", "sent", "expected"), HTTP_ERRORS)
@pytest.mark.parametrize("wire", ["openai", "anthropic"])
@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_http_errors_are_classified_by_their_fields_and_are_not_retried(
    server: ProviderServer,
    wire: str,
    stream: bool,
    status: int,
    message: str,
    type: str | None,
    code: str | None,
    param: str | None,
    sent: dict[str, Any],
    expected: Code,
) -> None:
    body = {"error": error_body(message, type, code, param)}
    if wire == "anthropic":
        body["type"] = "error"
    server.reply(Reply(status=status, body=body), OK_OPENAI if wire == "openai" else OK_ANTHROPIC)
    adapter = openai(server, stream=stream) if wire == "openai" else anthropic(server, stream=stream)
    failure = fails(adapter.complete, request(**sent))
    assert (failure.code, failure.status, failure.raw) == (expected, status, message)
    assert len(server.requests) == 1  # the SDK's retries are off: the engine owns retries


#: Error objects inside a 200 stream, by their fields, and the code those fields mean.
STREAM_FIELDS = [
    ({"type": "server_error", "code": 502}, Code.PROVIDER_ERROR),
    ({"type": "server_error", "code": "429"}, Code.RATE_LIMITED),
    ({"type": "api_error"}, Code.PROVIDER_ERROR),
    ({"type": "overloaded_error"}, Code.RATE_LIMITED),
    ({"type": "rate_limit_exceeded"}, Code.RATE_LIMITED),
    ({"type": "timeout_error"}, Code.PROVIDER_TIMEOUT),
    ({"type": "invalid_request_error", "param": "tool_choice"}, Code.TOOL_CHOICE_UNSUPPORTED),
    ({"status": "RESOURCE_EXHAUSTED", "code": 8}, Code.RATE_LIMITED),  # Google's shape
    ({"status": "INTERNAL"}, Code.PROVIDER_ERROR),
    ({}, Code.PROVIDER_ERROR),
]
#: Wordings that once chose codes by keyword: with the same fields, each must get the same code.
WORDINGS = [
    "upstream overloaded",
    "Rate limit exceeded, slow down",
    "Request timed out",
    "This model's maximum context length is exceeded",
    "Invalid API key",
    "tool_choice is not supported",
    "response_format json_schema is not supported",
    "content filter triggered",
]


def _stream_with_error(wire: str, error: dict[str, Any]) -> Reply:
    if wire == "openai":
        return openai_stream(openai_chunk({"content": "Approving the"}), json.dumps({"error": error}))
    return anthropic_stream(MESSAGE_START, *TEXT_SO_FAR, ("error", json.dumps({"type": "error", "error": error})))


@pytest.mark.parametrize(("fields", "code"), STREAM_FIELDS)
@pytest.mark.parametrize("wire", ["openai", "anthropic"])
def test_stream_error_events_with_the_same_fields_get_the_same_code_whatever_they_say(
    server: ProviderServer, wire: str, fields: dict[str, Any], code: Code
) -> None:
    adapter = openai(server, stream=True) if wire == "openai" else anthropic(server, stream=True)
    for wording in WORDINGS:
        server.reply(_stream_with_error(wire, {"message": wording, **fields}))
        failure = fails(adapter.complete, request())
        assert (failure.code, failure.status, failure.raw) == (code, 200, wording), wording
    assert len(server.requests) == len(WORDINGS)  # one call each: nothing retried inside the adapter


def test_a_provider_message_is_kept_for_people_with_credentials_masked(
    server: ProviderServer, caplog: pytest.LogCaptureFixture
) -> None:
    leaked = "Incorrect API key provided: sk-proj-abcdef0123456789. Find your key at https://example.test"
    server.reply(openai_error(401, leaked, code="invalid_api_key"))
    with caplog.at_level(logging.WARNING, logger="railyard.model"):
        failure = fails(openai(server).complete, request())
    assert failure.code == Code.PROVIDER_AUTH
    assert failure.raw == "Incorrect API key provided: [redacted]. Find your key at https://example.test"
    assert "sk-proj" not in caplog.text


def test_anthropic_refusing_output_config_is_schema_unsupported(server: ProviderServer) -> None:
    server.reply(anthropic_error(400, "output_config.format: Extra inputs are not permitted"))
    failure = fails(anthropic(server).complete, request(response_schema=ResponseSchema("p", SCHEMA, "strict")))
    assert failure.code == Code.SCHEMA_UNSUPPORTED


def test_an_empty_request_model_falls_back_to_the_adapters(server: ProviderServer) -> None:
    server.reply(OK_OPENAI, OK_ANTHROPIC)
    openai(server).complete(request(model=""))
    anthropic(server).complete(request(model=""))
    assert [body["model"] for body in server.bodies] == ["test-model", "test-model"]


def test_anthropic_overloaded_529_is_rate_limited(server: ProviderServer) -> None:
    server.reply(anthropic_error(529, "Overloaded", type="overloaded_error"))
    failure = fails(anthropic(server).complete, request())
    assert (failure.code, failure.status) == (Code.RATE_LIMITED, 529)
    assert len(server.requests) == 1


def test_openai_error_type_and_code_help_classify_a_vague_message(server: ProviderServer) -> None:
    server.reply(openai_error(400, "Request too large for model", code="context_length_exceeded"))
    assert fails(openai(server).complete, request()).code == Code.CONTEXT_OVERFLOW


def test_a_gateway_error_page_is_a_provider_error(server: ProviderServer) -> None:
    page = Reply(status=502, text="<html><body>502 Bad Gateway</body></html>")
    server.reply(page, page)
    assert fails(openai(server).complete, request()).code == Code.PROVIDER_ERROR
    assert fails(anthropic(server).complete, request()).code == Code.PROVIDER_ERROR


@pytest.mark.parametrize("provider", [openai, anthropic])
@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_a_slow_provider_is_a_timeout(server: ProviderServer, provider: Any, stream: bool) -> None:
    server.reply(Reply(delay=3.0, body={}))
    failure = fails(provider(server, stream=stream, timeout=FAST).complete, request())
    assert failure.code == Code.PROVIDER_TIMEOUT
    assert failure.retryable
    assert len(server.requests) == 1


def test_a_stream_that_stalls_midway_is_a_timeout(server: ProviderServer) -> None:
    server.reply(
        openai_stream(openai_chunk({"content": "Appro"}), openai_chunk({"content": "ving"}), event_delay=0.6),
        anthropic_stream(MESSAGE_START, *TEXT_SO_FAR, event_delay=0.6),
    )
    assert fails(openai(server, stream=True, timeout=FAST).complete, request()).code == Code.PROVIDER_TIMEOUT
    assert fails(anthropic(server, stream=True, timeout=FAST).complete, request()).code == Code.PROVIDER_TIMEOUT


@pytest.mark.parametrize("provider", [openai, anthropic])
def test_an_unreachable_provider_is_a_provider_error(provider: Any) -> None:
    with ProviderServer() as gone:
        pass  # closed: its port now refuses connections
    assert fails(provider(gone).complete, request()).code == Code.PROVIDER_ERROR


def test_openai_without_credentials_is_a_configuration_error_without_a_call(
    server: ProviderServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No key at all is the deployment's mistake, not a failure of the call: `MODEL_NOT_CONFIGURED`, a RailyardError
    the step does not record (it was PROVIDER_AUTH, which took each task to `~provider_error`)."""
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    adapter = sync(OpenAIAdapter("test-model", base_url=server.openai_base_url))
    with pytest.raises(RailyardError) as caught:
        adapter.complete(request())
    assert caught.value.code == Code.MODEL_NOT_CONFIGURED and "OPENAI_API_KEY" in caught.value.message
    assert server.requests == []


@pytest.mark.parametrize("provider", [openai, anthropic])
def test_error_text_never_carries_the_request_body(
    server: ProviderServer, provider: Any, caplog: pytest.LogCaptureFixture
) -> None:
    # A provider that echoes the request back beside its message: only the message is kept.
    echo = {"message": "Invalid request", "type": "invalid_request_error", "param": SECRET, "echo": f"for {SECRET}"}
    server.reply(Reply(status=400, body={"type": "error", "error": echo}))
    with caplog.at_level(logging.WARNING, logger="railyard.model"):
        failure = fails(provider(server).complete, request())
    assert failure.raw == "Invalid request"
    assert SECRET not in caplog.text
    assert SECRET in json.dumps(server.last_body)  # it did go on the wire, just not into the error


def test_error_raw_text_is_cut_to_200_characters(server: ProviderServer) -> None:
    server.reply(openai_error(500, "x" * 1000))
    assert len(fails(openai(server).complete, request()).raw) == 200


def test_openai_tool_call_extras_such_as_thought_signatures_go_back_unchanged(server: ProviderServer) -> None:
    """Gemini's OpenAI-compatible endpoint puts a thought signature on each tool call; it must come back."""
    extra = {"extra_content": {"google": {"thought_signature": "sig-gemini"}}}
    body = openai_completion(tool_calls=(("c1", "approve_refund", '{"amount": 5}'),), finish_reason="tool_calls").body
    body["choices"][0]["message"]["tool_calls"][0].update(extra)
    server.reply(Reply(body=body), OK_OPENAI)
    answer = openai(server).complete(request(tools=(APPROVE,)))
    assert answer.tool_calls[0].extra == extra
    history = (
        Message("user", "go"),
        Message("assistant", "", tool_calls=answer.tool_calls),
        Message("tool", "{}", tool_call_id="c1"),
    )
    openai(server).complete(request(messages=history))
    assert server.last_body["messages"][1]["tool_calls"][0]["extra_content"] == extra["extra_content"]


def test_the_model_and_id_a_provider_gives_its_answer_are_kept_from_bodies_and_streams() -> None:
    """What traces report as gen_ai.response.model and gen_ai.response.id; absent when the provider says nothing."""
    from engine.providers import anthropic_adapter, openai_adapter

    choice = {"index": 0, "message": {"content": "hi"}, "finish_reason": "stop"}
    body = {"id": "chatcmpl-1", "model": "gpt-4.1-2025", "choices": [choice]}
    answer = openai_adapter.parse_completion(body)
    assert (answer.response_model, answer.response_id) == ("gpt-4.1-2025", "chatcmpl-1")
    answer = openai_adapter.parse_completion({"choices": [choice]})
    assert (answer.response_model, answer.response_id) == (None, None)
    chunks = [
        {"id": "chatcmpl-2", "model": "m-2", "choices": [{"index": 0, "delta": {"content": "h"}}]},
        {
            "id": "chatcmpl-2",
            "model": "m-2",
            "choices": [{"index": 0, "delta": {"content": "i"}, "finish_reason": "stop"}],
        },
    ]
    answer = openai_adapter._read_stream(chunks)
    assert (answer.text, answer.response_model, answer.response_id) == ("hi", "m-2", "chatcmpl-2")

    message = {
        "id": "msg_1",
        "model": "claude-x",
        "content": [{"type": "text", "text": "hi"}],
        "stop_reason": "end_turn",
    }
    answer = anthropic_adapter.parse_message(message)
    assert (answer.response_model, answer.response_id) == ("claude-x", "msg_1")
    events: list[dict[str, Any]] = [
        {"type": "message_start", "message": {"id": "msg_2", "model": "claude-y", "usage": {"input_tokens": 1}}},
        {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
        {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "hi"}},
        {"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 1}},
        {"type": "message_stop"},
    ]
    answer = anthropic_adapter._read_stream(events)
    assert (answer.text, answer.response_model, answer.response_id) == ("hi", "claude-y", "msg_2")
