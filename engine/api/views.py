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
import re
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
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
from engine.api.schemas import TASK_ID_PATTERN
from engine.api.tokens import Principal
from engine.audit.reads import path_visits
from engine.core.approvals import decision_role, pending_view, self_approval
from engine.core.definition import Approval, Workflow
from engine.core.errors import Code, RailyardError, Refused
from engine.core.events import Event
from engine.core.fold import TaskState
from engine.core.payloads import event_code
from engine.core.summary import compact, summarise
from engine.runtime.engine import Engine, TaskView
from engine.store.protocol import TaskQuery

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
    return model.model_json_schema() if model is not None else None


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


#: How much of an event's summary the timeline and the inbox show.
TIMELINE_WIDTH = 160


def timeline(events: Iterable[Event]) -> list[Row]:
    return [
        Row(
            e.seq,
            when(e.at),
            e.actor,
            e.from_state or "",
            e.trigger,
            e.to_state,
            event_code(e.data),
            summarise(e, TIMELINE_WIDTH),
        )
        for e in events
    ]


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


def evidence(facts: Mapping[str, Any]) -> list[Evidence]:
    out = []
    for key, value in facts.items():
        if key.startswith("tool:") and isinstance(value, Mapping):
            out.append(Evidence(key.removeprefix("tool:"), display_arguments(value)))
    return out


@dataclass(frozen=True, slots=True)
class Reason:
    """Why the model proposed the call: the `reason` it gave as an argument, and what it wrote in that turn."""

    argument: str | None
    text: list[str] = field(default_factory=list)
    proposed_by: str | None = None
    seq: int | None = None


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
    return Reason(argument, text, proposing.actor, proposing.seq)


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
    created_at: str
    updated_at: str
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
        at = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise Refused(
            f"{value[:40]!r} is not a date (2026-12-01) or an ISO 8601 date-time", code=Code.PAYLOAD_INVALID
        ) from None
    return at.replace(tzinfo=UTC) if at.tzinfo is None else at.astimezone(UTC)


def public_states(registry: Iterable[Workflow]) -> list[str]:
    """The states people filter by: the declared ones (and `cancelled`, `limit_exceeded`), no internal `~` ones."""
    return sorted({s.name for wf in registry for s in wf.states})


def states_of(registry: Iterable[Workflow], state: str) -> tuple[str, ...]:
    """A public state and its internal sub-states (`S~force`, ...): a task in one of them is, to a person, in S."""
    if SUBSTATE in state:
        return (state,)
    inner = {s.name for wf in registry for s in wf.all_states if s.name.startswith(state + SUBSTATE)}
    return (state, *sorted(inner))


def list_tasks(engine: Engine, where: TaskFilter) -> TaskList:
    """One page of tasks, newest first; one keyset query (and one for the page's fields) however many exist."""
    limit = max(1, min(where.limit, MAX_LIMIT))
    after = decode_cursor(where.cursor) if where.cursor else None
    if after is not None and engine.store.row(after) is None:
        raise Refused("the cursor names no task here: start from the first page", code=Code.PAYLOAD_INVALID)
    q = (where.q or "").strip()
    query = TaskQuery(
        workflow=where.workflow or None,
        states=states_of(engine.registry, where.state) if where.state else (),
        status=where.status or None,
        started_by=(where.started_by or "").strip() or None,
        created_from=parse_when(where.created_from, end=False),
        created_before=parse_when(where.created_to, end=True),
        id_prefix=q.lower() if _ID_PREFIX.match(q) else None,
        field_value=q or None,
        after=after,
        limit=limit + 1,
    )
    rows = engine.store.list_tasks(query)
    shown = [
        ListedTask(
            t.row.task_id,
            t.row.workflow,
            t.row.version,
            t.row.state,
            t.row.status,
            t.row.seq,
            when(t.row.created_at),
            when(t.row.updated_at),
            t.started_by,
            t.fields,
        )
        for t in rows[:limit]
    ]
    more = len(rows) > limit
    return TaskList(shown, limit, encode_cursor(shown[-1].task_id) if more and shown else None)


# -- diagrams --------------------------------------------------------------------------------------
def workflow_diagram(definition: Workflow) -> dict[str, Any]:
    return {
        "workflow": definition.name,
        "version": definition.version,
        "format": "mermaid",
        "diagram": definition.machine.graph("mermaid"),
        "current": None,
        "path": [],
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


def why_not(principal: Principal, definition: Workflow, task: TaskState) -> str | None:
    """Why this principal will be refused an approval of `task` (None: the buttons are offered)."""
    if principal.read_only:
        return "your token is read-only (auditor)"
    role = decision_role(definition, task.state, "approve")
    if role not in principal.roles:
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
        seq=task.seq,
        role=pending["role"],
        started_by=pending["started_by"],
        proposed_by=pending["proposed_by"],
        digest=digest,
        tool=prepared.get("tool"),
        kind=prepared.get("kind"),
        arguments=display_arguments(prepared.get("arguments") or {}, schema_of(tool_args)),
        evidence=evidence(task.facts),
        reason=model_reason(events, digest),
        timeline=timeline(events),
        decisions=pending["decisions"],
        can_decide=refusal is None,
        why_not=refusal,
    )


def inbox(engine: Engine, principal: Principal, role: str | None = None) -> list[ApprovalView]:
    out = []
    for definition, task in engine.awaiting_approval(role=role):
        view = approval_view(engine, definition, task, engine.events_of(task), principal)
        if view is not None:
            out.append(view)
    return out


def task_page(engine: Engine, task_id: str, principal: Principal, *, internal: bool = False) -> TaskPage:
    task = engine.load(task_id)
    definition = engine.definition_of(task)
    events = engine.events_of(task)
    return TaskPage(
        view=engine.view(task),
        timeline=timeline(events),
        diagram=task_diagram(definition, events),
        approval=approval_view(engine, definition, task, events, principal),
        input=display_arguments(task.input, schema_of(definition.input)),
        route=task_route(definition, events, internal=internal),
        visits=visits_of(events, internal=internal),
        internal=internal,
    )


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
