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

import json
import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from engine.core.canonical import canonical_json, sha256_hex
from engine.core.definition import IDENTITY_FIELDS, redact
from engine.core.errors import Code, IntegrityError, Refused
from engine.core.payloads import PreparedCallData
from engine.core.tools.catalog import ToolCatalog, ToolDef, ToolKind

M = TypeVar("M", bound=BaseModel)

#: At most this many validation errors are reported (and recorded): enough to repair, bounded whatever is sent.
MAX_ERRORS = 20
_LOC_PART = 64
_ACTION_ID = re.compile(r"^[0-9a-f]{32}$")
_DIGESTED = (
    "task_id",
    "action_id",
    "tool",
    "kind",
    "arguments",
    "catalog",
    "catalog_digest",
    "policy_version",
    "required_role",
)


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
        {"loc": [p if isinstance(p, int) else str(p)[:_LOC_PART] for p in e["loc"]], "msg": e["msg"], "type": e["type"]}
        for e in exc.errors(include_url=False, include_context=False, include_input=False)[:MAX_ERRORS]
    ]


def summarise(errors: list[dict[str, Any]]) -> str:
    return "; ".join(f"{'.'.join(map(str, e['loc'])) or '(root)'}: {e['msg']}" for e in errors)


def _freeze(value: Any) -> Any:
    if isinstance(value, Mapping):
        return MappingProxyType({k: _freeze(v) for k, v in value.items()})
    if isinstance(value, list | tuple):
        return tuple(_freeze(v) for v in value)
    return value


def _thaw(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: _thaw(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_thaw(v) for v in value]
    return value


@dataclass(frozen=True)
class PreparedToolCall:
    """One tool call exactly as the server will make it; immutable all the way down, and digested.

    `arguments` is a read-only view (nested mappings and tuples); `to_dict()`
    gives plain JSON. Build one with `prepare`, or read one back with `from_dict`,
    which refuses a dict whose digest does not match its content.
    """

    task_id: str
    action_id: str
    tool: str
    kind: ToolKind
    arguments: Mapping[str, Any]
    catalog: str
    catalog_digest: str
    policy_version: str = "1"
    required_role: str | None = None
    digest: str = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "kind", ToolKind(self.kind))
        object.__setattr__(self, "arguments", _freeze(self.arguments))
        object.__setattr__(self, "digest", sha256_hex(canonical_json(self._content())))

    def __hash__(self) -> int:
        return hash(self.digest)

    def _content(self) -> dict[str, Any]:
        return {
            "task_id": self.task_id,
            "action_id": self.action_id,
            "tool": self.tool,
            "kind": str(self.kind),
            "arguments": _thaw(self.arguments),
            "catalog": self.catalog,
            "catalog_digest": self.catalog_digest,
            "policy_version": self.policy_version,
            "required_role": self.required_role,
        }

    def to_dict(self, *, redact_for: type[BaseModel] | None = None) -> PreparedCallData:
        """Plain JSON with the digest, as events record it. With `redact_for` (the tool's argument model),
        sensitive arguments are hidden for display; such a dict is for people, and `from_dict` refuses it."""
        arguments = _thaw(self.arguments)
        return {
            "task_id": self.task_id,
            "action_id": self.action_id,
            "tool": self.tool,
            "kind": "write" if self.kind is ToolKind.WRITE else "read",
            "arguments": redact(redact_for, arguments) if redact_for is not None else arguments,
            "catalog": self.catalog,
            "catalog_digest": self.catalog_digest,
            "policy_version": self.policy_version,
            "required_role": self.required_role,
            "digest": self.digest,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> PreparedToolCall:
        """Read a prepared call back (from the log, or from an approver), refusing one edited since it was made."""
        if not isinstance(data, Mapping):
            raise Refused("a prepared call must be a JSON object", code=Code.PAYLOAD_INVALID)
        expected = {*_DIGESTED, "digest"}
        problems = [f"missing {k}" for k in sorted(expected - set(data))]
        problems += [f"unexpected {str(k)[:_LOC_PART]}" for k in sorted(map(str, set(data) - expected))]
        for key in ("task_id", "action_id", "tool", "catalog", "catalog_digest", "policy_version", "digest"):
            if key in data and not isinstance(data[key], str):
                problems.append(f"{key} must be a string")
        if data.get("required_role") is not None and not isinstance(data.get("required_role"), str):
            problems.append("required_role must be a string or null")
        if "arguments" in data and not isinstance(data["arguments"], Mapping):
            problems.append("arguments must be an object")
        if "kind" in data and data["kind"] not in {str(k) for k in ToolKind}:
            problems.append("kind must be read or write")
        if isinstance(data.get("action_id"), str) and not _ACTION_ID.match(data["action_id"]):
            problems.append("action_id must be 32 lowercase hex characters")
        if problems:
            raise Refused(f"not a prepared call: {'; '.join(problems)}", code=Code.PAYLOAD_INVALID, problems=problems)
        call = cls(
            task_id=data["task_id"],
            action_id=data["action_id"],
            tool=data["tool"],
            kind=ToolKind(data["kind"]),
            arguments=data["arguments"],
            catalog=data["catalog"],
            catalog_digest=data["catalog_digest"],
            policy_version=data["policy_version"],
            required_role=data["required_role"],
        )
        if call.digest != data["digest"]:
            raise IntegrityError(
                f"prepared call {call.action_id} of task {call.task_id}: digest does not match its content",
                code=Code.HASH_MISMATCH,
                task_id=call.task_id,
                action_id=call.action_id,
            )
        return call


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


@dataclass(frozen=True, slots=True)
class Acting:
    """Who the call is made for, from the task's log (trusted; never the model's arguments): whoever started the
    task and whoever proposed the call (the model's actor, or the person who stood in for it), and the tenant the
    task belongs to. A tool that guards an object (a customer's order) checks ownership against these, not against
    anything the model wrote: a tenant's order is not another tenant's to refund."""

    started_by: str = ""
    proposed_by: str | None = None
    #: The task's tenant (None: the task belongs to none).
    tenant: str | None = None


@dataclass(frozen=True)
class ToolInvocation:
    """What a tool implementation receives: the prepared call, how long the engine will wait for it, and who it
    is made for (`acting`, trusted).

    Send `idempotency_key` to the remote (it is the action id), and set any
    network timeout below `timeout`: past it the engine stops waiting and the
    outcome of a write becomes `unknown`.
    """

    prepared: PreparedToolCall
    timeout: float
    acting: Acting = Acting()

    @property
    def task_id(self) -> str:
        return self.prepared.task_id

    @property
    def action_id(self) -> str:
        return self.prepared.action_id

    @property
    def idempotency_key(self) -> str:
        return self.prepared.action_id

    @property
    def arguments(self) -> dict[str, Any]:
        """A fresh, plain copy of the normalised arguments (the implementation may do what it likes with it)."""
        return dict(_thaw(self.prepared.arguments))

    def parse(self, model: type[M]) -> M:
        """The arguments as an instance of the tool's argument model (read back in JSON mode, as they were made)."""
        return model.model_validate_json(json.dumps(self.arguments))
