"""Shared by the HTTP API tests: tokens, an engine over the shop and sample workflows, a live uvicorn server."""

from __future__ import annotations

import dataclasses
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import uvicorn
from fastapi import FastAPI

from engine import Engine, Registry, ScriptedModel
from engine.api import TokenTable, create_app
from engine.providers.scripted import call
from tests.support.sample_workflows import all_workflows
from tests.support.shop import Ledger, make_workflow

#: Clear tokens exist only in tests; the server keeps their hashes.
TOKENS: dict[str, tuple[str, set[str]]] = {
    "tok-ann": ("ann", set()),  # a clerk: starts tasks, holds no approval role
    "tok-dana": ("dana", {"refund_approver", "approver"}),
    "tok-erin": ("erin", {"refund_approver", "approver"}),
    "tok-olga": ("olga", {"operator"}),
    "tok-bob": ("bob", {"support"}),  # no approval role
    "tok-audrey": ("audrey", {"auditor"}),  # read-only
}

REFUND = {"order_id": "O-1", "amount_cents": 4_000, "currency": "EUR", "reason": "damaged parcel"}


def bearer(name: str) -> dict[str, str]:
    return {"Authorization": f"Bearer tok-{name}"}


def token_table() -> TokenTable:
    return TokenTable.from_tokens(TOKENS)


#: The shop refund again, where only an `operator` may record what became of a payment (`settle`).
SETTLED_BY_OPERATORS = "shop_ops"


def make_api_engine(db_url: str, ledger_dir: Path) -> Engine:
    tokens = token_table()
    shop = make_workflow(Ledger(ledger_dir / "ledger.db"))
    ops = dataclasses.replace(shop, name=SETTLED_BY_OPERATORS, settle_role="operator")
    registry = Registry([shop, ops, *all_workflows()])
    return Engine(db_url, registry, authoriser=tokens)


def make_app(engine: Engine) -> FastAPI:
    return create_app(engine, token_table(), session_secret="test-secret")


def to_approval(
    engine: Engine,
    refund: dict[str, Any] = REFUND,
    *,
    starter: str = "ann",
    text: str | None = None,
    workflow: str = "shop_refund",
) -> str:
    """A shop refund driven by a scripted model up to its approval gate: the prepared call waits for a human."""
    task_id = engine.start(workflow, {"customer": "c1"}, actor=starter)
    proposal = call("propose_refund", **refund)
    if text is not None:
        proposal["text"] = text
    model = ScriptedModel([call("query_order", order_id="O-1"), proposal], profile="anthropic")
    assert engine.run(task_id, model=model).state == "awaiting_approval"
    return task_id


def to_open_write(engine: Engine, workflow: str = SETTLED_BY_OPERATORS) -> str:
    """A shop refund approved, whose payment's intent is in the log and its outcome is not: `unsettled`, pending.

    The worker that recorded the intent died long ago: its call can no longer land, so the write may be settled.
    """
    task_id = to_approval(engine, workflow=workflow)
    task = engine.approve(task_id, actor="dana", prepared_digest=engine.load(task_id).prepared["digest"])  # type: ignore[index]
    assert task.prepared is not None
    engine.commit_system(
        task,
        "call",
        {"intent": task.prepared, "attempt": 1, "requested_at": "2000-01-01T00:00:00Z"},
        actor="system:tools",
    )
    unsettled = engine.get(task_id).unsettled
    assert unsettled is not None and unsettled["status"] == "pending", unsettled
    return task_id


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def live_server(app: FastAPI) -> Iterator[str]:
    """The app under a real uvicorn server on a free port, in a thread; yields its base URL."""
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
