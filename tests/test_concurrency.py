"""Optimistic concurrency under real contention: threads (both databases) and processes (PostgreSQL).

Every round, all writers load the same head of one task, wait at a barrier,
then append with the same `expected_seq`. Exactly one may win each round; the
others must get ConcurrencyConflict and write nothing.
"""

from __future__ import annotations

import multiprocessing
import threading
from collections import Counter
from typing import Any

import pytest

from engine import ConcurrencyConflict, Engine, Registry, StaticRoles, verify_chain
from tests.support.sample_workflows import ROLES, all_workflows

ROUNDS = 25


def contend(eng: Engine, task_id: str, writer: int, rounds: int, loaded: Any, go: Any) -> list[str]:
    """One writer's rounds; returns 'won' or 'conflict' per round."""
    outcomes = []
    for n in range(rounds):
        loaded.wait()
        held = eng.load(task_id)
        go.wait()
        try:
            eng.transition(held, "tick", {"n": n * 100 + writer}, actor=f"writer-{writer}")
            outcomes.append("won")
        except ConcurrencyConflict:
            outcomes.append("conflict")
    return outcomes


def check_log(eng: Engine, task_id: str, wins: int) -> None:
    events = eng.history(task_id)
    assert [e.seq for e in events] == list(range(1, wins + 2)), "seq must be gap-free"
    assert verify_chain(events) == []
    task = eng.load(task_id)
    assert task.seq == wins + 1
    assert eng.store.row(task_id).seq == wins + 1  # type: ignore[union-attr]


def test_eight_threads_one_winner_per_seq(db_url: str) -> None:
    writers = 8
    with Engine(db_url, Registry(all_workflows()), authoriser=StaticRoles(ROLES), snapshot_every=10) as eng:
        task_id = eng.start("counter", {}, actor="ann")
        loaded, go = threading.Barrier(writers), threading.Barrier(writers)
        results: dict[int, list[str]] = {}

        def run(writer: int) -> None:
            results[writer] = contend(eng, task_id, writer, ROUNDS, loaded, go)

        threads = [threading.Thread(target=run, args=(w,)) for w in range(writers)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
        assert len(results) == writers, "a writer thread died"
        per_round = [Counter(results[w][n] for w in range(writers)) for n in range(ROUNDS)]
        assert all(c == Counter(won=1, conflict=writers - 1) for c in per_round), per_round
        check_log(eng, task_id, wins=ROUNDS)
        assert [s.seq for s in eng.store.snapshots(task_id)] == [10, 20]


def _process_writer(url: str, task_id: str, writer: int, rounds: int, loaded: Any, go: Any, out: Any) -> None:
    # The engine (and its connections) is created here, after the process started: never inherited.
    with Engine(url, Registry(all_workflows()), authoriser=StaticRoles(ROLES)) as eng:
        out.put((writer, contend(eng, task_id, writer, rounds, loaded, go)))


def test_four_processes_one_winner_per_seq_on_postgres(pg_database: str) -> None:
    from tests.support.postgres import truncate as _truncate

    _truncate(pg_database)
    writers = 4
    ctx = multiprocessing.get_context("spawn")
    with Engine(pg_database, Registry(all_workflows()), authoriser=StaticRoles(ROLES)) as eng:
        task_id = eng.start("counter", {}, actor="ann")
        loaded, go, out = ctx.Barrier(writers), ctx.Barrier(writers), ctx.Queue()
        procs = [
            ctx.Process(target=_process_writer, args=(pg_database, task_id, w, ROUNDS, loaded, go, out))
            for w in range(writers)
        ]
        for p in procs:
            p.start()
        results = dict(out.get(timeout=180) for _ in procs)
        for p in procs:
            p.join(timeout=60)
            assert p.exitcode == 0
        per_round = [Counter(results[w][n] for w in range(writers)) for n in range(ROUNDS)]
        assert all(c == Counter(won=1, conflict=writers - 1) for c in per_round), per_round
        check_log(eng, task_id, wins=ROUNDS)


@pytest.mark.parametrize("writers", [4])
def test_writers_on_distinct_tasks_never_conflict(db_url: str, writers: int) -> None:
    with Engine(db_url, Registry(all_workflows()), authoriser=StaticRoles(ROLES)) as eng:
        task_ids = [eng.start("counter", {}, actor="ann") for _ in range(writers)]
        errors: list[BaseException] = []

        def run(task_id: str) -> None:
            try:
                task = eng.load(task_id)
                for n in range(30):
                    task = eng.transition(task, "tick", {"n": n}, actor="w")
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=run, args=(t,)) for t in task_ids]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
        assert errors == []
        for task_id in task_ids:
            check_log(eng, task_id, wins=30)
