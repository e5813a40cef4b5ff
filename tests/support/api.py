"""Shared by the HTTP API tests: tokens, an engine over the shop and sample workflows, a live uvicorn server."""

from __future__ import annotations

import dataclasses
import re
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import uvicorn
from fastapi import FastAPI
from fastapi.routing import APIRoute
from fastapi.testclient import TestClient

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


# -- every answer as the document declares it --------------------------------------------------------------------
#: The statuses whose code is another than `STATUS_BY_CODE` gives (a failed If-Match, a body over the limit).
SPECIAL = {(412, "CONCURRENCY_CONFLICT"), (413, "PAYLOAD_INVALID")}


@dataclass(frozen=True, slots=True)
class Documented:
    """What the OpenAPI document says each operation may answer: per (method, path template), per error status,
    the codes it lists."""

    operations: dict[tuple[str, str], dict[int, list[str]]]
    patterns: list[tuple[re.Pattern[str], str]]

    @classmethod
    def of(cls, app: FastAPI) -> Documented:
        """What `app`'s document says. Every app `create_app` makes has the same document, and building it took
        about half a second, in the set-up of each API test: it is read once per set of routes (their paths,
        methods and endpoints, from which FastAPI builds it) and kept for the process."""
        key = (
            app.title,
            app.version,
            app.openapi_url,
            tuple(
                (route.path, tuple(sorted(route.methods or ())), route.endpoint)
                for route in app.routes
                if isinstance(route, APIRoute) and route.include_in_schema
            ),
        )
        if key not in _DOCUMENTED:
            _DOCUMENTED[key] = cls._read(app)
        return _DOCUMENTED[key]

    @classmethod
    def _read(cls, app: FastAPI) -> Documented:
        doc = app.openapi()
        operations: dict[tuple[str, str], dict[int, list[str]]] = {}
        for path, item in doc["paths"].items():
            for method, op in item.items():
                errors = {}
                for status, response in op["responses"].items():
                    schema = response.get("content", {}).get("application/json", {}).get("schema", {})
                    if int(status) >= 400:
                        errors[int(status)] = list(schema["properties"]["code"]["enum"])
                operations[(method.upper(), path)] = errors
        patterns = [(re.compile("^" + re.sub(r"\{[^}/]+\}", "[^/]+", p) + "$"), p) for p in doc["paths"]]
        return cls(operations, patterns)

    def operation(self, method: str, path: str) -> tuple[str, str] | None:
        for pattern, template in self.patterns:
            if pattern.match(path) and (method, template) in self.operations:
                return method, template
        return None

    def check(self, method: str, path: str, status: int, body: Any) -> None:
        """An /api answer is one its operation documents: a 2xx, or an error status it lists with a code it lists
        there. An address no operation has answers `code: null` (404, 405)."""
        found = self.operation(method, path)
        if found is None or status < 400:
            if found is None and status >= 400 and status not in (401, 413):
                assert status in (404, 405) and body.get("code") is None, (method, path, status, body)
            return
        listed = self.operations[found]
        assert status in listed, f"{found} answered {status}, which it does not document ({sorted(listed)}): {body}"
        assert body.get("code") in listed[status], (
            f"{found} answered {status} {body.get('code')}, not one of the codes it documents there: {listed[status]}"
        )


#: `Documented.of`'s, by the routes the document is built from.
_DOCUMENTED: dict[tuple[Any, ...], Documented] = {}


def documented(client: Any) -> Any:
    """`client` (a TestClient of the app) checking every /api answer against the app's document as it comes."""
    known = Documented.of(client.app)

    def check(response: Any) -> None:
        path = response.request.url.path
        if not path.startswith("/api/") or path == "/api/openapi.json":
            return
        response.read()
        body = response.json() if response.headers.get("content-type", "").startswith("application/json") else {}
        known.check(response.request.method, path, response.status_code, body if isinstance(body, dict) else {})

    client.event_hooks = {**client.event_hooks, "response": [*client.event_hooks.get("response", []), check]}
    return client


def csrf_of(html: str) -> str:
    found = re.search(r'name="csrf" value="([^"]+)"', html)
    assert found, html
    return found.group(1)


def login(client: TestClient, who: str) -> str:
    """Log in through the form with `tok-WHO`; returns the CSRF token of the new session (from the next page)."""
    page = client.get("/login")
    response = client.post("/login", data={"token": f"tok-{who}", "csrf": csrf_of(page.text)})
    assert response.status_code == 303 and response.headers["location"] == "/inbox", response.text
    return csrf_of(client.get("/inbox").text)
