"""`expense@1`: a small expense claim, the foundation's example workflow.

The claimant's agent drafts a claim; an approver holding `expense_approver`
approves it or sends it back. It exercises every part of a definition: an input
model, an agent state, an argument model with a guard, an approval role, a
deadline and terminal states.
"""

from __future__ import annotations

from datetime import timedelta

from pydantic import BaseModel, ConfigDict, Field

from engine import (
    Action,
    Agent,
    Approval,
    CardField,
    DecisionCard,
    GuardContext,
    Labels,
    Restricted,
    Terminal,
    Wait,
    Workflow,
)


class ExpenseInput(BaseModel):
    model_config = ConfigDict(extra="forbid")
    employee: str = Field(min_length=1, max_length=100)
    limit_cents: int = Field(ge=1, description="The most this employee may claim, in minor units.")


class Claim(BaseModel):
    model_config = ConfigDict(extra="forbid")
    amount_cents: int = Field(ge=1, description="Amount in minor units (cents).")
    currency: str = Field(pattern=r"^[A-Z]{3}$")
    description: str = Field(min_length=1, max_length=300)


class Comment(BaseModel):
    model_config = ConfigDict(extra="forbid")
    comment: str = Field(min_length=1, max_length=500)


def within_limit(ctx: GuardContext) -> str | None:
    """The claim may not exceed the limit the task was started with."""
    assert isinstance(ctx.args, Claim)
    limit = int(ctx.task.input["limit_cents"])
    if ctx.args.amount_cents > limit:
        # The limit itself is restricted (approvers only): the reason, which the log and its readers keep, says
        # that it was exceeded, not what it is.
        return f"amount {ctx.args.amount_cents} exceeds the employee's limit"
    return None


#: What the approver sees first: the claim as submitted, against the employee's limit.
CLAIM_CARD = DecisionCard(
    "Expense of {amount} by {employee}: {description}",
    (
        CardField("amount", "args.amount_cents", "amount", "money", currency="args.currency"),
        CardField("employee", "input.employee", "employee"),
        CardField("description", "args.description", "description"),
        CardField("limit", "input.limit_cents", "the employee's limit", "money", "args.currency", "inputs"),
    ),
)

#: The words the back office shows for expense (`Labels`: not in the digest).
EXPENSE_LABELS = Labels(
    states={
        "drafting": "Drafting the claim",
        "review": "Waiting for approval",
        "needs_human": "Nobody decided in time",
        "paid": "Paid",
        "withdrawn": "Withdrawn",
        "cancelled": "Cancelled",
        "limit_exceeded": "Out of budget",
    },
    actions={
        "submit": "Submit the claim",
        "withdraw": "Withdraw",
        "approve": "Approve the claim",
        "send_back": "Send back to the employee",
        "resume": "Put back for review",
        "cancel": "Cancel the claim",
    },
    fields={
        "employee": "Employee",
        "limit_cents": "Spending limit",
        "amount_cents": "Amount",
        "currency": "Currency",
        "description": "Description",
        "comment": "Comment",
    },
)

EXPENSE = Workflow(
    name="expense",
    version=1,
    description="An employee's expense claim, drafted by an agent and approved by a human.",
    input=ExpenseInput,
    searchable=("employee",),
    cards={"review": CLAIM_CARD},
    labels=EXPENSE_LABELS,
    # Operators pick up claims nobody decided in time, cancel them, and may draft a claim by hand.
    operator_role="expense_operator",
    model_override_role="expense_operator",
    # An employee's spending limit is for the approvers who hold claims to it (and auditors), not the operators.
    restricted=Restricted(roles=("expense_approver",), input=("limit_cents",)),
    states=[
        Agent(
            "drafting",
            description="The agent turns the employee's receipts into one claim.",
            actions=[
                Action("submit", "review", Claim, guards=[within_limit], description="Submit the claim."),
                Action("withdraw", "withdrawn", description="The employee no longer wants to claim."),
            ],
        ),
        Approval(
            "review",
            role="expense_approver",
            deadline=timedelta(hours=72),
            on_expired="needs_human",
            actions=[
                Action("approve", "paid", Comment),
                Action("send_back", "drafting", Comment),
            ],
        ),
        Wait(
            "needs_human",
            description="Nobody decided in time; an operator picks the claim up.",
            actions=[Action("resume", "review", role="expense_operator")],
        ),
        Terminal("paid"),
        Terminal("withdrawn"),
    ],
)
