"""Mermaid diagrams of a workflow, and of a task with the path it took drawn over it.

The path highlighting is `CompiledMachine.graph(visits=...)`: each edge the task
took is labelled with how often, and drawn (with the states it touches) in the
"previous" style. The pages show the Mermaid source as text; no renderer runs
in the browser (no third-party script under the Content-Security-Policy).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from engine.api.views import path_of
from engine.core.definition import Workflow
from engine.core.events import Event


def workflow_diagram(definition: Workflow) -> dict[str, Any]:
    return {
        "workflow": definition.name,
        "version": definition.version,
        "format": "mermaid",
        "diagram": definition.machine.graph("mermaid"),
        "current": None,
        "path": [],
    }


def task_diagram(definition: Workflow, events: Iterable[Event]) -> dict[str, Any]:
    steps, visits, current = path_of(events)
    diagram = definition.machine.graph("mermaid", current=current, visits=visits)
    return {
        "workflow": definition.name,
        "version": definition.version,
        "format": "mermaid",
        "diagram": diagram,
        "current": current,
        "path": steps,
    }
