"""Canonical JSON and digests: the one place that decides how bytes are hashed.

Sorted keys, no whitespace, UTF-8, no NaN: the same value always gives the same
bytes, on every machine and after a round trip through the database, so a hash
computed today can be recomputed by an auditor years later.
"""

from __future__ import annotations

import hashlib
import json
from datetime import UTC, datetime
from typing import Any

GENESIS_HASH = "0" * 64


def canonical_json(value: Any) -> str:
    """Serialize `value` deterministically; raises ValueError on NaN/Infinity and TypeError on non-JSON types."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def sha256_hex(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def utc(at: datetime) -> datetime:
    """Normalise a timestamp to aware UTC (SQLite hands back naive values that are UTC by construction)."""
    if at.tzinfo is None:
        return at.replace(tzinfo=UTC)
    return at.astimezone(UTC)


def format_instant(at: datetime) -> str:
    """The one textual form of an instant that enters a hash: UTC, microseconds, trailing Z."""
    return utc(at).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def parse_instant(text: str) -> datetime:
    """The inverse of `format_instant` (and any ISO 8601 text a driver returns), as aware UTC."""
    return utc(datetime.fromisoformat(text.replace("Z", "+00:00")))


def now() -> datetime:
    return datetime.now(UTC)
