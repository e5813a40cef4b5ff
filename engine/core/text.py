"""Text that came from outside (a model, a tool) as the log keeps it."""

from __future__ import annotations

import re

#: What the log keeps of a model's text: enough to audit, bounded whatever the model sends.
MAX_RECORDED_TEXT = 4000
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")


def clean(text: str, limit: int = MAX_RECORDED_TEXT) -> str:
    """Control characters removed, length capped (with a visible marker)."""
    text = _CONTROL.sub("", text)
    return text if len(text) <= limit else text[:limit] + "…[cut]"
