"""A parent workflow that starts a child task and is routed by its end; the child ends by itself (a deadline) or
by a person's signal. No model and no tool: a worker alone takes a parent through its child's start and end.

`RAILYARD_WORKFLOWS=tests.support.child_workflows` serves them to a worker process (the crash tests' workers)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from engine import ANYONE, Action, Child, Engine, TaskState, Terminal, Wait, Workflow


class ParentInput(BaseModel):
    model_config = ConfigDict(extra="forbid")
    order: str = Field(min_length=1)
    amount: int = Field(ge=1)


class ChildInput(BaseModel):
    model_config = ConfigDict(extra="forbid")
    order: str
    amount: int = Field(ge=1)


class Settle(BaseModel):
    model_config = ConfigDict(extra="forbid")
    paid: int = Field(ge=0)


class Outcome(BaseModel):
    """What the parent reads of the child's end."""

    model_config = ConfigDict(extra="forbid")
    state: str
    paid: int = 0


def child_input(task: TaskState) -> dict[str, Any]:
    """Code builds the child's input from the parent's input: the model never does."""
    return {"order": task.input["order"], "amount": task.input["amount"]}


def read_outcome(child: TaskState) -> dict[str, Any]:
    paid = child.facts.get("pay", {}).get("paid", child.input["amount"] if child.state == "paid" else 0)
    return {"state": child.state, "paid": paid}


def payout(quick: bool = True) -> Workflow:
    """The child: waits for a person's `pay` or `decline`; with `quick`, pays by itself almost at once (a deadline),
    so a worker ends it without anybody."""
    return Workflow(
        name="payout",
        version=1,
        input=ChildInput,
        operator_role=ANYONE,
        states=[
            Wait(
                "pending",
                actions=[Action("pay", "paid", Settle, role=ANYONE), Action("decline", "declined", role=ANYONE)],
                deadline=timedelta(milliseconds=50) if quick else None,
                on_expired="paid" if quick else None,
            ),
            Terminal("paid"),
            Terminal("declined"),
        ],
    )


def claim(deadline: timedelta | None = None, on_parent_end: str = "cancel") -> Workflow:
    """The parent: starts a payout, and is routed by where it ended."""
    return Workflow(
        name="claim",
        version=1,
        input=ParentInput,
        operator_role=ANYONE,
        states=[
            Child(
                "paying",
                workflow="payout",
                input=child_input,
                on={"paid": "closed", "declined": "refused"},
                otherwise="review",
                result=Outcome,
                read=read_outcome,
                deadline=deadline,
                on_expired="review" if deadline is not None else None,
                on_parent_end=on_parent_end,
            ),
            Wait("review", actions=[Action("close", "closed", role=ANYONE)]),
            Terminal("closed"),
            Terminal("refused"),
        ],
    )


WORKFLOWS = [payout(quick=True), claim()]


def children_of(eng: Engine, parent_id: str) -> list[str]:
    """Every payout task whose first event names `parent_id` as its parent: what "exactly one child" counts."""
    found = []
    for task_id in eng.store.task_ids(workflow="payout"):
        parent = eng.history(task_id)[0].data.get("parent")
        if parent is not None and parent["task_id"] == parent_id:
            found.append(task_id)
    return found
