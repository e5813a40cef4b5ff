"""Tool definitions and the versioned catalog that holds them: declarations only, no I/O.

A tool is what a workflow lets the model reach outside the engine. Its name,
argument and result schemas, kind, timeout and idempotency story are part of
the catalog's digest, and the catalog's `name@version` and digest enter the
workflow's digest: a tool whose schema or description changed without a new
catalog version is caught like any other definition change.

Every write tool must say how a lost outcome is recovered, because a worker
that dies after the call and before recording the outcome must never simply
call again: either the remote honours the idempotency key (`idempotent_remote`),
or the tool answers `reconcile(action_id)`, or, for a remote that can do
neither, `operator_settles`: a lost outcome waits for a person to record what
they verified (`Engine.settle`), and only "not executed" sends it again.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel

from engine.core.arguments import IDENTITY_FIELDS
from engine.core.canonical import canonical_json, sha256_hex
from engine.core.errors import Code, DefinitionError, Refused
from engine.core.tools.call import ToolKind

if TYPE_CHECKING:
    from engine.core.tools.call import ToolInvocation

#: Tool and catalog names: the same shape as state and action names, and valid as a provider function name.
NAME = re.compile(r"^[a-z][a-z0-9_]{0,63}$")


class ToolFailed(Exception):
    """Raised by a tool implementation when the remote definitely did not act (it refused the request).

    Any other exception from a write tool means "may have happened" and makes the
    outcome `unknown`; only this one makes it `failed`. `reason` is shown to the
    model, so it must be short and hold no secrets, URLs or SQL.
    """

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class Reconciled:
    """What `reconcile(action_id)` established about a write whose outcome was lost.

    `succeeded` (with the result) and `failed` (with a reason) record the outcome;
    only `not_found` lets the engine try again, with the same action id. `unknown`
    (the remote cannot tell yet, or reconciliation itself failed) keeps the task
    from calling again; past its budget a human decides.
    """

    outcome: Literal["succeeded", "failed", "not_found", "unknown"]
    result: BaseModel | Mapping[str, Any] | None = None
    reason: str | None = None
    code: Code | None = None

    @classmethod
    def succeeded(cls, result: BaseModel | Mapping[str, Any]) -> Reconciled:
        return cls("succeeded", result=result)

    @classmethod
    def failed(cls, reason: str) -> Reconciled:
        return cls("failed", reason=reason)

    @classmethod
    def not_found(cls) -> Reconciled:
        return cls("not_found")

    @classmethod
    def unknown(
        cls, reason: str = "the remote cannot tell yet", code: Code = Code.TOOL_EXECUTION_UNKNOWN
    ) -> Reconciled:
        return cls("unknown", reason=reason, code=code)


#: A tool's implementation: called with the prepared call (arguments, action id, idempotency key).
Runner = Callable[["ToolInvocation"], BaseModel | Mapping[str, Any]]
Reconciler = Callable[[str], Reconciled]


@dataclass(frozen=True)
class ToolDef:
    """One tool: its schemas, kind, limits and implementation. Validated by the catalog that holds it."""

    name: str
    args: type[BaseModel]
    result: type[BaseModel]
    kind: ToolKind
    run: Runner
    #: Seconds the engine waits for `run` (and `reconcile`); past it a read failed and a write is unknown.
    timeout: float = 10.0
    #: The remote deduplicates on the idempotency key (the action id): calling again cannot act twice.
    idempotent_remote: bool = False
    #: Asks the remote what became of an action id; required for a write without `idempotent_remote`.
    reconcile: Reconciler | None = None
    #: How many times in all a read tool may run for one prepared call (writes are never blindly repeated).
    max_attempts: int = 3
    description: str = ""
    #: The remote can neither deduplicate nor be asked: a lost outcome is settled by an operator's assertion.
    operator_settles: bool = False

    def spec(self) -> dict[str, Any]:
        """The digest-relevant content: what the model sees and how the engine treats the tool."""
        return {
            "name": self.name,
            "kind": str(self.kind),
            "description": self.description,
            "args": self.args.model_json_schema(),
            "result": self.result.model_json_schema(),
            "timeout": self.timeout,
            "idempotent_remote": self.idempotent_remote,
            "reconcile": self.reconcile is not None,
            "max_attempts": self.max_attempts,
            # Added later, present only when set: the digests of catalogs that do not use it stay put.
            **({"operator_settles": True} if self.operator_settles else {}),
        }

    def problems(self) -> list[str]:
        """Every defect of this tool, in a stable order; empty means valid."""
        where = f"tool {self.name!r}"
        out: list[str] = []
        if not isinstance(self.name, str) or not NAME.match(self.name):
            out.append(f"{where}: name must match {NAME.pattern}")
        if not isinstance(self.kind, ToolKind):
            out.append(f"{where}: kind {self.kind!r} must be ToolKind.READ or ToolKind.WRITE")
        if not _is_model(self.args):
            out.append(f"{where}: args must be a pydantic model class")
        else:
            if self.args.model_config.get("extra") != "forbid":
                out.append(f"{where}: argument model {self.args.__name__} must set extra='forbid'")
            identity = sorted(IDENTITY_FIELDS & set(self.args.model_fields))
            if identity:
                out.append(
                    f"{where}: argument model declares identity fields {identity}: "
                    "identity comes from the trusted caller"
                )
        if not _is_model(self.result):
            out.append(f"{where}: result must be a pydantic model class")
        if not callable(self.run):
            out.append(f"{where}: run must be callable")
        if self.reconcile is not None and not callable(self.reconcile):
            out.append(f"{where}: reconcile must be callable")
        if (
            isinstance(self.timeout, bool)
            or not isinstance(self.timeout, int | float)
            or not math.isfinite(self.timeout)
            or self.timeout <= 0
        ):
            out.append(f"{where}: timeout must be a positive number of seconds")
        if isinstance(self.max_attempts, bool) or not isinstance(self.max_attempts, int) or self.max_attempts < 1:
            out.append(f"{where}: max_attempts must be an integer >= 1")
        if (
            self.kind is ToolKind.WRITE
            and not self.idempotent_remote
            and self.reconcile is None
            and not self.operator_settles
        ):
            out.append(
                f"{where}: a write tool needs idempotent_remote=True, a reconcile function or "
                "operator_settles=True, so a lost outcome is never settled by calling again"
            )
        if not out:
            try:
                canonical_json(self.spec())
            except Exception as exc:  # a schema pydantic cannot express, or not JSON
                out.append(f"{where}: its schemas cannot be written as JSON ({type(exc).__name__})")
        return out


def _is_model(value: Any) -> bool:
    return isinstance(value, type) and issubclass(value, BaseModel)


@dataclass(frozen=True, eq=False)
class ToolCatalog:
    """A versioned set of tools, `name@version`, immutable and validated as it is built.

    Every problem is reported at once in one `DefinitionError`. The digest covers
    each tool's spec, sorted by name, so declaration order does not matter but any
    change a model or the engine could notice does.
    """

    name: str
    version: int
    tools: Sequence[ToolDef]
    _by_name: dict[str, ToolDef] = field(init=False, repr=False)
    _digest: str = field(init=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "tools", tuple(self.tools))
        problems = _validate(self)
        if problems:
            raise DefinitionError(self.ref, problems)
        object.__setattr__(self, "_by_name", {t.name: t for t in self.tools})
        object.__setattr__(self, "_digest", sha256_hex(canonical_json(self.spec())))

    @property
    def ref(self) -> str:
        """`name@version`, e.g. `ticket-tools@1`: the form a workflow and a prepared call record."""
        return f"{self.name}@{self.version}"

    @property
    def digest(self) -> str:
        return self._digest

    def names(self) -> list[str]:
        return [t.name for t in self.tools]

    def get(self, name: str) -> ToolDef:
        """The tool called `name`, or a TOOL_NOT_FOUND refusal (the name may come from a model: it is cut short)."""
        tool = self._by_name.get(name) if isinstance(name, str) else None
        if tool is None:
            shown = repr(name)[:80]
            raise Refused(
                f"catalog {self.ref} has no tool {shown}", code=Code.TOOL_NOT_FOUND, tool=shown, catalog=self.ref
            )
        return tool

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and name in self._by_name

    def spec(self) -> dict[str, Any]:
        """The canonical content the digest covers."""
        return {
            "name": self.name,
            "version": self.version,
            "tools": [t.spec() for t in sorted(self.tools, key=lambda t: t.name)],
        }


#: Catalog names may use hyphens (`ticket-tools`): they never reach a provider as a function name.
CATALOG_NAME = re.compile(r"^[a-z][a-z0-9_-]{0,63}$")


def _validate(catalog: ToolCatalog) -> list[str]:
    problems: list[str] = []
    if not isinstance(catalog.name, str) or not CATALOG_NAME.match(catalog.name):
        problems.append(f"catalog name {catalog.name!r} must match {CATALOG_NAME.pattern}")
    if isinstance(catalog.version, bool) or not isinstance(catalog.version, int) or catalog.version < 1:
        problems.append(f"version {catalog.version!r} must be an integer >= 1")
    seen: set[str] = set()
    for tool in catalog.tools:
        if not isinstance(tool, ToolDef):
            problems.append(f"{tool!r} is not a ToolDef")
            continue
        if tool.name in seen:
            problems.append(f"duplicate tool name {tool.name!r}")
        seen.add(tool.name)
        problems.extend(tool.problems())
    return problems
