"""Wake idle workers when a task becomes claimable: PostgreSQL LISTEN/NOTIFY, with polling as the fallback.

The database sends `railyard_runnable` (payload: the workflow name) from a
trigger whenever a task nobody holds becomes due: a start, a human decision, a
released lease (migration 0004). One listening connection per worker process
turns those into a `threading.Event`; the worker still polls, so a lost
notification, an expired lease or a dropped connection only costs latency,
never a task. SQLite has no notifications: workers there poll.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence

from sqlalchemy.engine import make_url

log = logging.getLogger("railyard.worker")

CHANNEL = "railyard_runnable"


def libpq_dsn(url: str) -> str:
    """The SQLAlchemy URL as a libpq connection string (psycopg's own `connect` takes that)."""
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


class Listener:
    """A daemon thread that LISTENs and calls `wake` on every notification about a workflow of interest."""

    def __init__(
        self,
        url: str,
        wake: Callable[[], None],
        workflows: Sequence[str] | None = None,
        *,
        reconnect_seconds: float = 1.0,
    ) -> None:
        self.dsn = libpq_dsn(url)
        self.wake = wake
        self.workflows = set(workflows) if workflows else None
        self.reconnect_seconds = reconnect_seconds
        self.listening = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="railyard-listen", daemon=True)

    def start(self) -> Listener:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        import psycopg

        while not self._stop.is_set():
            try:
                with psycopg.connect(self.dsn, autocommit=True) as conn:
                    conn.execute(f"LISTEN {CHANNEL}")
                    self.listening.set()
                    # The listener may have missed notifications while (re)connecting: look once.
                    self.wake()
                    while not self._stop.is_set():
                        for note in conn.notifies(timeout=0.5):
                            if self.workflows is None or note.payload in self.workflows:
                                self.wake()
            except psycopg.Error as exc:
                self.listening.clear()
                log.warning("LISTEN connection lost (%s); polling until it is back", type(exc).__name__)
                self._stop.wait(self.reconnect_seconds)
