"""`order_review@1`: a batch of orders reviewed together, one `order_check` child task per order, then a decision on
all of them. It shows a fan-out and its join (`Child(each=...)`, `engine.core.fanout`).

Each order's check is a task of its own (`order_check@1`): it clears the order by itself once its window passes,
unless an `order_reviewer` flags it first. The batch starts one check per order of its input (code builds the
list, never a model), waits for all of them holding nothing, and collects every outcome in the order of its
orders: all cleared releases the batch by itself; a flagged order sends it to a reviewer, who releases or holds the
batch with every check's outcome in front of them. A batch of more orders than its child budget (20) is refused
before any check starts.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from engine import Action, Budgets, Child, TaskState, Terminal, Wait, Workflow

#: Who flags an order's check and decides on a batch with a flagged order.
REVIEWER = "order_reviewer"
#: How long a check waits for a reviewer to flag its order before it clears it.
CHECK_WINDOW = timedelta(seconds=1)


class ReviewInput(BaseModel):
    model_config = ConfigDict(extra="forbid")
    batch_id: str = Field(min_length=1, max_length=40)
    orders: list[str] = Field(min_length=1, max_length=100)


class CheckInput(BaseModel):
    model_config = ConfigDict(extra="forbid")
    batch_id: str = Field(min_length=1, max_length=40)
    order_id: str = Field(min_length=1, max_length=40)


class ReviewNote(BaseModel):
    model_config = ConfigDict(extra="forbid")
    note: str = Field(min_length=1, max_length=1000)


class CheckOutcome(BaseModel):
    """What the batch reads of each check's end: the order, and whether it cleared."""

    model_config = ConfigDict(extra="forbid")
    order_id: str
    state: str


def one_check_per_order(task: TaskState) -> list[dict[str, Any]]:
    """The checks' inputs, one per order of the batch, in its order: built by code from the batch's input."""
    return [{"batch_id": task.input["batch_id"], "order_id": order} for order in task.input["orders"]]


def check_outcome(child: TaskState) -> dict[str, Any]:
    return {"order_id": child.input["order_id"], "state": child.state}


ORDER_CHECK = Workflow(
    name="order_check",
    version=1,
    description="Check one order of a batch: cleared once its window passes, unless a reviewer flags it.",
    input=CheckInput,
    operator_role=REVIEWER,
    states=[
        Wait(
            "checking",
            description="The order's automatic check: a reviewer may flag it within its window.",
            deadline=CHECK_WINDOW,
            on_expired="cleared",
            actions=[Action("flag", "flagged", ReviewNote, role=REVIEWER)],
        ),
        Terminal("cleared"),
        Terminal("flagged"),
    ],
)

ORDER_REVIEW = Workflow(
    name="order_review",
    version=1,
    description="Review a batch of orders: one check per order, then a decision on all of them.",
    input=ReviewInput,
    operator_role=REVIEWER,
    budgets=Budgets(children=20),
    states=[
        Child(
            "checking",
            description="One order_check task per order; the batch waits for every one of them.",
            workflow="order_check",
            version=1,
            each=one_check_per_order,
            join="all",
            on_child_failure="collect",
            succeeds=("cleared",),
            on={"joined": "released", "failed": "deciding"},
            otherwise="deciding",
            result=CheckOutcome,
            read=check_outcome,
        ),
        Wait(
            "deciding",
            description="A reviewer decides on the whole batch, every check's outcome in front of them.",
            actions=[
                Action("release", "released", ReviewNote, role=REVIEWER),
                Action("hold", "held", ReviewNote, role=REVIEWER),
            ],
        ),
        Terminal("released"),
        Terminal("held"),
    ],
)
