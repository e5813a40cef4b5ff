"""`railyard worker --processes N`: N real worker processes under one supervisor, on PostgreSQL. A process killed
with SIGKILL is started again and its tasks are resumed by the others, none lost and none run twice; SIGTERM
drains every process; `railyard status` shows the N as one worker with a line per process."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from engine import Engine, Registry
from tests.support.sample_workflows import COUNTER

REPO = Path(__file__).resolve().parent.parent
RAILYARD = str(Path(sys.executable).with_name("railyard"))
TICK: dict[str, object] = {"tool_calls": [{"name": "tick", "arguments": {"n": 1}}]}
FINISH: dict[str, object] = {"tool_calls": [{"name": "finish", "arguments": {}}]}


def wait_for(condition: Callable[[], bool], seconds: float = 120.0, what: str = "") -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"timed out: {what}"
        time.sleep(0.1)


def env_for(url: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAILYARD_")}
    return env | {
        "PYTHONPATH": str(REPO),
        "RAILYARD_DATABASE_URL": url,
        "RAILYARD_WORKFLOWS": "tests.support.sample_workflows",
    }


def script(tmp_path: Path, turns: list[dict[str, object]]) -> str:
    path = tmp_path / "model.json"
    path.write_text(json.dumps({"profile": "anthropic", "turns": turns}), encoding="utf-8")
    return f"scripted:{path}"


def status(url: str) -> dict[str, Any]:
    done = subprocess.run(
        [RAILYARD, "status", "--json"], env=env_for(url), capture_output=True, text=True, timeout=60, check=True
    )
    parsed: dict[str, Any] = json.loads(done.stdout)
    return parsed


def the_worker(url: str) -> dict[str, Any]:
    """The one worker `railyard status` lists (the supervisor's processes as one)."""
    workers = status(url)["workers"]
    assert len(workers) == 1, workers
    worker: dict[str, Any] = workers[0]
    return worker


def both_report(url: str) -> bool:
    """Whether `railyard status` lists one worker of two processes."""
    workers = status(url)["workers"]
    return len(workers) == 1 and len(workers[0].get("processes", [])) == 2


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie (exited, not yet reaped by its parent) is gone for this purpose.
    stat = Path(f"/proc/{pid}/stat")
    return not (stat.exists() and stat.read_text().split(")")[-1].split()[0] == "Z")


def test_a_killed_process_is_started_again_and_no_task_is_lost_or_run_twice(tmp_path: Path, pg_url: str) -> None:
    with Engine(pg_url, Registry([COUNTER])) as eng:
        # Each model turn takes two seconds, so a process always has tasks in hand when it is killed.
        model = script(tmp_path, [{**FINISH, "delay_seconds": 2.0}] * 200)
        argv = [RAILYARD, "worker", "--processes", "2", "--concurrency", "4", "--lease-seconds", "3"]
        argv += ["--report-seconds", "0.5", "--model", model]
        supervisor = subprocess.Popen(argv, env=env_for(pg_url), stderr=subprocess.PIPE, text=True)
        err = ""
        try:
            wait_for(lambda: both_report(pg_url), what="both processes report")
            victim = the_worker(pg_url)["processes"][0]
            task_ids = [eng.start("counter", {}, actor="ann") for _ in range(40)]

            def holds_tasks() -> bool:
                rows = [eng.store.row(t) for t in task_ids]
                return any(r is not None and r.lease_owner == victim["name"] for r in rows)

            wait_for(holds_tasks, what="process 0 holds tasks")
            held = {t for t in task_ids if (r := eng.store.row(t)) is not None and r.lease_owner == victim["name"]}
            os.kill(victim["pid"], signal.SIGKILL)

            def replaced() -> bool:
                workers = status(pg_url)["workers"]
                pids = [p["pid"] for w in workers for p in w.get("processes", [])]
                return len(workers) == 1 and len(pids) == 2 and pids[0] != victim["pid"]

            wait_for(replaced, what="process 0 started again")
            assert supervisor.poll() is None
            wait_for(lambda: all(eng.get(t).state == "done" for t in task_ids), what="every task done")
            worker = the_worker(pg_url)
            assert worker["pid"] == supervisor.pid and worker["restarts"] == 1
            assert [p["process"] for p in worker["processes"]] == [0, 1]
            assert worker["processes"][0]["restarts"] == 1
        finally:
            supervisor.send_signal(signal.SIGTERM)
            _, err = supervisor.communicate(timeout=90)
            print(err)  # shown when the test fails
        assert supervisor.returncode == 0, err
        assert f"process 0 (pid {victim['pid']}) died (signal 9)" in err
        # None lost, none run twice: each task ended by exactly one finish, its log a valid chain that proves it.
        for task_id in task_ids:
            assert [e.trigger for e in eng.history(task_id)] == ["start", "finish"], task_id
            assert eng.replay(task_id).ok
            row = eng.store.row(task_id)
            assert row is not None and row.lease_owner is None
        assert held  # the kill cut off work in hand: those tasks were resumed once their leases ran out


def test_sigterm_drains_every_process(tmp_path: Path, pg_url: str) -> None:
    with Engine(pg_url, Registry([COUNTER])) as eng:
        model = script(tmp_path, [{**TICK, "delay_seconds": 10.0}] * 20)
        argv = [RAILYARD, "worker", "--processes", "2", "--concurrency", "2", "--grace-seconds", "60"]
        argv += ["--report-seconds", "0.5", "--model", model]
        supervisor = subprocess.Popen(argv, env=env_for(pg_url), stderr=subprocess.PIPE, text=True)
        try:
            wait_for(lambda: both_report(pg_url), what="both processes report")
            pids = [p["pid"] for p in the_worker(pg_url)["processes"]]
            task_ids = [eng.start("counter", {}, actor="ann") for _ in range(4)]
            # Two tasks in hand in each process (concurrency 2), each inside its 10-second model call.
            wait_for(lambda: all((r := eng.store.row(t)) is not None and r.lease_owner for t in task_ids))
            # A task claimed a moment ago may not have begun its step yet, and a stopping worker hands such a task
            # back untouched (which is right, and not what this test is about): give each claim time to reach its
            # model call, which then lasts 10 s.
            time.sleep(2.0)
        finally:
            supervisor.send_signal(signal.SIGTERM)
            _, err = supervisor.communicate(timeout=90)
        assert supervisor.returncode == 0, err
        assert not any(alive(pid) for pid in pids)
        # Each process finished the step it was in, recorded it, and handed its tasks back, still due.
        for task_id in task_ids:
            assert [e.trigger for e in eng.history(task_id)] == ["start", "tick"], task_id
            row = eng.store.row(task_id)
            assert row is not None and row.lease_owner is None and row.status == "runnable"
        assert "2 processes, restarts 0, claimed 4, transitions 4, released 4, handed back 4" in err, err
        assert status(pg_url)["workers"] == []  # stopped processes are not listed as live


def test_once_runs_in_one_process(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/w.db"
    done = subprocess.run(
        [RAILYARD, "worker", "--once", "--processes", "2"], env=env_for(url), capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2
    assert "--once drains in one process" in done.stderr
