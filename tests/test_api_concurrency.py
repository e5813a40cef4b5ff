"""Commands racing over HTTP against a real uvicorn server: each from its own thread and connection, released
by one barrier, on SQLite and on PostgreSQL.

- Two approvers approve the same task at the same instant: exactly one
  decision reaches the log; one gets 200, the other 409 (the task is no
  longer awaiting approval, or the append conflicted).
- An approval and a cancel, both sent with `If-Match` naming the seq their
  senders saw: exactly one is applied, the other is 412 CONCURRENCY_CONFLICT,
  and the task ends where the winner sent it; the log replays clean.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import httpx

from engine import Code
from tests.support.api import bearer, live_server, make_api_engine, make_app, to_approval

ROUNDS = 5
IF_MATCH_ROUNDS = 30

#: Who sends what: an actor, and the command's path (after /api/tasks/{id}/), body and extra headers.
Command = tuple[str, str, dict[str, Any], dict[str, str]]


def race(url: str, task_id: str, commands: dict[str, Command]) -> dict[str, httpx.Response]:
    """Each command is POSTed from its own thread and connection, all released by one barrier."""
    clients = {
        name: httpx.Client(base_url=url, headers=bearer(who), timeout=30)
        for name, (who, _path, _body, _headers) in commands.items()
    }
    for client in clients.values():
        assert client.get("/api/me").status_code == 200  # connections open before the race
    barrier = threading.Barrier(len(clients))
    answers: dict[str, httpx.Response] = {}

    def send(name: str, client: httpx.Client) -> None:
        _who, path, body, headers = commands[name]
        barrier.wait()
        answers[name] = client.post(f"/api/tasks/{task_id}/{path}", json=body, headers=headers)

    threads = [threading.Thread(target=send, args=item) for item in clients.items()]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    for client in clients.values():
        client.close()
    assert set(answers) == set(commands), "a request did not come back"
    return answers


def test_two_approvers_at_once_one_200_one_409_one_decision(db_url: str, tmp_path: Path) -> None:
    with make_api_engine(db_url, tmp_path) as engine, live_server(make_app(engine)) as url:
        for _ in range(ROUNDS):
            task_id = to_approval(engine)
            digest = engine.load(task_id).prepared["digest"]  # type: ignore[index]
            answers = race(
                url,
                task_id,
                {who: (who, "approve", {"digest": digest, "comment": who}, {}) for who in ("dana", "erin")},
            )
            statuses = sorted(r.status_code for r in answers.values())
            assert statuses == [200, 409], {who: r.text for who, r in answers.items()}
            loser = next(r for r in answers.values() if r.status_code == 409)
            assert loser.json()["code"] in {str(Code.TASK_NOT_AWAITING_APPROVAL), str(Code.CONCURRENCY_CONFLICT)}
            winner = next(who for who, r in answers.items() if r.status_code == 200)
            decisions = [e for e in engine.history(task_id) if "approval" in e.data]
            assert [(e.actor, e.trigger) for e in decisions] == [(winner, "approve")]


def test_approve_and_cancel_with_the_same_if_match_exactly_one_wins(db_url: str, tmp_path: Path) -> None:
    with make_api_engine(db_url, tmp_path) as engine, live_server(make_app(engine)) as url:
        wins = {"approve": 0, "cancel": 0}
        for _ in range(IF_MATCH_ROUNDS):
            task_id = to_approval(engine)
            seen = engine.load(task_id)
            if_match = {"If-Match": f'"{seen.seq}"'}
            answers = race(
                url,
                task_id,
                {
                    "approve": (
                        "dana",
                        "approve",
                        {"digest": seen.prepared["digest"], "comment": "ok"},  # type: ignore[index]
                        if_match,
                    ),
                    "cancel": ("ann", "cancel", {"reason": "customer withdrew"}, if_match),
                },
            )
            shown = {name: (r.status_code, r.text) for name, r in answers.items()}
            won = [name for name, r in answers.items() if 200 <= r.status_code < 300]
            assert len(won) == 1, shown
            [winner] = won
            [loser] = set(answers) - {winner}
            assert answers[loser].status_code == 412, shown
            refusal = answers[loser].json()
            assert refusal["code"] == str(Code.CONCURRENCY_CONFLICT), shown
            assert refusal["details"]["expected"] == seen.seq and refusal["details"]["actual"] == seen.seq + 1
            expected_state = {"approve": "executing", "cancel": "cancelled"}[winner]
            assert refusal["details"]["state"] == expected_state, shown
            body = answers[winner].json()
            assert (body["state"], body["seq"]) == (expected_state, seen.seq + 1)
            assert answers[winner].headers["ETag"] == f'"{seen.seq + 1}"'
            task = engine.load(task_id)
            assert (task.state, task.seq) == (expected_state, seen.seq + 1)  # one event: the winner's
            assert engine.history(task_id)[-1].trigger == winner
            assert engine.replay(task_id).ok
            wins[winner] += 1
        assert sum(wins.values()) == IF_MATCH_ROUNDS
