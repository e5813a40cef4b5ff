"""A task as the runtime knows it after some of its events: its status and its state (`TaskState`).

The fold (`engine.core.fold`) makes a `TaskState` from a log; the definitions (`engine.core.definition`) say
what a guard reads of one; the commands, the decisions and the shells read one. It depends on no definition, so
that each of those may depend on it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from engine.core.effects import is_open
from engine.core.payloads import ParentLink, PreparedCallData
from engine.core.records import quick_init


class Status(StrEnum):
    """What a worker may do with a task, derived from the kind of its current state."""

    RUNNABLE = "runnable"  # agent and tool states: a worker advances them
    BLOCKED = "blocked"  # approval, wait and child states: they wait for a human, a signal, a child or a deadline
    TERMINAL = "terminal"


@quick_init
@dataclass(frozen=True, slots=True)
class TaskState:
    """Everything the runtime knows about a task after its first `seq` events.

    `facts` maps each trigger taken to the validated arguments it was last taken
    with: the task's accumulated context, which guards read.
    """

    task_id: str
    workflow: str
    version: int
    digest: str
    state: str
    status: Status
    seq: int
    last_hash: str
    input: dict[str, Any]
    facts: dict[str, Any] = field(default_factory=dict)
    visit: dict[str, Any] = field(default_factory=dict)
    started_by: str = ""
    #: The newest prepared tool call (what an approval approves, what a tool state runs) and who proposed it.
    prepared: PreparedCallData | None = None
    prepared_by: str | None = None
    #: What the budgets count: model turns, tool calls, calls per (tool, arguments), and when the task began.
    usage: dict[str, Any] = field(default_factory=dict)
    #: The newest write call and what it came to (`engine.effects.next_effect`); None before the first write.
    effect: dict[str, Any] | None = None
    #: A cancel recorded while a write was in flight: who asked, why, at which seq (`engine.effects`).
    cancel_requested: dict[str, Any] | None = None
    #: The tenant the task belongs to, from its first event (a `start`'s `tenant`, a `fork`'s carried one).
    tenant: str | None = None
    #: The parent task that started this one from a child state (`engine.core.children`), from its `start` event.
    parent: ParentLink | None = None

    @property
    def ref(self) -> str:
        return f"{self.workflow}@{self.version}"

    @property
    def terminal(self) -> bool:
        return self.status is Status.TERMINAL

    @property
    def unsettled(self) -> dict[str, Any] | None:
        """The write whose outcome is open (intent recorded, no outcome, or `unknown`), if there is one."""
        return self.effect if is_open(self.effect) else None

    def to_doc(self) -> dict[str, Any]:
        """The JSON form stored in snapshots.

        `effect` is there once a call was prepared (null until its intent), `cancel_requested` only when set:
        snapshots of tasks that never prepared a call are what they were before either existed, and a snapshot
        with a prepared call and no `effect` is recognisably older (`predates_effects`).
        """
        doc = {
            "task_id": self.task_id,
            "workflow": self.workflow,
            "version": self.version,
            "digest": self.digest,
            "state": self.state,
            "status": str(self.status),
            "seq": self.seq,
            "last_hash": self.last_hash,
            "input": self.input,
            "facts": self.facts,
            "visit": self.visit,
            "started_by": self.started_by,
            "prepared": self.prepared,
            "prepared_by": self.prepared_by,
            "usage": self.usage,
        }
        if self.effect is not None or self.prepared is not None:
            doc["effect"] = self.effect
        if self.cancel_requested is not None:
            doc["cancel_requested"] = self.cancel_requested
        if self.tenant is not None:
            doc["tenant"] = self.tenant
        if self.parent is not None:
            doc["parent"] = self.parent
        return doc

    @classmethod
    def from_doc(cls, doc: dict[str, Any]) -> TaskState:
        return cls(
            task_id=doc["task_id"],
            workflow=doc["workflow"],
            version=int(doc["version"]),
            digest=doc["digest"],
            state=doc["state"],
            status=Status(doc["status"]),
            seq=int(doc["seq"]),
            last_hash=doc["last_hash"],
            input=doc["input"],
            facts=doc["facts"],
            visit=doc.get("visit", {}),
            started_by=doc.get("started_by", ""),
            prepared=doc.get("prepared"),
            prepared_by=doc.get("prepared_by"),
            usage=doc.get("usage", {}),
            effect=doc.get("effect"),
            cancel_requested=doc.get("cancel_requested"),
            tenant=doc.get("tenant"),
            parent=doc.get("parent"),
        )
