"""Workers: claim due tasks with a lease, advance each until it blocks or ends, release it.

Threads, not asyncio: model and tool calls are blocking SDK calls that take
seconds, a transition takes a millisecond, and a thread per held task keeps
the code the same as `Engine.run`. Each held task carries its lease as a
fencing token to every append (`engine.leases`), a heartbeat thread extends it
while a long step runs, and no database transaction is open across a model
or tool call. A task whose lease expired (its worker died) is claimed again by
another worker and resumed from its log; a write tool's stranded intent is
reconciled, never re-sent.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import timedelta

from engine.canonical import now
from engine.core import Engine
from engine.definition import EXPIRED, LIMIT, Status
from engine.errors import Code, ConcurrencyConflict, LeaseLost, RailyardError
from engine.leases import Lease, holding
from engine.model.types import ModelAdapter
from engine.tool_runner import AttemptInFlight

log = logging.getLogger("railyard.worker")


@dataclass
class WorkerCounts:
    """What a worker has done, for its logs and `railyard worker` output."""

    claimed: int = 0
    finished_steps: int = 0
    conflicts: int = 0
    lease_losses: int = 0
    failures: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, name: str) -> None:
        with self.lock:
            setattr(self, name, getattr(self, name) + 1)


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
        poll_seconds: float = 0.5,
        max_turns: int = 50,
        retry_backoff: float = 5.0,
        max_failures: int = 5,
    ) -> None:
        self.engine = engine
        self.name = name or f"worker-{os.getpid()}-{threading.get_ident() % 10_000}"
        self.concurrency = concurrency
        self.lease_seconds = lease_seconds
        self.workflows = list(workflows) if workflows else None
        self.model = model
        self.thinking = thinking
        self.poll_seconds = poll_seconds
        self.max_turns = max_turns
        self.retry_backoff = retry_backoff
        self.max_failures = max_failures
        self.counts = WorkerCounts()

    def run(self, stop: threading.Event) -> None:
        """Claim and work until `stop` is set; the tasks in hand are finished (or handed back) first."""
        while not stop.is_set():
            if self.run_once() == 0:
                stop.wait(self.poll_seconds)

    def run_once(self) -> int:
        """Claim up to `concurrency` due tasks and advance them; returns how many were claimed."""
        claimed = self.engine.store.claim(self.name, limit=self.concurrency, lease_seconds=self.lease_seconds,
                                          workflows=self.workflows)
        if not claimed:
            return 0
        for _ in claimed:
            self.counts.add("claimed")
        with ThreadPoolExecutor(max_workers=self.concurrency, thread_name_prefix=self.name) as pool:
            list(pool.map(self._work, claimed))
        return len(claimed)

    def _work(self, claim: tuple[str, int]) -> None:
        task_id, epoch = claim
        lease = Lease(task_id, self.name, epoch)
        done = threading.Event()
        beat = threading.Thread(target=self._heartbeat, args=(lease, done), daemon=True)
        beat.start()
        started = time.perf_counter()
        failed = False
        try:
            with holding(lease):
                self._advance(task_id)
            self.counts.add("finished_steps")
        except AttemptInFlight as waiting:
            log.info("task %s: a stranded attempt may still be running; looking again at %s", task_id,
                     waiting.settle_after)
            self.engine.store.postpone(task_id, epoch, waiting.settle_after)
        except LeaseLost:
            self.counts.add("lease_losses")
            log.warning("task %s: lease epoch %s taken over; stopping", task_id, epoch)
        except ConcurrencyConflict:
            self.counts.add("conflicts")
            log.info("task %s: moved by someone else meanwhile; it will be looked at again", task_id)
        except Exception as exc:  # one bad task never stops a worker
            failed = True
            self.counts.add("failures")
            log.error("task %s: %s while advancing (%.200s)", task_id, type(exc).__name__, exc)
            tries = self.engine.store.postpone(task_id, epoch, now() + timedelta(seconds=self.retry_backoff),
                                               failed=True)
            if tries >= self.max_failures:
                self._give_up(lease, exc, tries)
        finally:
            done.set()
            beat.join(timeout=5)
            self.engine.store.release(task_id, epoch, step_succeeded=not failed)
            log.info("task %s released after %.1f ms", task_id, (time.perf_counter() - started) * 1000)

    def _give_up(self, lease: Lease, exc: Exception, tries: int) -> None:
        """A poison task: after `max_failures` raising steps, move it to the limit state (a human looks)."""
        try:
            with holding(lease):
                task = self.engine.load(lease.task_id)
                definition = self.engine.definition_of(task)
                if task.terminal or not definition.candidates(task.state, LIMIT):
                    return
                data = {"code": str(Code.INTERNAL_ERROR), "error": type(exc).__name__, "failures": tries}
                self.engine.commit_system(task, LIMIT, data, actor=self.name)
                log.error("task %s: gave up after %s failed steps (%s)", lease.task_id, tries, type(exc).__name__)
        except RailyardError as error:
            log.error("task %s: could not hand it off: %s", lease.task_id, error.code)

    def _advance(self, task_id: str) -> None:
        task = self.engine.load(task_id)
        if task.status is Status.BLOCKED:
            # A blocked task is due only when its deadline passed: fire it, once (a second worker conflicts).
            definition = self.engine.definition_of(task)
            if definition.candidates(task.state, EXPIRED):
                self.engine.transition(task, EXPIRED, actor="system:timer", system=True)
            return
        self.engine.run(task_id, model=self.model, thinking=self.thinking, max_turns=self.max_turns)

    def _heartbeat(self, lease: Lease, done: threading.Event) -> None:
        while not done.wait(self.lease_seconds / 3):
            try:
                if not self.engine.store.heartbeat(lease.task_id, lease.epoch, lease_seconds=self.lease_seconds):
                    log.warning("task %s: heartbeat found the lease taken over", lease.task_id)
                    return
            except RailyardError as error:
                log.warning("task %s: heartbeat failed: %s", lease.task_id, error.code)
