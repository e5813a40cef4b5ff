"""Canonical JSON and digests: the one place that decides how bytes are hashed.

Sorted keys, no whitespace, UTF-8, no NaN: the same value always gives the same
bytes, on every machine and after a round trip through the database, so a hash
computed today can be recomputed by an auditor years later.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from datetime import UTC, date, datetime
from json.encoder import c_make_encoder, encode_basestring  # type: ignore[attr-defined]
from typing import Any

GENESIS_HASH = "0" * 64

#: Built once: `json.dumps` with these arguments builds the same encoder on every call, which costs more
#: than encoding an event body, and replay hashes hundreds of thousands of them. The C encoder is the one
#: `json.dumps` itself runs; without a cycle check (event data comes from JSON, it has no cycles) it can be
#: shared by every thread.
_CANONICAL = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
_C_ENCODER = (
    c_make_encoder(None, _CANONICAL.default, encode_basestring, None, ":", ",", True, False, False)
    if c_make_encoder is not None
    else None
)


def canonical_json(value: Any) -> str:
    """Serialize `value` deterministically; raises ValueError on NaN/Infinity and TypeError on non-JSON types."""
    if _C_ENCODER is not None:
        return "".join(_C_ENCODER(value, 0))
    return _CANONICAL.encode(value)


#: A string as `canonical_json` writes it (quoted, escaped, non-ASCII kept): the encoder's own function.
json_string: Callable[[str], str] = encode_basestring


def sha256_hex(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def utc(at: datetime) -> datetime:
    """Normalise a timestamp to aware UTC (SQLite hands back naive values that are UTC by construction)."""
    if at.tzinfo is UTC:
        return at
    if at.tzinfo is None:
        return at.replace(tzinfo=UTC)
    return at.astimezone(UTC)


def format_instant(at: datetime) -> str:
    """The one textual form of an instant that enters a hash: UTC, microseconds, trailing Z.

    That is `strftime("%Y-%m-%dT%H:%M:%S.%fZ")`. Replay formats the time of every event
    it hashes, and `strftime` or an aware `isoformat` costs more than the rest of the
    hash; so the date part is formatted once per day (from year 1000 on `date.isoformat`
    writes the same characters; before it, glibc's `%Y` does not pad to four digits).
    A property test holds the two equal.
    """
    if at.tzinfo is not UTC:
        at = utc(at)
    if at.year < 1000:
        return at.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    day = at.date()
    prefix = _DAYS.get(day)
    if prefix is None:
        if len(_DAYS) >= 4096:
            _DAYS.clear()
        prefix = _DAYS[day] = day.isoformat() + "T"
    # Padded from a table and a seventh digit cut off: `%02d`-style formatting costs twice as much.
    return f"{prefix}{_TWO[at.hour]}:{_TWO[at.minute]}:{_TWO[at.second]}.{str(1_000_000 + at.microsecond)[1:]}Z"


#: `format_instant`'s date prefixes: a replay of years of logs meets a few thousand days.
_DAYS: dict[date, str] = {}
_TWO = [f"{n:02d}" for n in range(60)]


def parse_instant(text: str) -> datetime:
    """The inverse of `format_instant` (and any ISO 8601 text a driver returns), as aware UTC."""
    return utc(datetime.fromisoformat(text.replace("Z", "+00:00")))


def now() -> datetime:
    return datetime.now(UTC)
