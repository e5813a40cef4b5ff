"""Tools: the versioned catalog, prepared calls, untrusted results, and execution with unknown outcomes.

- declare: `ToolDef`, `ToolKind`, `ToolCatalog`, `Reconciled`, `ToolFailed`, and the argument types
  `MinorUnits`, `CurrencyCode`, `UtcTimestamp`, `Money`;
- prepare (pure): `prepare`, `PreparedToolCall`, `action_id_for`, `resolve`;
- results (pure): `accept_result`, `wrap_for_model`, `wrap_error_for_model`, `RESULT_NOTICE`;
- run (I/O): `execute`, `reconcile`, `outcome_of`, `ToolOutcome`.

This package imports `engine.definition` (identity fields, redaction) and
`engine.model.proposal` (text cleaning), so neither of those, nor what they
import, may import `engine.tools` at module level.
"""

from engine.tools.catalog import Reconciled, ToolCatalog, ToolDef, ToolFailed, ToolKind
from engine.tools.execute import ToolOutcome, execute, outcome_of, reconcile
from engine.tools.prepared import PreparedToolCall, ToolInvocation, action_id_for, prepare, resolve
from engine.tools.results import RESULT_NOTICE, accept_result, wrap_error_for_model, wrap_for_model
from engine.tools.types import CurrencyCode, MinorUnits, Money, UtcTimestamp

__all__ = [
    "RESULT_NOTICE",
    "CurrencyCode",
    "MinorUnits",
    "Money",
    "PreparedToolCall",
    "Reconciled",
    "ToolCatalog",
    "ToolDef",
    "ToolFailed",
    "ToolInvocation",
    "ToolKind",
    "ToolOutcome",
    "UtcTimestamp",
    "accept_result",
    "action_id_for",
    "execute",
    "outcome_of",
    "prepare",
    "reconcile",
    "resolve",
    "wrap_error_for_model",
    "wrap_for_model",
]
