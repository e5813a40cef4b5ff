"""Railyard: LLM agent tasks as explicit, versioned finite-state machines over a hash-chained event log.

The public surface a user reads first:

- declare a workflow: `Workflow`, the state kinds `Agent`, `Tool`, `Approval`, `Wait`, `Terminal`,
  and `Action` (with a pydantic argument model, guards and a role);
- run it: `Engine` (`start`, `fire`, `cancel`, `get`, `history`, `load`, `transition`);
- branch on refusals: `Code` and the `RailyardError` family.
"""

import logging

from engine.chain import Finding, verify_chain
from engine.core import Engine, TaskView
from engine.decide import Decision, decide
from engine.definition import (
    Action,
    Agent,
    Approval,
    GuardContext,
    State,
    StateKind,
    Status,
    Terminal,
    Tool,
    Wait,
    Workflow,
)
from engine.errors import (
    Code,
    ConcurrencyConflict,
    DefinitionError,
    IntegrityError,
    RailyardError,
    Refused,
    StoreError,
)
from engine.events import Event
from engine.fold import TaskState, fold
from engine.registry import Registry
from engine.replay import ReplayReport
from engine.roles import StaticRoles, roles_from_file
from engine.store import Store

# A library logs; the application decides where logs go. Without this, Python's last-resort
# handler would print raw database messages to a user's terminal.
logging.getLogger("railyard").addHandler(logging.NullHandler())

__all__ = [
    "Action",
    "Agent",
    "Approval",
    "Code",
    "ConcurrencyConflict",
    "Decision",
    "DefinitionError",
    "Engine",
    "Event",
    "Finding",
    "GuardContext",
    "IntegrityError",
    "RailyardError",
    "Refused",
    "Registry",
    "ReplayReport",
    "State",
    "StateKind",
    "StaticRoles",
    "Status",
    "Store",
    "StoreError",
    "TaskState",
    "TaskView",
    "Terminal",
    "Tool",
    "Wait",
    "Workflow",
    "decide",
    "fold",
    "roles_from_file",
    "verify_chain",
]
