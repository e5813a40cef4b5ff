"""A worker process for the fan-out tests: `python -m tests.support.fanout_worker NAME [POINT]`, with
RAILYARD_DATABASE_URL and RAILYARD_WORKFLOWS=tests.support.fanout_workflows.

Without a point it works until it is stopped (SIGTERM from the test) or `SECONDS` pass. With a point it kills
itself (SIGKILL) there (`POINTS`): after `AFTER_CREATES` of a fan-out's children exist and before the rest do (no
`spawned` yet); or after every child ended and before the parent records the join. A doomed process that reaches
no point exits 3.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from typing import Any

from engine import Engine, Worker
from engine.runtime import fanout

POINTS = ("amid_the_children", "before_the_join")
AFTER_CREATES = 40
SECONDS = 120.0


def die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def main(name: str, point: str | None) -> int:
    if point == "amid_the_children":
        make = Engine.create
        made = [0]

        def create_then_maybe_die(self: Engine, *args: Any, **kwargs: Any) -> str:
            out = make(self, *args, **kwargs)
            made[0] += 1
            if made[0] >= AFTER_CREATES:
                die()
            return out

        Engine.create = create_then_maybe_die  # type: ignore[method-assign]
    elif point == "before_the_join":
        record = fanout._record_end

        def die_before(*args: Any, **kwargs: Any) -> Any:
            die()
            return record(*args, **kwargs)

        fanout._record_end = die_before
    elif point is not None:
        raise SystemExit(f"unknown point {point!r}: one of {', '.join(POINTS)}")
    engine = Engine()
    stop = threading.Event()
    timer = threading.Timer(SECONDS, stop.set)
    timer.daemon = True
    timer.start()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    Worker(engine, name=name, listen=False, poll_seconds=0.05, lease_seconds=5, concurrency=4).run(stop)
    return 3 if point is not None else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else None))
