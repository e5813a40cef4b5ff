"""A workflow for the webhook tests: a task waits for an approver (new work for the role, with a deadline) and
ends when decided. No model and no tool: the worker's only job in these tests is to send the outbox."""

from __future__ import annotations

from datetime import timedelta

from engine import ANYONE, Action, Approval, Terminal, Workflow

REVIEW = Workflow(
    name="review",
    version=1,
    states=[
        Approval(
            "waiting",
            role="approver",
            deadline=timedelta(hours=1),
            on_expired="done",
            actions=[Action("approve", "done"), Action("reject", "done")],
        ),
        Terminal("done"),
    ],
    operator_role=ANYONE,
)

WORKFLOWS = [REVIEW]
ROLES = {"dana": {"approver"}}
