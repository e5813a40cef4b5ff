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

import importlib
import logging
from typing import TYPE_CHECKING, Any

import engine._interrupts  # first: Ctrl-C while the `railyard` command imports ends it quietly  # noqa: F401

# Every name below is served on first use (PEP 562), not imported with the package: `import engine` is what every
# `railyard` call pays before its command runs, and the eager imports (SQLAlchemy, pydantic, the runtime) cost
# about 0.6 s of it, which `railyard --help` never needs. `from engine import Engine` reads the same; mypy and
# editors see the imports under TYPE_CHECKING, which `tests/test_cli_start.py` keeps equal to the table.
if TYPE_CHECKING:
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
        Child,
        DecisionCard,
        Guard,
        GuardContext,
        Labels,
        Quorum,
        Restricted,
        RetryBudget,
        State,
        StateKind,
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
    from engine.core.fold import fold
    from engine.core.model_interface import ModelAdapter, ModelRequest, ModelResponse
    from engine.core.payloads import EventData, event_code
    from engine.core.replay import ReplayReport
    from engine.core.summary import summarise
    from engine.core.task import Status, TaskState
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

#: Where each public name lives, written as an entry point is: "module:attribute", or "module" for a module.
_EXPORTS: dict[str, str] = {
    "AUDITOR": "engine.core.access:AUDITOR",
    "Caller": "engine.core.access:Caller",
    "GENESIS_HASH": "engine.core.canonical:GENESIS_HASH",
    "canonical_json": "engine.core.canonical:canonical_json",
    "sha256_hex": "engine.core.canonical:sha256_hex",
    "Finding": "engine.core.chain:Finding",
    "verify_chain": "engine.core.chain:verify_chain",
    "Decision": "engine.core.decide:Decision",
    "decide": "engine.core.decide:decide",
    "ANYONE": "engine.core.definition:ANYONE",
    "Action": "engine.core.definition:Action",
    "Agent": "engine.core.definition:Agent",
    "Approval": "engine.core.definition:Approval",
    "Budgets": "engine.core.definition:Budgets",
    "RetryBudget": "engine.core.definition:RetryBudget",
    "CardField": "engine.core.definition:CardField",
    "Child": "engine.core.definition:Child",
    "Quorum": "engine.core.definition:Quorum",
    "DecisionCard": "engine.core.definition:DecisionCard",
    "Guard": "engine.core.definition:Guard",
    "Labels": "engine.core.definition:Labels",
    "GuardContext": "engine.core.definition:GuardContext",
    "Restricted": "engine.core.definition:Restricted",
    "State": "engine.core.definition:State",
    "StateKind": "engine.core.definition:StateKind",
    "Status": "engine.core.task:Status",
    "Terminal": "engine.core.definition:Terminal",
    "Tool": "engine.core.definition:Tool",
    "Wait": "engine.core.definition:Wait",
    "Workflow": "engine.core.definition:Workflow",
    "Code": "engine.core.errors:Code",
    "ConcurrencyConflict": "engine.core.errors:ConcurrencyConflict",
    "DefinitionError": "engine.core.errors:DefinitionError",
    "IntegrityError": "engine.core.errors:IntegrityError",
    "LeaseLost": "engine.core.errors:LeaseLost",
    "RailyardError": "engine.core.errors:RailyardError",
    "Refused": "engine.core.errors:Refused",
    "StoreError": "engine.core.errors:StoreError",
    "Event": "engine.core.events:Event",
    "TaskState": "engine.core.task:TaskState",
    "fold": "engine.core.fold:fold",
    "ModelAdapter": "engine.core.model_interface:ModelAdapter",
    "ModelRequest": "engine.core.model_interface:ModelRequest",
    "ModelResponse": "engine.core.model_interface:ModelResponse",
    "EventData": "engine.core.payloads:EventData",
    "event_code": "engine.core.payloads:event_code",
    "ReplayReport": "engine.core.replay:ReplayReport",
    "summarise": "engine.core.summary:summarise",
    "Acting": "engine.core.tools:Acting",
    "CurrencyCode": "engine.core.tools:CurrencyCode",
    "MinorUnits": "engine.core.tools:MinorUnits",
    "Money": "engine.core.tools:Money",
    "PreparedToolCall": "engine.core.tools:PreparedToolCall",
    "Reconciled": "engine.core.tools:Reconciled",
    "ToolCatalog": "engine.core.tools:ToolCatalog",
    "ToolDef": "engine.core.tools:ToolDef",
    "ToolFailed": "engine.core.tools:ToolFailed",
    "ToolInvocation": "engine.core.tools:ToolInvocation",
    "ToolKind": "engine.core.tools:ToolKind",
    "UtcTimestamp": "engine.core.tools:UtcTimestamp",
    "RESTRICTED": "engine.core.visibility:RESTRICTED",
    "enable_metrics": "engine.observability.hooks:enable_metrics",
    "enable_tracing": "engine.observability.hooks:enable_tracing",
    "ScriptedModel": "engine.providers:ScriptedModel",
    "adapter_from_spec": "engine.providers:adapter_from_spec",
    "scripted_call": "engine.providers.scripted:call",
    "config": "engine.runtime.config",
    "Engine": "engine.runtime.engine:Engine",
    "TaskView": "engine.runtime.engine:TaskView",
    "open_model": "engine.runtime.models:open_model",
    "Registry": "engine.runtime.registry:Registry",
    "StaticRoles": "engine.runtime.roles:StaticRoles",
    "roles_from_file": "engine.runtime.roles:roles_from_file",
    "SETTLE_MARGIN_SECONDS": "engine.runtime.tool_runner:SETTLE_MARGIN_SECONDS",
    "Worker": "engine.runtime.worker:Worker",
    "MemoryStore": "engine.store:MemoryStore",
    "SqlStore": "engine.store:SqlStore",
    "Store": "engine.store:Store",
    "migrations": "engine.store.migrations",
    "redact_url": "engine.store:redact_url",
}

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
    "Child",
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
    "Labels",
    "LeaseLost",
    "MemoryStore",
    "MinorUnits",
    "ModelAdapter",
    "ModelRequest",
    "ModelResponse",
    "Money",
    "PreparedToolCall",
    "Quorum",
    "RailyardError",
    "Reconciled",
    "Refused",
    "Registry",
    "ReplayReport",
    "Restricted",
    "RetryBudget",
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


if not TYPE_CHECKING:  # for mypy a misspelt `engine.X` stays an error, not an `Any` this function could return

    def __getattr__(name: str) -> Any:
        """A public name, imported the first time it is asked for and kept in the module from then on."""
        target = _EXPORTS.get(name)
        if target is None:
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
        module, _, attribute = target.partition(":")
        value = importlib.import_module(module)
        if attribute:
            value = getattr(value, attribute)
        globals()[name] = value
        return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
