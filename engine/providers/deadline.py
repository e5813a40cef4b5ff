"""A call's overall deadline: the SDKs' timeout bounds each connect and each read, not the call.

A provider, or a gateway in front of it, that sends something just inside every read timeout would otherwise
hold a call open for as long as it keeps doing so: a stream's chunks, a stream's keep-alives (SSE comments on the
OpenAI wire, `ping` events on the Anthropic one, which the SDKs read and never hand over), or the bytes of a
non-streamed body. Each adapter runs the whole attempt, sending and reading, inside `bounded`: at the deadline
the attempt is cancelled where it waits and is `PROVIDER_TIMEOUT`, retried like any timeout. An adapter built
with the SDK's own retries (`max_retries`, from Python only; the engine's retries are the default) has no overall
deadline: the SDK waits between its attempts as long as a provider's `retry-after` says (the Anthropic SDK without
a cap), so only the SDK's per-read timeouts bound it, and a deadline would report a 429 as a timeout. Checking the
clock at each chunk instead (as the adapters did while they were synchronous) missed the keep-alives: a 1 s
call lasted 31 s.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from engine.core.errors import Code
from engine.core.model_errors import ModelError


@asynccontextmanager
async def bounded(seconds: float | None) -> AsyncIterator[None]:
    """Cut what runs inside after `seconds` (None: never): `PROVIDER_TIMEOUT`."""
    try:
        async with asyncio.timeout(seconds):
            yield
    except TimeoutError:
        raise ModelError(Code.PROVIDER_TIMEOUT, f"no complete answer within the call's {seconds:g} s") from None
