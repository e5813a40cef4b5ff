"""The demo's doomed worker for a ticket that starts a refund: it records the intent, makes the refund task, and is
killed (SIGKILL) before the ticket records that the refund exists. `python -m workflows.demo_child_crash`, with
RAILYARD_DATABASE_URL set; `railyard demo` runs it."""

from __future__ import annotations

import os
import signal
import sys
from typing import Any

from engine import Engine, Registry, Worker


def main() -> int:
    make = Engine.create

    def create_then_die(self: Engine, *args: Any, **kwargs: Any) -> str:
        made = make(self, *args, **kwargs)
        os.kill(os.getpid(), signal.SIGKILL)  # the refund task exists; the ticket has not recorded it
        return made

    Engine.create = create_then_die  # type: ignore[method-assign]
    with Engine(registry=Registry.from_modules(["workflows"])) as engine:
        Worker(engine, name="demo-doomed", listen=False, lease_seconds=2, workflows=["ticket_triage"]).drain()
    return 3  # it was not killed: nothing to start


if __name__ == "__main__":
    sys.exit(main())
