"""`railyard demo` on both databases: its scenarios leave the logs they claim to, and replay verifies them.

The assertions read the task logs and the fake provider's books, never the printed text.
"""

from __future__ import annotations

import io
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest
from rich.console import Console

from engine import Engine, Registry
from tests.support.payloads import undeclared
from tests.support.postgres import truncate
from tests.support.reference import steps
from tests.test_docs import blocks, without_comment
from workflows import fakes
from workflows.demo import run_demo


def test_the_demo_scenarios(db_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RAILYARD_WORKFLOWS", raising=False)  # the demo runs the project's own workflows
    console = Console(file=io.StringIO(), width=120)
    started = time.monotonic()
    tasks = run_demo(db_url, console)
    assert time.monotonic() - started < 45  # five scenarios, two of them with a worker process killed
    books = fakes.systems(db_url)
    with Engine(db_url, Registry.from_env()) as eng:
        refund = [(trigger, to) for _, trigger, to in steps(eng, tasks.refund)]
        assert refund == [
            ("start", "collecting_information"),
            ("query_order", "looking_up_order"),
            ("call", "looking_up_order"),
            ("succeeded", "collecting_information"),
            ("assess_eligibility", "eligible"),
            ("repair", "eligible~force"),
            ("propose_refund", "awaiting_approval"),
            ("approve", "executing"),
            ("call", "executing"),
            ("succeeded", "completed"),
        ]
        history = eng.history(tasks.refund)
        assert history[5].data["turn"]["code"] == "DOMAIN_INVALID"  # the amount over the balance, repaired
        assert history[7].actor == "dana"  # bob's attempt was refused and left no event
        ticket = eng.history(tasks.ticket)
        assert [e.trigger for e in ticket] == ["start", "query_ticket", "call", "succeeded", "repair", "decide"]
        assert ticket[4].data["turn"]["code"] == "NO_ACTION" and ticket[-1].to_state == "human_queue"
        crashed = eng.history(tasks.crashed_refund)
        assert [(e.trigger, e.to_state) for e in crashed[-3:]] == [
            ("approve", "executing"),
            ("call", "executing"),
            ("succeeded", "completed"),
        ]
        assert crashed[-1].data["reconciled"] is True  # settled from the provider, not paid again
        for task_id in (tasks.refund, tasks.crashed_refund):
            action_id = eng.load(task_id).prepared["action_id"]  # type: ignore[index]
            assert books.payments.executions()[action_id] == 1
        assert all(eng.replay(t).ok for t in (tasks.refund, tasks.ticket, tasks.crashed_refund))
        for task_id in (tasks.refund, tasks.ticket, tasks.crashed_refund):
            assert undeclared(eng.history(task_id)) == []
        # The ticket that started a refund task: a worker was killed after making it, another found it by its
        # action id; exactly one refund task, paid once, and the ticket answered from its outcome.
        parent = eng.history(tasks.ticket_with_refund)
        assert [(e.trigger, e.to_state) for e in parent[-5:]] == [
            ("decide", "refunding"),
            ("spawn", "refunding"),
            ("spawned", "refunding"),
            ("child_completed", "answering"),
            ("reply", "resolved"),
        ]
        assert parent[-2].data["child"]["result"] == {"state": "completed", "amount": 30_000, "currency": "USD"}
        assert [c["task_id"] for c in eng.get(tasks.ticket_with_refund).children] == [tasks.child_refund]
        assert tasks.child_refund is not None and eng.get(tasks.child_refund).state == "completed"
        action_id = eng.load(tasks.child_refund).prepared["action_id"]  # type: ignore[index]
        assert books.payments.executions()[action_id] == 1
        for task_id in (tasks.ticket_with_refund, tasks.child_refund):
            assert eng.replay(task_id).ok and undeclared(eng.history(task_id)) == []
        # The batch review: a worker was killed amid the fan-out (two of four checks made), another found those
        # by their action ids and made the rest; exactly one check per order, the join collected in order.
        review = eng.history(tasks.order_review)
        assert [(e.trigger, e.to_state) for e in review] == [
            ("start", "checking"),
            ("spawn", "checking"),
            ("spawned", "checking"),
            ("child_failed", "deciding"),
            ("hold", "held"),
        ]
        assert review[2].actor == "system:children"
        spawn = review[1].data["fan_out"]
        assert [c["task_id"] for c in spawn["children"]] == list(tasks.order_checks)
        assert len(eng.store.task_ids(workflow="order_check")) == 4
        ends = [
            ((c.get("result") or {}).get("order_id"), c.get("state")) for c in review[3].data["fan_out"]["children"]
        ]
        assert ends == [("O-2001", "cleared"), ("O-2002", "cleared"), ("O-2003", "flagged"), ("O-2004", "cleared")]
        for task_id in (tasks.order_review, *tasks.order_checks):
            assert eng.replay(task_id).ok and undeclared(eng.history(task_id)) == []


REPO = Path(__file__).resolve().parent.parent
RAILYARD = Path(sys.executable).parent / "railyard"


def railyard(*args: str, url: str) -> subprocess.CompletedProcess[str]:
    """The installed `railyard`, run in the clone as `make demo` runs it, on `url` and the project's workflows."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAILYARD_")}
    return subprocess.run(
        [str(RAILYARD), *args],
        cwd=REPO,
        env={**env, "RAILYARD_DATABASE_URL": url},
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )


def test_the_readme_follow_up_shows_what_make_demo_leaves(tmp_path: Path) -> None:
    """`make demo` (db upgrade, then demo) on a fresh SQLite file, then the README's `console demo` block: each
    command succeeds, and prints exactly the output the README shows under it."""
    url = f"sqlite:///{tmp_path / 'railyard.db'}"
    for step in (["db", "upgrade"], ["demo"]):
        done = railyard(*step, url=url)
        assert done.returncode == 0, done.stderr
    [block] = [b for b in blocks(REPO / "README.md") if b.lang == "console" and b.option("demo")]
    shown: dict[str, list[str]] = {}
    command = ""
    for line in block.text.splitlines():
        if line.startswith("$ "):
            command = without_comment(line[2:]).strip()
            shown[command] = []
        else:
            shown[command].append(line)
    assert "railyard replay --all" in shown
    for command, expected in shown.items():
        argv = shlex.split(command)
        assert argv[0] == "railyard"
        done = railyard(*argv[1:], url=url)
        assert done.returncode == 0, f"{command}: {done.stderr}"
        if expected:
            assert done.stdout.splitlines() == expected, command


def test_the_demo_never_prints_the_database_password(pg_database: str) -> None:
    """The demo's header names the database it runs on, with the password replaced by `***`."""
    truncate(pg_database)
    secret = "s3cret-demo-password"
    url = pg_database.replace("://postgres@", f"://postgres:{secret}@")
    assert secret in url
    done = railyard("demo", url=url)
    assert done.returncode == 0, done.stderr
    assert "Railyard demo" in done.stdout and "postgres:***@" in done.stdout
    assert secret not in done.stdout + done.stderr
