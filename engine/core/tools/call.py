"""A tool call as it is made: its kind, the immutable, digested `PreparedToolCall`, and what an implementation
receives (`ToolInvocation`, with who it is made for, `Acting`).

The catalog (`engine.core.tools.catalog`) declares tools that take an invocation; `engine.core.tools.prepared`
compiles a model's arguments into a prepared call against the catalog. Both need these, and these need neither.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from types import MappingProxyType
from typing import Any, TypeVar

from pydantic import BaseModel

from engine.core.arguments import redact
from engine.core.canonical import canonical_json, sha256_hex
from engine.core.errors import Code, IntegrityError, Refused
from engine.core.payloads import PreparedCallData


class ToolKind(StrEnum):
    """`read` tools may be retried within a limit; `write` tools change the world and are never blindly repeated."""

    READ = "read"
    WRITE = "write"


M = TypeVar("M", bound=BaseModel)


LOC_PART = 64


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
        problems += [f"unexpected {str(k)[:LOC_PART]}" for k in sorted(map(str, set(data) - expected))]
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
