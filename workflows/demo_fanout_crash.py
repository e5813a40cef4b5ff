"""The demo's doomed worker for a batch review: it records the batch's intent to start one check per order, makes
the first checks, and is killed (SIGKILL) before it makes the rest. `python -m workflows.demo_fanout_crash`, with
RAILYARD_DATABASE_URL set; `railyard demo` runs it."""

from __future__ import annotations

import os
import signal
import sys
from typing import Any

from engine import Engine, Registry, Worker

#: How many checks exist when the worker dies.
MADE_BEFORE_THE_CRASH = 2


def main() -> int:
    make = Engine.create
    made = [0]

    def create_then_die(self: Engine, *args: Any, **kwargs: Any) -> str:
        out = make(self, *args, **kwargs)
        made[0] += 1
        if made[0] >= MADE_BEFORE_THE_CRASH:
            os.kill(os.getpid(), signal.SIGKILL)  # some checks exist, the others not; the batch recorded neither
        return out

    Engine.create = create_then_die  # type: ignore[method-assign]
    with Engine(registry=Registry.from_modules(["workflows"])) as engine:
        Worker(engine, name="demo-doomed-batch", listen=False, lease_seconds=2, workflows=["order_review"]).drain()
    return 3  # it was not killed: nothing to start


if __name__ == "__main__":
    sys.exit(main())
