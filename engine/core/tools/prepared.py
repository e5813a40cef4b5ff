"""Compile a model's tool arguments into an immutable, digested `PreparedToolCall`: pure, no I/O.

The model's JSON is never what runs. The server validates it against the
tool's argument model, normalises it (money as integer minor units, instants
in UTC, enums as their values, defaults filled in), pins it to the catalog and
policy version, and gives it an `action_id` derived from the task and the seq
of the intent event. The digest over all of that is what an approver names, so
an approval covers exactly the call that will run; and the action id is the
idempotency key the remote and `reconcile` both see, so a resumed worker
asks about the same action instead of making a new one.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

from pydantic import ValidationError

from engine.core.arguments import IDENTITY_FIELDS
from engine.core.canonical import canonical_json, sha256_hex
from engine.core.errors import Code, Refused
from engine.core.tools.call import LOC_PART, PreparedToolCall
from engine.core.tools.catalog import ToolCatalog, ToolDef

#: At most this many validation errors are reported (and recorded): enough to repair, bounded whatever is sent.
MAX_ERRORS = 20


def action_id_for(task_id: str, seq: int) -> str:
    """The action id of the tool call whose intent is event `seq` of `task_id`: 32 hex chars, the same every time.

    Deterministic so a worker resuming the task after a crash derives the id the
    dead worker used, and the remote (or `reconcile`) recognises the action.
    """
    if not isinstance(task_id, str) or not task_id:
        raise ValueError("task_id must be a non-empty string")
    if isinstance(seq, bool) or not isinstance(seq, int) or seq < 1:
        raise ValueError("seq must be an integer >= 1")
    return sha256_hex(f"{task_id}:{seq}")[:32]


def compact_errors(exc: ValidationError) -> list[dict[str, Any]]:
    """Where and why validation failed, never the rejected values (they may be sensitive, or an injection)."""
    return [
        {"loc": [p if isinstance(p, int) else str(p)[:LOC_PART] for p in e["loc"]], "msg": e["msg"], "type": e["type"]}
        for e in exc.errors(include_url=False, include_context=False, include_input=False)[:MAX_ERRORS]
    ]


def summarise(errors: list[dict[str, Any]]) -> str:
    return "; ".join(f"{'.'.join(map(str, e['loc'])) or '(root)'}: {e['msg']}" for e in errors)


def prepare(
    catalog: ToolCatalog,
    tool_name: str,
    raw_args: Mapping[str, Any],
    *,
    task_id: str,
    seq: int,
    policy_version: str = "1",
    required_role: str | None = None,
    allowed: Collection[str] | None = None,
) -> PreparedToolCall:
    """Compile a proposed call into a `PreparedToolCall`, or refuse with the first failing check's code.

    Checks in order: the tool is in `allowed` (this state's tools, when given;
    TOOL_NOT_ALLOWED, checked first so the model learns nothing of other tools),
    in the catalog (TOOL_NOT_FOUND), the arguments set no identity field
    (IDENTITY_OVERRIDE), and they validate (TOOL_ARGUMENT_INVALID, with the
    location, message and type of each error, never the values). `seq` is the
    seq of the event that will record this call as the intent.
    """
    if allowed is not None and tool_name not in allowed:
        shown = repr(tool_name)[:80]
        raise Refused(
            f"tool {shown} is not allowed here", code=Code.TOOL_NOT_ALLOWED, tool=shown, allowed=sorted(allowed)
        )
    tool = catalog.get(tool_name)
    if not isinstance(raw_args, Mapping):
        raise Refused(
            f"{tool.name}: arguments must be a JSON object",
            code=Code.TOOL_ARGUMENT_INVALID,
            tool=tool.name,
            errors=[{"loc": [], "msg": "expected an object", "type": "dict_type"}],
        )
    identity = sorted(IDENTITY_FIELDS & {k for k in raw_args if isinstance(k, str)})
    if identity:
        raise Refused(
            f"{tool.name}: identity fields {identity} come from the trusted caller",
            code=Code.IDENTITY_OVERRIDE,
            tool=tool.name,
            fields=identity,
        )
    try:
        model = tool.args.model_validate(dict(raw_args))
        arguments = model.model_dump(mode="json")
        canonical_json(arguments)
    except ValidationError as exc:
        errors = compact_errors(exc)
        raise Refused(
            f"{tool.name}: invalid arguments: {summarise(errors)}",
            code=Code.TOOL_ARGUMENT_INVALID,
            tool=tool.name,
            errors=errors,
        ) from None
    except (ValueError, TypeError):  # NaN, infinity, or a value with no JSON form
        raise Refused(
            f"{tool.name}: arguments have no canonical JSON form",
            code=Code.TOOL_ARGUMENT_INVALID,
            tool=tool.name,
            errors=[{"loc": [], "msg": "not representable as JSON", "type": "json"}],
        ) from None
    return PreparedToolCall(
        task_id=task_id,
        action_id=action_id_for(task_id, seq),
        tool=tool.name,
        kind=tool.kind,
        arguments=arguments,
        catalog=catalog.ref,
        catalog_digest=catalog.digest,
        policy_version=policy_version,
        required_role=required_role,
    )


def resolve(catalog: ToolCatalog, prepared: PreparedToolCall) -> ToolDef:
    """The tool a prepared call names, refusing if the catalog is not the one it was prepared (and approved) on."""
    if (prepared.catalog, prepared.catalog_digest) != (catalog.ref, catalog.digest):
        raise Refused(
            f"prepared call {prepared.action_id} was made on catalog {prepared.catalog} "
            f"({prepared.catalog_digest[:12]}), not {catalog.ref} ({catalog.digest[:12]})",
            code=Code.DEFINITION_CHANGED,
            catalog=prepared.catalog,
            action_id=prepared.action_id,
        )
    tool = catalog.get(prepared.tool)
    if tool.kind is not prepared.kind:
        raise Refused(
            f"tool {tool.name} is {tool.kind}, the prepared call says {prepared.kind}",
            code=Code.DEFINITION_CHANGED,
            tool=tool.name,
            action_id=prepared.action_id,
        )
    return tool
