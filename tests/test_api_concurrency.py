"""Two approvers approving the same task at the same instant, over HTTP against a real uvicorn server.

Exactly one decision reaches the log: one approver gets 200, the other 409
(the task is no longer awaiting approval, or the append conflicted), on SQLite
and on PostgreSQL.
"""

from __future__ import annotations

import threading
from pathlib import Path

import httpx

from engine import Code
from tests.api_support import bearer, live_server, make_api_engine, make_app, to_approval

ROUNDS = 5


def race(url: str, task_id: str, digest: str,
         approvers: tuple[str, ...] = ("dana", "erin")) -> dict[str, httpx.Response]:
    """Each approver POSTs the approval from its own thread and connection, released by one barrier."""
    clients = {who: httpx.Client(base_url=url, headers=bearer(who), timeout=30) for who in approvers}
    for client in clients.values():
        assert client.get("/api/me").status_code == 200  # connections open before the race
    barrier = threading.Barrier(len(clients))
    answers: dict[str, httpx.Response] = {}

    def approve(who: str, client: httpx.Client) -> None:
        barrier.wait()
        answers[who] = client.post(f"/api/tasks/{task_id}/approve", json={"digest": digest, "comment": who})

    threads = [threading.Thread(target=approve, args=item) for item in clients.items()]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    for client in clients.values():
        client.close()
    return answers


def test_two_approvers_at_once_one_200_one_409_one_decision(db_url: str, tmp_path: Path) -> None:
    with make_api_engine(db_url, tmp_path) as engine, live_server(make_app(engine)) as url:
        for _ in range(ROUNDS):
            task_id = to_approval(engine)
            answers = race(url, task_id, engine.load(task_id).prepared["digest"])  # type: ignore[index]
            statuses = sorted(r.status_code for r in answers.values())
            assert statuses == [200, 409], {who: r.text for who, r in answers.items()}
            loser = next(r for r in answers.values() if r.status_code == 409)
            assert loser.json()["code"] in {str(Code.TASK_NOT_AWAITING_APPROVAL), str(Code.CONCURRENCY_CONFLICT)}
            winner = next(who for who, r in answers.items() if r.status_code == 200)
            decisions = [e for e in engine.history(task_id) if "approval" in e.data]
            assert [(e.actor, e.trigger) for e in decisions] == [(winner, "approve")]
