"""What the fake systems answer when they refuse: a remote's own errors, not the engine's.

The workflows' tool adapters decide what each means to the engine (a clear
refusal is `ToolFailed`; anything else from a write stays uncertain).
"""

from __future__ import annotations


class Declined(Exception):
    """The remote refused the request and did nothing; `code` says why in one word, for books and tests."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class NotFound(Declined):
    """The thing asked for does not exist."""

    def __init__(self, what: str) -> None:
        super().__init__("not_found", f"no {what}")
