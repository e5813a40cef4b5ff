"""Workflows with token budgets, for the tests of what model turns spend (`tests/test_token_usage.py`)."""

from __future__ import annotations

from engine import ANYONE, Action, Agent, Budgets, Terminal, Workflow
from tests.support.sample_workflows import TicketDecision, TicketInput

#: At most 100 tokens over the whole task.
CAPPED = Workflow(
    name="capped",
    version=1,
    input=TicketInput,
    states=[
        Agent("deciding", actions=[Action("decide", "decided", TicketDecision)], max_repairs=5),
        Terminal("decided"),
    ],
    budgets=Budgets(tokens=100),
    operator_role=ANYONE,
    model_override_role=ANYONE,
)

#: At most 100 tokens in each agent state: drafting's tokens do not count against reviewing's.
PER_STATE = Workflow(
    name="per_state",
    version=1,
    input=TicketInput,
    states=[
        Agent("drafting", actions=[Action("draft", "reviewing", TicketDecision)], max_repairs=5),
        Agent("reviewing", actions=[Action("decide", "decided", TicketDecision)], max_repairs=5),
        Terminal("decided"),
    ],
    budgets=Budgets(state_tokens=100),
    operator_role=ANYONE,
    model_override_role=ANYONE,
)
