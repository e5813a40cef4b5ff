"""SDK clients per event loop: an async client's connections belong to the loop that opened them.

A worker keeps one loop for its life and one client per adapter on it, closed when it stops; `Engine.run`
from synchronous code runs on its thread's loop (`engine.runtime.offload.run_sync`), whose clients serve every
call of that thread and are closed with it (`close_loop_clients`), so no connection outlives its loop and none
is reused from a closed one.
"""

from __future__ import annotations

import asyncio
import contextlib
import weakref
from collections.abc import Awaitable, Callable
from typing import Any, Generic, Protocol, TypeVar


class _Closable(Protocol):
    def close(self) -> Awaitable[None]: ...


C = TypeVar("C", bound=_Closable)

#: The clients opened on each loop, with the `Clients` that handed them out (which forget them when closed).
_opened: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, list[tuple[Clients[Any], _Closable]]] = (
    weakref.WeakKeyDictionary()
)


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
            _opened.setdefault(loop, []).append((self, client))
        return client

    def _forget(self, loop: asyncio.AbstractEventLoop) -> None:
        self._by_loop.pop(loop, None)


async def close_loop_clients() -> None:
    """Close the clients opened on the running loop (before it closes, or when a worker stops); a later call on
    the same loop opens a new one."""
    loop = asyncio.get_running_loop()
    for owner, client in _opened.pop(loop, []):
        owner._forget(loop)
        with contextlib.suppress(Exception):  # a client that fails to close must not hide the step's own result
            await client.close()
