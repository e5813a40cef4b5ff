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
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from engine import (
    Action,
    Agent,
    CardField,
    Child,
    DecisionCard,
    GuardContext,
    Labels,
    Restricted,
    TaskState,
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


class RefundingVerdict(StrEnum):
    ESCALATE = "ESCALATE"
    RESOLVE = "RESOLVE"
    REQUEST_INFO = "REQUEST_INFO"
    REFUND = "REFUND"


class RefundingDecision(BaseModel):
    """ticket_triage@2's decision: REFUND starts a `refund` task for the ticket's order and waits for it."""

    model_config = ConfigDict(extra="forbid")
    ticket_id: str = Field(pattern=TICKET_ID, description="The ticket decided on: the task's own.")
    decision: RefundingVerdict = Field(
        description="ESCALATE to a human, RESOLVE (answered), REQUEST_INFO from the customer, or REFUND the order."
    )
    reason: str = Field(min_length=1, max_length=500)


class TriageInputV2(BaseModel):
    """ticket_triage@2: the helpdesk that opens the task says whose ticket it is and which order it is about, when
    it knows: a refund is started only for a known customer and order (the model never names them)."""

    model_config = ConfigDict(extra="forbid")
    ticket_id: str = Field(pattern=TICKET_ID)
    customer_id: str | None = Field(default=None, pattern=r"^C-\d{3,6}$")
    order_id: str | None = Field(default=None, pattern=r"^O-\d{4}$")


class RefundOutcome(BaseModel):
    """What the ticket reads of its refund: where it ended, and what was paid (minor units), if anything."""

    model_config = ConfigDict(extra="forbid")
    state: str
    amount: int | None = None
    currency: str | None = None


class Reply(BaseModel):
    model_config = ConfigDict(extra="forbid")
    message: str = Field(min_length=1, max_length=2000, description="The answer the customer is sent.")


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


def _verdict_is(verdict: str, ctx: GuardContext) -> str | None:
    """Routing, not a rule: it refuses only to let the matching route win, so when the whole decision is
    refused (another ticket) the model is told what is wrong, not which routes did not match."""
    assert isinstance(ctx.args, TicketDecision | RefundingDecision)
    if str(ctx.args.decision) == str(verdict) or is_this_ticket(ctx) is not None:
        return None
    return f"routes {verdict} only"


def escalates(ctx: GuardContext) -> str | None:
    return _verdict_is(Verdict.ESCALATE, ctx)


def resolves(ctx: GuardContext) -> str | None:
    return _verdict_is(Verdict.RESOLVE, ctx)


def requests_info(ctx: GuardContext) -> str | None:
    return _verdict_is(Verdict.REQUEST_INFO, ctx)


DECIDE = "Decide the ticket: ESCALATE, RESOLVE or REQUEST_INFO, with a short reason."

TRIAGE_CARDS = {
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
}

_TRIAGE_STATES = {
    "reading": "Reading the ticket",
    "fetching_ticket": "Fetching the ticket",
    "deciding": "Deciding",
    "human_queue": "In the support queue",
    "awaiting_customer": "Waiting for the customer",
    "resolved": "Resolved",
    "closed_unanswered": "Closed, unanswered",
    "cancelled": "Cancelled",
    "limit_exceeded": "Out of budget",
}
_TRIAGE_ACTIONS = {
    "query_ticket": "Read the ticket",
    "decide": "Decide",
    "resolve": "Resolve",
    "ask_customer": "Ask the customer",
    "customer_replied": "Customer replied",
    "reply": "Answer the customer",
    "cancel": "Cancel the ticket",
}
_TRIAGE_FIELDS = {"ticket_id": "Ticket", "decision": "Decision", "reason": "Reason", "note": "Note"}
#: The words the back office shows for ticket_triage (`Labels`: not in the digest).
TRIAGE_LABELS = Labels(states=_TRIAGE_STATES, actions=_TRIAGE_ACTIONS, fields=_TRIAGE_FIELDS)
TRIAGE_LABELS_V2 = Labels(
    states={**_TRIAGE_STATES, "refunding": "Refunding the order", "answering": "Answering the customer"},
    actions=_TRIAGE_ACTIONS,
    fields={**_TRIAGE_FIELDS, "order_id": "Order"},
)

TICKET_TRIAGE = Workflow(
    name="ticket_triage",
    version=1,
    description="Triage one support ticket: read it, then escalate it, resolve it or ask the customer.",
    input=TriageInput,
    searchable=("ticket_id",),
    cards=TRIAGE_CARDS,
    labels=TRIAGE_LABELS,
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


def refunds(ctx: GuardContext) -> str | None:
    return _verdict_is(RefundingVerdict.REFUND, ctx)


def knows_the_order(ctx: GuardContext) -> str | None:
    """A refund is started only for the customer and order the helpdesk named when it opened the task."""
    if ctx.task.input.get("customer_id") and ctx.task.input.get("order_id"):
        return None
    return "the task names no customer and order to refund: ESCALATE instead"


def refund_input(task: TaskState) -> dict[str, Any]:
    """The refund child's input, built by code from the ticket task: the customer and order the helpdesk named, and
    the customer's own words from the ticket. The model chose to refund; it does not say whom or what."""
    ticket = task.facts.get("tool:query_ticket") or {}
    return {
        "customer_id": task.input["customer_id"],
        "order_id": task.input["order_id"],
        "message": str(ticket.get("body") or ticket.get("subject") or task.input["ticket_id"])[:2000],
    }


def refund_outcome(child: TaskState) -> dict[str, Any]:
    """The refund's end, read from its final state: the payment's receipt when it paid."""
    receipt = child.facts.get("tool:payments_refund") or {}
    return {"state": child.state, "amount": receipt.get("amount"), "currency": receipt.get("currency")}


DECIDE_V2 = "Decide the ticket: ESCALATE, RESOLVE, REQUEST_INFO, or REFUND the order, with a short reason."
ANSWER = "Answer the customer: what became of the refund (read child:refunding in your facts)."

TICKET_TRIAGE_V2 = Workflow(
    name="ticket_triage",
    version=2,
    description="Triage one support ticket: read it, then escalate it, resolve it, ask the customer, or start a "
    "refund task for its order and answer the customer from its outcome.",
    input=TriageInputV2,
    searchable=("ticket_id",),
    cards=TRIAGE_CARDS,
    labels=TRIAGE_LABELS_V2,
    tools=TICKET_TOOLS,
    operator_role=SUPPORT,
    model_override_role=SUPPORT,
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
        Agent(
            "deciding",
            description="Decide what happens to the ticket you read.",
            on_exhausted="human_queue",
            actions=[
                Action(
                    "decide",
                    "human_queue",
                    RefundingDecision,
                    guards=[is_this_ticket, escalates],
                    description=DECIDE_V2,
                ),
                Action(
                    "decide", "resolved", RefundingDecision, guards=[is_this_ticket, resolves], description=DECIDE_V2
                ),
                Action(
                    "decide",
                    "awaiting_customer",
                    RefundingDecision,
                    guards=[is_this_ticket, requests_info],
                    description=DECIDE_V2,
                ),
                Action(
                    "decide",
                    "refunding",
                    RefundingDecision,
                    guards=[is_this_ticket, refunds, knows_the_order],
                    description=DECIDE_V2,
                ),
            ],
        ),
        # The refund is a task of its own (refund@1, pinned), with its own approval and payment; this ticket waits
        # for it, holding nothing, and a cancel of the ticket requests the refund's cancel.
        Child(
            "refunding",
            description="A refund task runs for the ticket's order; the ticket waits for its end.",
            workflow="refund",
            version=1,
            input=refund_input,
            on={"completed": "answering", "rejected": "answering"},
            otherwise="human_queue",
            result=RefundOutcome,
            read=refund_outcome,
        ),
        Agent(
            "answering",
            description="Tell the customer what became of their refund.",
            on_exhausted="human_queue",
            actions=[Action("reply", "resolved", Reply, description=ANSWER)],
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
