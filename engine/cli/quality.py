"""`railyard quality`: how each model behaves in each state, computed from the log for a period.

The figures are folded from the task logs (`engine.audit.quality`), so they are exact and can be computed again
for any period. With --as, only the tasks that person may read are counted, as their export would hold them.
The heavy modules are imported inside the command: `railyard --help` does not pay for them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer

from engine.cli.options import JsonFlag, ReaderOpt, instant

if TYPE_CHECKING:
    from engine.core.quality import Prices


def quality(
    workflow: Annotated[str | None, typer.Option("--workflow", help="Only this workflow's tasks.")] = None,
    since: Annotated[
        str | None, typer.Option("--since", help="Only what happened at or after this date or time (ISO 8601, UTC).")
    ] = None,
    until: Annotated[
        str | None, typer.Option("--until", help="Only what happened before this date or time (ISO 8601, UTC).")
    ] = None,
    model: Annotated[
        str | None,
        typer.Option("--model", help="Only this model's turns: provider:model, or the model's name alone."),
    ] = None,
    reader: ReaderOpt = None,
    as_json: JsonFlag = False,
) -> None:
    """Per workflow, version, state, provider, model and rung: turns, first-try compliance, repairs, escalations,
    parse failures, schema failures per field, domain rejections per guard, hand-offs and tokens; per state, the
    time tasks spent in it (p50, p95, waits for people included). Computed from the log, for the period asked."""
    from engine.audit.quality import read_quality
    from engine.cli import render
    from engine.cli.exits import open_engine
    from engine.core.errors import Code, Refused
    from engine.runtime import queries, shown

    since_at, until_at = instant(since, "--since"), instant(until, "--until")
    if since_at is not None and until_at is not None and until_at <= since_at:
        raise typer.BadParameter("must be after --since", param_hint="--until")
    with open_engine() as engine:
        caller = engine.caller(reader) if reader is not None else None
        bounds = queries.scope(engine, caller)
        if workflow is not None and caller is None:
            engine.registry.get(workflow)  # WORKFLOW_UNKNOWN, naming the known ones
        elif workflow is not None and caller is not None:
            known = {definition.name for definition in engine.registry}
            if workflow not in known or (bounds.workflows is not None and workflow not in bounds.workflows):
                # Unknown, or not theirs to read: the same words either way (what they may not read is absent).
                raise Refused(
                    f"no workflow named {workflow!r} that {caller.actor} may read",
                    code=Code.WORKFLOW_UNKNOWN,
                    workflow=workflow,
                )
        figures = read_quality(
            engine.audit,
            workflow=workflow,
            since=since_at,
            until=until_at,
            model=model,
            readable=None if caller is None else lambda logs: shown.readable_logs(logs, bounds),
            prices=_prices(),
        )
    render.quality(figures, as_json)


def _prices() -> Prices:
    """The prices of the capability profiles (built in, and RAILYARD_PROFILES_FILE's), by profile and model."""
    from engine.core.profiles import load_profiles, profile_prices

    return profile_prices(load_profiles())
