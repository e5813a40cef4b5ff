"""Railyard: LLM agent tasks as explicit, versioned finite-state machines over a hash-chained event log.

The public surface a user reads first:

- declare a workflow: `Workflow`, the state kinds `Agent`, `Tool`, `Approval`, `Wait`, `Terminal`,
  and `Action` (with a pydantic argument model, guards and a role; `ANYONE` says any signed-in person may);
- run it: `Engine` (`start`, `fire`, `cancel`, `get`, `history`, `load`, `transition`);
- give it tools: `ToolCatalog`, `ToolDef`, `ToolKind`, `ToolInvocation` (with who it is made for, `Acting`),
  `Reconciled`, `ToolFailed`,
  and the argument types `MinorUnits`, `CurrencyCode`, `Money`, `UtcTimestamp`;
- branch on refusals: `Code` and the `RailyardError` family;
- observe it: `enable_tracing` (OpenTelemetry spans; the OTEL_* variables do it without code) and
  `enable_metrics` (Prometheus).

Everything a user or a workflow module needs is importable from here; the
folders below are the layers (`engine.core` pure, `engine.store`, `engine.audit`,
`engine.providers`, `engine.runtime`, `engine.api`, `engine.cli`; see
CONTRIBUTING.md), and a deep import is a missing export.
"""

import logging

import engine._interrupts  # first: Ctrl-C while the `railyard` command imports ends it quietly  # noqa: F401
from engine.core.access import AUDITOR, Caller
from engine.core.canonical import GENESIS_HASH, canonical_json, sha256_hex
from engine.core.chain import Finding, verify_chain
from engine.core.decide import Decision, decide
from engine.core.definition import (
    ANYONE,
    Action,
    Agent,
    Approval,
    Budgets,
    CardField,
    DecisionCard,
    Guard,
    GuardContext,
    Restricted,
    State,
    StateKind,
    Status,
    Terminal,
    Tool,
    Wait,
    Workflow,
)
from engine.core.errors import (
    Code,
    ConcurrencyConflict,
    DefinitionError,
    IntegrityError,
    LeaseLost,
    RailyardError,
    Refused,
    StoreError,
)
from engine.core.events import Event
from engine.core.fold import TaskState, fold
from engine.core.model_interface import ModelAdapter, ModelRequest, ModelResponse
from engine.core.payloads import EventData, event_code
from engine.core.replay import ReplayReport
from engine.core.summary import summarise
from engine.core.tools import (
    Acting,
    CurrencyCode,
    MinorUnits,
    Money,
    PreparedToolCall,
    Reconciled,
    ToolCatalog,
    ToolDef,
    ToolFailed,
    ToolInvocation,
    ToolKind,
    UtcTimestamp,
)
from engine.core.visibility import RESTRICTED
from engine.observability.hooks import enable_metrics, enable_tracing
from engine.providers import ScriptedModel, adapter_from_spec
from engine.providers.scripted import call as scripted_call
from engine.runtime import config
from engine.runtime.engine import Engine, TaskView
from engine.runtime.models import open_model
from engine.runtime.registry import Registry
from engine.runtime.roles import StaticRoles, roles_from_file
from engine.runtime.tool_runner import SETTLE_MARGIN_SECONDS
from engine.runtime.worker import Worker
from engine.store import MemoryStore, SqlStore, Store, migrations, redact_url

# A library logs; the application decides where logs go. Without this, Python's last-resort
# handler would print raw database messages to a user's terminal.
logging.getLogger("railyard").addHandler(logging.NullHandler())

__all__ = [
    "ANYONE",
    "AUDITOR",
    "GENESIS_HASH",
    "RESTRICTED",
    "SETTLE_MARGIN_SECONDS",
    "Acting",
    "Action",
    "Agent",
    "Approval",
    "Budgets",
    "Caller",
    "CardField",
    "Code",
    "ConcurrencyConflict",
    "CurrencyCode",
    "Decision",
    "DecisionCard",
    "DefinitionError",
    "Engine",
    "Event",
    "EventData",
    "Finding",
    "Guard",
    "GuardContext",
    "IntegrityError",
    "LeaseLost",
    "MemoryStore",
    "MinorUnits",
    "ModelAdapter",
    "ModelRequest",
    "ModelResponse",
    "Money",
    "PreparedToolCall",
    "RailyardError",
    "Reconciled",
    "Refused",
    "Registry",
    "ReplayReport",
    "Restricted",
    "ScriptedModel",
    "SqlStore",
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
    "ToolCatalog",
    "ToolDef",
    "ToolFailed",
    "ToolInvocation",
    "ToolKind",
    "UtcTimestamp",
    "Wait",
    "Worker",
    "Workflow",
    "adapter_from_spec",
    "canonical_json",
    "config",
    "decide",
    "enable_metrics",
    "enable_tracing",
    "event_code",
    "fold",
    "migrations",
    "open_model",
    "redact_url",
    "roles_from_file",
    "scripted_call",
    "sha256_hex",
    "summarise",
    "verify_chain",
]
