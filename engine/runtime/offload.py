"""Where a step's blocking work runs, so that a step can be one coroutine for every caller.

A step (`Engine.drive`, `AgentRunner.step`) is a coroutine: the model call is awaited, so a worker holds
thousands of calls on one event loop instead of one operating-system thread each (issue #18: threads capped a
worker at about 600 calls in flight and cost 1 MB each). Everything else a step does goes through synchronous
libraries and user code (the store's SQLAlchemy reads and appends, a tool's function, a model adapter written
without `async`) and is handed to an `Offload`:

- `INLINE` for `Engine.run`, `Engine.step` and the CLI: the caller waits for the step anyway and nothing else
  shares its loop, so running the work in place is both correct and cheapest.
- `Threads` for a worker: store work on a few threads (as many as the connections it should hold, so a worker's
  PostgreSQL connections stay bounded however many tasks it has in hand), and work that waits on something
  slow (a tool, a synchronous adapter) on threads of their own, so a slow tool never delays an append.

Both carry the caller's context into the thread: the lease's fencing token (`engine.runtime.leases`) and the
current trace span are context variables.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import contextvars
import queue
import threading
import weakref
from collections.abc import Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Protocol, TypeVar

from engine.providers.loops import close_loop_clients

T = TypeVar("T")


class Offload(Protocol):
    """How a coroutine runs a blocking function: `store` for database work, `wait` for slow calls."""

    async def store(self, fn: Callable[[], T]) -> T: ...

    async def wait(self, fn: Callable[[], T]) -> T: ...


class Inline:
    """Store work in place, for a caller that is waiting for this one step anyway; slow work on a thread, since
    it is user code (a tool, a synchronous adapter) that may run an event loop of its own (`asyncio.run`), which
    it cannot do on the thread whose loop is running the step."""

    async def store(self, fn: Callable[[], T]) -> T:
        return fn()

    async def wait(self, fn: Callable[[], T]) -> T:
        return await asyncio.to_thread(fn)  # the context (lease, span) goes along


INLINE = Inline()


class Threads:
    """Bounded thread pools for a worker's event loop: `store_threads` for the database, `wait_threads` for
    slow calls. Threads are started on demand, so an idle pool costs nothing."""

    def __init__(self, store_threads: int, wait_threads: int, name: str) -> None:
        self._store = _Pool(max(1, store_threads), f"{name}-store")
        self._wait = _Pool(max(1, wait_threads), f"{name}-wait")
        self._claims = _Pool(1, f"{name}-claims")

    async def store(self, fn: Callable[[], T]) -> T:
        return await self._store.run(fn)

    async def claim(self, fn: Callable[[], T]) -> T:
        """A worker's claims, on a thread (and a connection) of their own: not queued behind the appends of a
        burst of answers, whose tasks' slots they fill."""
        return await self._claims.run(fn)

    async def wait(self, fn: Callable[[], T]) -> T:
        return await self._wait.run(fn)

    def close(self) -> None:
        """Wait for what is running; nothing new is accepted."""
        self._store.close()
        self._wait.close()
        self._claims.close()


class _Pool:
    """Threads taking blocking calls from one queue and handing each result back to the loop that asked.

    Not `loop.run_in_executor`: a worker makes three or four of these hand-offs per model turn, and each through
    a `ThreadPoolExecutor` cost about 140 us of CPU when the loop was otherwise idle (a `concurrent.futures.Future`
    with its condition, `wrap_future` chaining a second future to it, a wake-up of the loop per result). Here a
    call is one queue entry and one asyncio future, and results that finish while the loop is busy are handed
    back together with a single wake-up (`_Returns`)."""

    def __init__(self, size: int, name: str) -> None:
        self._size, self._name = size, name
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._idle = 0
        self._lock = threading.Lock()
        self._closed = False
        self._returns: _Returns | None = None  # for the loop that uses the pool (a worker's one loop)

    async def run(self, fn: Callable[[], T]) -> T:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        context = contextvars.copy_context()  # the lease and the span go with the work
        with self._lock:
            if self._closed:
                raise RuntimeError("cannot schedule new work after the worker's threads were closed")
            if self._idle == 0 and len(self._threads) < self._size:
                thread = threading.Thread(target=self._serve, name=f"{self._name}-{len(self._threads)}", daemon=True)
                self._threads.append(thread)
                thread.start()
            elif self._idle:  # an idle thread takes it
                self._idle -= 1
        returns = self._returns
        if returns is None or returns.loop is not loop:
            returns = self._returns = _Returns(loop)
        self._jobs.put((returns, future, context, fn))
        return await future

    def _serve(self) -> None:
        while (job := self._jobs.get()) is not None:
            returns, future, context, fn = job
            if not future.cancelled():  # a caller that stopped waiting before it started: not run (a write, maybe)
                try:
                    returns.put(future, context.run(fn), None)
                except BaseException as error:  # handed to the awaiting coroutine, as run_in_executor does
                    returns.put(future, None, error)
            with self._lock:
                self._idle += 1

    def close(self) -> None:
        with self._lock:
            self._closed = True
            threads = list(self._threads)
        for _ in threads:
            self._jobs.put(None)
        for thread in threads:
            thread.join()


_Job = tuple["_Returns", "asyncio.Future[Any]", contextvars.Context, Callable[[], Any]]


class _Returns:
    """Results on their way back to one loop: the threads append, and one callback on the loop settles all that
    arrived, so a burst of results costs one wake-up of the loop instead of one each."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self._done: collections.deque[tuple[asyncio.Future[Any], Any, BaseException | None]] = collections.deque()
        self._scheduled = False

    def put(self, future: asyncio.Future[Any], result: Any, error: BaseException | None) -> None:
        self._done.append((future, result, error))
        if not self._scheduled:  # a settle that is already scheduled clears the flag before it takes what is here
            self._scheduled = True
            with contextlib.suppress(RuntimeError):  # the loop is closed: nobody is waiting any more
                self.loop.call_soon_threadsafe(self._settle)

    def _settle(self) -> None:
        self._scheduled = False
        done = self._done
        while done:
            future, result, error = done.popleft()
            if future.cancelled():  # the coroutine stopped waiting; the call itself ran to its end
                continue
            try:
                if error is None:
                    future.set_result(result)
                else:
                    future.set_exception(error)
            except (TypeError, RuntimeError) as refused:  # StopIteration cannot be set on a future: say why, go on
                future.set_exception(RuntimeError(f"the call raised {type(error).__name__}: {refused}"))


def run_sync(coroutine: Coroutine[Any, Any, T], *, serving: bool = False) -> T:
    """The coroutine's result for a synchronous caller (`Engine.run` from plain code).

    Each thread keeps one event loop for its synchronous calls, so the model clients opened on it (an SDK
    client's TLS context and its open connections, or a custom adapter's own client) serve every later call
    of that thread instead of being built again each time; the loop and its clients are closed when the thread
    ends, or at exit. The caller's context variables (a lease, a trace span) go with each call.

    A call (`serving=False`) runs on the loop directly: `asyncio.Runner.run` installs and removes a SIGINT
    handler around every call, and `signal.signal` formats the handler it replaces (a partial holding the
    task, so the task's whole repr), which was a sixth of a step's CPU. Ctrl-C during a call raises
    KeyboardInterrupt, as in any synchronous call, once the step has been cancelled and its cleanups have run.
    A worker (`serving=True`) runs under `Runner.run`: there the first Ctrl-C only cancels the loop's main task,
    which the worker turns into a drain (finish the steps in hand, hand the tasks back), and only a second one
    interrupts; the cost is paid once per worker, not per step.

    Called from inside a running loop (a notebook, an async application calling the synchronous API), it runs
    on a thread of its own rather than fail: the caller's loop is blocked for the step, as any blocking call is.
    """
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        runner = _thread_loop()
        context = contextvars.copy_context()
        if serving:
            return runner.run(coroutine, context=context)
        return _call(runner.get_loop(), coroutine, context)
    context = contextvars.copy_context()
    with ThreadPoolExecutor(1, thread_name_prefix="railyard-sync") as pool:
        return pool.submit(context.run, asyncio.run, _closing(coroutine)).result()


def _call(loop: asyncio.AbstractEventLoop, coroutine: Coroutine[Any, Any, T], context: contextvars.Context) -> T:
    task = loop.create_task(coroutine, context=context)
    try:
        return loop.run_until_complete(task)
    except KeyboardInterrupt:
        if not task.done():  # interrupted while the loop waited: let the step unwind (finally blocks, releases)
            task.cancel()
            with contextlib.suppress(BaseException):
                loop.run_until_complete(task)
        raise


class _ThreadLoop(threading.local):
    runner: asyncio.Runner | None = None


_loops = _ThreadLoop()


def _thread_loop() -> asyncio.Runner:
    runner = _loops.runner
    if runner is None:
        runner = _loops.runner = asyncio.Runner()
        # Closed (its clients first) when the thread ends and its locals go, or at exit for the threads left.
        holder = _Holder(runner)
        _loops.holder = holder
        weakref.finalize(holder, _close, runner)
    return runner


class _Holder:
    """Dies with its thread's locals, taking the thread's loop with it (`weakref.finalize`)."""

    def __init__(self, runner: asyncio.Runner) -> None:
        self.runner = runner


def _close(runner: asyncio.Runner) -> None:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        with contextlib.suppress(Exception):  # at exit or in a finaliser nothing must raise
            runner.run(close_loop_clients())
    with contextlib.suppress(Exception):
        runner.close()


async def _closing(coroutine: Coroutine[Any, Any, T]) -> T:
    try:
        return await coroutine
    finally:
        await close_loop_clients()
