"""The worker's hand-off of blocking work to threads (`engine.runtime.offload.Threads`), as the worker relies on it:
every call's result or exception comes back to the coroutine that asked, with the caller's context (the lease's
fencing token rides on a context variable); never more threads than asked for, whatever the number of tasks in
hand (each store thread holds a database connection); a coroutine that stops waiting leaves the others
unharmed; closing waits for the work running and refuses new work."""

from __future__ import annotations

import asyncio
import contextvars
import threading
import time

import pytest

from engine.runtime.offload import Threads

LEASE: contextvars.ContextVar[str] = contextvars.ContextVar("lease", default="none")


def test_results_exceptions_and_context_come_back_to_each_caller() -> None:
    async def main() -> None:
        io = Threads(3, 2, "t")

        async def one(i: int) -> tuple[int, str, str]:
            LEASE.set(f"epoch-{i}")
            value = await io.store(lambda: i * 2)
            seen = await io.store(LEASE.get)
            where = await io.wait(lambda: threading.current_thread().name)
            return value, seen, where

        try:
            results = await asyncio.gather(*(one(i) for i in range(500)))
            assert [r[0] for r in results] == [i * 2 for i in range(500)]
            assert [r[1] for r in results] == [f"epoch-{i}" for i in range(500)]
            assert all(r[2].startswith("t-wait") for r in results)

            def boom() -> None:
                raise KeyError("gone")

            with pytest.raises(KeyError, match="gone"):
                await io.store(boom)
            assert await io.store(lambda: "still serving") == "still serving"
        finally:
            io.close()

    asyncio.run(main())


def test_never_more_threads_than_asked_for() -> None:
    names: set[str] = set()
    running = 0
    most = 0
    lock = threading.Lock()

    def work() -> None:
        nonlocal running, most
        with lock:
            running += 1
            most = max(most, running)
            names.add(threading.current_thread().name)
        time.sleep(0.002)
        with lock:
            running -= 1

    async def main() -> None:
        io = Threads(4, 2, "t")
        try:
            await asyncio.gather(*(io.store(work) for _ in range(400)))
        finally:
            io.close()

    asyncio.run(main())
    assert most == 4
    assert len(names) == 4


def test_a_claim_is_not_queued_behind_store_work() -> None:
    """A burst of appends fills the store threads; the claim that refills the slots they free runs at once, on a
    thread of its own."""
    release = threading.Event()

    def append() -> str:
        release.wait(10)
        return "appended"

    async def main() -> tuple[str, bool, list[str]]:
        io = Threads(2, 2, "w")
        try:
            appends = [asyncio.ensure_future(io.store(append)) for _ in range(20)]
            claimed = await asyncio.wait_for(io.claim(lambda: threading.current_thread().name), 5)
            waiting = not any(a.done() for a in appends)
            release.set()
            return claimed, waiting, await asyncio.gather(*appends)
        finally:
            release.set()
            io.close()

    claimed, appends_waiting, appended = asyncio.run(main())
    assert claimed == "w-claims-0" and appends_waiting
    assert appended == ["appended"] * 20


def test_a_caller_that_stops_waiting_does_not_disturb_the_others() -> None:
    started, release = threading.Event(), threading.Event()
    finished: list[str] = []

    def slow() -> str:
        started.set()
        release.wait(5)
        finished.append("slow")
        return "slow"

    async def main() -> None:
        io = Threads(2, 1, "t")
        try:
            waiting = asyncio.create_task(io.store(slow))
            await asyncio.to_thread(started.wait, 5)
            waiting.cancel()
            with pytest.raises(asyncio.CancelledError):
                await waiting
            release.set()
            assert await io.store(lambda: "next") == "next"
        finally:
            io.close()

    asyncio.run(main())
    assert finished == ["slow"]  # the call itself ran to its end, as a thread's work does


def test_close_waits_for_running_work_and_refuses_new_work() -> None:
    done: list[int] = []

    def slow() -> None:
        time.sleep(0.2)
        done.append(1)

    async def main() -> None:
        io = Threads(2, 1, "t")
        task = asyncio.create_task(io.store(slow))
        await asyncio.sleep(0.05)
        await asyncio.to_thread(io.close)
        assert done == [1]
        await task
        with pytest.raises(RuntimeError):
            await io.store(lambda: None)

    asyncio.run(main())


def test_a_result_the_loop_cannot_take_does_not_strand_the_others_settled_with_it() -> None:
    """A call that raises StopIteration (next() on an exhausted iterator in a synchronous adapter) cannot have its
    exception set on an asyncio future. Its result arrives in the same batch as another call's: that one must still
    be delivered, and the caller of the bad one gets an error rather than waiting for ever (attacker review)."""
    gate = threading.Event()

    def bad() -> None:
        gate.wait(5)
        raise StopIteration

    def good() -> str:
        gate.wait(5)
        time.sleep(0.01)
        return "ok"

    async def main() -> None:
        io = Threads(2, 2, "t")
        try:
            failing, working = asyncio.ensure_future(io.wait(bad)), asyncio.ensure_future(io.wait(good))
            await asyncio.sleep(0.05)
            gate.set()
            time.sleep(0.2)  # the loop is busy: both results arrive before the one settle that takes them
            assert await asyncio.wait_for(working, 3) == "ok"
            with pytest.raises(RuntimeError, match="StopIteration"):
                await asyncio.wait_for(failing, 3)
        finally:
            io.close()

    asyncio.run(main())


def test_a_queued_call_whose_caller_stopped_waiting_is_not_run() -> None:
    """As with run_in_executor: a call not yet started when its caller is cancelled never runs (it may be a write
    whose caller was told it did not happen)."""
    ran: list[str] = []

    async def main() -> None:
        io = Threads(1, 1, "t")
        try:
            first = asyncio.ensure_future(io.store(lambda: time.sleep(0.3)))
            await asyncio.sleep(0.01)
            second = asyncio.ensure_future(io.store(lambda: ran.append("second")))
            await asyncio.sleep(0.01)
            second.cancel()
            await first
            assert await io.store(lambda: "after") == "after"  # the thread goes on serving
        finally:
            io.close()

    asyncio.run(main())
    assert ran == []
