"""Small workflows the tests drive; they use every state kind."""

from __future__ import annotations

import dataclasses
from datetime import timedelta

from pydantic import BaseModel, ConfigDict, Field

from engine import ANYONE, Action, Agent, Approval, GuardContext, Terminal, Tool, Wait, Workflow

ROLES = {"dana": {"approver"}, "olga": {"operator"}}


class OrderInput(BaseModel):
    model_config = ConfigDict(extra="forbid")
    customer: str
    balance: int = Field(ge=0)


class Proposal(BaseModel):
    model_config = ConfigDict(extra="forbid")
    amount: int = Field(ge=1)
    reason: str = Field(min_length=1, max_length=300)


class Note(BaseModel):
    model_config = ConfigDict(extra="forbid")
    note: str = Field(min_length=1)


def within_balance(ctx: GuardContext) -> str | None:
    assert isinstance(ctx.args, Proposal)
    balance = int(ctx.task.input["balance"])
    return None if ctx.args.amount <= balance else f"amount {ctx.args.amount} exceeds balance {balance}"


def small_amount(ctx: GuardContext) -> str | None:
    assert isinstance(ctx.args, Proposal)
    return None if ctx.args.amount <= 100 else "not small"


def large_amount(ctx: GuardContext) -> str | None:
    assert isinstance(ctx.args, Proposal)
    return None if ctx.args.amount > 100 else "not large"


def refund_states() -> list:  # type: ignore[type-arg]
    states = [
        Agent(
            "assessing",
            actions=[
                Action("propose", "auto_refund", Proposal, guards=[within_balance, small_amount]),
                Action("propose", "awaiting_approval", Proposal, guards=[within_balance, large_amount]),
                Action("give_up", "rejected"),
                Action("note", "assessing", Note),
            ],
        ),
        Approval(
            "awaiting_approval",
            role="approver",
            deadline=timedelta(hours=48),
            on_expired="needs_human",
            actions=[Action("approve", "executing"), Action("reject", "rejected", Note)],
        ),
        Tool(
            "auto_refund",
            tool="payments.refund",
            on_succeeded="completed",
            on_failed="needs_human",
            on_unknown="needs_human",
        ),
        Tool(
            "executing",
            tool="payments.refund",
            on_succeeded="completed",
            on_failed="needs_human",
            on_unknown="needs_human",
        ),
        Wait(
            "needs_human",
            actions=[
                Action("resume", "assessing", role="operator"),
                Action("close", "rejected", Note, role="operator"),
            ],
        ),
        Terminal("completed"),
        Terminal("rejected"),
    ]
    return states


REFUND_V1 = Workflow(
    name="refund", version=1, input=OrderInput, states=refund_states(), operator_role=ANYONE, model_override_role=ANYONE
)


def edited_refund_v1() -> Workflow:
    """refund@1 with its description edited and the same version: code that changed without a new version (a
    function, so that a registry reading this module's workflows does not find two refund@1)."""
    return dataclasses.replace(REFUND_V1, description="edited")


REFUND_V2 = Workflow(
    name="refund",
    version=2,
    input=OrderInput,
    states=refund_states(),
    description="v2: same states, new description",
    operator_role=ANYONE,
    model_override_role=ANYONE,
)


class TickArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")
    n: int


#: A loop for long logs: `tick` keeps the task where it is, `finish` ends it.
COUNTER = Workflow(
    name="counter",
    version=1,
    states=[
        Agent("counting", actions=[Action("tick", "counting", TickArgs), Action("finish", "done")]),
        Terminal("done"),
    ],
    operator_role=ANYONE,
    model_override_role=ANYONE,
)


class TicketDecision(BaseModel):
    model_config = ConfigDict(extra="forbid")
    ticket_id: str
    decision: str = Field(pattern="^(ESCALATE|RESOLVE|REQUEST_INFO)$")
    reason: str = Field(min_length=1, max_length=300)


def same_ticket(ctx: GuardContext) -> str | None:
    assert isinstance(ctx.args, TicketDecision)
    return None if ctx.args.ticket_id == ctx.task.input["ticket_id"] else "a decision for another ticket"


class TicketInput(BaseModel):
    model_config = ConfigDict(extra="forbid")
    ticket_id: str


def escalation_needs_review(ctx: GuardContext) -> str | None:
    assert isinstance(ctx.args, TicketDecision)
    return "escalations are reviewed by a human" if ctx.args.decision == "ESCALATE" else None


#: One agent action: the ladder can name the one tool. Escalations are routed to a review (risk).
TRIAGE = Workflow(
    name="triage",
    version=1,
    input=TicketInput,
    states=[
        Agent(
            "deciding",
            actions=[
                Action(
                    "decide",
                    "decided",
                    TicketDecision,
                    guards=[same_ticket],
                    description="Record the triage decision.",
                    risk=escalation_needs_review,
                    risk_target="escalation_review",
                )
            ],
            max_repairs=2,
        ),
        Approval("escalation_review", role="approver", actions=[Action("confirm", "decided")]),
        Terminal("decided"),
    ],
    operator_role=ANYONE,
    model_override_role=ANYONE,
)


def all_workflows() -> list[Workflow]:
    return [REFUND_V1, REFUND_V2, COUNTER, TRIAGE]
