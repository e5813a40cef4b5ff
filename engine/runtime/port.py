"""What the agent and tool runners need of the engine: a small port, so they do not depend on `Engine` itself.

The runners decide a step and hand it to `commit` (or `commit_system` for the
engine's own triggers); they read definitions and, after a conflict, the task
as it now stands. `Engine` is the one implementation; a test may pass another.
"""

from __future__ import annotations

from typing import Protocol

from engine.core.decide import Decision
from engine.core.definition import Workflow
from engine.core.payloads import EventData
from engine.core.task import TaskState


class TaskPort(Protocol):
    """Load, look up the definition, and append a decided step under optimistic concurrency."""

    def load(self, task_id: str) -> TaskState: ...

    def definition_of(self, task: TaskState) -> Workflow: ...

    def commit(self, task: TaskState, decision: Decision, *, actor: str) -> TaskState: ...

    def commit_system(self, task: TaskState, trigger: str, data: EventData, *, actor: str) -> TaskState: ...
