"""A batch workflow that fans out one `check` child per order and joins on them; the child passes by itself almost
at once (a deadline) or waits for a person's `pass` / `fail`. No model and no tool: workers alone run a batch.

`RAILYARD_WORKFLOWS=tests.support.fanout_workflows` serves them to worker processes (the fan-out's crash and
multi-process tests)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from engine import ANYONE, Action, Budgets, Child, Engine, Quorum, TaskState, Terminal, Wait, Workflow


class BatchInput(BaseModel):
    model_config = ConfigDict(extra="forbid")
    orders: list[str] = Field(min_length=1)


class CheckInput(BaseModel):
    model_config = ConfigDict(extra="forbid")
    order: str = Field(min_length=1)
    index: int = Field(ge=0)


class Verdict(BaseModel):
    """What the batch reads of each check's end."""

    model_config = ConfigDict(extra="forbid")
    state: str
    order: str


def one_check_per_order(task: TaskState) -> list[dict[str, Any]]:
    """Code builds one child input per order of the batch's input, in order: never the model."""
    return [{"order": order, "index": i} for i, order in enumerate(task.input["orders"])]


def read_verdict(child: TaskState) -> dict[str, Any]:
    return {"state": child.state, "order": child.input["order"]}


def check(quick: bool = True, name: str = "check") -> Workflow:
    """The child: waits for a person's `pass` or `fail`; with `quick`, passes by itself almost at once."""
    return Workflow(
        name=name,
        version=1,
        input=CheckInput,
        operator_role=ANYONE,
        states=[
            Wait(
                "checking",
                actions=[Action("pass", "passed", role=ANYONE), Action("fail", "failed", role=ANYONE)],
                deadline=timedelta(milliseconds=50) if quick else None,
                on_expired="passed" if quick else None,
            ),
            Terminal("passed"),
            Terminal("failed"),
        ],
    )


def batch(
    join: str | Quorum = "all",
    on_child_failure: str = "fail_fast",
    children: int | None = 200,
    on_parent_end: str = "cancel",
    name: str = "batch",
    child: str = "check",
) -> Workflow:
    """The parent: one check (of workflow `child`) per order, joined on `join`; `children` is its child budget."""
    return Workflow(
        name=name,
        version=1,
        input=BatchInput,
        operator_role=ANYONE,
        budgets=Budgets(children=children),
        states=[
            Child(
                "checking",
                workflow=child,
                each=one_check_per_order,
                join=join,
                on_child_failure=on_child_failure,
                succeeds=("passed",),
                on={"joined": "accepted", "failed": "refused"},
                otherwise="refused",
                result=Verdict,
                read=read_verdict,
                on_parent_end=on_parent_end,
            ),
            Terminal("accepted"),
            Terminal("refused"),
        ],
    )


WORKFLOWS = [
    check(quick=True),
    check(quick=False, name="slow_check"),
    batch(),
    batch(join="any", name="batch_any", child="slow_check"),
    batch(join=Quorum(50), name="batch_quorum", child="slow_check"),
]


def checks_of(eng: Engine, parent_id: str, workflow: str = "check") -> dict[str, list[str]]:
    """Every check task whose first event names `parent_id` as its parent, by the action id it names: what "no child
    started twice" counts (one task per action id)."""
    found: dict[str, list[str]] = {}
    for task_id in eng.store.task_ids(workflow=workflow):
        parent = eng.history(task_id)[0].data.get("parent")
        if parent is not None and parent["task_id"] == parent_id:
            found.setdefault(parent["action_id"], []).append(task_id)
    return found
