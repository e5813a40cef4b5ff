"""Quality figures of a period, read from the logs the way an export reads them.

The figures are the pure fold's (`engine.core.quality`); this reads the logs it folds. It streams them with
`Auditor.logs` (task rows a keyset page at a time, each followed by its events; an archived task's from its
archive file), so a period of a million turns is read once and never held whole. The store narrows the tasks to
those of `workflow` changed at or after `since`; the fold counts only what happened within the period.

A read made for a person passes what narrows a stream of logs to the tasks they may read (the read side's
`engine.runtime.shown.readable_logs` with their `queries.scope`): the others are passed over as if they did not
exist, as an export made for them leaves them out.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from datetime import datetime

from engine.audit.auditor import Auditor
from engine.core.events import Event
from engine.core.quality import Period, Prices, Quality, fold_quality
from engine.core.rows import TaskRow

__all__ = ["Readable", "read_quality"]

#: What narrows a stream of logs (rows each followed by their events) to the tasks a reader may read.
Readable = Callable[[Iterator[TaskRow | Event]], Iterable[TaskRow | Event]]


def read_quality(
    auditor: Auditor,
    *,
    workflow: str | None = None,
    since: datetime | None = None,
    until: datetime | None = None,
    model: str | None = None,
    readable: Readable | None = None,
    prices: Prices | None = None,
) -> Quality:
    """The figures of the turns and visits of `since <= at < until` (open ends: no bound), of `workflow`'s tasks
    (None: every workflow's), of `model`'s turns (`provider:model` or the model's name; None: every model's),
    among the tasks `readable` keeps (None: every task), costed at `prices` (None: no cost)."""
    logs = auditor.logs(workflow=workflow, since=since)
    return fold_quality(logs if readable is None else readable(logs), Period(since, until), model, prices)
