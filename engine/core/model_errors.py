"""Provider errors: every failure of a model call becomes one closed code.

Nothing is swallowed: an HTTP error, an error event inside a 200 stream, a
timeout, a refusal by the content filter all raise `ModelError` with a code.
Only the code reaches the public log; the raw text goes to the server log,
cut to 200 characters, and never with the request body.
"""

from __future__ import annotations

import logging

from engine.core.errors import Category, Code

log = logging.getLogger("railyard.model")

#: Codes a provider call can fail with.
PROVIDER_CODES = frozenset(code for code in Code if code.category is Category.PROVIDER)
#: Retried with backoff inside a bounded budget; they never spend repairs.
RETRYABLE = frozenset({Code.RATE_LIMITED, Code.PROVIDER_TIMEOUT})
#: The request's shape was refused: move one rung down the forcing ladder, never re-send it unchanged.
REQUEST_SHAPE = frozenset({Code.TOOL_CHOICE_UNSUPPORTED, Code.SCHEMA_UNSUPPORTED})


class ModelError(Exception):
    """A failed model call with its closed code. `raw` is for the server log only."""

    def __init__(self, code: Code, raw: str = "", *, status: int | None = None) -> None:
        if code not in PROVIDER_CODES:
            raise ValueError(f"{code} is not a provider code")
        super().__init__(f"{code}")
        self.code = code
        self.status = status
        self.raw = raw[:200]
        log.warning("model error %s (status %s): %s", code, status, self.raw)

    @property
    def retryable(self) -> bool:
        return self.code in RETRYABLE


def classify(status: int | None, message: str) -> Code:
    """Map an HTTP status and error text to a code: the one mapping every adapter uses."""
    text = message.lower()
    if status in (401, 403) or "api key" in text or "unauthorized" in text:
        return Code.PROVIDER_AUTH
    if status in (429, 529) or "rate limit" in text or "overloaded" in text:
        return Code.RATE_LIMITED
    if status in (408, 504) or "timed out" in text or "timeout" in text:
        return Code.PROVIDER_TIMEOUT
    if "tool_choice" in text or "tool choice" in text or "forces tool use" in text:
        return Code.TOOL_CHOICE_UNSUPPORTED
    if "context length" in text or "context window" in text or "maximum context" in text or "too long" in text:
        return Code.CONTEXT_OVERFLOW
    if any(
        k in text
        for k in (
            "response_format",
            "json_schema",
            "json schema",
            "structured output",
            "output_config",
            "output_format",
            "output format",
        )
    ):
        return Code.SCHEMA_UNSUPPORTED
    if "content filter" in text or "content_filter" in text or "safety" in text:
        return Code.CONTENT_FILTERED
    return Code.PROVIDER_ERROR
