"""SDK clients per event loop: an async client's connections belong to the loop that opened them.

A worker keeps one loop for its life and one client per adapter on it; `Engine.run` from synchronous code
runs each call on a loop of its own (`engine.runtime.offload.run_sync`), which closes the clients opened on it
when it ends (`close_loop_clients`), so no connection outlives its loop and none is reused from a closed one.
"""

from __future__ import annotations

import asyncio
import contextlib
import weakref
from collections.abc import Awaitable, Callable
from typing import Generic, Protocol, TypeVar


class _Closable(Protocol):
    def close(self) -> Awaitable[None]: ...


C = TypeVar("C", bound=_Closable)

_opened: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, list[_Closable]] = weakref.WeakKeyDictionary()


class Clients(Generic[C]):
    """One adapter's SDK client on each event loop, opened with `make` on the loop's first call."""

    def __init__(self, make: Callable[[], C]) -> None:
        self._make = make
        self._by_loop: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, C] = weakref.WeakKeyDictionary()

    def here(self) -> C:
        """The client for the running loop."""
        loop = asyncio.get_running_loop()
        client = self._by_loop.get(loop)
        if client is None:
            client = self._by_loop[loop] = self._make()
            _opened.setdefault(loop, []).append(client)
        return client


async def close_loop_clients() -> None:
    """Close the clients opened on the running loop (before it closes)."""
    for client in _opened.pop(asyncio.get_running_loop(), []):
        with contextlib.suppress(Exception):  # a client that fails to close must not hide the step's own result
            await client.close()
