"""An overall deadline for a streamed call: the SDKs' timeout bounds each read, not the call.

A stream that sends a chunk just before every read timeout would otherwise hold
a call open for as long as it trickles. The adapters read their streams through
`within`, which gives up (`PROVIDER_TIMEOUT`, retried like any timeout) at the
first chunk that arrives after the deadline; a read that waits for a chunk is
itself cut by the SDK's read timeout, so an attempt lasts under twice the
timeout, whatever the stream does.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterable, AsyncIterator
from typing import TypeVar

from engine.core.errors import Code
from engine.core.model_errors import ModelError

T = TypeVar("T")


def deadline(seconds: float) -> float:
    """The `time.monotonic()` by which a call sent now must have ended."""
    return time.monotonic() + seconds


async def within(items: AsyncIterable[T], until: float) -> AsyncIterator[T]:
    """`items` as they arrive, until `until` (a `deadline`) has passed; then `PROVIDER_TIMEOUT`."""
    async for item in items:
        if time.monotonic() > until:
            raise ModelError(Code.PROVIDER_TIMEOUT, "the stream was still arriving at the call's deadline")
        yield item
