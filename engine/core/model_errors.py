"""Provider errors: every failure of a model call becomes one closed code.

Nothing is swallowed: an HTTP error, an error event inside a 200 stream, a
timeout, a refusal by the content filter all raise `ModelError` with a code.

The code is chosen from what the provider says in fields (the HTTP status, the
error's `type`, `code` and `param`) and from what the request carried, through
one table, `ERROR_TABLE`; never from the message. Messages are prose: the same
failure is worded differently by every gateway, and wording matched by keyword
once turned a `server_error` that said "upstream overloaded" into a retried
`RATE_LIMITED`. The message is still kept, redacted and cut to 200 characters,
for the server log; it never reaches the public log, nor does the request body.
`docs/errors.md` prints the table from this module.
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Any, Literal

from engine.core.errors import Category, Code
from engine.core.model_interface import ModelRequest, Usage
from engine.core.text import clean

log = logging.getLogger("railyard.model")

#: Codes a provider call can fail with.
PROVIDER_CODES = frozenset(code for code in Code if code.category is Category.PROVIDER)
#: Retried with backoff inside a bounded budget; they never spend repairs. A `PROVIDER_ERROR` is retried too when it
#: is `transient`: a server error (5xx) or a connection that failed or was cut.
RETRYABLE = frozenset({Code.RATE_LIMITED, Code.PROVIDER_TIMEOUT})
#: An error object's `type` (or Google's `status`) that says the server failed, whatever the HTTP status.
SERVER_FAILURE_TYPES = frozenset(
    {"server_error", "api_error", "internal_error", "service_unavailable", "INTERNAL", "UNAVAILABLE"}
)
#: The request's shape was refused: move one rung down the forcing ladder, never re-send it unchanged.
REQUEST_SHAPE = frozenset({Code.TOOL_CHOICE_UNSUPPORTED, Code.SCHEMA_UNSUPPORTED})
#: What the server log keeps of a provider's message.
RAW_LIMIT = 200

# Credentials a provider may echo in its message ("Incorrect API key provided: sk-...").
_SECRET = re.compile(r"(?i)\b(?:sk-[\w-]{6,}|AIza[\w-]{20,}|bearer\s+[\w.~+/=-]{8,}|(?:api[_-]?key|token)=[^\s&]+)")


def redact(text: str) -> str:
    """`text` without control characters, key-like strings masked, cut to `RAW_LIMIT` characters."""
    return _SECRET.sub("[redacted]", clean(text, 10 * RAW_LIMIT))[:RAW_LIMIT]


def error_message(body: object, fallback: str) -> str:
    """The provider's own error message (`error.message`), for people: never the request, never a code's reason."""
    if isinstance(body, dict):
        inner = body.get("error", body)
        if isinstance(inner, dict) and isinstance(inner.get("message"), str) and inner["message"]:
            return str(inner["message"])
        if isinstance(inner, str) and inner:
            return inner
    if isinstance(body, str) and body:
        return body
    return fallback


class ModelError(Exception):
    """A failed model call with its closed code. `raw` is for the server log only."""

    def __init__(
        self,
        code: Code,
        raw: str = "",
        *,
        status: int | None = None,
        named: bool = True,
        usage: Usage | None = None,
        transient: bool = False,
    ) -> None:
        if code not in PROVIDER_CODES:
            raise ValueError(f"{code} is not a provider code")
        super().__init__(f"{code}")
        self.code = code
        self.status = status
        self.raw = redact(raw)
        #: For a request-shape code: whether the error's own fields named the shape (`param: tool_choice`), or
        #: only the request's contents made it one (see `classify`). Only a named refusal is shared process-wide.
        self.named = named
        #: What the provider reported spending on an answer that arrived and still failed (truncated, filtered,
        #: empty): token budgets count it.
        self.usage = usage
        #: For `PROVIDER_ERROR`: whether the failure was the server's or the connection's (a 5xx, a refused or
        #: dropped connection, a stream cut short), which calling again may fix, rather than the request's.
        self.transient = transient
        #: How long the provider asked to be left alone before the next call (`retry_after`), in seconds.
        self.retry_after: float | None = None
        #: Set by the runner: the errors of the calls before this one, each retried (`provider_said`, `waited`).
        self.retried: list[dict[str, Any]] = []
        #: Set by the runner that made the calls: how many it made, and the seconds they took, backoff included.
        self.attempts = 1
        self.seconds = 0.0
        log.warning("model error %s (status %s): %s", code, status, self.raw)

    @property
    def retryable(self) -> bool:
        """Whether calling again may succeed: a rate limit, a timeout, or a transient `PROVIDER_ERROR`. Never a
        refused request, refused credentials, a filtered or truncated answer: calling again gets the same."""
        return self.code in RETRYABLE or (self.code is Code.PROVIDER_ERROR and self.transient)


@dataclass(frozen=True, slots=True)
class ErrorFields:
    """What a provider says about a failure apart from its prose.

    `status` is the HTTP status (200 for an error object inside a 200 body or
    stream); `type`, `code` and `param` are the error object's own fields, as
    OpenAI-compatible servers (`{"error": {"type", "code", "param"}}`) and
    Anthropic (`{"type": "error", "error": {"type"}}`) send them.
    """

    status: int | None = None
    type: str | None = None
    code: str | None = None
    param: str | None = None

    @classmethod
    def of(cls, body: object, status: int | None = None) -> ErrorFields:
        """The fields of an error body (`{"error": {...}}`, or the error object itself); absent ones are None."""
        inner = body.get("error", body) if isinstance(body, dict) else None
        if not isinstance(inner, dict):
            return cls(status)

        def text(key: str) -> str | None:
            value = inner.get(key)
            return str(value) if isinstance(value, str | int) and not isinstance(value, bool) and value != "" else None

        # Google's errors (Gemini's OpenAI-compatible endpoint) name their kind in `status` (`RESOURCE_EXHAUSTED`).
        google = inner.get("status")
        kind = text("type") or (google if isinstance(google, str) and google else None)
        return cls(status, kind, text("code"), text("param"))

    def effective_status(self) -> int | None:
        """The HTTP status, or for an error inside a 200 the status its numeric `code` names (`"code": 502`)."""
        if self.status not in (None, 200):
            return self.status
        if self.code is not None and self.code.isdigit() and 400 <= int(self.code) <= 599:
            return int(self.code)
        return self.status


#: What a request may carry that a provider refuses by its shape (see `refusable`).
Shape = Literal["forced_tool_choice", "response_schema"]
Field = Literal["status", "type", "code", "param", "request"]


@dataclass(frozen=True, slots=True)
class Rule:
    """One row of the table: when `field` has one of `values`, the error is `code`."""

    field: Field
    values: tuple[str, ...]
    code: Code


#: The mapping, in order: the first rule that matches decides; nothing matches: PROVIDER_ERROR.
#: `param` matches on its first segment (`response_format.json_schema` is `response_format`). `request` rules
#: apply to a refused request (status 400 or 422, or type `invalid_request_error` or `INVALID_ARGUMENT`) whose
#: `param` names nothing else: the provider refused this request, and of what it carried only these shapes are optional.
ERROR_TABLE: tuple[Rule, ...] = (
    Rule("status", ("401", "403"), Code.PROVIDER_AUTH),
    Rule(
        "type",
        ("authentication_error", "permission_error", "invalid_api_key", "UNAUTHENTICATED", "PERMISSION_DENIED"),
        Code.PROVIDER_AUTH,
    ),
    Rule("code", ("invalid_api_key", "invalid_authentication", "unauthorized"), Code.PROVIDER_AUTH),
    Rule("status", ("413",), Code.CONTEXT_OVERFLOW),
    Rule("type", ("request_too_large", "context_length_exceeded"), Code.CONTEXT_OVERFLOW),
    Rule("code", ("context_length_exceeded", "string_above_max_length"), Code.CONTEXT_OVERFLOW),
    Rule("code", ("content_filter", "content_policy_violation", "data_inspection_failed"), Code.CONTENT_FILTERED),
    Rule(
        "type",
        ("rate_limit_error", "rate_limit_exceeded", "overloaded_error", "requests", "tokens", "RESOURCE_EXHAUSTED"),
        Code.RATE_LIMITED,
    ),
    Rule("code", ("rate_limit_exceeded", "overloaded"), Code.RATE_LIMITED),
    Rule("type", ("timeout_error", "DEADLINE_EXCEEDED"), Code.PROVIDER_TIMEOUT),
    Rule("param", ("tool_choice",), Code.TOOL_CHOICE_UNSUPPORTED),
    Rule("param", ("response_format", "output_config", "output_format"), Code.SCHEMA_UNSUPPORTED),
    Rule("status", ("429", "529"), Code.RATE_LIMITED),
    Rule("status", ("408", "504"), Code.PROVIDER_TIMEOUT),
    Rule("request", ("forced_tool_choice",), Code.TOOL_CHOICE_UNSUPPORTED),
    Rule("request", ("response_schema",), Code.SCHEMA_UNSUPPORTED),
)

#: The `param` rules: a refusal whose own fields name the shape it refused.
_NAMING_PARAMS = frozenset(
    value for rule in ERROR_TABLE if rule.field == "param" and rule.code in REQUEST_SHAPE for value in rule.values
)


def refusable(request: ModelRequest | None) -> frozenset[Shape]:
    """The shapes in `request` a provider may refuse: a forced tool choice (named or `required`), a native schema."""
    if request is None:
        return frozenset()
    shapes: set[Shape] = set()
    if request.tool_choice not in (None, "auto", "none"):
        shapes.add("forced_tool_choice")
    if request.response_schema is not None:
        shapes.add("response_schema")
    return frozenset(shapes)


def names_shape(fields: ErrorFields) -> bool:
    """Whether the error's own fields name the request shape refused (`param: tool_choice`, `response_format`).

    A refusal found only by a `request` rule (a 400 without `param`: every Anthropic 400) may be about anything
    (a prompt too long, a bad image): it demotes the rung for the task that saw it, whose next turn, sent
    without the shape, is the test; other tasks keep the rung until a named refusal says otherwise.
    """
    return bool(fields.param) and re.split(r"[.\[]", fields.param or "", maxsplit=1)[0] in _NAMING_PARAMS


def failure(
    fields: ErrorFields,
    sent: frozenset[Shape],
    message: str,
    status: int | None = None,
    headers: Mapping[str, str] | None = None,
) -> ModelError:
    """The `ModelError` of an error the provider sent: its code (`classify`), whether it named the shape, and how
    long it asked the caller to wait (its `retry-after-ms` or `retry-after` header)."""
    server = (fields.effective_status() or 0) >= 500 or fields.type in SERVER_FAILURE_TYPES
    error = ModelError(classify(fields, sent), message, status=status, named=names_shape(fields), transient=server)
    error.retry_after = retry_after(headers or {})
    return error


def retry_after(headers: Mapping[str, str], at: datetime | None = None) -> float | None:
    """The seconds a provider asks a client to wait before its next call: `retry-after-ms` (OpenAI's and
    Anthropic's, in milliseconds) first, else `retry-after` in seconds or as an HTTP date; None when neither says
    (or says something that is not a time to come). Header names are matched without regard to case."""
    lowered = {k.lower(): v for k, v in headers.items()}
    for name, scale in (("retry-after-ms", 0.001), ("retry-after", 1.0)):
        raw = (lowered.get(name) or "").strip()
        if not raw:
            continue
        try:
            seconds = float(raw) * scale
        except ValueError:
            if scale != 1.0:
                continue
            try:
                when = parsedate_to_datetime(raw)
            except (TypeError, ValueError, IndexError):
                continue
            if when.tzinfo is None:
                when = when.replace(tzinfo=UTC)
            seconds = (when - (at or datetime.now(UTC))).total_seconds()
        if math.isfinite(seconds) and seconds >= 0:
            return seconds
    return None


def classify(fields: ErrorFields, sent: frozenset[Shape] = frozenset()) -> Code:
    """The code of a provider error, from its fields and the shapes the request carried (`refusable`)."""
    status = fields.effective_status()
    param = re.split(r"[.\[]", fields.param, maxsplit=1)[0] if fields.param else None
    refused_request = status in (400, 422) or fields.type in ("invalid_request_error", "INVALID_ARGUMENT")
    observed = {
        "status": str(status) if status is not None else None,
        "type": fields.type,
        "code": fields.code,
        "param": param,
    }
    for rule in ERROR_TABLE:
        if rule.field == "request":
            if refused_request and param is None and any(shape in sent for shape in rule.values):
                return rule.code
            continue
        if observed[rule.field] in rule.values:
            return rule.code
    return Code.PROVIDER_ERROR


#: What the log keeps of a provider's own words about an error: enough to tell "upstream overloaded" from a quota.
MAX_PROVIDER_MESSAGE = 300


def provider_said(error: ModelError) -> dict[str, Any]:
    """What an event records of a provider's error: its code, its HTTP status, and its message (secrets redacted
    when the error was made, control characters removed, capped), so that `show`, `history` and the task page can
    say why a call failed or was made again, not only its code."""
    said: dict[str, Any] = {"code": str(error.code)}
    if error.status is not None:
        said["status"] = error.status
    if message := clean(error.raw, MAX_PROVIDER_MESSAGE).strip():
        said["message"] = message
    return said
