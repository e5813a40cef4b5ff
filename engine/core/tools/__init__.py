"""Tools, the pure part: the versioned catalog, prepared calls and untrusted results.

- declare: `ToolDef`, `ToolKind`, `ToolCatalog`, `Reconciled`, `ToolFailed`, and the argument types
  `MinorUnits`, `CurrencyCode`, `UtcTimestamp`, `Money`;
- prepare: `prepare`, `PreparedToolCall`, `action_id_for`, `resolve`;
- results: `accept_result`, `wrap_for_model`, `wrap_error_for_model`, `RESULT_NOTICE`.

Running a call (I/O, with timeouts and unknown outcomes) is `engine.runtime.execute`.

A call as made (`call.py`) builds on nothing here; the catalog declares tools that take one; `prepared.py`
compiles arguments against the catalog into one. The package builds on `engine.core.arguments` (identity
fields, redaction) and `engine.core.text`, never on the definitions, which may import it.
"""

from engine.core.tools.call import Acting, PreparedToolCall, ToolInvocation, ToolKind
from engine.core.tools.catalog import Reconciled, ToolCatalog, ToolDef, ToolFailed
from engine.core.tools.prepared import action_id_for, prepare, resolve
from engine.core.tools.results import RESULT_NOTICE, accept_result, wrap_error_for_model, wrap_for_model
from engine.core.tools.types import CurrencyCode, MinorUnits, Money, UtcTimestamp

__all__ = [
    "RESULT_NOTICE",
    "Acting",
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
    "UtcTimestamp",
    "accept_result",
    "action_id_for",
    "prepare",
    "resolve",
    "wrap_error_for_model",
    "wrap_for_model",
]
