"""The classification of provider errors, as a pure table: fields in, a code out, the message never consulted."""

from __future__ import annotations

from typing import Any

import pytest

from engine import Code
from engine.core.model_errors import (
    ERROR_TABLE,
    ErrorFields,
    ModelError,
    Rule,
    Shape,
    classify,
    failure,
    names_shape,
    redact,
)


def _matching(rule: Rule, value: str) -> tuple[ErrorFields, frozenset[Any]]:
    if rule.field == "request":
        return ErrorFields(400, "invalid_request_error"), frozenset({value})
    if rule.field == "status":
        return ErrorFields(int(value)), frozenset()
    return ErrorFields(None, **{rule.field: value}), frozenset()


@pytest.mark.parametrize("rule", ERROR_TABLE, ids=lambda r: f"{r.field}-{r.code}")
def test_every_row_of_the_table_decides_what_it_says(rule: Rule) -> None:
    # No earlier row shadows a later one: each value, alone, gets its row's code.
    for value in rule.values:
        fields, sent = _matching(rule, value)
        assert classify(fields, sent) is rule.code, (rule, value)


def test_fields_that_match_no_row_are_a_provider_error() -> None:
    assert classify(ErrorFields()) is Code.PROVIDER_ERROR
    assert classify(ErrorFields(500, "server_error", "internal")) is Code.PROVIDER_ERROR
    assert classify(ErrorFields(200, "server_error", "502")) is Code.PROVIDER_ERROR


def test_a_numeric_code_stands_for_the_status_only_inside_a_200() -> None:
    assert classify(ErrorFields(200, "server_error", "429")) is Code.RATE_LIMITED
    assert classify(ErrorFields(None, None, "504")) is Code.PROVIDER_TIMEOUT
    assert classify(ErrorFields(500, "server_error", "429")) is Code.PROVIDER_ERROR  # the HTTP status is the status
    assert classify(ErrorFields(200, None, "8")) is Code.PROVIDER_ERROR  # not an HTTP status


def test_a_refused_request_is_a_refused_shape_only_when_it_carried_one_and_param_names_nothing_else() -> None:
    refused = ErrorFields(400, "invalid_request_error")
    assert classify(refused) is Code.PROVIDER_ERROR
    assert classify(refused, frozenset({"forced_tool_choice"})) is Code.TOOL_CHOICE_UNSUPPORTED
    assert classify(refused, frozenset({"response_schema"})) is Code.SCHEMA_UNSUPPORTED
    named = ErrorFields(400, "invalid_request_error", param="messages[1].content")
    assert classify(named, frozenset({"forced_tool_choice"})) is Code.PROVIDER_ERROR
    assert classify(ErrorFields(400, param="response_format.json_schema.strict")) is Code.SCHEMA_UNSUPPORTED
    # A server error is not a refusal of the request, whatever the request carried.
    assert classify(ErrorFields(500, "api_error"), frozenset({"forced_tool_choice"})) is Code.PROVIDER_ERROR


@pytest.mark.parametrize(
    ("body", "fields"),
    [
        ({"error": {"type": "server_error", "code": 502, "param": None}}, ErrorFields(200, "server_error", "502")),
        ({"type": "error", "error": {"type": "overloaded_error"}}, ErrorFields(200, "overloaded_error")),
        ({"code": 429, "status": "RESOURCE_EXHAUSTED"}, ErrorFields(200, "RESOURCE_EXHAUSTED", "429")),
        ({"error": "upstream overloaded"}, ErrorFields(200)),
        ("<html>502</html>", ErrorFields(200)),
        ([{"error": {"code": 429}}], ErrorFields(200)),
        ({"error": {"type": True, "code": "", "param": ["x"]}}, ErrorFields(200)),
    ],
)
def test_the_fields_are_read_from_any_shape_an_error_body_takes(body: object, fields: ErrorFields) -> None:
    assert ErrorFields.of(body, 200) == fields


def test_the_message_kept_for_people_is_cleaned_masked_and_cut() -> None:
    text = "bad key sk-live-0123456789abcdef\x1b[31m; Bearer abcdefghijklmnop; url?api_key=s3cr3t&x=1 " + "y" * 400
    kept = redact(text)
    assert len(kept) == 200 and "\x1b" not in kept
    assert "sk-live" not in kept and "abcdefghijklmnop" not in kept and "s3cr3t" not in kept
    assert kept.startswith("bad key [redacted][31m; [redacted]; url?[redacted]&x=1 ")
    assert ModelError(Code.PROVIDER_AUTH, text).raw == kept


NAMED = [
    # (the error's fields, whether they name the refused shape themselves)
    (ErrorFields(400, "invalid_request_error", None, "tool_choice"), True),
    (ErrorFields(400, "invalid_request_error", None, "response_format.json_schema"), True),
    (ErrorFields(400, "invalid_request_error", None, "output_config"), True),
    (ErrorFields(400, "invalid_request_error"), False),  # every Anthropic 400: "prompt is too long" included
    (ErrorFields(400, "invalid_request_error", None, "messages[0]"), False),
    (ErrorFields(422, None, None, None), False),
]


@pytest.mark.parametrize(("fields", "named"), NAMED)
def test_only_a_param_that_names_the_shape_makes_a_refusal_every_tasks(fields: ErrorFields, named: bool) -> None:
    """A shape refusal found from the request alone stays the task's (docs/errors.md); one the fields name is shared."""
    forced: frozenset[Shape] = frozenset({"forced_tool_choice"})
    assert names_shape(fields) is named
    error = failure(fields, forced, "message")
    assert error.named is named
    if named or fields.param is None:
        assert error.code in (Code.TOOL_CHOICE_UNSUPPORTED, Code.SCHEMA_UNSUPPORTED)
