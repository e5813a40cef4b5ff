"""A worker process that kills itself (SIGKILL) at one point of the child protocol: `python -m
tests.support.child_crash POINT`, with RAILYARD_DATABASE_URL and RAILYARD_WORKFLOWS=tests.support.child_workflows.

The points (`POINTS`): after the parent's intent and before the child exists; after the child exists and before
the parent records it; after the parent recorded it and before it looks at the child; after the child ended and
before its parent is woken or records the end. A process that reaches no point exits 3 after `SECONDS`.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Callable
from typing import Any

from engine import Engine, Worker
from engine.runtime.children import ChildRunner

POINTS = ("before_the_child", "after_the_child", "after_spawned", "after_the_child_ended")
SECONDS = 30.0


def die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def before(fn: Callable[..., Any]) -> Callable[..., Any]:
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        die()
        return fn(*args, **kwargs)

    return wrapped


def after(fn: Callable[..., Any]) -> Callable[..., Any]:
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        out = fn(*args, **kwargs)
        die()
        return out

    return wrapped


def main(point: str) -> int:
    if point == "before_the_child":
        Engine.create = before(Engine.create)  # type: ignore[method-assign]
    elif point == "after_the_child":
        Engine.create = after(Engine.create)  # type: ignore[method-assign]
    elif point == "after_spawned":
        ChildRunner._look = before(ChildRunner._look)  # type: ignore[method-assign]
    elif point == "after_the_child_ended":
        Engine._wake_parent = before(Engine._wake_parent)  # type: ignore[method-assign]
    else:
        raise SystemExit(f"unknown point {point!r}: one of {', '.join(POINTS)}")
    engine = Engine()
    stop = threading.Event()
    threading.Timer(SECONDS, stop.set).start()
    Worker(engine, name=f"doomed-{point}", listen=False, poll_seconds=0.05, lease_seconds=2).run(stop)
    return 3  # no point was reached


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
