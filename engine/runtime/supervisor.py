"""A supervisor of worker processes: `railyard worker --processes N`.

One worker process is one interpreter: it spends a few milliseconds of CPU around each model turn and serves at
most one core's worth of them (issue #33: 341 one-turn tasks/s at 1,024 calls in flight, with the other core
idle). The supervisor starts N of them, each a whole `railyard worker` of its own (its own event loop, store
threads, connections opened after it starts, leases under its own name), and does only three things:

- it starts a process again when one dies (a crash, an out-of-memory kill, `kill -9`), after a pause that grows
  while a slot keeps dying young, so a broken host does not spin. The dead process's tasks are not lost: their
  leases expire and any worker resumes each from its log, as after any worker's death;
- it drains them all when it is told to stop: it closes each child's stdin, which the child takes as its stop
  signal (finish the step in hand, hand the task back, exit 0). A pipe, not a signal, so a process that also got
  the signal itself (Ctrl-C reaches the terminal's whole process group; systemd signals every process of the
  unit) is not told twice, which would cut its step off. A second stop kills them at once. A supervisor that
  dies closes the pipes too, so its children drain rather than run on as orphans;
- it stops them all when one exits 2: that process cannot run (its configuration), and neither can its twins.

The children report to the `workers` table under their own names, each naming its supervisor, and `railyard
status` shows them as one worker with a line per process (`engine.core.worker_groups`).
"""

from __future__ import annotations

import logging
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Mapping
from contextlib import suppress
from dataclasses import dataclass, field

log = logging.getLogger("railyard.worker")

#: The exit status of a process that cannot run (a usage or configuration error): it is not started again.
EXIT_USAGE = 2
#: A process that lived this long before it died was not dying young: its slot's pause starts over.
YOUNG_SECONDS = 60.0


def restart_delay(young_deaths: int, *, first: float = 1.0, most: float = 30.0) -> float:
    """How long to wait before starting a slot again after its `young_deaths`-th death in a row of a process
    that lived less than `YOUNG_SECONDS`: 1 s, 2 s, 4 s ... at most 30 s."""
    return min(most, first * 2.0 ** max(0, young_deaths - 1))


def child_name(supervisor: str, index: int, restarts: int) -> str:
    """The worker name of slot `index`'s process after `restarts` restarts of it: unique per process, so a lease
    or a `workers` row never names two processes."""
    return f"{supervisor}-p{index}" + (f"r{restarts}" if restarts else "")


@dataclass
class Slot:
    """One of the N places a worker process runs in."""

    index: int
    restarts: int = 0
    young_deaths: int = 0
    process: subprocess.Popen[bytes] | None = None
    started: float = 0.0
    due: float = 0.0  # when to start it (again): monotonic time
    exit_status: int | None = None  # the last process's, once it ended during the drain
    pids: list[int] = field(default_factory=list)


class Supervisor:
    """Keep `processes` worker processes running; drain them on `stop()`. `command(index, restarts)` is the
    argv of slot `index`'s process (its `--supervised` identity included)."""

    def __init__(
        self,
        command: Callable[[int, int], list[str]],
        processes: int,
        *,
        grace_seconds: float,
        env: Mapping[str, str] | None = None,
        poll_seconds: float = 0.2,
    ) -> None:
        self.command = command
        self.slots = [Slot(i) for i in range(processes)]
        self.grace_seconds = grace_seconds
        self.env = dict(env) if env is not None else None
        self.poll_seconds = poll_seconds
        self._wake = threading.Event()
        self._stops = 0  # how many times stop() was called: 1 drains, 2 kills
        self._fatal: int | None = None  # a child's exit status that stops them all

    # -- what the signal handler calls ------------------------------------
    @property
    def stopping(self) -> bool:
        """Whether it was told to stop (and drains its processes)."""
        return self._stops > 0

    def stop(self) -> None:
        """First call: drain every process. Second: kill them. Safe from a signal handler (sets flags only)."""
        self._stops += 1
        self._wake.set()

    # -- the loop ----------------------------------------------------------
    def run(self) -> int:
        """Start the processes and keep them running until stopped; returns the exit status for the command:
        0 when every process drained cleanly, else the first non-zero status one ended with (2 when a process
        could not run, 128 + SIGTERM when one was cut off at the end of its grace)."""
        for slot in self.slots:
            self._start(slot)
        draining_since: float | None = None
        while True:
            if self._stops >= 2:
                self._kill_all()
                return 128 + signal.SIGTERM
            if (self._stops or self._fatal is not None) and draining_since is None:
                draining_since = time.monotonic()
                self._drain_all()
            self._reap(draining=draining_since is not None)
            live = [s for s in self.slots if s.process is not None]
            if draining_since is not None:
                if not live:
                    return self._exit_status()
                # Each child cuts its own steps off at the end of its grace; this is for one that does not.
                if time.monotonic() - draining_since > self.grace_seconds + 10:
                    log.error("%s processes still running after the grace period: killing them", len(live))
                    self._kill_all()
                    return 128 + signal.SIGTERM
            else:
                for slot in self.slots:
                    if slot.process is None and time.monotonic() >= slot.due:
                        self._start(slot)
            self._wake.wait(self.poll_seconds)
            self._wake.clear()

    def _start(self, slot: Slot) -> None:
        argv = self.command(slot.index, slot.restarts)
        # stdin is the stop pipe; stdout and stderr are the supervisor's (the logs go where its logs go).
        slot.process = subprocess.Popen(argv, stdin=subprocess.PIPE, env=self.env)
        slot.started = time.monotonic()
        slot.pids.append(slot.process.pid)
        if slot.restarts:
            log.warning("process %s started again (pid %s, restart %s)", slot.index, slot.process.pid, slot.restarts)

    def _reap(self, *, draining: bool) -> None:
        for slot in self.slots:
            process = slot.process
            if process is None or (status := process.poll()) is None:
                continue
            slot.process = None
            if draining:
                slot.exit_status = status
                continue
            if status == EXIT_USAGE:
                log.error("process %s (pid %s) cannot run (exit 2): stopping the others", slot.index, process.pid)
                self._fatal = status
                slot.exit_status = status
                continue
            lived = time.monotonic() - slot.started
            slot.young_deaths = slot.young_deaths + 1 if lived < YOUNG_SECONDS else 1
            delay = restart_delay(slot.young_deaths)
            slot.restarts += 1
            slot.due = time.monotonic() + delay
            how = f"signal {-status}" if status < 0 else f"exit {status}"
            log.warning(
                "process %s (pid %s) died (%s) after %.0f s; starting another in %.0f s; its tasks are resumed when"
                " their leases expire",
                slot.index,
                process.pid,
                how,
                lived,
                delay,
            )

    def _drain_all(self) -> None:
        for slot in self.slots:
            if slot.process is not None and slot.process.stdin is not None:
                with suppress(OSError):  # it died meanwhile: reaped next
                    slot.process.stdin.close()  # the child's stop signal

    def _kill_all(self) -> None:
        for slot in self.slots:
            if slot.process is not None:
                slot.process.kill()
        for slot in self.slots:
            if slot.process is not None:
                slot.exit_status = slot.process.wait()
                slot.process = None

    def _exit_status(self) -> int:
        if self._fatal is not None:
            return self._fatal
        return next((s.exit_status for s in self.slots if s.exit_status), 0)
