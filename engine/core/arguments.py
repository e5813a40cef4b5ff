"""Rules on the arguments a caller or a model supplies, whatever they are for (an action, a tool call, an eval).

Who is acting, and for whom, comes from the trusted caller's context, never from arguments: an argument model
may not declare the identity fields. A field declared sensitive never reaches the log: it is replaced before the
event is written, and guards still see the real value. Kept apart from the definitions, the catalog and the
prepared calls, which all apply these rules, so that none of them needs another to know them.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

#: Who is acting, for whom: these come from the trusted caller's context, never from arguments.
IDENTITY_FIELDS = frozenset(
    {"actor", "tenant", "tenant_id", "customer", "customer_id", "role", "roles", "user", "user_id"}
)


REDACTED = "[redacted]"


def sensitive_fields(model: type[BaseModel] | None) -> frozenset[str]:
    """Fields declared with `Field(json_schema_extra={"sensitive": True})`: never written to the log."""
    if model is None:
        return frozenset()
    return frozenset(
        name
        for name, f in model.model_fields.items()
        if isinstance(f.json_schema_extra, dict) and f.json_schema_extra.get("sensitive") is True
    )


def redact(model: type[BaseModel] | None, values: dict[str, Any]) -> dict[str, Any]:
    """`values` with the model's sensitive fields replaced, for the log; guards still see the real values."""
    hidden = sensitive_fields(model)
    return {k: (REDACTED if k in hidden else v) for k, v in values.items()} if hidden else values
