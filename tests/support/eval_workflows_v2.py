"""claims@2 beside claims@1 (`tests.support.eval_workflows`): two versions of a workflow an evaluation compares.
Its own module, so the tests that load only claims@1 run against that version."""

from __future__ import annotations

from pydantic import Field

from engine import ANYONE, Action, Agent, Approval, Restricted, Terminal, Workflow
from tests.support.eval_workflows import Claim, ClaimInput


class ReasonedClaim(Claim):
    """claims@2: a claim must say why, which a model trained on claims@1 leaves out."""

    reason: str = Field(min_length=1, max_length=200, description="Why the customer is owed this.")


CLAIMS_V2 = Workflow(
    name="claims",
    version=2,
    input=ClaimInput,
    operator_role=ANYONE,
    restricted=Restricted(roles=("approver",), input=("limit_cents",)),
    states=[
        Agent(
            "drafting",
            actions=[Action("submit", "review", ReasonedClaim), Action("give_up", "closed")],
        ),
        Approval("review", role="approver", actions=[Action("approve", "closed")]),
        Terminal("closed"),
    ],
)
