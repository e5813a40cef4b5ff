"""What the pages show and how: values in display form, the task list, the diagrams, the inbox and the task
page, and the templates they are rendered with.

An approver decides on the prepared call, so amounts are shown as money
(`40.00 EUR`), not as the minor units the call carries; the evidence is what
the tools returned; the model's reason is what it wrote. All of it is untrusted
text, and stays text: the Jinja2 environment autoescapes every template,
whatever its name, and no template marks anything `|safe`.

The display functions are pure. The task list reads the heads of the logs
(`Store.recent`, one bounded round trip, newest first), never the events. The
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

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import jinja2
from fastapi import Request
from fastapi.responses import HTMLResponse
from fastapi.templating import Jinja2Templates
from markupsafe import Markup
from pydantic import BaseModel

from engine.api.route import Visit, task_route, visits_of
from engine.api.tokens import Principal
from engine.audit.reads import path_visits
from engine.core.approvals import decision_role, pending_view, self_approval
from engine.core.definition import Approval, Workflow
from engine.core.events import Event
from engine.core.fold import TaskState
from engine.core.payloads import event_code
from engine.core.summary import compact, summarise
from engine.runtime.engine import Engine, TaskView
from engine.store import Store

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


# -- the task list ---------------------------------------------------------------------------------
MAX_LIMIT = 500


@dataclass(frozen=True, slots=True)
class TaskFilter:
    workflow: str | None = None
    state: str | None = None
    status: str | None = None
    limit: int = 100


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


def list_tasks(store: Store, where: TaskFilter) -> list[ListedTask]:
    rows = store.recent(
        workflow=where.workflow, state=where.state, status=where.status, limit=max(1, min(where.limit, MAX_LIMIT))
    )
    return [
        ListedTask(r.task_id, r.workflow, r.version, r.state, r.status, r.seq, when(r.created_at), when(r.updated_at))
        for r in rows
    ]


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


def render(request: Request, name: str, status_code: int = 200, **values: Any) -> HTMLResponse:
    return templates.TemplateResponse(request, name, values, status_code=status_code)
