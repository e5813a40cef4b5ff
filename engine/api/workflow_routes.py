"""The JSON API over definitions: which workflows and versions this server runs, and their diagrams."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Path, Query

from engine.api.auth import Ctx, Reader
from engine.api.diagrams import workflow_diagram
from engine.api.responses import errors
from engine.api.schemas import NAME_PATTERN, DiagramBody, WorkflowBody
from engine.core.definition import Workflow
from engine.runtime.registry import Registry

router = APIRouter(prefix="/api", tags=["workflows"])

Name = Annotated[str, Path(pattern=NAME_PATTERN, description="Workflow name.")]


def version_body(wf: Workflow) -> dict[str, Any]:
    return {
        "version": wf.version,
        "ref": wf.ref,
        "digest": wf.digest,
        "initial": wf.initial_state,
        "states": [s.name for s in wf.states],
        "description": wf.description,
    }


def workflow_body(registry: Registry, name: str) -> dict[str, Any]:
    newest = registry.get(name)  # WORKFLOW_UNKNOWN if there is none
    return {
        "name": name,
        "newest": newest.version,
        "versions": [version_body(registry.get(name, v)) for v in registry.versions(name)],
    }


@router.get("/workflows", response_model=list[WorkflowBody], responses=errors(401))
def workflows(ctx: Ctx, _who: Reader) -> list[dict[str, Any]]:
    """Every workflow this server's code defines, with all its versions."""
    registry = ctx.engine.registry
    names = list(dict.fromkeys(wf.name for wf in registry))
    return [workflow_body(registry, name) for name in names]


@router.get("/workflows/{name}", response_model=WorkflowBody, responses=errors(401, 404, 422))
def workflow(name: Name, ctx: Ctx, _who: Reader) -> dict[str, Any]:
    """One workflow's versions."""
    return workflow_body(ctx.engine.registry, name)


@router.get("/workflows/{name}/diagram", response_model=DiagramBody, responses=errors(401, 404, 422))
def diagram(
    name: Name,
    ctx: Ctx,
    _who: Reader,
    version: Annotated[int | None, Query(ge=1, le=2**31 - 1, description="Version (default: newest).")] = None,
) -> dict[str, Any]:
    """The version's state diagram (Mermaid)."""
    return workflow_diagram(ctx.engine.registry.get(name, version))
