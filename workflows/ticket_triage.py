"""`ticket_triage@1`: a model reads one support ticket and decides ESCALATE, RESOLVE or REQUEST_INFO.

The model first reads the ticket with `query_ticket`, which returns a
low-sensitivity snapshot (no phone number, no national id, no internal
notes: the model has no use for them and a log should not hold them). Then
its one allowed action is `decide`, a `TicketDecision`: a state with a single
action gets the strongest rung of the forcing ladder its provider allows
(native schema, or the one tool named), so a chatty answer is repaired into
a decision rather than accepted as prose. A decision about any ticket but the
task's own is refused (DOMAIN_INVALID). ESCALATE goes to a human queue,
RESOLVE ends the task, REQUEST_INFO waits for the customer.
"""

from __future__ import annotations

from datetime import timedelta
from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field

from engine import (
    Action,
    Agent,
    CardField,
    DecisionCard,
    GuardContext,
    Restricted,
    Terminal,
    Tool,
    ToolCatalog,
    ToolDef,
    ToolFailed,
    ToolInvocation,
    ToolKind,
    Wait,
    Workflow,
)
from workflows import fakes

TICKET_ID = r"^T-\d{4}$"
SUPPORT = "support_agent"
PORTAL = "customer_portal"
READ_TIMEOUT = 2.0


class TriageInput(BaseModel):
    model_config = ConfigDict(extra="forbid")
    ticket_id: str = Field(pattern=TICKET_ID)


class TicketQuery(BaseModel):
    model_config = ConfigDict(extra="forbid")
    ticket_id: str = Field(pattern=TICKET_ID, description="The ticket to read, e.g. T-5001.")


class TicketSnapshot(BaseModel):
    """What a triage model may read of a ticket: its content, none of the customer's personal data."""

    ticket_id: str
    subject: str
    body: str
    status: str
    priority: str
    product: str
    opened_at: str


class Verdict(StrEnum):
    ESCALATE = "ESCALATE"
    RESOLVE = "RESOLVE"
    REQUEST_INFO = "REQUEST_INFO"


class TicketDecision(BaseModel):
    model_config = ConfigDict(extra="forbid")
    ticket_id: str = Field(pattern=TICKET_ID, description="The ticket decided on: the task's own.")
    decision: Verdict = Field(description="ESCALATE to a human, RESOLVE (answered), or REQUEST_INFO from the customer.")
    reason: str = Field(min_length=1, max_length=500)


class Note(BaseModel):
    model_config = ConfigDict(extra="forbid")
    note: str = Field(min_length=1, max_length=1000)


def query_ticket(call: ToolInvocation) -> TicketSnapshot:
    query = call.parse(TicketQuery)
    try:
        ticket = fakes.systems().tickets.get(query.ticket_id, timeout=call.timeout)
    except fakes.Declined as refusal:
        raise ToolFailed(refusal.message) from None
    # An allow-list, field by field: whatever the help desk adds to its records stays out.
    return TicketSnapshot(
        ticket_id=ticket.ticket_id,
        subject=ticket.subject,
        body=ticket.body,
        status=ticket.status,
        priority=ticket.priority,
        product=ticket.product,
        opened_at=ticket.opened_at.isoformat(),
    )


TICKET_TOOLS = ToolCatalog(
    "ticket-tools",
    1,
    [
        ToolDef(
            "query_ticket",
            TicketQuery,
            TicketSnapshot,
            ToolKind.READ,
            query_ticket,
            timeout=READ_TIMEOUT,
            description="Read a ticket's subject, body, status, priority and product (no personal data).",
        ),
    ],
)


def is_this_ticket(ctx: GuardContext) -> str | None:
    """Only the task's own ticket may be read or decided on."""
    named, own = getattr(ctx.args, "ticket_id", None), ctx.task.input["ticket_id"]
    return None if named == own else f"this task is about ticket {own}, not {named}"


def _verdict_is(verdict: Verdict, ctx: GuardContext) -> str | None:
    """Routing, not a rule: it refuses only to let the matching route win, so when the whole decision is
    refused (another ticket) the model is told what is wrong, not which routes did not match."""
    assert isinstance(ctx.args, TicketDecision)
    if ctx.args.decision is verdict or is_this_ticket(ctx) is not None:
        return None
    return f"routes {verdict} only"


def escalates(ctx: GuardContext) -> str | None:
    return _verdict_is(Verdict.ESCALATE, ctx)


def resolves(ctx: GuardContext) -> str | None:
    return _verdict_is(Verdict.RESOLVE, ctx)


def requests_info(ctx: GuardContext) -> str | None:
    return _verdict_is(Verdict.REQUEST_INFO, ctx)


DECIDE = "Decide the ticket: ESCALATE, RESOLVE or REQUEST_INFO, with a short reason."

TICKET_TRIAGE = Workflow(
    name="ticket_triage",
    version=1,
    description="Triage one support ticket: read it, then escalate it, resolve it or ask the customer.",
    input=TriageInput,
    searchable=("ticket_id",),
    cards={
        "human_queue": DecisionCard(
            "Ticket {ticket}: {subject}",
            (
                CardField("ticket", "input.ticket_id", "ticket"),
                CardField("subject", "facts.tool:query_ticket.subject", "subject"),
                CardField("priority", "facts.tool:query_ticket.priority", "priority"),
                CardField("why", "args.reason", "why it was escalated"),
                CardField("body", "facts.tool:query_ticket.body", "the customer wrote", section="evidence"),
                CardField("opened", "facts.tool:query_ticket.opened_at", "opened", "date", section="evidence"),
            ),
        )
    },
    tools=TICKET_TOOLS,
    # Support agents run the queue: they take hand-offs, retry, cancel, and may read or decide a ticket by hand.
    operator_role=SUPPORT,
    model_override_role=SUPPORT,
    # What the customer wrote is for support agents (and auditors); the portal that relays replies is not shown it.
    restricted=Restricted(roles=(SUPPORT,), results=("query_ticket.body",)),
    states=[
        Agent(
            "reading",
            description="Read the task's ticket.",
            on_exhausted="human_queue",
            actions=[
                Action(
                    "query_ticket",
                    "fetching_ticket",
                    TicketQuery,
                    guards=[is_this_ticket],
                    prepares="query_ticket",
                    description="Read the ticket (read-only).",
                ),
            ],
        ),
        Tool(
            "fetching_ticket", tool="query_ticket", on_succeeded="deciding", on_failed="reading", on_unknown="reading"
        ),
        # One trigger, three targets: the first action whose guards pass routes the decision.
        Agent(
            "deciding",
            description="Decide what happens to the ticket you read.",
            on_exhausted="human_queue",
            actions=[
                Action("decide", "human_queue", TicketDecision, guards=[is_this_ticket, escalates], description=DECIDE),
                Action("decide", "resolved", TicketDecision, guards=[is_this_ticket, resolves], description=DECIDE),
                Action(
                    "decide",
                    "awaiting_customer",
                    TicketDecision,
                    guards=[is_this_ticket, requests_info],
                    description=DECIDE,
                ),
            ],
        ),
        Wait(
            "human_queue",
            description="A support agent takes the ticket.",
            actions=[
                Action("resolve", "resolved", Note, role=SUPPORT),
                Action("ask_customer", "awaiting_customer", Note, role=SUPPORT),
            ],
        ),
        Wait(
            "awaiting_customer",
            description="Waiting for the customer's answer.",
            deadline=timedelta(days=7),
            on_expired="closed_unanswered",
            actions=[Action("customer_replied", "reading", Note, role=PORTAL)],
        ),
        Terminal("resolved"),
        Terminal("closed_unanswered"),
    ],
)
