"""`railyard demo`: the example workflow's paths and refusals, printed step by step.

No provider is called: the agent's answers come from a scripted model, so the
demo runs the same way on every machine, through the same forcing ladder and
repair loop a real model gets. Approver roles come from the demo's own trusted
context, as they would from RAILYARD_ROLES_FILE.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rich.console import Console
from rich.panel import Panel

from engine.chain import verify_chain
from engine.core import Engine
from engine.errors import ConcurrencyConflict, RailyardError
from engine.fold import TaskState
from engine.model.scripted import ScriptedModel
from engine.registry import Registry
from engine.roles import StaticRoles

DEMO_ROLES = {"dana": {"expense_approver"}}


def run_demo(database_url: str, console: Console) -> None:
    from engine.cli import history_table

    registry = Registry.from_env()
    expense = registry.get("expense")
    console.print(Panel.fit(
        f"[bold]Railyard demo[/] on {database_url}\nworkflow {expense.ref} (digest {expense.digest[:12]}); "
        f"roles: dana = expense_approver",
    ))
    with Engine(database_url, registry, authoriser=StaticRoles(DEMO_ROLES)) as engine:
        task_id = engine.start("expense", {"employee": "ann", "limit_cents": 50_000}, actor="ann")
        console.print(f"1. ann starts task [bold]{task_id}[/] in state [cyan]{engine.get(task_id).state}[/]")

        def step(label: str, action: Callable[[], TaskState]) -> None:
            before = engine.get(task_id).seq
            try:
                task = action()
            except RailyardError as refusal:
                after = engine.get(task_id).seq
                console.print(f"{label}\n   [red]refused[/] {refusal.code}: {refusal.message}"
                              f"\n   log unchanged: seq {before} -> {after}")
                return
            console.print(f"{label}\n   [green]ok[/] -> [cyan]{task.state}[/] (seq {task.seq})")

        claim: dict[str, Any] = {"amount_cents": 72_000, "currency": "EUR", "description": "Conference trip"}
        # A scripted model (no provider needed): it answers in prose, then over the limit, then correctly.
        model = ScriptedModel({"profile": "anthropic", "model": "demo", "turns": [
            {"text": "I'll file the conference trip."},
            {"tool_calls": [{"name": "submit", "arguments": claim}]},
            {"tool_calls": [{"name": "submit", "arguments": {**claim, "amount_cents": 42_000}}]},
        ]})
        before = engine.get(task_id).seq
        engine.run(task_id, model=model)
        for event in engine.store.events(task_id, after_seq=before):
            turn = event.data["turn"]
            outcome = f"[red]{turn['code']}[/]" if turn.get("code") else "[green]accepted[/]"
            console.print(f"2. model turn ({turn['strategy']}): {event.from_state} --{event.trigger}--> "
                          f"[cyan]{event.to_state}[/] {outcome}")
        step("3. bob (no role) tries to approve",
             lambda: engine.fire(task_id, "approve", {"comment": "fine"}, actor="bob"))
        step("4. dana (expense_approver) approves",
             lambda: engine.fire(task_id, "approve", {"comment": "within policy"}, actor="dana"))
        step("5. ann tries to cancel the paid claim",
             lambda: engine.cancel(task_id, actor="ann", reason="changed my mind"))

        other = engine.start("expense", {"employee": "ben", "limit_cents": 10_000}, actor="ben")
        held = engine.load(other)
        engine.transition(held, "withdraw", actor="model")
        try:
            engine.transition(held, "submit", {**claim, "amount_cents": 5_000}, actor="model")
        except ConcurrencyConflict as conflict:
            console.print(f"6. two writers on task {other} from seq {held.seq}: the second gets "
                          f"[red]{conflict.code}[/] (expected {conflict.expected}, found {conflict.actual})")

        console.print(history_table(engine.history(task_id), title=f"history of {task_id}"))
        for tid in (task_id, other):
            findings = verify_chain(engine.history(tid))
            verdict = "[green]hash chain verified[/]" if not findings else f"[red]{findings}[/]"
            console.print(f"{tid}: {len(engine.history(tid))} events, {verdict}")
        console.print(Panel(expense.machine.graph("mermaid", current=engine.get(task_id).state),
                            title="railyard graph expense"))
        console.print("Look further:\n"
                      f"  railyard history {task_id}\n"
                      f"  railyard show {task_id} --json\n"
                      "  railyard graph expense --format dot")
