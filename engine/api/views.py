"""What the pages show and how: values in display form, the task list, the diagrams, the inbox and the task
page, and the templates they are rendered with.

An approver decides on the prepared call, so amounts are shown as money
(`40.00 EUR`), not as the minor units the call carries; the evidence is what
the tools returned; the model's reason is what it wrote. All of it is untrusted
text, and stays text: the Jinja2 environment autoescapes every template,
whatever its name, and no template marks anything `|safe`.

The display functions are pure. The task list reads the heads of the logs
(`Store.list_tasks`, one keyset page, newest first), never the events. The
diagrams are `CompiledMachine.graph(visits=...)`: each edge a task took is
labelled with how often and drawn, with the states it touches, in the
"previous" style; the pages show the Mermaid source as text (no renderer runs
in the browser, no third-party script under the Content-Security-Policy). The
inbox repeats the checks `engine.core.approvals.check_decision` will make
(role, separation of duties, read-only token) only to decide whether to offer
the buttons; the engine makes them again when the form is posted, and its
answer is the one that counts.
"""

from __future__ import annotations

import base64
import functools
import json
import re
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any

import jinja2
from fastapi import Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from fastapi.templating import Jinja2Templates
from markupsafe import Markup
from pydantic import BaseModel

from engine.api.auth import Flash, Session, current_session
from engine.api.route import Visit, task_route, visits_of
from engine.api.schemas import TASK_ID_PATTERN, WorkKind
from engine.api.tokens import Principal
from engine.audit.reads import path_visits
from engine.core import access
from engine.core.access import Caller, holds
from engine.core.approvals import DECISIONS, decision_role, pending_view, self_approval
from engine.core.canonical import format_instant
from engine.core.definition import (
    CANCEL,
    COMMENT,
    HANDOFF_SUFFIX,
    LIMIT_STATE,
    MIGRATE,
    PROVIDER_ERROR_SUFFIX,
    REDRIVE,
    Agent,
    Approval,
    CardField,
    Labels,
    StateKind,
    Tool,
    Wait,
    Workflow,
)
from engine.core.effects import CANCEL_REQUESTED, SETTLE
from engine.core.errors import Code, RailyardError, Refused
from engine.core.events import Event
from engine.core.forks import last_entry, redrive_problem, repeat_hazard, writes
from engine.core.lineage import Chain, chain_of, declared
from engine.core.payloads import event_code
from engine.core.quality import turn_tag
from engine.core.remarks import is_remark
from engine.core.summary import compact, details, summarise
from engine.core.task import TaskState
from engine.runtime import queries
from engine.runtime.engine import Engine, TaskView
from engine.runtime.queries import QueuedTask, QueueQuery, TaskQuery, WorkClaim, readable
from engine.runtime.shown import withheld_from

# -- values in display form ------------------------------------------------------------------------
#: ISO 4217 currencies whose minor unit is not a hundredth (the default exponent is 2).
_EXPONENT = {
    "BIF": 0,
    "CLP": 0,
    "DJF": 0,
    "GNF": 0,
    "ISK": 0,
    "JPY": 0,
    "KMF": 0,
    "KRW": 0,
    "PYG": 0,
    "RWF": 0,
    "UGX": 0,
    "VND": 0,
    "VUV": 0,
    "XAF": 0,
    "XOF": 0,
    "XPF": 0,
    "BHD": 3,
    "IQD": 3,
    "JOD": 3,
    "KWD": 3,
    "LYD": 3,
    "OMR": 3,
    "TND": 3,
}
#: The description `engine.tools.types.MinorUnits` gives a field: how a schema says "this is money".
_MINOR_UNITS_HINT = "in minor units"
_MONEY_SUFFIXES = ("_cents", "_minor", "_minor_units")


def format_money(minor: int, currency: str) -> str:
    """`4000, "EUR"` -> `40.00 EUR`; `1500, "JPY"` -> `1,500 JPY`; thousands separated."""
    exponent = _EXPONENT.get(currency.upper(), 2)
    sign = "-" if minor < 0 else ""
    whole, part = divmod(abs(minor), 10**exponent)
    text = f"{whole:,}" + (f".{part:0{exponent}d}" if exponent else "")
    return f"{sign}{text} {currency}"


def money_fields(schema: Mapping[str, Any] | None, names: Iterable[str]) -> set[str]:
    """The argument names that hold minor units: declared so in the JSON schema, or named `*_cents`/`*_minor`."""
    props = (schema or {}).get("properties", {})
    found = {n for n in names if n.endswith(_MONEY_SUFFIXES)}
    for name, prop in props.items():
        if isinstance(prop, dict) and _MINOR_UNITS_HINT in str(prop.get("description", "")):
            found.add(name)
    return found


@dataclass(frozen=True, slots=True)
class Shown:
    """One argument as shown: its name and its display text (money formatted, the rest as JSON)."""

    name: str
    text: str
    money: bool = False
    #: A page of this server the value links to (a task), if it is one.
    link: str | None = None


def display_arguments(arguments: Mapping[str, Any], schema: Mapping[str, Any] | None = None) -> list[Shown]:
    """Arguments in display form. Money needs a currency beside it (`currency` field, or a `{amount, currency}`)."""
    currency = arguments.get("currency") if isinstance(arguments.get("currency"), str) else None
    money = money_fields(schema, arguments)
    out: list[Shown] = []
    for name, value in arguments.items():
        if name in money and isinstance(value, int) and not isinstance(value, bool) and currency:
            out.append(Shown(name, format_money(value, currency), money=True))
        elif (
            isinstance(value, Mapping)
            and set(value) == {"amount", "currency"}
            and isinstance(value["amount"], int)
            and isinstance(value["currency"], str)
        ):
            out.append(Shown(name, format_money(value["amount"], value["currency"]), money=True))
        else:
            out.append(Shown(name, value if isinstance(value, str) else compact(value)))
    return out


def schema_of(model: type[BaseModel] | None) -> dict[str, Any] | None:
    """The model's JSON schema, built once per model (pydantic builds it anew on each call, about 1 ms)."""
    return _schema(model) if model is not None else None


@functools.lru_cache(maxsize=512)
def _schema(model: type[BaseModel]) -> dict[str, Any]:
    return model.model_json_schema()


def when(at: datetime) -> str:
    return at.strftime("%Y-%m-%d %H:%M:%S UTC")


@dataclass(frozen=True, slots=True)
class Row:
    """One event of the timeline as the task page and the inbox show it."""

    seq: int
    at: str
    actor: str
    from_state: str
    trigger: str
    to_state: str
    code: str | None
    summary: str
    #: The sentences under the line (`engine.core.summary.details`), the event as JSON, and a mark for the steps
    #: a reader looks for (`recovered`, `repair`, `approval`, `cancel`, `migration`), if it is one.
    details: list[str] = field(default_factory=list)
    raw: str = ""
    mark: str | None = None
    #: A model turn's rung and whether it answered the first ask (`engine.core.quality.turn_tag`), if it is one.
    turn: str | None = None
    #: What people read (`Workflow.labels`, identifiers as the fallback): the trigger, the states, the code's
    #: one-line meaning (`Code.reference`, the table of docs/errors.md) and the instant for `<time datetime>`.
    trigger_label: str = ""
    from_label: str = ""
    to_label: str = ""
    code_label: str = ""
    code_meaning: str = ""
    at_iso: str = ""
    #: Arguments and results as `label: value` rows (the JSON stays behind the raw event's disclosure).
    fields: list[tuple[str, str]] = field(default_factory=list)
    #: A person's note (`comment`), shown as what they wrote.
    note: str = ""


#: How much of an event's summary the timeline and the inbox show.
TIMELINE_WIDTH = 160


def _mark(e: Event) -> str | None:
    if e.data.get("reconciled") is True or "settled" in e.data:
        return "recovered"
    if "approval" in e.data:
        return "approval"
    if e.trigger in (CANCEL, CANCEL_REQUESTED):
        return "cancel"
    if e.trigger == MIGRATE:
        return "migration"
    if e.trigger == "repair":
        return "repair"
    return None


def code_meaning(code: str | None) -> str:
    """A code's one-line meaning: the reference text `docs/errors.md` is generated from (`Code.reference`), to its
    first sentence; empty for a code Railyard does not define."""
    if not code or code not in Code.__members__:
        return ""
    text = Code[code].reference
    first = re.split(r"(?<=[.;])\s", text, maxsplit=1)[0]
    return first.rstrip(";")


def why_line(definition: Workflow, event: Event, *, values: bool = True) -> str:
    """Why a task waits, led by the reason a person reads: for a step with a code (a failed payment, a hand-off),
    the workflow's label for the code, else the tool's own message, else the code's meaning, then the step and the
    code itself last; otherwise the step in words."""
    code = event_code(event.data)
    step = definition.labels.for_action(event.trigger)
    said = summarise(event, TIMELINE_WIDTH) if values else ""
    if not code:
        return f"{step} — {said}" if said else step
    outcome = event.data.get("outcome")
    message = outcome.get("message") if isinstance(outcome, Mapping) and values else None
    reason = definition.labels.codes.get(code) or message or code_meaning(code) or code
    return f"{reason} — {step}" + (f": {said}" if said else "") + f" ({code})"


def value_text(value: Any) -> str:
    """A value as a person reads it in a `label: value` row: text as itself, lists joined, the rest compact."""
    if isinstance(value, str):
        return value
    if isinstance(value, bool) or value is None:
        return {True: "yes", False: "no", None: "none"}[value]
    if isinstance(value, int | float):
        return str(value)
    if isinstance(value, list) and all(isinstance(v, str | int | float) for v in value):
        return ", ".join(str(v) for v in value) or "none"
    return compact(value, 200)


def event_fields(e: Event, labels: Labels) -> list[tuple[str, str]]:
    """An event's arguments and a tool's result as `label: value` rows: what a person reads instead of JSON."""
    data = e.data
    values: Any = data.get("args")
    if values is None and (intent := data.get("intent")) is not None:
        values = intent.get("arguments")
    if values is None and (outcome := data.get("outcome")) is not None:
        values = outcome.get("result")
    if not isinstance(values, Mapping):
        return []
    return [(labels.for_field(str(k)), value_text(v)) for k, v in values.items()]


def timeline(events: Iterable[Event], labels: Labels | None = None) -> list[Row]:
    events = list(events)
    words = labels or Labels()
    out = []
    for n, e in enumerate(events):
        code = event_code(e.data)
        shown = event_fields(e, words)
        note = e.data.get("note") if e.trigger == COMMENT else None
        out.append(
            Row(
                e.seq,
                when(e.at),
                e.actor,
                e.from_state or "",
                e.trigger,
                e.to_state,
                code,
                # With fields shown as rows, the line says what the step was, not its JSON again.
                summarise(e, TIMELINE_WIDTH, values=not shown),
                details(e, earlier=events[:n] if e.data.get("reconciled") is True else ()),  # only these read it
                json.dumps(e.to_dict(), indent=2, ensure_ascii=False, default=str),
                _mark(e),
                tag.label if (tag := turn_tag(e)) is not None else None,
                trigger_label=words.for_action(e.trigger),
                from_label=words.for_state(e.from_state.split(SUBSTATE)[0]) if e.from_state else "",
                to_label=words.for_state(e.to_state),
                code_label=words.for_code(code) if code else "",
                code_meaning=code_meaning(code),
                at_iso=format_instant(e.at),
                fields=shown,
                note=str(note.get("text", "")) if isinstance(note, Mapping) else "",
            )
        )
    return out


@dataclass(frozen=True, slots=True)
class Stay:
    """One visit to a state, as the timeline groups it: the events that happened while the task was there (its
    internal `~` states are part of it), the last of which took it elsewhere."""

    state: str
    rows: list[Row]
    #: The state as people read it (its label, `Workflow.labels`).
    label: str = ""

    @property
    def span(self) -> str:
        first, last = self.rows[0], self.rows[-1]
        return f"seq {first.seq}" if first is last else f"seq {first.seq} to {last.seq}"


def stays(rows: Iterable[Row]) -> list[Stay]:
    out: list[Stay] = []
    for row in rows:
        where = row.from_state.split(SUBSTATE)[0] if row.from_state else "started"
        if out and out[-1].state == where:
            out[-1].rows.append(row)
        else:
            out.append(Stay(where, [row], row.from_label or where))
    return out


def path_of(events: Iterable[Event]) -> tuple[list[dict[str, Any]], Counter[tuple[str, str, str]], str | None]:
    """The transitions taken (in order), how often each edge was taken, and the state the task ended in."""
    events = list(events)
    visits, current = path_visits(events)
    steps = [
        {"seq": e.seq, "from_state": e.from_state, "trigger": e.trigger, "to_state": e.to_state}
        for e in events
        if e.from_state is not None
    ]
    return steps, visits, current


@dataclass(frozen=True, slots=True)
class Evidence:
    """What the tools returned: the facts the guards read and the approver should see."""

    tool: str
    fields: list[Shown]
    #: When it was read: the time of the event that recorded the result (an approver sees how old it is).
    read_at: str | None = None


def evidence(
    facts: Mapping[str, Any], events: Iterable[Event] = (), definition: Workflow | None = None
) -> list[Evidence]:
    """Each tool's latest result, with its money shown as money (the result model says which fields are) and
    the time it was read."""
    read: dict[str, str] = {}
    for e in events:
        result = e.data.get("tool_result")
        if result is not None:
            read[str(result.get("tool"))] = when(e.at)
    tools = definition.tools if definition is not None else None
    out = []
    for key, value in facts.items():
        if key.startswith("tool:") and isinstance(value, Mapping):
            name = key.removeprefix("tool:")
            model = tools.get(name).result if tools is not None and name in tools else None
            out.append(Evidence(name, display_arguments(value, schema_of(model)), read.get(name)))
    return out


@dataclass(frozen=True, slots=True)
class Reason:
    """Why the model proposed the call: the `reason` it gave as an argument, and what it wrote in that turn."""

    argument: str | None
    text: list[str] = field(default_factory=list)
    proposed_by: str | None = None
    seq: int | None = None
    at: str | None = None
    #: The role a person proposed it with, standing in for the model (None: the model proposed it).
    stood_in: str | None = None


def model_reason(events: Iterable[Event], digest: str | None) -> Reason:
    """From the event that prepared the call awaiting approval (the newest one carrying its digest)."""
    proposing: Event | None = None
    for e in events:
        prepared = e.data.get("prepared")
        if isinstance(prepared, Mapping) and (digest is None or prepared.get("digest") == digest):
            proposing = e
    if proposing is None:
        return Reason(None)
    raw = proposing.data.get("args")
    args: Mapping[str, Any] = raw if isinstance(raw, Mapping) else {}
    argument = next((str(args[k]) for k in ("reason", "rationale", "justification") if k in args), None)
    turn = proposing.data.get("turn")
    messages = (turn.get("messages") if turn is not None else None) or []
    text = [
        str(m.get("content"))
        for m in messages
        if isinstance(m, Mapping) and m.get("role") == "assistant" and m.get("content")
    ]
    stood_in = proposing.data.get("stood_in")
    role = stood_in.get("role") if isinstance(stood_in, Mapping) else None
    return Reason(argument, text, proposing.actor, proposing.seq, when(proposing.at), role)


# -- the task lists --------------------------------------------------------------------------------
#: The page size of the task lists unless `limit` says otherwise, and the most a page may hold.
PAGE_SIZE = 50
MAX_LIMIT = 500
#: What a search box entry must look like to be tried as a task id prefix too (task ids are UUIDs).
_ID_PREFIX = re.compile(r"^[0-9a-fA-F-]{1,36}$")
_CURSOR_PREFIX = "t1."
#: What separates a state from its generated sub-states (`S~force`, `S~handoff`, `S~provider_error`).
SUBSTATE = "~"


@dataclass(frozen=True, slots=True)
class TaskFilter:
    """A task list request as the API and the page take it: every value as the caller sent it."""

    workflow: str | None = None
    #: A public state matches its internal `~` sub-states too; a state named with `~` matches only itself.
    state: str | None = None
    status: str | None = None
    started_by: str | None = None
    #: A date (`2026-12-01`, UTC) or an ISO 8601 date-time: created at or after it.
    created_from: str | None = None
    #: A date: created on or before that day; a date-time: created before it.
    created_to: str | None = None
    #: A task id prefix, or the whole value of a searchable input field (a customer id, an order id).
    q: str | None = None
    cursor: str | None = None
    limit: int = PAGE_SIZE


@dataclass(frozen=True, slots=True)
class ListedTask:
    task_id: str
    workflow: str
    version: int
    state: str
    status: str
    seq: int
    created_at: datetime
    updated_at: datetime
    started_by: str
    fields: dict[str, str]


@dataclass(frozen=True, slots=True)
class TaskList:
    tasks: list[ListedTask]
    limit: int
    #: The cursor of the next page (None: this is the last one).
    next_cursor: str | None


def encode_cursor(task_id: str) -> str:
    """Opaque to clients: the id of a page's last task, so the next page starts after it."""
    return _CURSOR_PREFIX + base64.urlsafe_b64encode(task_id.encode()).decode().rstrip("=")


def decode_cursor(cursor: str) -> str:
    refused = Refused("the cursor is not one this server gave: start from the first page", code=Code.PAYLOAD_INVALID)
    if not cursor.startswith(_CURSOR_PREFIX) or len(cursor) > 200:
        raise refused
    text = cursor.removeprefix(_CURSOR_PREFIX)
    try:
        task_id = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)).decode()
    except (ValueError, UnicodeDecodeError):
        raise refused from None
    if not re.fullmatch(TASK_ID_PATTERN, task_id):
        raise refused
    return task_id


def parse_when(text: str | None, *, end: bool) -> datetime | None:
    """A filter bound in UTC: a date is its midnight (for `end`, the next day's); a naive date-time is UTC."""
    if text is None or not text.strip():
        return None
    value = text.strip()
    try:
        if len(value) == 10:
            day = date.fromisoformat(value)
            return datetime(day.year, day.month, day.day, tzinfo=UTC) + (timedelta(days=1) if end else timedelta())
        if "T" not in value and " " not in value:  # `20261201` or `2026-W48` are not the forms this takes
            raise ValueError(value)
        at = datetime.fromisoformat(value.replace("Z", "+00:00"))
        return at.replace(tzinfo=UTC) if at.tzinfo is None else at.astimezone(UTC)
    except (ValueError, OverflowError):  # past the calendar's ends (9999-12-31 + a day, year 1 at +14:00)
        raise Refused(
            f"{value[:40]!r} is not a date (2026-12-01) or an ISO 8601 date-time (2026-12-01T09:30:00Z) "
            "within the years 1 to 9999",
            code=Code.PAYLOAD_INVALID,
        ) from None


def public_states(registry: Iterable[Workflow]) -> list[str]:
    """The states people filter by: the declared ones (and `cancelled`, `limit_exceeded`), no internal `~` ones."""
    return sorted({s.name for wf in registry for s in wf.states})


def states_of(registry: Iterable[Workflow], state: str) -> tuple[str, ...]:
    """A public state and its internal sub-states (`S~force`, ...): a task in one of them is, to a person, in S."""
    if SUBSTATE in state:
        return (state,)
    inner = {s.name for wf in registry for s in wf.all_states if s.name.startswith(state + SUBSTATE)}
    return (state, *sorted(inner))


def task_query(engine: Engine, where: TaskFilter) -> TaskQuery:
    """The store's query for the task list's filters and search (no cursor, no page size): the page's, the
    API's and the CSV export's alike."""
    q = (where.q or "").strip()
    return TaskQuery(
        workflow=where.workflow or None,
        states=states_of(engine.registry, where.state) if where.state else (),
        status=where.status or None,
        started_by=(where.started_by or "").strip() or None,
        created_from=parse_when(where.created_from, end=False),
        created_before=parse_when(where.created_to, end=True),
        id_prefix=q.lower() if _ID_PREFIX.match(q) else None,
        field_value=q or None,
    )


def list_tasks(engine: Engine, where: TaskFilter, caller: Caller | None = None) -> TaskList:
    """One page of tasks, newest first; one keyset query (and one for the page's fields) however many exist.
    Only the tasks `caller` may read are listed (`runtime.queries.readable`; None: the trusted process)."""
    limit = max(1, min(where.limit, MAX_LIMIT))
    after = decode_cursor(where.cursor) if where.cursor else None
    if after is not None and not queries.exists(engine, after, caller):
        raise Refused("the cursor names no task here: start from the first page", code=Code.PAYLOAD_INVALID)
    query = replace(task_query(engine, where), after=after, limit=limit + 1)
    rows = queries.list_tasks(engine, query, caller)
    shown = [
        ListedTask(
            t.row.task_id,
            t.row.workflow,
            t.row.version,
            t.row.state,
            t.row.status,
            t.row.seq,
            t.row.created_at,
            t.row.updated_at,
            t.started_by,
            t.fields,
        )
        for t in rows[:limit]
    ]
    more = len(rows) > limit
    return TaskList(shown, limit, encode_cursor(shown[-1].task_id) if more and shown else None)


# -- diagrams --------------------------------------------------------------------------------------
def diagram_children(definition: Workflow) -> list[dict[str, Any]]:
    """The child states a diagram draws with the workflow each starts: what the pages link to (`/workflows/NAME`)."""
    return [
        {"state": state, "workflow": name, "version": version}
        for state, (name, version) in definition.machine.child_workflows().items()
    ]


def workflow_diagram(definition: Workflow) -> dict[str, Any]:
    return {
        "workflow": definition.name,
        "version": definition.version,
        "format": "mermaid",
        "diagram": definition.machine.graph("mermaid"),
        "current": None,
        "path": [],
        "children": diagram_children(definition),
    }


def task_diagram(definition: Workflow, events: Iterable[Event]) -> dict[str, Any]:
    steps, visits, current = path_of(events)
    diagram = definition.machine.graph("mermaid", current=current, visits=visits)
    return {
        "workflow": definition.name,
        "version": definition.version,
        "format": "mermaid",
        "diagram": diagram,
        "current": current,
        "path": steps,
        "children": diagram_children(definition),
    }


# -- the inbox and the task page -------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class ApprovalView:
    task_id: str
    workflow: str
    state: str
    #: The seq the page was rendered at: the forms send it back, so a decision lands only on the task as shown.
    seq: int
    role: str
    started_by: str
    proposed_by: str | None
    digest: str | None
    tool: str | None
    kind: str | None
    arguments: list[Shown]
    evidence: list[Evidence]
    reason: Reason
    timeline: list[Row]
    decisions: list[str]
    can_decide: bool
    why_not: str | None = None
    #: Exactly the triggers this person may fire here, each with its form (`buttons`).
    buttons: list[Button] = field(default_factory=list)
    #: What the workflow declares this decision shows first (or the default: the input).
    card: Card | None = None
    #: The state as people read it (`Workflow.labels`).
    state_label: str = ""

    @property
    def subject(self) -> str:
        """What a decision is about, for the buttons' accessible names: "refund of 40.00 EUR for task 1d1b2c3d…"."""
        money = next((a.text for a in self.arguments if a.money), None)
        what = self.workflow.partition("@")[0].replace("_", " ") + (f" of {money}" if money else "")
        return f"{what} for task {self.task_id[:8]}…"


@dataclass(frozen=True, slots=True)
class TaskPage:
    view: TaskView
    timeline: list[Row]
    diagram: dict[str, Any]
    approval: ApprovalView | None
    input: list[Shown] = field(default_factory=list)
    #: The route drawn (`engine.api.route`), the stays it lists, and whether internal states are shown apart.
    route: Markup = field(default_factory=Markup)
    visits: list[Visit] = field(default_factory=list)
    internal: bool = False
    #: The triggers this person may fire now (outside an approval card, which carries its own).
    buttons: list[Button] = field(default_factory=list)
    #: Who started it, how long it has waited and its deadline, if it waits on a person.
    work: WorkItem | None = None
    #: Whether this person may add a note (they act, and the task has not ended), and whether notes reach the model.
    may_note: bool = False
    notes_to_model: bool = False
    #: The state as people read it (`Workflow.labels`).
    state_label: str = ""


def why_not(principal: Principal, definition: Workflow, task: TaskState) -> str | None:
    """Why this principal will be refused an approval of `task` (None: the buttons are offered)."""
    if principal.read_only:
        return "your token is read-only (auditor)"
    role = decision_role(definition, task.state, "approve")
    if not holds(principal.roles, role):
        return f"deciding needs the role {role!r}, which you do not hold"
    if self_approval(definition, task, principal.actor):
        return "you started this task or proposed the call: someone else must approve it (you may reject it)"
    return None


def approval_view(
    engine: Engine, definition: Workflow, task: TaskState, events: list[Event], principal: Principal
) -> ApprovalView | None:
    state = definition.state(task.state)
    if not isinstance(state, Approval) or task.terminal:
        return None
    prepared: Mapping[str, Any] = task.prepared or {}
    tool_args = None
    if prepared and definition.tools is not None and prepared.get("tool") in definition.tools:
        tool_args = definition.tools.get(str(prepared["tool"])).args
    pending = pending_view(definition, task)  # what `railyard approvals` and GET /api/approvals show
    digest = pending["digest"]
    refusal = why_not(principal, definition, task)
    return ApprovalView(
        task_id=pending["task_id"],
        workflow=pending["workflow"],
        state=pending["state"],
        state_label=definition.labels.for_state(str(pending["state"])),
        seq=task.seq,
        role=pending["role"],
        started_by=pending["started_by"],
        proposed_by=pending["proposed_by"],
        digest=digest,
        tool=prepared.get("tool"),
        kind=prepared.get("kind"),
        arguments=(
            display_arguments(prepared.get("arguments") or {}, schema_of(tool_args))
            if prepared
            else proposed_arguments(definition, task, events)
        ),
        evidence=evidence(task.facts, events, definition),
        card=decision_card(definition, task, events),
        reason=model_reason(events, digest),
        timeline=timeline(events, definition.labels),
        decisions=pending["decisions"],
        can_decide=refusal is None,
        why_not=refusal,
        buttons=buttons(definition, task, principal),
    )


def proposed_arguments(definition: Workflow, task: TaskState, events: list[Event]) -> list[Shown]:
    """Without a prepared call, what is decided on is what the step into this state was fired with (an expense
    claim's amount and description), shown with its model's formats."""
    for e in reversed(events):
        args = e.data.get("args")
        if e.to_state == task.state and e.from_state is not None and isinstance(args, Mapping):
            found = definition.candidates(e.from_state, e.trigger) if definition.has_state(e.from_state) else ()
            return display_arguments(args, schema_of(found[0].args if found else None))
    return []


def as_shown(
    engine: Engine, task: TaskState, events: list[Event], principal: Principal
) -> tuple[TaskState, list[Event]]:
    """The task and its log as this person is shown them: without what its workflow restricts from them."""
    hidden = withheld_from(engine, principal.caller, task, events)
    if hidden is None:
        return task, events
    events = hidden.events(events)
    return hidden.task(task), events


def task_page(engine: Engine, task_id: str, principal: Principal, *, internal: bool = False) -> TaskPage:
    task = engine.load(task_id)
    definition = engine.definition_of(task)
    task, events = as_shown(engine, task, engine.events_of(task), principal)
    approval = approval_view(engine, definition, task, events, principal)
    steps = [e for e in events if not is_remark(e)]  # the route and the path are of transitions: notes are not steps
    return TaskPage(
        view=queries.waiting_for_quota(engine, engine.view(task)),
        timeline=timeline(events, definition.labels),
        diagram=task_diagram(definition, steps),
        approval=approval,
        input=display_arguments(task.input, schema_of(definition.input)),
        route=task_route(definition, steps, internal=internal),
        visits=visits_of(steps, internal=internal),
        internal=internal,
        buttons=[]
        if approval is not None
        else [
            *buttons(definition, task, principal),
            *_redrive(definition, task, events, principal),
        ],
        work=work_of(engine, definition, task, events, principal, datetime.now(UTC), approval),
        may_note=not principal.read_only and not task.terminal,
        notes_to_model=definition.notes_to_model,
        state_label=definition.labels.for_state(task.state),
    )


#: The period the workflow page's quality figures cover, ending now.
QUALITY_DAYS = 7


@dataclass(frozen=True, slots=True)
class StateQuality:
    """One state of a workflow as its page shows it: the model's turns there (a row per version, model and rung)
    and the time tasks spent in it (a row per version), over the last `QUALITY_DAYS` days."""

    name: str
    kind: str
    description: str
    turns: list[dict[str, Any]]
    visits: list[dict[str, Any]]
    #: A child state's child workflow (name, version; None: the newest at the start), linked to its page.
    starts: tuple[str, int | None] | None = None


@dataclass(frozen=True, slots=True)
class WorkflowPage:
    name: str
    version: int
    description: str
    since: str
    states: list[StateQuality]


def workflow_page(engine: Engine, name: str, caller: Caller, at: datetime) -> WorkflowPage:
    """The newest version of `name` with each state's quality figures (`engine.core.quality`) of the last
    `QUALITY_DAYS` days, counted over the tasks `caller` may read (the caller's read scope, as an export made for
    them): the same figures `railyard quality --workflow NAME --since ... --as PERSON` prints."""
    from engine.audit.quality import read_quality
    from engine.core.profiles import load_profiles, profile_prices
    from engine.runtime.shown import readable_logs

    definition = engine.registry.get(name)
    since = at - timedelta(days=QUALITY_DAYS)
    bounds = queries.scope(engine, caller)
    figures = read_quality(
        engine.audit,
        workflow=name,
        since=since,
        until=at,
        readable=lambda logs: readable_logs(logs, bounds),
        prices=profile_prices(load_profiles()),
    )
    shown = figures.to_dict()
    states = [
        StateQuality(
            state.name,
            str(state.kind),
            getattr(state, "description", ""),
            [row for row in shown["turns"] if row["state"] == state.name],
            # Its generated wait states (`S~handoff`, `S~provider_error`) with it: their waits are its cost too.
            [row for row in shown["states"] if row["state"].partition("~")[0] == state.name],
            definition.machine.child_workflows().get(state.name),
        )
        for state in definition.states
        if not state.name.startswith("~")
    ]
    return WorkflowPage(definition.name, definition.version, definition.description, when(since), states)


# -- templates -------------------------------------------------------------------------------------
TEMPLATES = Path(__file__).parent / "templates"
STATIC = Path(__file__).parent / "static"

_env = jinja2.Environment(
    loader=jinja2.FileSystemLoader(str(TEMPLATES)),
    autoescape=True,
    undefined=jinja2.StrictUndefined,
    trim_blocks=True,
    lstrip_blocks=True,
)
templates = Jinja2Templates(env=_env)


_TASK_PATH = re.compile(r"^/tasks/([A-Za-z0-9][A-Za-z0-9_.:-]{0,63})/")


def back_to(path: str) -> str | None:
    """The page an error page links back to: the task a refused form (`/tasks/ID/approve`) was about."""
    found = _TASK_PATH.match(path)
    return f"/tasks/{found.group(1)}" if found else None


def render(request: Request, name: str, status_code: int = 200, **values: Any) -> HTMLResponse:
    """A page. A GET shows the session's flash message (and clears it); an error page keeps the header of the
    session it was shown in and links back to the page it came from."""
    if name == "error.html":
        if values.get("session") is None:
            values["session"] = _session_or_none(request)
        values.setdefault("back", back_to(request.url.path))
    session = values.get("session")
    if "flash" not in values:
        values["flash"] = session.take_flash() if isinstance(session, Session) and request.method == "GET" else None
    if "paused_models" not in values:
        signed_in = isinstance(session, Session)
        values["paused_models"] = queries.paused_models(request.app.state.railyard.engine) if signed_in else []
    return templates.TemplateResponse(request, name, values, status_code=status_code)


def refused_command(request: Request, code: str, message: str) -> Response | None:
    """A page command refused after its origin and CSRF checks passed (its fields did not validate): the refusal
    goes to the session's flash and the answer is a redirect to the task, like every other command's (None: not
    a page command of a session, answer with the error page)."""
    back = back_to(request.url.path)
    session = _session_or_none(request) if request.method == "POST" and back is not None else None
    if session is None or back is None:
        return None
    session.flash(Flash("refused", message, code))
    return RedirectResponse(back, status_code=303)


def _session_or_none(request: Request) -> Session | None:
    """The session of a request being answered with an error: none if it has none, or the store is what failed."""
    try:
        return current_session(request)
    except (RailyardError, AttributeError, KeyError):
        return None


# -- the work queue: every task waiting on a person, and the buttons a person may press ------------
#: What each kind is called on the page, in the order the groups are listed.
KIND_LABELS = {
    WorkKind.APPROVAL: "Approvals",
    WorkKind.HANDOFF: "Hand-offs",
    WorkKind.FAILURE: "Failures to retry",
    WorkKind.LIMIT: "Limits reached",
    WorkKind.CANCEL_REVIEW: "Effects after a cancel",
    WorkKind.WAIT: "Waiting on a person",
}
#: The ages the queue can be filtered by: waiting (since its last event) longer than this.
AGES = {"1h": timedelta(hours=1), "4h": timedelta(hours=4), "1d": timedelta(days=1), "3d": timedelta(days=3)}
AGE_LABELS = {"1h": "an hour", "4h": "4 hours", "1d": "a day", "3d": "3 days"}
#: The queue's page size, and the most an API page may hold: each item is a task loaded from its log.
WORK_PAGE_SIZE = 50
WORK_MAX_LIMIT = 100


def work_kind(definition: Workflow, state: str) -> WorkKind | None:
    """What waiting in `state` is, read from the definition alone (None: not a person's work).

    A wait state reached by a tool's `failed`/`unknown` outcome is a failure; one an agent hands off to (its
    `~handoff`, `~provider_error`, `on_exhausted` or `on_provider_error`) or a deadline expires into is a hand-off;
    the others count only if a caller may fire one of their triggers besides `cancel`."""
    if not definition.has_state(state):
        return None
    found = definition.state(state)
    if isinstance(found, Approval):
        return WorkKind.APPROVAL
    if not isinstance(found, Wait):
        return None
    if state == (definition.limit_state or LIMIT_STATE):
        return WorkKind.LIMIT
    if state == definition.effect_after_cancel:
        return WorkKind.CANCEL_REVIEW
    if not [t for t in definition.triggers(state) if t != CANCEL]:
        return None
    if state.endswith((HANDOFF_SUFFIX, PROVIDER_ERROR_SUFFIX)):
        return WorkKind.HANDOFF
    for source in definition.all_states:
        if isinstance(source, Tool) and state in (source.on_failed, source.on_unknown):
            return WorkKind.FAILURE
    for source in definition.all_states:
        if isinstance(source, Agent) and state in (source.on_exhausted, source.on_provider_error):
            return WorkKind.HANDOFF
        if isinstance(source, Approval | Wait) and source.on_expired == state:
            return WorkKind.HANDOFF
    return WorkKind.WAIT


def queue_triggers(definition: Workflow, state: str) -> list[str]:
    """The triggers that make a task in `state` someone's work: its human triggers but `cancel` (every state has
    it), except where a budget ran out and cancelling is what a person decides."""
    human = definition.triggers(state)
    if work_kind(definition, state) is WorkKind.LIMIT:
        return human
    return [t for t in human if t != CANCEL]


def may_fire(definition: Workflow, state: str, trigger: str, principal: Principal) -> bool:
    """Whether `principal` may fire `trigger` in `state`, as the one authorisation point says (the engine asks it
    again when the trigger is fired, and its answer counts)."""
    return access.may_fire(definition, state, trigger, principal.caller)


@dataclass(frozen=True, slots=True)
class FormField:
    """One field of a trigger's form, generated from its argument model's JSON schema."""

    name: str
    label: str
    #: `text`, `textarea`, `number`, `checkbox`, `select`, `list` (comma-separated) or `json`.
    widget: str
    required: bool
    description: str = ""
    options: tuple[str, ...] = ()
    max_length: int | None = None


def form_fields(model: type[BaseModel] | None) -> list[FormField]:
    """The fields of an argument model as form inputs: what a person types is checked by the model when posted."""
    schema = schema_of(model) or {}
    required = set(schema.get("required", []))
    out = []
    for name, raw in schema.get("properties", {}).items():
        prop = _non_null(raw, schema.get("$defs", {}))
        kind, enum = prop.get("type"), prop.get("enum")
        widget = "json"
        if enum is not None or "const" in prop:
            widget = "select"
        elif kind == "string":
            widget = "textarea" if int(prop.get("maxLength", 0) or 0) > 200 or "maxLength" not in prop else "text"
        elif kind in ("integer", "number"):
            widget = "number"
        elif kind == "boolean":
            widget = "checkbox"
        elif kind == "array" and _non_null(prop.get("items", {}), schema.get("$defs", {})).get("type") == "string":
            widget = "list"
        options = tuple(str(o) for o in (enum or ([prop["const"]] if "const" in prop else [])))
        out.append(
            FormField(
                name,
                str(prop.get("title") or raw.get("title") or name.replace("_", " ")).capitalize(),
                widget,
                name in required,
                str(prop.get("description") or raw.get("description") or ""),
                options,
                prop.get("maxLength"),
            )
        )
    return out


def _non_null(prop: Mapping[str, Any], defs: Mapping[str, Any]) -> Mapping[str, Any]:
    """`Optional[X]`'s X, and a `$ref` resolved: the type a form asks for."""
    if "$ref" in prop:
        prop = defs.get(str(prop["$ref"]).rsplit("/", 1)[-1], {})
    for key in ("anyOf", "oneOf"):
        if key in prop:
            kept = [p for p in prop[key] if p.get("type") != "null"]
            if len(kept) == 1:
                return {**{k: v for k, v in prop.items() if k != key}, **_non_null(kept[0], defs)}
    return prop


def payload_from_form(model: type[BaseModel] | None, form: Mapping[str, str]) -> dict[str, Any]:
    """A trigger's payload from its form (`arg.NAME` fields): typed as the model's schema says, empty optional
    fields left out. Whatever does not convert is refused here; the model's own checks come when it is fired."""
    out: dict[str, Any] = {}
    for f in form_fields(model):
        text = form.get(f"arg.{f.name}")
        if f.widget == "checkbox":
            out[f.name] = text is not None
            continue
        if text is None or not text.strip():
            if f.required:  # the model refuses it, with the field named
                out[f.name] = ""
            continue
        value = text.strip()
        try:
            if f.widget == "number":
                out[f.name] = int(value) if re.fullmatch(r"-?\d+", value) else float(value)
            elif f.widget == "list":
                out[f.name] = [v.strip() for v in re.split(r"[,\n]", value) if v.strip()]
            elif f.widget == "json":
                out[f.name] = json.loads(value)
            else:
                out[f.name] = value
        except ValueError:
            raise Refused(
                f"{f.label}: {value[:40]!r} is not a {'number' if f.widget == 'number' else 'JSON value'}",
                code=Code.PAYLOAD_INVALID,
                field=f.name,
            ) from None
    return out


@dataclass(frozen=True, slots=True)
class Button:
    """A human trigger the state allows and the person may fire: its form, where it leads, and whether it asks
    for a confirmation first (it leads to a write)."""

    trigger: str
    label: str
    #: Where the form posts: the decision endpoints for approve/reject of an approval, else the one for triggers.
    action: str
    #: What happens next, in words: "to Paying the refund: runs payments_refund (a write)", states by their labels.
    then: str
    fields: list[FormField]
    #: The write the confirmation restates (its tool and amount), or None: no confirmation.
    confirm: str | None = None
    style: str = ""
    #: Hidden values the form carries besides the seq and the CSRF token (the digest an approval names).
    hidden: dict[str, str] = field(default_factory=dict)
    #: How the form names its fields: `arg.NAME` for a trigger's payload, bare for a decision's comment.
    prefix: str = "arg."
    #: A button that stops the task for good (cancel): set apart from the decisions, with its own confirmation.
    danger: bool = False


#: Decision triggers whose comment the approval records (their models may not declare it).
_COMMENT_FIELD = {"approve": ("comment", "Comment"), "reject": ("reason", "Reason for rejecting")}


def _leads_to(definition: Workflow, target: str) -> tuple[str, str | None]:
    """Where an action leads, in words, and the write it runs there (None: no write)."""
    state = definition.state(target)
    named = definition.labels.for_state(target)
    if isinstance(state, Tool) and definition.tools is not None and state.tool in definition.tools:
        kind = str(definition.tools.get(state.tool).kind)
        then = f"to {named}: runs {state.tool} ({'a write' if kind == 'write' else 'a read'})"
        return then, state.tool if kind == "write" else None
    if state.kind is StateKind.TERMINAL:
        return f"ends the task: {named}", None
    return f"to {named} ({state.kind})" if named == target else f"to {named}", None


def buttons(definition: Workflow, task: TaskState, principal: Principal) -> list[Button]:
    """Exactly the human triggers the state allows and the roles let this person fire, in declaration order,
    each with its form; approving one's own request is left out (separation of duties)."""
    if task.terminal or principal.read_only:
        return []
    state = definition.state(task.state)
    triggers = [*definition.triggers(task.state), *([SETTLE] if task.unsettled is not None else [])]
    prepared: Mapping[str, Any] = task.prepared or {}
    money = next((a.text for a in _prepared_shown(definition, prepared) if a.money), None)
    out = []
    for trigger in triggers:
        if not may_fire(definition, task.state, trigger, principal):
            continue
        decision = isinstance(state, Approval) and trigger in DECISIONS
        if decision and trigger == "approve" and self_approval(definition, task, principal.actor):
            continue
        action = definition.candidates(task.state, trigger)[0]
        then, write = _leads_to(definition, action.target)
        if trigger == SETTLE:
            then = "records what you verified about the open write"
        fields = form_fields(action.args)
        hidden: dict[str, str] = {}
        if decision:
            name, label = _COMMENT_FIELD[trigger]
            fields = [FormField(name, label, "textarea", trigger == "reject" or bool(action.args), max_length=2000)]
            if trigger == "approve":
                hidden["digest"] = str(prepared.get("digest") or "")
        confirm = None
        if write is not None:
            confirm = f"runs {write}" + (f" for {money}" if money else "")
        if trigger == CANCEL:  # never one click away from a decision: its own group, style and confirmation
            confirm = "stops the task for good: nothing after it runs"
        out.append(
            Button(
                trigger,
                definition.labels.actions.get(trigger) or trigger.replace("_", " ").capitalize(),
                f"/tasks/{task.task_id}/{trigger}" if decision else f"/tasks/{task.task_id}/fire",
                then,
                fields,
                confirm,
                "ok"
                if trigger == "approve"
                else "no"
                if trigger == "reject"
                else "danger"
                if trigger == CANCEL
                else "",
                hidden,
                "" if decision else "arg.",
                danger=trigger == CANCEL,
            )
        )
    return out


def redrive_button(definition: Workflow, task: TaskState, events: list[Event], principal: Principal) -> Button | None:
    """The Send back button of a task handed to a person because its agent or tool states could not go on (a
    hand-off, a budget's limit): to one of the agent or tool states it was in that `Engine.redrive` would take,
    repeating no write, for someone holding the redrive role. The engine checks it all again when it is posted."""
    if task.terminal or principal.read_only or task.state not in definition.redrive_sources():
        return None
    if access.operator_refusal(definition, task.state, REDRIVE, principal.caller, task.task_id) is not None:
        return None
    if task.unsettled is not None:  # the engine refuses every redrive while a write's outcome is open
        return None
    carried = task.prepared["action_id"] if task.prepared else None
    targets = []
    for state in definition.states:
        entered = last_entry(events, state.name)
        if state.name not in definition.redrive_targets() or entered is None:
            continue
        if redrive_problem(definition, task, state.name, entered) is not None:
            continue
        if repeat_hazard(writes(events, entered), entered, carried, source_live=False) is None:
            targets.append(state.name)
    if not targets:
        return None
    fields = [
        FormField("to_state", "Send it back to", "select", True, options=tuple(targets)),
        FormField("reason", "Why", "textarea", True, max_length=500),
    ]
    writing = [t for t in targets if isinstance(definition.state(t), Tool) and _leads_to(definition, t)[1] is not None]
    confirm = (
        f"can run {', '.join(_leads_to(definition, t)[1] or '' for t in writing)} again (a write)" if writing else None
    )
    return Button(
        REDRIVE,
        "Send back",
        f"/tasks/{task.task_id}/redrive",
        "to the state chosen, its budgets started again (a redrive)",
        fields,
        confirm,
        "",
        {},
        "",
    )


def _redrive(definition: Workflow, task: TaskState, events: list[Event], principal: Principal) -> list[Button]:
    found = redrive_button(definition, task, events, principal)
    return [found] if found is not None else []


def _prepared_shown(definition: Workflow, prepared: Mapping[str, Any]) -> list[Shown]:
    tool_args = None
    if prepared and definition.tools is not None and prepared.get("tool") in definition.tools:
        tool_args = definition.tools.get(str(prepared["tool"])).args
    return display_arguments(prepared.get("arguments") or {}, schema_of(tool_args))


def ago(delta: timedelta) -> str:
    """A duration as people say it: `3 d 4 h`, `2 h 5 min`, `40 s`."""
    seconds = max(0, int(delta.total_seconds()))
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days} d {hours} h"
    if hours:
        return f"{hours} h {minutes} min"
    return f"{minutes} min" if minutes else f"{secs} s"


@dataclass(frozen=True, slots=True)
class WorkItem:
    """One task waiting on the signed-in person, as the inbox draws it and GET /api/work lists it."""

    task_id: str
    workflow: str
    version: int
    state: str
    kind: WorkKind
    seq: int
    started_by: str
    created_at: datetime
    #: When it started waiting here (the last event), and its deadline with what happens then.
    waiting_since: datetime
    deadline: datetime | None
    at_deadline: str | None
    #: Why it waits, in words: the summary of the event that brought it here.
    why: str
    fields: list[Shown]
    buttons: list[Button]
    #: The full decision card, for approvals.
    approval: ApprovalView | None = None
    card: Card | None = None
    #: What each tool returned last, and when it was read.
    evidence: list[Evidence] = field(default_factory=list)

    #: How long it has waited, as people say it (when the page was drawn).
    waited: str = ""
    #: The state as people read it (`Workflow.labels`).
    state_label: str = ""

    @property
    def subject(self) -> str:
        return f"{self.workflow} task {self.task_id[:8]}…"


@dataclass(frozen=True, slots=True)
class WorkCount:
    kind: WorkKind
    workflow: str
    #: Tasks the person may act on, and those waiting on roles they do not hold (not drawn).
    yours: int
    others: int


@dataclass(frozen=True, slots=True)
class QueueRow:
    """One row of the work queue's table, drawn from the task's row, its fields and the event at its head (one
    read for the whole page), never its log: what is asked, of whom, since when, until when, and who is on it."""

    task_id: str
    workflow: str
    version: int
    state: str
    kind: WorkKind
    #: The seq and (for an approval of a prepared call) the digest a decision on this row is made on.
    seq: int
    digest: str | None
    started_by: str
    created_at: datetime
    waiting_since: datetime
    deadline: datetime | None
    at_deadline: str | None
    #: What the person is asked, in words: "Approve or reject: payments_refund, 40.00 EUR".
    asked: str
    #: Why it waits, in words: the summary of the event that brought it here (withheld where it is restricted).
    why: str
    fields: dict[str, str]
    #: The triggers this person may fire here (the engine checks again when one is fired).
    triggers: list[str]
    claim: WorkClaim | None
    waited: str = ""
    #: The task that started this one, as its row names it ("ticket triage T-5001"); None: no child, or a parent
    #: of a workflow the reader may not read (its handle is withheld with it).
    chain: Chain | None = None
    #: The state in the words the workflow's labels give it (the identifier where it gives none).
    state_label: str = ""

    @property
    def subject(self) -> str:
        return f"{self.workflow.partition('@')[0].replace('_', ' ')} task {self.task_id[:8]}…"


@dataclass(frozen=True, slots=True)
class WorkPage:
    rows: list[QueueRow]
    #: The tasks the filters select (kind, workflow, age, search), by kind and workflow: the pages hold the `yours`.
    counts: list[WorkCount]
    limit: int
    next_cursor: str | None
    #: Yours per kind under the other filters (workflow, age), whatever kind is chosen: what choosing a kind finds.
    by_kind: dict[WorkKind, int] = field(default_factory=dict)
    #: The filters the counts are of, in words (empty: none, every task waiting on a person).
    filters: list[str] = field(default_factory=list)
    #: Which page this is (1: the first), counted along the cursors by the pages that link to the next one.
    page: int = 1
    sort: str = "deadline"
    descending: bool = False
    #: The item opened in place (its full card), if one was asked for and is still there to decide.
    opened: WorkItem | None = None

    def total(self) -> tuple[int, int]:
        """Of the tasks the filters select: those the person may act on (every page's), and those waiting on roles
        they do not hold (never listed)."""
        return sum(c.yours for c in self.counts), sum(c.others for c in self.counts)

    @property
    def pages(self) -> int:
        return max(1, -(-self.total()[0] // self.limit))

    @property
    def first_shown(self) -> int:
        """The position of the page's first row among all of them ("51-100 of 7,216")."""
        return (self.page - 1) * self.limit + 1 if self.rows else 0

    @property
    def last_shown(self) -> int:
        return (self.page - 1) * self.limit + len(self.rows)

    def claim_of(self, task_id: str) -> WorkClaim | None:
        """The live claim on a row of this page (None: nobody is on it, or it is not on this page)."""
        return next((r.claim for r in self.rows if r.task_id == task_id), None)

    def after(self, task_id: str) -> str | None:
        """The row after `task_id` on this page (then the first of the next page is the queue's to find)."""
        ids = [r.task_id for r in self.rows]
        return ids[ids.index(task_id) + 1] if task_id in ids and ids.index(task_id) + 1 < len(ids) else None


#: The orders the queue's columns sort by (`Store.queue_page`), and what each is called on the page.
SORT_LABELS = {
    "deadline": "deadline",
    "waiting": "waiting since",
    "created": "created",
    "workflow": "workflow",
    "state": "state",
}


#: A place a task can wait on a person in: its workflow, state and kind, and whether this person may act there.
QueuePlace = tuple[Workflow, str, WorkKind, bool]


def _queue_states(engine: Engine, principal: Principal) -> list[QueuePlace]:
    """Every (version, state) a task can wait on a person in, its kind, and whether this person may act there."""
    out = []
    names = readable(engine, principal.caller)
    for definition in engine.registry:
        if names is not None and definition.name not in names:
            continue  # what a person may not read is neither shown nor counted
        for state in definition.all_states:
            kind = work_kind(definition, state.name)
            if kind is None:
                continue
            mine = any(may_fire(definition, state.name, t, principal) for t in queue_triggers(definition, state.name))
            out.append((definition, state.name, kind, mine))
    return out


def queue_query(
    engine: Engine,
    principal: Principal,
    *,
    workflow: str | None,
    older_than: str | None,
    q: str,
    sort: str,
    descending: bool,
    at: datetime,
) -> tuple[list[QueuePlace], QueueQuery]:
    """The places the queue's filters select and the store query over all of them (the counts' query; the page
    lists only `listed_places`): one definition of the filters for the page, the API and the CSV export."""
    states = [
        (d, s, k, mine) for d, s, k, mine in _queue_states(engine, principal) if not workflow or d.name == workflow
    ]
    where = QueueQuery(
        places=[(d.name, d.version, s) for d, s, _k, _m in states],
        waiting_before=at - AGES[older_than] if older_than else None,
        id_prefix=q.lower() if q and _ID_PREFIX.match(q) else None,
        field_value=q or None,
        sort=sort,
        descending=descending,
        at=at,
    )
    return states, where


def listed_places(states: Iterable[QueuePlace], kind: str | None) -> list[tuple[str, int, str]]:
    """The places whose tasks are listed: those this person may act on (the others are only counted)."""
    return [(d.name, d.version, s) for d, s, k, mine in states if mine and (not kind or k == kind)]


def places_of(states: Iterable[QueuePlace]) -> dict[tuple[str, int, str], tuple[Workflow, WorkKind]]:
    return {(d.name, d.version, s): (d, k) for d, s, k, _m in states}


def work_queue(
    engine: Engine,
    principal: Principal,
    *,
    kind: str | None = None,
    workflow: str | None = None,
    older_than: str | None = None,
    q: str | None = None,
    sort: str = "deadline",
    descending: bool = False,
    cursor: str | None = None,
    page: int = 1,
    limit: int = WORK_PAGE_SIZE,
    opened: str | None = None,
) -> WorkPage:
    """One page of the tasks waiting on this person, in the order asked (nearest deadline first by default), then
    oldest (by creation, then id), with the counts per kind and workflow of the tasks the same filters select.

    Two statements whatever the queue holds: the page (`Store.queue_page`: rows, fields, head events, claims) and
    the counts (`Store.queue_counts`, the sums the database keeps per place). Tasks waiting on roles the person
    lacks are counted, never listed. `opened` is the one task whose full card is drawn in place (it alone is
    loaded with its log)."""
    limit = max(1, min(limit, WORK_MAX_LIMIT))
    sort = sort if sort in SORT_LABELS else "deadline"
    after = decode_cursor(cursor) if cursor else None
    if after is not None and not queries.exists(engine, after, principal.caller):
        raise Refused("the cursor names no task here: start from the first page", code=Code.PAYLOAD_INVALID)
    at = datetime.now(UTC)
    text = (q or "").strip()
    states, where = queue_query(
        engine, principal, workflow=workflow, older_than=older_than, q=text, sort=sort, descending=descending, at=at
    )
    found = queries.queue_counts(engine, where, principal.caller)
    counts: dict[tuple[WorkKind, str], list[int]] = {}
    for definition, state, k, mine in states:
        n = found.get((definition.name, definition.version, state), 0)
        if n:
            entry = counts.setdefault((k, definition.name), [0, 0])
            entry[0 if mine else 1] += n
    by_kind = {k: sum(n[0] for (of, _w), n in counts.items() if of is k) for k in WorkKind}
    listed = queries.queue_page(
        engine, replace(where, places=listed_places(states, kind), after=after, limit=limit + 1), principal.caller
    )
    by_place = places_of(states)
    rows = [queue_row(engine, by_place, t, principal, at) for t in listed[:limit]]
    more = len(listed) > limit
    order = list(WorkKind)
    shown = [
        WorkCount(k, w, yours, others)
        for (k, w), (yours, others) in sorted(counts.items(), key=lambda kv: (order.index(kv[0][0]), kv[0][1]))
        if not kind or k == kind
    ]
    filters = [
        *([f"kind {KIND_LABELS[WorkKind(kind)].lower()}"] if kind else []),
        *([f"workflow {workflow}"] if workflow else []),
        *([f"waiting longer than {AGE_LABELS[older_than]}"] if older_than else []),
        *([f"matching {text!r}"] if text else []),
    ]
    cut = encode_cursor(listed[limit - 1].row.task_id) if more else None
    item = None
    if opened and queries.exists(engine, opened, principal.caller):
        item = work_item(engine, opened, principal, at)
    return WorkPage(rows, shown, limit, cut, by_kind, filters, max(1, page), sort, descending, item)


def queue_row(
    engine: Engine,
    places: Mapping[tuple[str, int, str], tuple[Workflow, WorkKind]],
    found: QueuedTask,
    principal: Principal,
    at: datetime,
) -> QueueRow:
    """A queue row from the store's read of the task. What the event at its head says (why it waits, the call it
    prepared) is shown only to someone who may see its workflow's restricted fields, since the rest of the log
    that would tell which values to withhold is not read here; the digest is taken from the head too, and read
    from the task itself only in the rare case the head did not bring the task to its approval (an approval
    entered without preparing a call, an expense's, has none to name: loading each of those cost 4 ms a row)."""
    row = found.row
    definition, kind = places[(row.workflow, row.version, row.state)]
    head = found.head
    if head is not None and is_remark(head):  # a note or a claim says nothing of why the task waits: the last step does
        head = next((e for e in reversed(engine.history(row.task_id)) if not is_remark(e)), head)
    prepared = head.data.get("prepared") if head is not None else None
    prepared_by = head.actor if head is not None and isinstance(prepared, Mapping) else None
    if kind is WorkKind.APPROVAL and not isinstance(prepared, Mapping) and (head is None or head.to_state != row.state):
        try:
            task = engine.load(row.task_id)
        except RailyardError:
            task = None
        prepared = task.prepared if task is not None and task.seq == row.seq else None
        prepared_by = task.prepared_by if task is not None else None
    digest = str(prepared["digest"]) if isinstance(prepared, Mapping) and prepared.get("digest") else None
    open_to = access.sees_restricted(definition, principal.caller)
    state = definition.state(row.state)
    expires = state.on_expired if isinstance(state, Approval | Wait) else None
    # The buttons the card would offer (`buttons`, `redrive_button`), as far as the row tells: a settlement and
    # whether a redrive has a state to go back to are the log's to say, and the card's.
    triggers = [
        t
        for t in definition.triggers(row.state)
        if not principal.read_only
        and may_fire(definition, row.state, t, principal)
        and not (
            t == "approve"
            and isinstance(state, Approval)
            and not state.allow_self_approval
            and principal.actor in {found.started_by, prepared_by}
        )
    ]
    if (
        not principal.read_only
        and row.state in definition.redrive_sources()
        and access.operator_refusal(definition, row.state, REDRIVE, principal.caller, row.task_id) is None
    ):
        triggers.append(REDRIVE)
    asked = (
        " or ".join(definition.labels.actions.get(t) or t.replace("_", " ") for t in triggers).capitalize()
        or "Nothing you may do: read it"
    )
    if isinstance(prepared, Mapping) and open_to:
        money = next((a.text for a in _prepared_shown(definition, prepared) if a.money), None)
        asked += f": {prepared.get('tool')}" + (f", {money}" if money else "")
    why = why_line(definition, head, values=open_to) if head is not None else ""
    return QueueRow(
        task_id=row.task_id,
        workflow=definition.ref,
        version=row.version,
        state=row.state,
        state_label=definition.labels.for_state(row.state),
        kind=kind,
        seq=row.seq,
        digest=digest,
        started_by=found.started_by,
        created_at=row.created_at,
        waiting_since=row.updated_at,
        deadline=row.next_run_at if expires else None,
        at_deadline=f"goes to {expires}" if expires else None,
        asked=asked,
        why=why,
        fields=declared(found.fields),
        triggers=triggers,
        claim=found.claim,
        waited=ago(at - row.updated_at),
        chain=readable_chain(engine, found.fields, principal),
    )


def readable_chain(engine: Engine, fields: Mapping[str, str], principal: Principal) -> Chain | None:
    """The parent a queue row names, if the reader may read its workflow (its handle is a field of its input)."""
    chain = chain_of(fields)
    if chain is None:
        return None
    versions = [engine.registry.get(chain.workflow, v) for v in engine.registry.versions(chain.workflow)]
    return chain if versions and access.may_read(versions, principal.caller) else None


def work_item(engine: Engine, task_id: str, principal: Principal, at: datetime) -> WorkItem | None:
    try:
        task = engine.load(task_id)
    except Refused:
        return None
    definition = engine.definition_of(task)
    task, events = as_shown(engine, task, engine.events_of(task), principal)
    approval = approval_view(engine, definition, task, events, principal)
    return work_of(engine, definition, task, events, principal, at, approval)


def work_of(
    engine: Engine,
    definition: Workflow,
    task: TaskState,
    events: list[Event],
    principal: Principal,
    at: datetime,
    approval: ApprovalView | None,
) -> WorkItem | None:
    """The task as a piece of someone's work (None: it does not wait on a person)."""
    row = queries.row(engine, task.task_id)
    kind = work_kind(definition, task.state)
    if row is None or kind is None or task.terminal or not events:
        return None
    state = definition.state(task.state)
    expires = state.on_expired if isinstance(state, Approval | Wait) else None
    last = next((e for e in reversed(events) if not is_remark(e)), events[-1])  # why it waits: not a note
    return WorkItem(
        task_id=task.task_id,
        workflow=definition.ref,
        version=definition.version,
        state=task.state,
        state_label=definition.labels.for_state(task.state),
        kind=kind,
        seq=task.seq,
        started_by=task.started_by,
        created_at=row.created_at,
        waiting_since=row.updated_at,
        deadline=row.next_run_at if expires else None,
        at_deadline=f"goes to {expires}" if expires else None,
        why=why_line(definition, last),
        fields=display_arguments(task.input, schema_of(definition.input)),
        buttons=[*buttons(definition, task, principal), *_redrive(definition, task, events, principal)],
        approval=approval,
        card=decision_card(definition, task, events),
        evidence=evidence(task.facts, events, definition),
        waited=ago(at - row.updated_at),
    )


# -- decision cards: what a workflow declares a decision shows -------------------------------------
@dataclass(frozen=True, slots=True)
class Card:
    title: str
    facts: list[Shown]
    inputs: list[Shown]
    evidence: list[Shown]
    #: False: the workflow declares no card for the state, and this is the default (its input).
    declared: bool


_ABSENT = object()
_CURRENCY = re.compile(r"^[A-Z]{3}$")


def _read(path: str, sources: Mapping[str, Any]) -> Any:
    """The value at `path` (`input.customer_id`, `facts.tool:query_order.total`), or _ABSENT."""
    value: Any = sources
    for part in path.split("."):
        if not isinstance(value, Mapping) or part not in value:
            return _ABSENT
        value = value[part]
    return value


def card_value(f: CardField, sources: Mapping[str, Any]) -> Shown:
    """One field of a card in display form; a value not on record says so rather than showing `null`."""
    label = f.label or f.name.replace("_", " ")
    value = _read(f.path, sources)
    if value is _ABSENT or value is None:
        return Shown(label, "not on record")
    if f.format == "money" and isinstance(value, int) and not isinstance(value, bool):
        currency = f.currency if _CURRENCY.match(f.currency) else _read(f.currency, sources)
        if isinstance(currency, str):
            return Shown(label, format_money(value, currency), money=True)
    if f.format == "date" and isinstance(value, str):
        try:
            return Shown(label, when(datetime.fromisoformat(value.replace("Z", "+00:00")).astimezone(UTC)))
        except ValueError:
            pass
    if f.format == "task" and isinstance(value, str) and re.fullmatch(TASK_ID_PATTERN, value):
        return Shown(label, value, link=f"/tasks/{value}")
    return Shown(label, value if isinstance(value, str) and f.format != "json" else compact(value))


def decision_card(definition: Workflow, task: TaskState, events: list[Event]) -> Card:
    """The card the workflow declares for the task's state, read from the task; without one, a default: a title
    naming the workflow and the state, and the input (the prepared call and the evidence are always shown)."""
    declared = definition.cards.get(task.state)
    if declared is None:
        title = f"{definition.name.replace('_', ' ')} waiting in {task.state}"
        return Card(title, [], display_arguments(task.input, schema_of(definition.input)), [], False)
    step: Any = {}
    for e in reversed(events):
        if e.to_state == task.state and isinstance(e.data.get("args"), Mapping):
            step = e.data["args"]
            break
    prepared: Mapping[str, Any] = task.prepared["arguments"] if task.prepared else {}
    sources = {"input": task.input, "prepared": prepared, "facts": task.facts, "args": step}
    shown = {f.name: (f, card_value(f, sources)) for f in declared.fields}
    title = re.sub(
        r"{([^{}]*)}", lambda m: shown[m.group(1)][1].text if m.group(1) in shown else m.group(0), declared.title
    )
    by = {
        section: [v for f, v in shown.values() if f.section == section] for section in ("facts", "inputs", "evidence")
    }
    return Card(title, by["facts"], by["inputs"], by["evidence"], True)


#: What every template may call: the one time format, and the names of the kinds of work.
_env.globals.update(
    when=when,
    kinds=KIND_LABELS,
    stays=stays,
    ages=AGE_LABELS,
    sort_labels=SORT_LABELS,
    may_see_webhooks=access.may_see_webhooks,  # the menu asks the rule the page enforces, not a copy of it
)
