"""A workflow whose input names a customer (an identity field), restricts a field to approvers and whose action
takes a sensitive argument: what an evaluation case must never carry."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from engine import ANYONE, Action, Agent, Approval, Restricted, Terminal, Workflow


class ClaimInput(BaseModel):
    model_config = ConfigDict(extra="forbid")
    customer: str
    limit_cents: int = Field(ge=1)
    message: str


class Claim(BaseModel):
    model_config = ConfigDict(extra="forbid")
    amount_cents: int = Field(ge=1, description="In cents.")
    card_last4: str = Field(pattern=r"^\d{4}$", json_schema_extra={"sensitive": True})


CLAIMS = Workflow(
    name="claims",
    version=1,
    input=ClaimInput,
    operator_role=ANYONE,
    restricted=Restricted(roles=("approver",), input=("limit_cents",)),
    states=[
        Agent(
            "drafting",
            actions=[Action("submit", "review", Claim), Action("give_up", "closed")],
        ),
        Approval("review", role="approver", actions=[Action("approve", "closed")]),
        Terminal("closed"),
    ],
)
