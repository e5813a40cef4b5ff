"""Text that came from outside (a model, a tool) as the log keeps it, and names a person mistyped."""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable

#: What the log keeps of a model's text: enough to audit, bounded whatever the model sends.
MAX_RECORDED_TEXT = 4000
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")


def clean(text: str, limit: int = MAX_RECORDED_TEXT) -> str:
    """Control characters removed, length capped (with a visible marker)."""
    text = _CONTROL.sub("", text)
    return text if len(text) <= limit else text[:limit] + "…[cut]"


def closest(name: str, known: Iterable[str], cutoff: float = 0.6) -> str | None:
    """The known name `name` is most likely a slip for (None: none is close enough): what "did you mean" says."""
    found = difflib.get_close_matches(name, list(known), n=1, cutoff=cutoff)
    return found[0] if found else None
