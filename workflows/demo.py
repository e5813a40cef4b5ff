"""`railyard demo`: the reference workflows on their showcase paths, printed step by step.

Four scenarios against the fakes (orders, payments, tickets) in the demo's own
database: (1) a refund through a read tool, an amount the guard refuses and the
model repairs, an approval, and one payment; (2) a ticket whose model answers in
prose until the forcing ladder gets a `TicketDecision` out of it; (3) a worker
process killed after the payment provider acted, and another worker that
reconciles instead of paying again; (4) a ticket that starts a refund task (a
child state), a worker killed after making it and before the ticket records it,
and another that finds it by its action id; (5) a batch of orders that starts one
check task per order (a fan-out), a worker killed after making two of the four,
another that finds those by their action ids and makes the rest, a flagged
check, and a reviewer's decision on all of them. Then every demo task is replayed and
the refund's route is drawn. No provider is called unless `--model` names one; the
scripted answers walk the same engine paths (forcing, repair, approval) a real
model gets.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.panel import Panel
from rich.table import Table
from sqlalchemy.engine import make_url

from engine import (
    Code,
    Engine,
    Event,
    ModelAdapter,
    RailyardError,
    Registry,
    ScriptedModel,
    StaticRoles,
    TaskState,
    Worker,
    open_model,
    redact_url,
    summarise,
)
from engine.core.canonical import now
from workflows import fakes
from workflows.refund_tools import SETTLE_SECONDS
from workflows.scripts import (
    REFUND_DAMAGED_ORDER_INPUT,
    REFUND_WRONG_ITEM_INPUT,
    TICKET_DOUBLE_CHARGE,
    TICKET_DOUBLE_CHARGE_INPUT,
    TICKET_REFUND,
    TICKET_REFUND_INPUT,
    refund_damaged_order,
    refund_wrong_item,
)

#: The demo's trusted context: who holds which role (a deployment reads RAILYARD_ROLES_FILE instead).
DEMO_ROLES = {"dana": {"refund_approver"}, "sam": {"support_agent"}, "olga": {"order_reviewer"}}
#: The batch of scenario 5: one order_check task per order.
ORDER_REVIEW_INPUT: dict[str, Any] = {"batch_id": "B-77", "orders": ["O-2001", "O-2002", "O-2003", "O-2004"]}
#: The repository the reference workflows are in (the folder holding this package): they are not installed.
REPOSITORY = Path(__file__).resolve().parents[1]
#: The killed worker's lease: short, so the demo need not wait long for it to run out.
CRASH_LEASE_SECONDS = 2


class Demo:
    """One run of the five scenarios on `engine`, printing to `console`."""

    def __init__(self, engine: Engine, console: Console, database_url: str, model: ModelAdapter | None) -> None:
        self.engine = engine
        self.console = console
        self.database_url = database_url
        self.model = model
        self.books = fakes.systems(database_url)

    # -- printing -------------------------------------------------------
    def show_events(self, task_id: str, after_seq: int) -> None:
        for event in self.engine.store.events(task_id, after_seq=after_seq):
            self.console.print(f"   {event.seq:>2} {_arrow(event)}  {summarise(event, 100)}", highlight=False)

    def advance(self, task_id: str, label: str, action: Callable[[], Any]) -> Any:
        """Run `action`, then print the events it appended (or the refusal and the untouched log)."""
        before = self.engine.get(task_id).seq
        self.console.print(f"[bold]{label}[/]")
        try:
            result = action()
        except RailyardError as refusal:
            if refusal.code in (Code.MODEL_NOT_CONFIGURED, Code.CONFIG_INVALID):  # no model, no credentials:
                raise  # the demo cannot go on (its later scenarios would take up this one's task)
            after = self.engine.get(task_id).seq
            self.console.print(
                f"   [red]refused[/] {refusal.code}: {refusal.message}"
                f"\n   the log is unchanged (seq {before} -> {after})",
                highlight=False,
            )
            return None
        self.show_events(task_id, before)
        return result

    def model_for(self, script: dict[str, Any]) -> ModelAdapter:
        return self.model if self.model is not None else ScriptedModel(script)

    # -- scenarios ------------------------------------------------------
    def refund(self) -> str:
        self.console.rule("1. A refund: read tool, a refused amount repaired, approval, paid once")
        engine = self.engine
        task_id = engine.start("refund", REFUND_DAMAGED_ORDER_INPUT, actor="portal")
        view = engine.get(task_id)
        self.console.print(
            f"the customer portal starts [bold]{task_id}[/] on {view.workflow}@{view.version}: "
            f'"{REFUND_DAMAGED_ORDER_INPUT["message"]}"',
            highlight=False,
        )
        version = view.version
        task: TaskState | None = self.advance(
            task_id,
            "the agent works the case (model turns and the order lookup)",
            lambda: engine.run(task_id, model=self.model_for(refund_damaged_order(version))),
        )
        if task is None or task.state != "awaiting_approval":
            self.console.print(f"   the model left the task in {engine.get(task_id).state}; no approval to give")
            return task_id
        prepared: Mapping[str, Any] = engine.load(task_id).prepared or {}
        self.console.print(
            f"   awaiting approval: {prepared.get('tool')} {_money(prepared.get('arguments', {}))} "
            f"(action {str(prepared.get('action_id'))[:8]}, digest {str(prepared.get('digest'))[:12]})",
            highlight=False,
        )
        self.advance(
            task_id,
            "bob, who does not hold refund_approver, tries to approve",
            lambda: engine.approve(task_id, actor="bob", prepared_digest=prepared.get("digest")),
        )
        self.advance(
            task_id,
            "dana (refund_approver) approves what she was shown",
            lambda: engine.approve(
                task_id, actor="dana", prepared_digest=prepared.get("digest"), comment="Photos match the claim."
            ),
        )
        self.advance(task_id, "the engine executes the approved call", lambda: engine.run(task_id))
        paid = self.books.payments.executions().get(str(prepared.get("action_id")), 0)
        self.console.print(
            f"   the payment provider's books: action {str(prepared.get('action_id'))[:8]} "
            f"executed [bold]{paid}[/] time(s)",
            highlight=False,
        )
        return task_id

    def ticket(self) -> str:
        self.console.rule("2. A ticket: prose forced into a TicketDecision")
        engine = self.engine
        task_id = engine.start("ticket_triage", TICKET_DOUBLE_CHARGE_INPUT, actor="helpdesk", version=1)
        ticket = TICKET_DOUBLE_CHARGE_INPUT["ticket_id"]
        self.console.print(f"the helpdesk starts [bold]{task_id}[/] for ticket {ticket}", highlight=False)
        self.advance(
            task_id,
            "the agent reads the ticket (phone, id number and notes withheld) and decides",
            lambda: engine.run(task_id, model=self.model_for(TICKET_DOUBLE_CHARGE)),
        )
        self.console.print(f"   the ticket is now in [cyan]{engine.get(task_id).state}[/]")
        return task_id

    def crash(self) -> str:
        self.console.rule("3. A worker killed mid-refund; another resumes it without paying twice")
        engine = self.engine
        task_id = engine.start("refund", REFUND_WRONG_ITEM_INPUT, actor="portal")
        version = engine.get(task_id).version
        engine.run(task_id, model=ScriptedModel(refund_wrong_item(version)))
        prepared: Mapping[str, Any] = engine.load(task_id).prepared or {}
        engine.approve(task_id, actor="dana", prepared_digest=prepared.get("digest"), comment="Wrong colour.")
        action_id = str(prepared.get("action_id"))
        self.console.print(
            f"[bold]{task_id}[/] is approved: {_money(prepared.get('arguments', {}))}, action {action_id[:8]}",
            highlight=False,
        )
        self.books.arm("payments.refund", "crash_after")
        self.console.print(
            "[bold]a `railyard worker` process claims it; it is killed (SIGKILL) right after the "
            "provider paid, before the outcome is recorded[/]"
        )
        before = engine.get(task_id).seq
        returncode = self._run_doomed_worker()
        killed = "killed by SIGKILL" if returncode == -signal.SIGKILL else f"exit status {returncode}"
        self.console.print(f"   the worker process ended: {killed}")
        self.show_events(task_id, before)
        row = engine.store.row(task_id)
        self.console.print(
            f"   the log ends on the recorded intent; the lease still names "
            f"{row.lease_owner if row else None}; the provider paid "
            f"{self.books.payments.executions().get(action_id, 0)} time(s)",
            highlight=False,
        )
        wait = CRASH_LEASE_SECONDS + SETTLE_SECONDS
        self.console.print(
            f"[bold]another worker, {wait:.0f} s later (the lease ran out; a stranded call gets "
            f"{SETTLE_SECONDS:.0f} s to settle)[/]"
        )
        time.sleep(wait)
        before = engine.get(task_id).seq
        Worker(engine, name="demo-worker-2", listen=False).run_once()
        self.show_events(task_id, before)
        paid = self.books.payments.executions().get(action_id, 0)
        self.console.print(
            f"   [cyan]{engine.get(task_id).state}[/]; the provider's books: action {action_id[:8]} "
            f"executed [bold]{paid}[/] time(s)",
            highlight=False,
        )
        return task_id

    def _run_doomed_worker(self) -> int:
        exe = Path(sys.executable).with_name("railyard")
        command = [str(exe)] if exe.exists() else [sys.executable, "-m", "engine.cli"]
        # The worker loads the reference workflows from the repository they are in (they are not installed), run
        # there so that no `workflows` package of the directory the demo was started in is what it imports.
        env = {**os.environ, "RAILYARD_DATABASE_URL": absolute(self.database_url), "RAILYARD_WORKFLOWS": "workflows"}
        # The task is at its payment: the worker needs no model turn, but a worker serving agent states refuses
        # to start without a model, so it gets one with nothing to say.
        with tempfile.TemporaryDirectory() as folder:
            silent = Path(folder) / "silent.json"
            silent.write_text(json.dumps({"turns": []}))
            done = subprocess.run(
                [
                    *command,
                    "worker",
                    "--once",
                    "--workflows",
                    "refund",
                    "--lease-seconds",
                    str(CRASH_LEASE_SECONDS),
                    "--model",
                    f"scripted:{silent}",
                ],
                env=env,
                cwd=REPOSITORY,
                capture_output=True,
                text=True,
                timeout=120,
            )
        return done.returncode

    def ticket_refund(self) -> tuple[str, str | None]:
        self.console.rule("4. A ticket that needs a refund: it starts a refund task, a worker dies mid-start")
        engine = self.engine
        script = self.model_for(TICKET_REFUND)
        ticket_id = engine.start("ticket_triage", TICKET_REFUND_INPUT, actor="helpdesk", version=2)
        self.console.print(
            f"the helpdesk starts [bold]{ticket_id}[/] on ticket_triage@2 for ticket T-5003 (customer C-100, "
            "order O-1003, not delivered)",
            highlight=False,
        )
        self.advance(
            ticket_id,
            "the agent reads the ticket and decides REFUND",
            lambda: engine.run(ticket_id, model=script, max_turns=3),  # up to the child state, not into it
        )
        self.console.print(
            "[bold]a worker process starts the refund task; it is killed (SIGKILL) after the refund task exists, "
            "before the ticket records it[/]"
        )
        before = engine.get(ticket_id).seq
        env = {**os.environ, "RAILYARD_DATABASE_URL": absolute(self.database_url)}
        done = subprocess.run(
            [sys.executable, "-m", "workflows.demo_child_crash"],
            env=env,
            cwd=REPOSITORY,
            capture_output=True,
            timeout=120,
        )
        killed = "killed by SIGKILL" if done.returncode == -signal.SIGKILL else f"exit status {done.returncode}"
        self.console.print(f"   the worker process ended: {killed}")
        self.show_events(ticket_id, before)
        spawn = next((e for e in engine.history(ticket_id) if e.trigger == "spawn"), None)
        if spawn is None:
            self.console.print("   no refund task was started")
            return ticket_id, None
        refund_id = str(spawn.data["child"]["task_id"])
        first = engine.history(refund_id)[0]
        self.console.print(
            f"   refund task [bold]{refund_id}[/] exists; its first event names its parent "
            f"{first.data['parent']['task_id'][:8]} (seq {first.data['parent']['seq']})",
            highlight=False,
        )
        time.sleep(CRASH_LEASE_SECONDS + 0.5)
        before = engine.get(ticket_id).seq
        self.console.print("[bold]another worker, once the lease ran out: it finds the refund task by its action id[/]")
        Worker(engine, name="demo-worker-3", listen=False, workflows=["ticket_triage"]).run_once()
        self.show_events(ticket_id, before)
        self.advance(refund_id, "the refund task's agent works the case", lambda: engine.run(refund_id, model=script))
        prepared: Mapping[str, Any] = engine.load(refund_id).prepared or {}
        if engine.get(refund_id).state == "awaiting_approval":
            self.advance(
                refund_id,
                "dana approves the refund, and it is paid",
                lambda: (
                    engine.approve(refund_id, actor="dana", prepared_digest=prepared.get("digest")),
                    engine.run(refund_id, model=script),
                ),
            )
        before = engine.get(ticket_id).seq
        self.console.print("[bold]the refund's end woke the ticket: a worker records it and the agent answers[/]")
        Worker(engine, name="demo-worker-4", listen=False, workflows=["ticket_triage"], model=script).drain()
        self.show_events(ticket_id, before)
        view = engine.get(ticket_id)
        self.console.print(
            f"   the ticket is [cyan]{view.state}[/]; it started {len(view.children)} refund task(s); "
            f"the provider paid action {str(prepared.get('action_id'))[:8]} "
            f"{self.books.payments.executions().get(str(prepared.get('action_id')), 0)} time(s)",
            highlight=False,
        )
        return ticket_id, refund_id

    def order_review(self) -> tuple[str, list[str]]:
        self.console.rule("5. A batch of orders: one check task per order, a worker dies amid the fan-out")
        engine = self.engine
        review_id = engine.start("order_review", ORDER_REVIEW_INPUT, actor="back-office")
        orders = ORDER_REVIEW_INPUT["orders"]
        self.console.print(
            f"the back office starts [bold]{review_id}[/] on order_review@1 for batch {ORDER_REVIEW_INPUT['batch_id']}"
            f" ({len(orders)} orders: {', '.join(orders)}); code builds one order_check per order",
            highlight=False,
        )
        self.console.print(
            "[bold]a worker process records the intent for all four checks, makes two, and is killed (SIGKILL)[/]"
        )
        env = {**os.environ, "RAILYARD_DATABASE_URL": absolute(self.database_url)}
        done = subprocess.run(
            [sys.executable, "-m", "workflows.demo_fanout_crash"],
            env=env,
            cwd=REPOSITORY,
            capture_output=True,
            timeout=120,
        )
        killed = "killed by SIGKILL" if done.returncode == -signal.SIGKILL else f"exit status {done.returncode}"
        self.console.print(f"   the worker process ended: {killed}")
        self.show_events(review_id, 0)
        self.console.print(f"   check tasks that exist: {self._checks(review_id)} of {len(orders)}", highlight=False)
        self._lease_ran_out(review_id)
        before = engine.get(review_id).seq
        self.console.print(
            "[bold]another worker, once the lease ran out: it finds the two checks by their action ids and makes "
            "the other two[/]"
        )
        Worker(engine, name="demo-worker-5", listen=False, workflows=["order_review"]).run_once()
        self.show_events(review_id, before)
        checks = [str(c["task_id"]) for c in engine.get(review_id).children]
        flagged = checks[2] if len(checks) > 2 else None
        if flagged is not None:
            self.advance(
                flagged,
                f"olga (order_reviewer) flags the check of {orders[2]}",
                lambda: engine.fire(flagged, "flag", {"note": "Shipping address differs from the card's."}, "olga"),
            )
        before = engine.get(review_id).seq
        self.console.print("[bold]the other checks clear when their window passes; a worker records the join[/]")
        worker = Worker(engine, name="demo-worker-6", listen=False, workflows=["order_check", "order_review"])
        deadline = time.monotonic() + 20
        while engine.get(review_id).state == "checking" and time.monotonic() < deadline:
            worker.drain()
            time.sleep(0.2)
        self.show_events(review_id, before)
        joined = engine.load(review_id).facts.get("children:checking") or {}
        for child in joined.get("children", []):
            self.console.print(f"   {child['result']['order_id']}: {child['state']}", highlight=False)
        if engine.get(review_id).state == "deciding":
            self.advance(
                review_id,
                "olga decides on the whole batch: hold it",
                lambda: engine.fire(review_id, "hold", {"note": "Hold the batch until O-2003 is verified."}, "olga"),
            )
        view = engine.get(review_id)
        self.console.print(
            f"   the batch is [cyan]{view.state}[/]; it started {len(view.children)} check task(s), one per order",
            highlight=False,
        )
        return review_id, checks

    def _lease_ran_out(self, task_id: str) -> None:
        """Wait (at most a few seconds) until the killed worker's lease on `task_id` has run out."""
        deadline = time.monotonic() + CRASH_LEASE_SECONDS + 5
        while time.monotonic() < deadline:
            row = self.engine.store.row(task_id)
            if row is None or row.lease_expires_at is None or row.lease_expires_at <= now():
                return
            time.sleep(0.1)

    def _checks(self, review_id: str) -> int:
        return sum(1 for c in self.engine.get(review_id).children if c["state"] is not None)

    # -- audit ----------------------------------------------------------
    def audit(self, task_ids: list[str]) -> None:
        self.console.rule("Replay: every demo task, checked from its log without calling a model or a tool")
        table = Table()
        for column in ("task", "workflow", "events", "verdict"):
            table.add_column(column)
        for task_id in task_ids:
            report = self.engine.replay(task_id)
            verdict = "[green]verified[/]" if report.ok else f"[red]{', '.join(report.codes)}[/]"
            table.add_row(task_id, report.workflow, str(report.events), verdict)
        self.console.print(table)

    def route(self, task_id: str) -> None:
        row, visits, current = self.engine.audit.path(task_id)  # what `railyard graph --task` draws
        definition = self.engine.registry.get(row.workflow, row.version)
        diagram = definition.machine.graph("mermaid", current=current, visits=visits)
        self.console.print(
            Panel(
                route_only(diagram),
                title=f"railyard graph refund --task {task_id} (the route taken; the command prints every state)",
            )
        )


def absolute(url: str) -> str:
    """`url` with a relative SQLite path made absolute, so that it names the same file from another directory."""
    parsed = make_url(url)
    path = parsed.database
    if parsed.get_backend_name() != "sqlite" or not path or path == ":memory:" or os.path.isabs(path):
        return url
    return parsed.set(database=os.path.abspath(path)).render_as_string(hide_password=False)


@dataclass(frozen=True)
class DemoTasks:
    """The tasks one run created, so a test can check their logs instead of the printed text."""

    refund: str
    ticket: str
    crashed_refund: str
    #: The ticket that started a refund task (scenario 4), and that refund task (None if it was not started).
    ticket_with_refund: str = ""
    child_refund: str | None = None
    #: The batch review that fanned out (scenario 5), and its checks in the order of its orders.
    order_review: str = ""
    order_checks: tuple[str, ...] = ()


def run_demo(
    database_url: str, console: Console, model: str | None = None, model_settings: Mapping[str, Any] | None = None
) -> DemoTasks:
    fakes.bind(database_url)
    fakes.systems(database_url).reset()
    registry = Registry.from_modules(["workflows"])  # the reference workflows, whatever RAILYARD_WORKFLOWS says
    adapter = open_model(model, model_settings) if model else None
    console.print(
        Panel.fit(
            f"[bold]Railyard demo[/] on {redact_url(database_url)}\n"
            f"workflows: {', '.join(w.ref for w in registry)}\n"
            f"model: {model or 'scripted (no provider called)'}; roles: dana = refund_approver",
        )
    )
    started = time.monotonic()
    with Engine(database_url, registry, authoriser=StaticRoles(DEMO_ROLES)) as engine:
        demo = Demo(engine, console, database_url, adapter)
        refund = demo.refund()
        ticket = demo.ticket()
        crashed = demo.crash()
        parent, child = demo.ticket_refund()
        review, checks = demo.order_review()
        demo.audit([refund, ticket, crashed, parent, *([child] if child else []), review, *checks])
        demo.route(refund)
    console.print(
        f"done in {time.monotonic() - started:.1f} s. Look further:\n"
        f"  railyard history {refund}\n"
        f"  railyard show {parent}   (a ticket and the refund task it started)\n"
        f"  railyard show {review}   (a batch and its four checks)\n"
        f"  railyard show {refund} --as-of 7\n"
        "  railyard approvals\n"
        f"  railyard graph refund --task {refund} --format dot\n"
        "  railyard replay --all\n"
        f"  railyard export {crashed} > refund.jsonl && railyard verify-export refund.jsonl",
        highlight=False,
    )
    return DemoTasks(refund, ticket, crashed, parent, child, review, tuple(checks))


def route_only(mermaid: str) -> str:
    """The Mermaid diagram cut down to the states visited and the edges taken (those with a visit count)."""
    visited = {
        line.split()[1]
        for line in mermaid.splitlines()
        if line.strip().startswith("Class ") and line.split()[-1] in ("s_previous", "s_active")
    }
    kept = []
    for line in mermaid.splitlines():
        words = line.split()
        if line.strip().startswith("classDef"):
            continue
        if words[:1] == ["state"] and words[-1] not in visited:
            continue
        if words[:1] == ["Class"] and words[1] not in visited:
            continue
        if "-->" in line and "[*]" not in line and "x)" not in line:
            continue
        kept.append(line)
    return "\n".join(kept)


def _arrow(event: Event) -> str:
    return f"{event.from_state or ''} --{event.trigger}--> {event.to_state}"


def _money(arguments: dict[str, Any]) -> str:
    amount, currency = arguments.get("amount"), arguments.get("currency")
    if isinstance(amount, int) and isinstance(currency, str):
        return f"{amount / 100:,.2f} {currency} for order {arguments.get('order_id')}"
    return str(arguments)
