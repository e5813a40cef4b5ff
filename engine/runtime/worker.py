"""Workers: claim due tasks with a lease, advance each until it blocks or ends, release it.

One event loop, not a thread per task: a task in hand is a coroutine (`Engine.drive`, the code `Engine.run`
runs), its model calls are awaited, and the synchronous work around them goes to bounded thread pools
(`engine.runtime.offload.Threads`): the store's reads and appends on `store_threads` threads (so a worker
holds a bounded number of database connections however many tasks it has in hand), its claims on one thread
of their own (never queued behind a burst of appends), tool steps and synchronous model adapters on threads
of their own. So the number of model calls in flight is bounded by
`concurrency`, not by the operating system's threads (issue #18: a thread a task capped one process at about
600 calls and cost 1 MB each).

A worker keeps `concurrency` tasks in hand and claims another as soon as one is released, so one slow task
never holds up the others. Each held task carries its lease as a fencing token to every append
(`engine.runtime.leases`, a context variable that goes with the work to the threads); one heartbeat thread
extends all of the worker's leases while long steps run, and no database transaction is open across a model
or tool call. A task whose lease expired (its worker died) is claimed again by another worker and resumed
from its log; a write tool's stranded intent is reconciled, never re-sent.

Idle workers wake on the store's notifications where it sends them
(`Store.supports_notify`: PostgreSQL's, `engine.store.wakeups`) and poll as a
fallback. A stopping worker claims nothing more and hands each task
back between two steps.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from functools import partial
from typing import Any

from engine.core.canonical import now
from engine.core.definition import EXPIRED, LIMIT, Child, StateKind
from engine.core.errors import Code, ConcurrencyConflict, LeaseLost, RailyardError, Refused
from engine.core.model_interface import ModelAdapter
from engine.core.payloads import EventData
from engine.core.profiles import load_profiles
from engine.core.rows import Claim, WorkerReport
from engine.core.task import Status, TaskState
from engine.observability import hooks
from engine.providers.loops import close_loop_clients
from engine.runtime import config
from engine.runtime.engine import Engine
from engine.runtime.flow import FlowWait, flow_settings
from engine.runtime.leases import Lease, holding
from engine.runtime.offload import Offload, Threads, run_sync
from engine.runtime.tool_runner import AttemptInFlight
from engine.runtime.webhooks import Sender, deadlines_of

log = logging.getLogger("railyard.worker")

COUNTS = ("claimed", "transitions", "released", "handed_back", "conflicts", "lease_losses", "failures", "config_errors")
#: Refusals that say this process cannot run the task (its deployment lacks the version, the model, a tool, a
#: readable setting), not that the task's step failed: the task is left as it is, and its failures are not counted.
CONFIGURATION = frozenset(
    {
        Code.DEFINITION_MISSING,
        Code.DEFINITION_CHANGED,
        Code.MODEL_NOT_CONFIGURED,
        Code.CONFIG_INVALID,
        Code.TOOL_NOT_FOUND,
        # A child state names a workflow (or version) this process does not define.
        Code.WORKFLOW_UNKNOWN,
        Code.VERSION_UNKNOWN,
    }
)


@dataclass
class WorkerCounts:
    """What a worker has done so far: logged, printed at exit and reported to the `workers` table."""

    claimed: int = 0
    transitions: int = 0
    released: int = 0
    handed_back: int = 0
    conflicts: int = 0
    lease_losses: int = 0
    failures: int = 0
    config_errors: int = 0
    #: Milliseconds from "due" to "claimed" for the latest claims (a bounded window, for p50/p99).
    claim_latency_ms: deque[float] = field(default_factory=lambda: deque(maxlen=10_000), repr=False)
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, name: str, n: int = 1) -> None:
        with self.lock:
            setattr(self, name, getattr(self, name) + n)

    def claimed_one(self, latency_ms: float) -> None:
        with self.lock:
            self.claimed += 1
            self.claim_latency_ms.append(max(latency_ms, 0.0))

    def snapshot(self) -> dict[str, Any]:
        with self.lock:
            doc: dict[str, Any] = {name: getattr(self, name) for name in COUNTS}
            latencies = sorted(self.claim_latency_ms)
        doc["claim_latency_p50_ms"] = _quantile(latencies, 0.50)
        doc["claim_latency_p99_ms"] = _quantile(latencies, 0.99)
        return doc


def _quantile(ordered: list[float], q: float) -> float | None:
    if not ordered:
        return None
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 3)


class Worker:
    """One worker process's loop. Share nothing with other workers but the database."""

    def __init__(
        self,
        engine: Engine,
        *,
        name: str | None = None,
        concurrency: int = 4,
        lease_seconds: float = 30.0,
        workflows: Sequence[str] | None = None,
        model: ModelAdapter | None = None,
        thinking: bool = False,
        poll_seconds: float = 1.0,
        max_turns: int = 50,
        retry_backoff: float = 5.0,
        max_failures: int = 5,
        report_seconds: float = 10.0,
        listen: bool = True,
        checkpoint_seconds: float | None = None,
        store_threads: int = 6,
        supervisor: dict[str, Any] | None = None,
        webhooks: bool = True,
    ) -> None:
        self.engine = engine
        self.name = name or f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self.concurrency = concurrency
        self.lease_seconds = lease_seconds
        # By default only the workflows this process defines: a task of another is left to a worker that has it.
        self.workflows = list(workflows) if workflows else sorted({w.name for w in engine.registry})
        self.model = model
        self.thinking = thinking
        self.poll_seconds = poll_seconds
        self.max_turns = max_turns
        self.retry_backoff = retry_backoff
        self.max_failures = max_failures
        self.report_seconds = report_seconds
        self.listen = listen and engine.store.supports_notify
        #: Take a signed checkpoint this often (RAILYARD_SIGNING_KEY, RAILYARD_CHECKPOINT_DIR); None: never.
        self.checkpoint_seconds = checkpoint_seconds
        #: Threads for the store's work (loads, appends, claims, releases): the worker's database connections,
        #: plus its heartbeat's and listener's. Six keep up with about 500 one-turn tasks a second.
        self.store_threads = max(1, min(store_threads, concurrency))
        #: A process of `railyard worker --processes N`: its supervisor's name and pid, its slot and how many times
        #: that slot was started again; reported with its counts, so `railyard status` shows the N as one worker.
        self.supervisor = supervisor
        #: Send the webhook outbox while serving (`engine.runtime.webhooks`); not in `--once` drains.
        self.webhooks = webhooks
        self.counts = WorkerCounts()
        self.started_at = now()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._awake: asyncio.Event | None = None
        self._ticked = time.monotonic()  # when the loop last ran (`_tick`)
        self._stop = threading.Event()
        self._held: set[str] = set()  # the tasks whose leases the heartbeat extends
        self._held_lock = threading.Lock()

    def check_configuration(self) -> None:
        """Refuse to start (MODEL_NOT_CONFIGURED) when the workflows served have agent states and no model is set,
        or (CONFIG_INVALID) when the capability profiles those states need cannot be read.

        Started without a model, a worker would claim agent tasks only to leave them; better that the operator
        hears it before anything is claimed.
        """
        needing = sorted(
            {
                w.ref
                for w in self.engine.registry
                if w.name in self.workflows and any(s.kind is StateKind.AGENT for s in w.states)
            }
        )
        if needing:
            load_profiles()  # an unreadable profiles file (RAILYARD_PROFILES_FILE) is CONFIG_INVALID now, not later
            flow_settings()  # so is a bad quota or breaker setting, there or in the environment
        if self.model is not None or self.engine.model is not None or config.model_spec() is not None:
            return
        if needing:
            raise Refused(
                f"the workflows this worker serves have agent states ({', '.join(needing)}) and no model "
                "is configured: set RAILYARD_MODEL or --model (scripted:PATH, openai:MODEL, "
                "anthropic:MODEL), or serve only other workflows (--workflows)",
                code=Code.MODEL_NOT_CONFIGURED,
                workflows=needing,
            )

    # -- the loop -------------------------------------------------------
    def wake(self) -> None:
        """Look for due tasks now rather than at the next poll (a notification arrived, a slot freed up).

        Safe from any thread: the listener calls it from its own."""
        loop, awake = self._loop, self._awake
        if loop is not None and awake is not None:
            with suppress(RuntimeError):  # the loop just closed: nothing left to wake
                loop.call_soon_threadsafe(awake.set)

    def stop(self) -> None:
        """Stop claiming; the tasks in hand are handed back after their current step."""
        self._stop.set()
        self.wake()

    def run(self, stop: threading.Event | None = None) -> None:
        """Keep `concurrency` tasks in hand until `stop` (or `self.stop()`); then finish the steps in hand."""

        def stopping() -> bool:
            return self._stop.is_set() or (stop is not None and stop.is_set())

        run_sync(self._serve(stopping), serving=True)

    def run_once(self) -> int:
        """Claim up to `concurrency` due tasks and advance them; returns how many were claimed."""
        return run_sync(self._serve(self._stop.is_set, once=True))

    def drain(self, max_tasks: int | None = None) -> int:
        """Advance every task that is due now, `concurrency` at a time, until none is due or in hand (or after
        `max_tasks` claims), then return how many were claimed: `railyard worker --once`, for cron."""
        return run_sync(self._serve(self._stop.is_set, drain=True, max_tasks=max_tasks))

    async def _serve(
        self,
        stopping: Callable[[], bool],
        *,
        once: bool = False,
        drain: bool = False,
        max_tasks: int | None = None,
    ) -> int:
        """The loop: claim into free slots, each claim a coroutine, until `stopping`; then wait for those in hand
        (each is handed back after its current step, since `stopping` is true). Returns how many were claimed.

        `once`: one claim. `drain`: claim until nothing is in hand and a claim finds nothing due, or `max_tasks`
        claims; a task in hand may make another due (a child ending wakes its parent), so one empty claim is not the
        end while work is in hand."""
        self._loop, self._awake = asyncio.get_running_loop(), asyncio.Event()
        io = Threads(self.store_threads, self.concurrency, self.name)
        in_hand: set[asyncio.Task[None]] = set()
        claimed = 0

        def done(task: asyncio.Task[None]) -> None:
            in_hand.discard(task)
            if not task.cancelled() and (error := task.exception()) is not None:  # `_work` catches; never silent
                log.error("a task's work ended with %s: %s", type(error).__name__, error)
            if self._awake is not None:
                self._awake.set()

        ticking = asyncio.create_task(self._tick())
        try:
            with self._serving(listen=not (once or drain)):  # no wake-up to wait for: what is due now
                try:
                    while not stopping():
                        self._awake.clear()  # before the claim: a wake-up that arrives during it is not lost
                        free = self.concurrency - len(in_hand)
                        if max_tasks is not None:
                            free = min(free, max_tasks - claimed)
                        got = 0
                        if free > 0:
                            for claim, loaded in await io.claim(partial(self._claim, free)):
                                claimed, got = claimed + 1, got + 1
                                task = asyncio.create_task(self._work(claim, loaded, stopping, io))
                                in_hand.add(task)
                                task.add_done_callback(done)
                        if once:
                            break
                        if drain and (
                            (free > 0 and got == 0 and not in_hand) or (max_tasks is not None and claimed >= max_tasks)
                        ):
                            break  # nothing is due and nothing in hand can make more due (a child waking its parent)
                        with suppress(TimeoutError):
                            await asyncio.wait_for(self._awake.wait(), self.poll_seconds)
                except asyncio.CancelledError:
                    # Ctrl-C in a program that runs `Worker.run` itself (asyncio's own SIGINT handler cancels the
                    # loop's main task): stop as on SIGTERM, letting each task in hand finish the step it is in
                    # and be handed back, so no call already paid for is thrown away and no lease is left held.
                    # A second Ctrl-C interrupts that at once.
                    log.warning(
                        "interrupted: finishing the %s steps in hand, then handing their tasks back", len(in_hand)
                    )
                    self._stop.set()
                    await asyncio.gather(*in_hand, return_exceptions=True)
                    raise
                await asyncio.gather(*in_hand, return_exceptions=True)
        finally:
            ticking.cancel()
            self._loop = self._awake = None
            io.close()  # after the tasks in hand: their releases run on it
            await close_loop_clients()  # the model clients' connections end with the worker
        return claimed

    async def _tick(self) -> None:
        """Say the loop is running, for the heartbeat: a loop blocked by a call that should have been awaited
        must not keep its leases alive (`_heartbeat`)."""
        while True:
            self._ticked = time.monotonic()
            await asyncio.sleep(1.0)

    def _claim(self, limit: int) -> list[tuple[Claim, TaskState | None]]:
        """Claim up to `limit` due tasks and load them: one hand-off (to the claims' own thread, `Threads.claim`)
        and two round trips, where a load of its own for each task was a hand-off and a statement more per step
        (issue #18). A task the batch left out (`Engine.load_many`) is None: its step loads it on its own, and
        meets why."""
        started = time.perf_counter() if hooks.active else 0.0
        try:
            claimed = self.engine.store.claim(
                self.name, limit=limit, lease_seconds=self.lease_seconds, workflows=self.workflows
            )
        except RailyardError as error:  # the database is away: try again at the next poll
            log.error("claim failed: %s", error.code)
            return []
        at = now()
        for claim in claimed:
            self.counts.claimed_one((at - claim.due_at).total_seconds() * 1000)
        if hooks.active:
            hooks.claimed(self.name, claimed, started, at)
        if not claimed:
            return []
        try:
            loaded = self.engine.load_many([claim.task_id for claim in claimed])
        except RailyardError:  # each step loads its task again, and says what failed
            loaded = {}
        return [(claim, loaded.get(claim.task_id)) for claim in claimed]

    @contextmanager
    def _serving(self, *, listen: bool = True) -> Iterator[None]:
        """While the loop runs: the heartbeat (leases and the worker's report) and, where the store
        can notify (PostgreSQL), the listener."""
        done = threading.Event()
        beat = threading.Thread(target=self._heartbeat, args=(done,), name=f"{self.name}-heartbeat", daemon=True)
        beat.start()
        signer = None
        if self.checkpoint_seconds is not None:  # its own thread: a checkpoint never delays a heartbeat
            signer = threading.Thread(
                target=self._checkpoints, args=(done, self.checkpoint_seconds), name=f"{self.name}-checkpoints"
            )
            signer.daemon = True
            signer.start()
        listener = self.engine.store.wakeups(self.wake, self.workflows).start() if listen and self.listen else None
        sender = self._webhook_sender(done) if listen and self.webhooks else None
        try:
            yield
        finally:
            done.set()
            beat.join(timeout=5)
            if sender is not None:  # an attempt in flight ends within its timeout; its lease covers the rest
                sender.join(timeout=self.engine.outbox_settings.timeout_seconds + 5)
            if signer is not None:
                signer.join(timeout=30)
            if listener is not None:
                listener.stop()
            self._report(stopped_at=now())

    def _webhook_sender(self, done: threading.Event) -> threading.Thread:
        """The webhook sender's thread (`engine.runtime.webhooks`), with the deadline sweep over the states of the
        workflows this worker serves that declare a deadline."""
        states = [
            (d.name, d.version, s.name)
            for d in self.engine.registry
            if d.name in self.workflows
            for s in d.all_states
            if getattr(s, "deadline", None) is not None
        ]
        store = self.engine.store
        sender = Sender(store, self.name, self.engine.outbox_settings, deadlines_of(store, states) if states else None)
        thread = threading.Thread(target=sender.run, args=(done,), name=f"{self.name}-webhooks", daemon=True)
        thread.start()
        return thread

    # -- one task -------------------------------------------------------
    async def _work(self, claim: Claim, loaded: TaskState | None, stopping: Callable[[], bool], io: Offload) -> None:
        """One claim, from the step to the release. Never raises: whatever fails is logged, and a task whose
        release could not be written is left to its lease, which expires by itself."""
        try:
            await self._hold(claim, loaded, stopping, io)
        except Exception:
            log.exception("task %s: its claim could not be finished; its lease expires by itself", claim.task_id)

    async def _hold(self, claim: Claim, loaded: TaskState | None, stopping: Callable[[], bool], io: Offload) -> None:
        lease = Lease(claim.task_id, self.name, claim.epoch, patience=self.lease_seconds)
        task_id = claim.task_id
        started = time.perf_counter()
        failed = False
        cleared = True  # whether this claim's end clears the task's count of failed steps
        ended = False  # whether its last append ended the task, which dropped the lease in the same write
        with self._held_lock:
            self._held.add(task_id)
        try:
            with holding(lease):
                ended = await self._advance(task_id, loaded, stopping, io)
        except FlowWait as waiting:
            # The breaker is open or the quota short: nothing happened to the task, so nothing is written; it is
            # put off, its lease given back, and any worker looks again when the wait is over.
            log.info("task %s: %s of %s; looking again at %s", task_id, waiting.reason, waiting.key, waiting.until)
            await self._postpone(io, claim, waiting.until)
            # Quota waits are often a fraction of a second: this worker looks again then, not at its next poll.
            delay = (waiting.until - now()).total_seconds() + 0.01
            asyncio.get_running_loop().call_later(max(delay, 0.0), self.wake)
        except AttemptInFlight as waiting:
            log.info(
                "task %s: a stranded attempt may still be running; looking again at %s", task_id, waiting.settle_after
            )
            await self._postpone(io, claim, waiting.settle_after)
        except LeaseLost:
            self.counts.add("lease_losses")
            if hooks.active:
                hooks.lease_lost(task_id)
            log.warning("task %s: lease epoch %s taken over; stopping", task_id, claim.epoch)
        except ConcurrencyConflict:
            self.counts.add("conflicts")
            log.info("task %s: moved by someone else meanwhile; it will be looked at again", task_id)
        except (Exception, asyncio.CancelledError) as exc:  # one bad task never stops a worker
            current = asyncio.current_task()
            if isinstance(exc, asyncio.CancelledError) and (current is None or current.cancelling()):
                raise  # the loop itself is being torn down (a second Ctrl-C): not this task's failure
            # (A CancelledError nobody asked for was raised by the step's own code, an adapter say: a failure.)
            if isinstance(exc, RailyardError) and exc.code in CONFIGURATION:
                # A deployment or configuration mistake, not a poison task: this process lacks the task's version
                # (or has other code under its number), a model, a tool. Leave the task untouched for a worker
                # that can run it, and never count it as the task's failure.
                cleared = False
                self.counts.add("config_errors")
                log.error(
                    "task %s: %s (%s); left as it is, for a worker that can run it", task_id, exc.code, exc.message
                )
                await self._postpone(io, claim, now() + timedelta(seconds=self.retry_backoff))
                return
            failed = True
            self.counts.add("failures")
            log.error("task %s: %s while advancing (%.200s)", task_id, type(exc).__name__, exc)
            tries = await self._postpone(io, claim, now() + timedelta(seconds=self.retry_backoff), failed=True)
            if tries >= self.max_failures:
                await io.store(partial(self._give_up, lease, exc, tries))
        finally:
            with self._held_lock:
                self._held.discard(task_id)
            try:
                succeeded = cleared and not failed
                held_ms = (time.perf_counter() - started) * 1000
                if ended:  # the ending append already gave the lease back and cleared the failed steps, and
                    # its transition's line says the task ended: no second line per task at INFO
                    log.debug("task %s ended after %.1f ms", task_id, held_ms)
                else:
                    await io.store(lambda: self.engine.store.release(task_id, claim.epoch, step_succeeded=succeeded))
                    log.info("task %s released after %.1f ms", task_id, held_ms)
                self.counts.add("released")
            except RailyardError as error:  # the lease expires by itself
                log.error("task %s: release failed: %s", task_id, error.code)

    async def _postpone(self, io: Offload, claim: Claim, until: datetime, *, failed: bool = False) -> int:
        """Put the task off until `until`; the failed steps it counts now, or 0 when the store did not answer
        (the lease then expires by itself and the task is tried again)."""
        try:
            return await io.store(lambda: self.engine.store.postpone(claim.task_id, claim.epoch, until, failed=failed))
        except RailyardError as error:
            log.error("task %s: could not put it off: %s", claim.task_id, error.code)
            return 0

    async def _advance(self, task_id: str, loaded: TaskState | None, stopping: Callable[[], bool], io: Offload) -> bool:
        """Step the task (as its claim loaded it, or loaded now) until it waits, ends or the worker stops; whether
        it ended."""
        task = loaded if loaded is not None else await io.store(lambda: self.engine.load(task_id))
        definition = self.engine.definition_of(task)
        if task.status is Status.BLOCKED and not isinstance(definition.state(task.state), Child):
            # A blocked task is due only when its deadline passed: fire it, once (a second worker conflicts). A
            # child state is due to start its child, or to look at it (`engine.runtime.children`): driven below.
            if definition.candidates(task.state, EXPIRED):
                fired = await io.store(lambda: self.engine.transition(task, EXPIRED, actor="system:timer", system=True))
                self.counts.add("transitions")
                return fired.terminal
            return False
        after = await self.engine.drive(
            task, model=self.model, thinking=self.thinking, max_turns=self.max_turns, until=stopping, io=io
        )
        self.counts.add("transitions", after.seq - task.seq)
        if stopping() and after.status is Status.RUNNABLE:
            self.counts.add("handed_back")
            log.info("task %s: handed back at seq %s (the worker is stopping)", task_id, after.seq)
        return after.terminal

    def _give_up(self, lease: Lease, exc: BaseException, tries: int) -> None:
        """A poison task: after `max_failures` raising steps, move it to the limit state (a human looks)."""
        try:
            with holding(lease):
                task = self.engine.load(lease.task_id)
                definition = self.engine.definition_of(task)
                if task.terminal or not definition.candidates(task.state, LIMIT):
                    return
                data: EventData = {"code": str(Code.INTERNAL_ERROR), "error": type(exc).__name__, "failures": tries}
                self.engine.commit_system(task, LIMIT, data, actor=self.name)
                self.counts.add("transitions")
                log.error("task %s: gave up after %s failed steps (%s)", lease.task_id, tries, type(exc).__name__)
        except RailyardError as error:
            log.error("task %s: could not hand it off: %s", lease.task_id, error.code)

    # -- heartbeat and report -------------------------------------------
    def _heartbeat(self, done: threading.Event) -> None:
        """Extend this worker's leases every third of a lease; report its counts every `report_seconds`."""
        interval = min(self.lease_seconds / 3, self.report_seconds)
        last_report = 0.0
        self._report()
        while not done.wait(interval):
            try:
                with self._held_lock:
                    held = list(self._held)
                stalled = time.monotonic() - self._ticked
                if held and self._loop is not None and stalled > self.lease_seconds / 2:
                    # Something blocks the event loop (a synchronous call made on it): none of the tasks in hand is
                    # moving, so their leases are let go rather than kept alive; another worker takes them over and
                    # this one's next append is refused (LEASE_LOST).
                    log.error(
                        "heartbeat: the event loop has not run for %.0f s; %s leases left to expire", stalled, len(held)
                    )
                elif held:
                    self._extend_leases(held)
                if time.monotonic() - last_report >= self.report_seconds:
                    last_report = time.monotonic()
                    self._report()
            except RailyardError as error:
                log.warning("heartbeat failed: %s", error.code)

    def _extend_leases(self, held: list[str]) -> None:
        """Extend the leases of the tasks in hand, and say which were taken over by another worker.

        A lease not extended is not always one taken over: the task may have ended (its last append drops the
        lease) or been released since `held` was read. Only a task still in hand whose row names another
        owner is reported, so the warning means what it says."""
        kept = self.engine.store.heartbeat(self.name, held, lease_seconds=self.lease_seconds)
        missing = [task_id for task_id in held if task_id not in kept]
        if not missing:
            return
        with self._held_lock:
            missing = [task_id for task_id in missing if task_id in self._held]
        taken = []
        for task_id in missing:
            row = self.engine.store.row(task_id)
            if row is not None and row.lease_owner not in (None, self.name):
                taken.append(task_id)
        if taken:
            log.warning("heartbeat: %s of %s leases were taken over: %s", len(taken), len(held), ", ".join(taken))

    def _checkpoints(self, done: threading.Event, every: float) -> None:
        """Sign a checkpoint of every task's head every `every` seconds, the first one at once."""
        while True:
            try:
                header, path, unrecorded = self.engine.audit.checkpoint()
                log.info("checkpoint %s: %s tasks, root %s", path.name, header.tree_size, header.root)
                if unrecorded is not None:
                    log.warning("checkpoint %s is not noted in the database: %s", path.name, unrecorded)
            except RailyardError as error:  # a missing key is the operator's to fix; the work goes on
                log.error("checkpoint failed: %s: %s", error.code, error.message)
            except Exception:  # a full disk, a directory gone: logged, and tried again at the next interval
                log.exception("checkpoint failed")
            if done.wait(every):
                return

    def _report(self, stopped_at: datetime | None = None) -> None:
        counts = self.counts.snapshot()
        log.info("worker %s counts %s", self.name, " ".join(f"{k}={v}" for k, v in counts.items()))
        if self.supervisor is not None:
            counts["supervisor"] = self.supervisor
        try:
            self.engine.store.report_worker(
                WorkerReport(
                    self.name,
                    socket.gethostname(),
                    os.getpid(),
                    self.concurrency,
                    self.started_at,
                    now(),
                    stopped_at,
                    counts,
                )
            )
        except RailyardError as error:  # a report is for operators; losing one never stops the work
            log.warning("worker report failed: %s", error.code)
