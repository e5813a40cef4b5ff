"""CSV export of the back office's lists as the person may see them: the work queue, the task list, the
approvals waiting, the access trail and the webhook deliveries.

A download is the list its page shows with the same filters, sort and search, every page of it: the rows are
read in keyset pages of `EXPORT_PAGE` (never the whole list in memory) and written out as they come, so the first
byte leaves after the first page's read whatever the list holds. What a person may see is decided exactly as on
the page (`views.queue_query`, `queries.list_tasks`): a task they could not see there is not in the file.

Cells a spreadsheet would take for a formula (`=`, `+`, `-`, `@`, a tab or a carriage return first) are prefixed
with a single quote (OWASP's "CSV injection"); a plain number such as `-12.50` is left as it is, being no formula.
Where a workflow's decision card declares money that the queue row carries (a field read from the prepared call
or the step's arguments), the file has one column for the amount and one for its currency, and ends with one
totals row per currency.
"""

from __future__ import annotations

import csv
import io
import json
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from itertools import chain
from typing import Any

from fastapi.responses import StreamingResponse

from engine.api.schemas import WorkKind
from engine.api.tokens import Principal
from engine.api.views import (
    _EXPONENT,
    SORT_LABELS,
    QueuePlace,
    TaskFilter,
    listed_places,
    places_of,
    queue_query,
    queue_row,
    task_query,
)
from engine.api.webhooks_page import webhooks_page
from engine.core import access
from engine.core.definition import Approval, Workflow
from engine.core.people import AccessChange
from engine.runtime import queries
from engine.runtime.engine import Engine
from engine.runtime.queries import TaskQuery

#: Rows read per keyset page while a file is written: what the export holds in memory at once. The first page
#: is a list page's size, so the first rows leave as soon as a page would have been drawn.
EXPORT_PAGE = 500
FIRST_PAGE = 50
#: The media type of every export, and the query value that asks for one (`?format=csv`, pages and API alike).
CSV_TYPE = "text/csv; charset=utf-8"
CSV_FORMAT = "csv"
#: A cell a spreadsheet would read as a formula starts with one of these.
_FORMULA_START = ("=", "+", "-", "@", "\t", "\r")
_NUMBER = re.compile(r"^-?\d+(\.\d+)?$")
#: Where a card's money can be read from a queue row: the head event's prepared call or its step's arguments.
_ROW_SOURCES = ("prepared", "args")


def safe_cell(value: object) -> str:
    """The text of one cell, never a formula: `=1+2` -> `'=1+2`; `-12.50` stays (a number is no formula)."""
    text = "" if value is None else str(value)
    if text.startswith(_FORMULA_START) and not _NUMBER.match(text):
        return "'" + text
    return text


def csv_line(cells: Iterable[object]) -> str:
    out = io.StringIO()
    csv.writer(out, lineterminator="\r\n").writerow([safe_cell(c) for c in cells])
    return out.getvalue()


def instant(at: datetime | None) -> str:
    """An instant as a spreadsheet reads it: ISO 8601 in UTC, to the second."""
    return "" if at is None else at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def amount(minor: int, currency: str) -> str:
    """Minor units as a plain decimal (`4000, EUR` -> `40.00`): a number a spreadsheet can add, no separators."""
    exponent = _EXPONENT.get(currency.upper(), 2)
    sign = "-" if minor < 0 else ""
    whole, part = divmod(abs(minor), 10**exponent)
    return f"{sign}{whole}" + (f".{part:0{exponent}d}" if exponent else "")


def csv_response(lines: Iterator[str], name: str) -> StreamingResponse:
    """The file as it is written, as a download named `name-<date>.csv`. Its first line (the header, written once
    the filters are read) is taken before the answer starts: a filter that is refused (a date that is not one)
    is an error answer with its code, not a 200 whose file stops short."""
    day = datetime.now(UTC).strftime("%Y-%m-%d")
    first = next(lines, "")
    return StreamingResponse(
        (line.encode() for line in chain([first], lines)),
        media_type=CSV_TYPE,
        headers={"Content-Disposition": f'attachment; filename="{name}-{day}.csv"', "Cache-Control": "no-store"},
    )


# -- the work queue ------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class MoneyColumn:
    """A money field some listed state's card declares and a queue row carries: its label and, per place, the
    path of its value and of its currency (a path, or an ISO 4217 code)."""

    label: str
    paths: dict[tuple[str, int, str], tuple[str, str]]


def money_columns(states: Sequence[QueuePlace], listed: Sequence[tuple[str, int, str]]) -> list[MoneyColumn]:
    """The money columns of the listed places' cards, by label (a refund's `refund` column is one column across
    the workflow's versions), in the order the cards declare them."""
    found: dict[str, dict[tuple[str, int, str], tuple[str, str]]] = {}
    for definition, state, _kind, _mine in states:
        place = (definition.name, definition.version, state)
        card = definition.cards.get(state)
        if place not in listed or card is None:
            continue
        for f in card.fields:
            if f.format == "money" and f.path.split(".")[0] in _ROW_SOURCES:
                found.setdefault(f.label or f.name.replace("_", " "), {})[place] = (f.path, f.currency)
    return [MoneyColumn(label, paths) for label, paths in found.items()]


def field_names(definitions: Iterable[Workflow]) -> list[str]:
    """The searchable input fields the rows may carry (the page shows each under the task's id), in order."""
    names: dict[str, None] = {}
    for definition in definitions:
        names.update(dict.fromkeys(definition.searchable))
    return list(names)


def _read(path: str, sources: Mapping[str, Any]) -> Any:
    value: Any = sources
    for part in path.split("."):
        if not isinstance(value, Mapping) or part not in value:
            return None
        value = value[part]
    return value


def _money_of(head_data: Mapping[str, Any], path: str, currency: str) -> tuple[int, str] | None:
    prepared = head_data.get("prepared")
    sources = {
        "prepared": prepared.get("arguments", {}) if isinstance(prepared, Mapping) else {},
        "args": head_data.get("args") if isinstance(head_data.get("args"), Mapping) else {},
    }
    value = _read(path, sources)
    code = currency if re.fullmatch(r"[A-Z]{3}", currency) else _read(currency, sources)
    if isinstance(value, int) and not isinstance(value, bool) and isinstance(code, str) and code:
        return value, code
    return None


QUEUE_COLUMNS = ("task", "workflow", "state", "kind", "asked of you", "why", "waiting since", "deadline")


def queue_csv(
    engine: Engine,
    principal: Principal,
    *,
    kind: str | None = None,
    workflow: str | None = None,
    older_than: str | None = None,
    q: str | None = None,
    sort: str = "deadline",
    descending: bool = False,
) -> Iterator[str]:
    """The work queue with the page's filters, sort and search, every row the page would list (the tasks waiting
    on roles the person lacks are not), a keyset page at a time, then one totals row per currency."""
    at = datetime.now(UTC)
    sort = sort if sort in SORT_LABELS else "deadline"
    states, where = queue_query(
        engine,
        principal,
        workflow=workflow,
        older_than=older_than,
        q=(q or "").strip(),
        sort=sort,
        descending=descending,
        at=at,
    )
    listed = listed_places(states, kind)
    by_place = places_of(states)
    fields = field_names({by_place[p][0] for p in listed})
    money = money_columns(states, listed)
    yield csv_line(
        [
            *QUEUE_COLUMNS,
            *fields,
            *(c for m in money for c in (m.label, f"{m.label} currency")),
            "who is on it",
        ]
    )
    totals: dict[str, dict[str, int]] = {}
    after: str | None = None
    size = min(FIRST_PAGE, EXPORT_PAGE)
    while listed:
        page = queries.queue_page(engine, replace(where, places=listed, after=after, limit=size), principal.caller)
        for found in page:
            r = queue_row(engine, by_place, found, principal, at)
            place = (found.row.workflow, found.row.version, found.row.state)
            open_to = access.sees_restricted(by_place[place][0], principal.caller)
            cells: list[object] = []
            for m in money:
                got = None
                if place in m.paths and open_to and found.head is not None:
                    got = _money_of(found.head.data, *m.paths[place])
                if got is None:
                    cells += ["", ""]
                    continue
                minor, code = got
                cells += [amount(minor, code), code]
                per = totals.setdefault(code, {})
                per[m.label] = per.get(m.label, 0) + minor
            yield csv_line(
                [
                    r.task_id,
                    r.workflow,
                    r.state,
                    r.kind,
                    r.asked,
                    r.why,
                    instant(r.waiting_since),
                    instant(r.deadline),
                    *(r.fields.get(n, "") for n in fields),
                    *cells,
                    r.claim.actor if r.claim is not None else "",
                ]
            )
        if len(page) < size:
            break
        after, size = page[-1].row.task_id, EXPORT_PAGE
    yield from _totals(totals, money, len(QUEUE_COLUMNS) - 1 + len(fields), tail=1)


# -- the task list ---------------------------------------------------------------------------------
TASK_COLUMNS = ("task", "workflow", "version", "state", "status", "started by", "created", "updated")


def tasks_csv(engine: Engine, where: TaskFilter, principal: Principal) -> Iterator[str]:
    """The task list with the page's filters and search, newest first, every task the person may read, a
    keyset page at a time."""
    query: TaskQuery = replace(task_query(engine, where), limit=min(FIRST_PAGE, EXPORT_PAGE))
    fields = field_names(engine.registry)
    yield csv_line([*TASK_COLUMNS, *fields])
    while True:
        page = queries.list_tasks(engine, query, principal.caller)
        for t in page:
            row = t.row
            yield csv_line(
                [
                    row.task_id,
                    row.workflow,
                    row.version,
                    row.state,
                    row.status,
                    t.started_by,
                    instant(row.created_at),
                    instant(row.updated_at),
                    *(t.fields.get(n, "") for n in fields),
                ]
            )
        if len(page) < query.limit:
            break
        query = replace(query, after=page[-1].row.task_id, limit=EXPORT_PAGE)


# -- the approvals waiting ---------------------------------------------------------------------------
APPROVAL_COLUMNS = (
    "task",
    "workflow",
    "version",
    "state",
    "role",
    "started by",
    "proposed by",
    "tool",
    "arguments",
    "digest",
)


def _approval_places(engine: Engine, principal: Principal, role: str | None) -> list[tuple[Workflow, str]]:
    """The approval states whose tasks `principal` may read (of `role`, if given), as the API's list selects."""
    names = queries.readable(engine, principal.caller)
    return [
        (d, s.name)
        for d in engine.registry
        if names is None or d.name in names
        for s in d.all_states
        if isinstance(s, Approval) and (role is None or s.role == role)
    ]


def approvals_csv(engine: Engine, principal: Principal, role: str | None = None) -> Iterator[str]:
    """`GET /api/approvals` as one file: every approval waiting that the person may read, oldest first, a page at
    a time, with the prepared call's arguments (as shown to them: restricted values withheld) and its digest, and
    the money its card declares, with one totals row per currency."""
    places = _approval_places(engine, principal, role)
    listed = [(d.name, d.version, s) for d, s in places]
    money = money_columns([(d, s, WorkKind.APPROVAL, True) for d, s in places], listed)
    yield csv_line([*APPROVAL_COLUMNS, *(c for m in money for c in (m.label, f"{m.label} currency"))])
    totals: dict[str, dict[str, int]] = {}
    after: str | None = None
    size = FIRST_PAGE
    while True:
        found, last = queries.approvals(engine, principal.caller, role=role, after=after, limit=size)
        for item in found:
            name, _, version = str(item["workflow"]).rpartition("@")
            place = (name, int(version), str(item["state"]))
            prepared = item.get("prepared") if isinstance(item.get("prepared"), Mapping) else None
            cells: list[object] = []
            for m in money:
                got = _money_of({"prepared": prepared}, *m.paths[place]) if place in m.paths and prepared else None
                if got is None:
                    cells += ["", ""]
                    continue
                minor, code = got
                cells += [amount(minor, code), code]
                per = totals.setdefault(code, {})
                per[m.label] = per.get(m.label, 0) + minor
            yield csv_line(
                [
                    item["task_id"],
                    name,
                    version,
                    item["state"],
                    item["role"],
                    item["started_by"],
                    item.get("proposed_by") or "",
                    prepared.get("tool", "") if prepared else "",
                    json.dumps(prepared.get("arguments"), sort_keys=True, ensure_ascii=False) if prepared else "",
                    item.get("digest") or "",
                    *cells,
                ]
            )
        if last is None:
            break
        after, size = last, EXPORT_PAGE
    yield from _totals(totals, money, len(APPROVAL_COLUMNS) - 1, tail=0)


def _totals(
    totals: Mapping[str, Mapping[str, int]], money: Sequence[MoneyColumn], blank: int, tail: int
) -> Iterator[str]:
    """One row per currency: `total EUR`, `blank` empty cells, each money column's sum, `tail` empty cells."""
    for code in sorted(totals):
        sums = totals[code]
        cells = [c for m in money for c in ((amount(sums[m.label], code), code) if m.label in sums else ("", ""))]
        yield csv_line([f"total {code}", *[""] * blank, *cells, *[""] * tail])


# -- the access trail -------------------------------------------------------------------------------
TRAIL_COLUMNS = ("id", "at", "by", "action", "subject", "details")


def trail_csv(engine: Engine) -> Iterator[str]:
    """The whole access trail, oldest first, a page at a time (the caller is an auditor: the route checks)."""
    people = engine.people
    yield csv_line(TRAIL_COLUMNS)
    after: int | None = None
    size = FIRST_PAGE
    while True:
        page: list[AccessChange] = people.trail(after=after, limit=size)
        for c in page:
            yield csv_line(
                [c.id, instant(c.at), c.by, str(c.action), c.subject, json.dumps(dict(c.details), sort_keys=True)]
            )
        if len(page) < size:
            break
        after, size = page[-1].id, EXPORT_PAGE


# -- the webhook deliveries -----------------------------------------------------------------------
DELIVERY_COLUMNS = (
    "id",
    "subscription",
    "kind",
    "task",
    "status",
    "attempts",
    "created",
    "next attempt",
    "delivered",
    "last error",
)


def deliveries_csv(engine: Engine, principal: Principal, *, status: str = "", subscription: str = "") -> Iterator[str]:
    """The deliveries the webhooks page lists with the same filters (the newest, `webhooks_page.SHOWN`), newest
    first. Refused as the page is, before the file starts."""
    page = webhooks_page(engine, principal, status=status, subscription=subscription)
    yield csv_line(DELIVERY_COLUMNS)
    for d in page.deliveries:
        yield csv_line([d[k] if d[k] is not None else "" for k in _DELIVERY_KEYS])


_DELIVERY_KEYS = (
    "id",
    "subscription",
    "kind",
    "task_id",
    "status",
    "attempts",
    "created_at",
    "next_attempt_at",
    "delivered_at",
    "last_error",
)
