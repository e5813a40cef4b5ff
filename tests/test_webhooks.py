"""Webhooks (issue #32): the outbox is written with the event, a receiver started here verifies every signature,
a worker SIGKILLed mid-delivery loses nothing (a duplicate carries the same id), a receiver that was down gets
everything once it is back, a rotated secret signs beside the new one, and bad subscriptions are refused.

Every wait has a deadline and everything started is stopped in a `finally`. The "down for 60 s" scenario is
compressed by a short backoff base (RAILYARD_WEBHOOK_BACKOFF_SECONDS): the code path is the worker's own.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from engine import Engine, Registry, ScriptedModel
from engine.cli import app
from engine.core.errors import Code, ConcurrencyConflict, RailyardError
from engine.core.events import seal
from engine.core.flow import BreakerSettings
from engine.core.webhooks import (
    DELIVERED,
    FAILED,
    Backoff,
    Secret,
    Subscription,
    event_happenings,
    headers,
    message_id,
    messages,
    next_try,
    parse_interest,
    sign,
)
from engine.runtime.outbox import replay, rotate, subscribe
from engine.runtime.roles import StaticRoles
from engine.runtime.webhooks import Sender, SenderSettings
from engine.store import migrations
from tests.support import reference
from tests.support.webhook_workflows import ROLES, WORKFLOWS
from workflows import fakes
from workflows.scripts import REFUND_DAMAGED_ORDER_INPUT, refund_damaged_order

REPO = Path(__file__).resolve().parent.parent
#: The longest any test waits for something to happen before it fails (never a fixed sleep).
PATIENCE = 90.0
FAST = SenderSettings(Backoff(base_seconds=0.2, max_seconds=1.0, give_up_seconds=3600), 2.0, 4.0, 0.1, 60.0)


def wait_for(what: Callable[[], bool], message: str, timeout: float = PATIENCE) -> None:
    deadline = time.monotonic() + timeout
    while not what():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s: {message}")
        time.sleep(0.05)


def verify(secret: str, msg_id: str, timestamp: str, body: bytes, signature: str) -> bool:
    """The receiver's check, written from the specification (not with Railyard's code)."""
    key = base64.b64decode(secret.removeprefix("whsec_"))
    expected = base64.b64encode(
        hmac.new(key, f"{msg_id}.{timestamp}.".encode() + body, hashlib.sha256).digest()
    ).decode()
    return any(
        part.startswith("v1,") and hmac.compare_digest(part[3:], expected) for part in signature.split(" ") if part
    )


class Receiver:
    """An HTTP receiver on 127.0.0.1: records every request, checks its signatures against `secrets`, answers 204.
    With `hold` clear, requests wait (at most 30 s) before the answer: a delivery in flight."""

    def __init__(self, secrets: list[str], port: int = 0) -> None:
        self.secrets = secrets
        self.got: list[dict[str, Any]] = []
        self.bad: list[dict[str, Any]] = []
        self.lock = threading.Lock()
        self.hold = threading.Event()
        self.hold.set()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["content-length"]))
                seen = {
                    "id": self.headers["webhook-id"],
                    "timestamp": self.headers["webhook-timestamp"],
                    "signature": self.headers["webhook-signature"],
                    "body": body,
                    "verified": [
                        s
                        for s in receiver.secrets
                        if verify(
                            s,
                            self.headers["webhook-id"],
                            self.headers["webhook-timestamp"],
                            body,
                            self.headers["webhook-signature"],
                        )
                    ],
                }
                with receiver.lock:
                    (receiver.got if seen["verified"] else receiver.bad).append(seen)
                receiver.hold.wait(30)
                try:
                    self.send_response(204 if seen["verified"] else 401)
                    self.end_headers()
                except OSError:
                    pass  # the sender was killed meanwhile

            def log_message(self, *_args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}/hook"
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    def __enter__(self) -> Receiver:
        self.thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.hold.set()
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=10)

    def ids(self) -> list[str]:
        with self.lock:
            return [g["id"] for g in self.got]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def engine(db_url: str) -> Iterator[Engine]:
    with Engine(db_url, Registry(WORKFLOWS), authoriser=StaticRoles(ROLES)) as eng:
        yield eng


def subscribed(eng: Engine, url: str, kinds: list[str], fmt: str = "standard") -> Subscription:
    sub = subscribe(eng.store, url, kinds, fmt, "test")
    eng.outbox.forget()  # this process matches the new subscription from the next event
    return sub


@pytest.fixture
def sending(engine: Engine) -> Iterator[Callable[..., None]]:
    """Start in-process senders (the worker's `Sender.run`); each is stopped and joined after the test."""
    started: list[tuple[threading.Event, threading.Thread]] = []

    def start(settings: SenderSettings = FAST, name: str = "sender") -> None:
        done = threading.Event()
        thread = threading.Thread(target=Sender(engine.store, name, settings).run, args=(done,), daemon=True)
        thread.start()
        started.append((done, thread))

    try:
        yield start
    finally:
        for done, _ in started:
            done.set()
        for _, thread in started:
            thread.join(timeout=15)
            assert not thread.is_alive(), "a sender did not stop"


# -- pure: matching, ids, signatures, backoff ---------------------------------------------------------------------
def test_signatures_follow_standard_webhooks() -> None:
    # The specification's example (standard-webhooks' reference libraries use it in their tests).
    secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
    body = '{"test": 2432232314}'
    assert sign(secret, "msg_p5jXN8AQM9LWM0D4loKWxJek", 1614265330, body) == (
        "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
    )
    sent = headers([secret, "whsec_" + base64.b64encode(b"k" * 24).decode()], "msg_1", 1614265330, body)
    assert len(sent["webhook-signature"].split(" ")) == 2
    assert verify(secret, "msg_1", "1614265330", body.encode(), sent["webhook-signature"])


def test_matching_is_by_kind_role_and_deadline_with_one_id_per_happening() -> None:
    at = datetime(2026, 12, 5, tzinfo=UTC)
    sub = Subscription(
        "wh_1",
        "https://x.example/h",
        (parse_interest("work.created:approver"),),
        "slack",
        (Secret("whsec_x"),),
        at,
        "t",
    )
    other = Subscription("wh_2", "https://y.example/h", (parse_interest("task.ended"),), "standard", (), at, "t")
    found = event_happenings(
        task_id="t1",
        workflow="review",
        event_key="t1:1",
        at=at,
        entered="waiting",
        status="blocked",
        waiting_roles=lambda _state: frozenset({"approver"}),
        failed_write=None,
    )
    out = messages(found, [sub, other])
    assert [(m.subscription_id, m.kind) for m in out] == [("wh_1", "work.created")]
    assert out[0].id == message_id("wh_1", "t1:1:work") == messages(found, [sub])[0].id
    assert "New work for approver" in json.loads(out[0].body)["text"]
    elsewhere = event_happenings(
        task_id="t1",
        workflow="review",
        event_key="t1:1",
        at=at,
        entered="waiting",
        status="blocked",
        waiting_roles=lambda _state: frozenset({"operator"}),
        failed_write=None,
    )
    assert messages(elsewhere, [sub]) == []


@pytest.mark.parametrize("kind", ["nope", "task.ended:3", "deadline.near", "deadline.near:-1", "deadline.near:x"])
def test_an_unknown_kind_is_refused(kind: str) -> None:
    with pytest.raises(RailyardError) as refused:
        parse_interest(kind)
    assert refused.value.code == Code.WEBHOOK_KIND_UNKNOWN


def test_backoff_is_bounded_by_time_not_by_a_count() -> None:
    backoff = Backoff(base_seconds=5, max_seconds=300, give_up_seconds=86400)
    since = at = datetime(2026, 12, 5, tzinfo=UTC)
    attempts = 0
    while (then := next_try(backoff, attempts + 1, since, at, 0.99)) is not None:
        attempts += 1
        at = then
    # A receiver down for 60 s, or for hours, is still being tried: hundreds of attempts over a day.
    assert attempts > 250
    assert at - since <= timedelta(seconds=86400)
    assert next_try(backoff, 1, since, since, 0.0) == since + timedelta(seconds=2.5)  # jitter: half to all of it


# -- the outbox is written with the event -------------------------------------------------------------------------
def test_the_outbox_is_written_with_the_event_and_not_without_it(engine: Engine) -> None:
    sub = subscribed(engine, "http://127.0.0.1:9/h", ["work.created:approver", "task.ended"])
    task_id = engine.start("review", {}, actor="dana")
    first = engine.store.deliveries()
    assert [(d.message.kind, d.message.task_id) for d in first] == [("work.created", task_id)]
    task = engine.load(task_id)
    stale = seal(
        task_id=task_id,
        seq=task.seq + 1,
        at=datetime.now(UTC),
        actor="dana",
        from_state="waiting",
        trigger="approve",
        to_state="done",
        data={},
        prev_hash=task.last_hash,
    )
    lost = messages(
        event_happenings(
            task_id=task_id,
            workflow="review",
            event_key=f"{task_id}:stale",
            at=stale.at,
            entered="done",
            status="terminal",
            waiting_roles=lambda _s: frozenset(),
            failed_write=None,
        ),
        [sub],
    )
    engine.cancel(task_id, "dana", "not needed")  # another writer moves the task first
    written = sorted(d.message.id for d in engine.store.deliveries())
    assert sorted(d.message.kind for d in engine.store.deliveries()) == ["task.ended", "work.created"]
    with pytest.raises(ConcurrencyConflict):  # neither the stale event nor its message is written
        engine.store.append(task_id, task.seq, [stale], status="terminal", outbox=lost)
    assert sorted(d.message.id for d in engine.store.deliveries()) == written
    assert lost and lost[0].id not in written


def test_the_deadline_sweep_writes_one_message_per_task_and_deadline(engine: Engine) -> None:
    subscribed(engine, "http://127.0.0.1:9/h", ["deadline.near:2"])
    far = subscribed(engine, "http://127.0.0.1:9/far", ["deadline.near:0.5"])
    ids = [engine.start("review", {}, actor="dana") for _ in range(3)]
    from engine.runtime.webhooks import deadlines_of

    sender = Sender(engine.store, "sweeper", FAST, deadlines_of(engine.store, [("review", 1, "waiting")]))
    at = datetime.now(UTC)
    assert sender.sweep(at) == 3  # due within 1 h: near for the 2 h window, not yet for the 30 min one
    assert sender.sweep(at + timedelta(seconds=5)) == 0  # run again (or by another worker): nothing twice
    assert sorted(d.message.task_id or "" for d in engine.store.deliveries()) == sorted(ids)
    assert not engine.store.deliveries(subscription_id=far.id)


# -- delivery ----------------------------------------------------------------------------------------------------
def test_a_receiver_down_gets_everything_once_back_every_signature_verified(
    engine: Engine, sending: Callable[..., None]
) -> None:
    port = free_port()
    sub = subscribed(engine, f"http://127.0.0.1:{port}/hook", ["work.created", "task.ended"])
    secret = sub.secrets[0].value
    ids = [engine.start("review", {}, actor="dana") for _ in range(4)]
    for task_id in ids[:2]:
        engine.cancel(task_id, "dana", "done with it")
    wanted = {d.message.id for d in engine.store.deliveries()}
    assert len(wanted) == 6
    sending()
    # Down: every message is tried, and tried again, with the backoff (base 0.2 s: 60 s compressed to seconds).
    wait_for(
        lambda: all(d.attempts >= 3 for d in engine.store.deliveries()),
        "every message tried three times while the receiver is down",
    )
    assert all(d.status == "pending" and d.last_error for d in engine.store.deliveries())
    with Receiver([secret], port) as receiver:
        wait_for(lambda: all(d.status == DELIVERED for d in engine.store.deliveries()), "all delivered")
        assert set(receiver.ids()) == wanted
        assert receiver.bad == []
        bodies = {g["id"]: json.loads(g["body"]) for g in receiver.got}
    assert {b["type"] for b in bodies.values()} == {"work.created", "task.ended"}
    assert all(b["data"]["task_id"] in ids for b in bodies.values())


def test_a_rotated_secret_signs_beside_the_new_one_until_its_overlap_ends(
    engine: Engine, sending: Callable[..., None]
) -> None:
    with Receiver([]) as receiver:
        sub = subscribed(engine, receiver.url, ["task.ended"], fmt="slack")
        old = sub.secrets[0].value
        new, signing = rotate(engine.store, sub.id, timedelta(hours=1))
        assert signing == 2
        receiver.secrets = [old, new]
        task_id = engine.start("review", {}, actor="dana")
        engine.cancel(task_id, "dana", "rotation")
        sending()
        wait_for(lambda: len(receiver.got) == 1, "the first message")
        got = receiver.got[0]
        assert got["verified"] == [old, new]  # both signatures, each verified with its own secret
        assert json.loads(got["body"])["text"].startswith("Task ended")
        newest, signing = rotate(engine.store, sub.id, timedelta(0))  # no overlap: only the newest signs
        assert signing == 1
        receiver.secrets = [old, new, newest]
        second = engine.start("review", {}, actor="dana")
        engine.cancel(second, "dana", "rotation")
        wait_for(lambda: len(receiver.got) == 2, "the second message")
        assert receiver.got[1]["verified"] == [newest]
        assert receiver.bad == []


def test_a_message_given_up_on_is_failed_and_replayed_with_the_same_id(
    engine: Engine, sending: Callable[..., None]
) -> None:
    port = free_port()
    sub = subscribed(engine, f"http://127.0.0.1:{port}/hook", ["task.ended"])
    task_id = engine.start("review", {}, actor="dana")
    engine.cancel(task_id, "dana", "give up")
    brief = SenderSettings(Backoff(base_seconds=0.2, max_seconds=0.5, give_up_seconds=1.0), 2.0, 4.0, 0.1, 60.0)
    sending(brief)
    wait_for(lambda: [d.status for d in engine.store.deliveries()] == [FAILED], "given up after its window")
    (failed,) = engine.store.deliveries(status=FAILED)
    with pytest.raises(RailyardError) as refused:
        replay(engine.store, [failed.message.id, "msg_unknown"])
    assert refused.value.code == Code.WEBHOOK_NOT_FOUND
    assert engine.store.deliveries(status=FAILED)  # nothing moved
    with Receiver([sub.secrets[0].value], port) as receiver:
        assert replay(engine.store, [failed.message.id]) == 1
        wait_for(lambda: [d.status for d in engine.store.deliveries()] == [DELIVERED], "replayed and delivered")
        assert receiver.ids() == [failed.message.id]


def test_a_worker_killed_mid_delivery_loses_nothing_and_a_duplicate_has_the_same_id(
    engine: Engine, db_url: str, tmp_path: Path
) -> None:
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "RAILYARD_DATABASE_URL": db_url,
        "RAILYARD_WORKFLOWS": "tests.support.webhook_workflows",
        "RAILYARD_WEBHOOK_BACKOFF_SECONDS": "0.2",
        "RAILYARD_WEBHOOK_BACKOFF_MAX_SECONDS": "1",
        "RAILYARD_WEBHOOK_TIMEOUT_SECONDS": "3",
        "RAILYARD_WEBHOOK_LEASE_SECONDS": "6",
        "RAILYARD_WEBHOOK_POLL_SECONDS": "0.2",
    }
    workers: list[subprocess.Popen[bytes]] = []

    def worker(name: str) -> subprocess.Popen[bytes]:
        log = (tmp_path / f"{name}.log").open("wb")
        started = subprocess.Popen(
            [str(Path(sys.executable).parent / "railyard"), "worker", "--processes", "1", "--grace-seconds", "1"],
            env=env,
            cwd=REPO,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        workers.append(started)
        return started

    with Receiver([]) as receiver:
        try:
            sub = subscribed(engine, receiver.url, ["work.created", "task.ended"])
            receiver.secrets = [sub.secrets[0].value]
            for _ in range(5):
                engine.cancel(engine.start("review", {}, actor="dana"), "dana", "crash test")
            wanted = {d.message.id for d in engine.store.deliveries()}
            assert len(wanted) == 10
            receiver.hold.clear()  # the first requests wait for an answer: deliveries in flight
            doomed = worker("doomed")
            wait_for(lambda: len(receiver.got) >= 1, "a delivery in flight")
            in_flight = set(receiver.ids())
            os.killpg(doomed.pid, signal.SIGKILL)
            doomed.wait(timeout=30)
            assert doomed.returncode == -signal.SIGKILL
            receiver.hold.set()
            # The dead worker's leases expire (6 s) and the heir takes its messages over.
            heir = worker("heir")
            wait_for(
                lambda: all(d.status == DELIVERED for d in engine.store.deliveries()),
                "every message delivered after the crash",
                timeout=150,
            )
            heir.send_signal(signal.SIGTERM)
            heir.wait(timeout=60)
        finally:
            for w in workers:
                if w.poll() is None:
                    os.killpg(w.pid, signal.SIGKILL)
                    w.wait(timeout=30)
        got = receiver.ids()
        assert receiver.bad == []
        assert set(got) == wanted  # every event delivered at least once
        # What was in flight when the worker died was sent again, with the same id (and the same body).
        assert all(got.count(i) >= 2 for i in in_flight)
        bodies: dict[str, set[bytes]] = {}
        for g in receiver.got:
            bodies.setdefault(g["id"], set()).add(g["body"])
        assert all(len(b) == 1 for b in bodies.values())


# -- the CLI -----------------------------------------------------------------------------------------------------
def test_the_cli_refuses_bad_subscriptions_with_stable_codes_and_keeps_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = f"sqlite:///{tmp_path / 'railyard.db'}"
    migrations.upgrade(url)
    monkeypatch.setenv("RAILYARD_DATABASE_URL", url)
    runner = CliRunner()

    def run(*args: str) -> tuple[int, str, str]:
        result = runner.invoke(app, list(args))
        return result.exit_code, result.stdout, result.stderr

    for args, code in [
        (["https://x.example/h", "--kind", "nope"], "WEBHOOK_KIND_UNKNOWN"),
        (["ftp://x.example/h", "--kind", "task.ended"], "WEBHOOK_URL_INVALID"),
        (["file:///etc/passwd", "--kind", "task.ended"], "WEBHOOK_URL_INVALID"),
        (["https://x.example/h", "--kind", "task.ended", "--format", "xml"], "WEBHOOK_FORMAT_UNKNOWN"),
        (["https://x.example/h", "--kind", "task.ended", "--secret", "hunter2"], "WEBHOOK_SECRET_INVALID"),
    ]:
        status, _, err = run("webhooks", "add", *args, "--by", "op")
        assert status == 1 and f"{code}:" in err, (args, err)
    assert json.loads(run("webhooks", "list", "--json")[1]) == []
    status, out, _ = run("webhooks", "add", "https://x.example/h", "--kind", "breaker.opened", "--by", "op", "--json")
    assert status == 0
    made = json.loads(out)
    assert made["secret"].startswith("whsec_") and made["kinds"] == ["breaker.opened"]
    listed = json.loads(run("webhooks", "list", "--json")[1])
    assert [r["id"] for r in listed] == [made["id"]] and "secret" not in json.dumps(listed).replace('"secrets"', "")
    status, out, _ = run("webhooks", "rotate-secret", made["id"], "--json")
    assert status == 0 and json.loads(out)["signing"] == 2
    assert run("webhooks", "remove", "wh_none")[2].startswith("WEBHOOK_NOT_FOUND:")
    assert run("webhooks", "remove", made["id"])[0] == 0
    assert json.loads(run("webhooks", "list", "--json")[1]) == []
    assert json.loads(run("webhooks", "deliveries", "--json")[1]) == []


# -- a payment failed, a breaker opened ------------------------------------------------------------------------------
books, eng = reference.books, reference.eng  # the reference workflows' fixtures


def test_a_failed_payment_is_a_message_written_with_its_outcome(eng: Engine, books: fakes.Systems) -> None:
    subscribed(eng, "http://127.0.0.1:9/h", ["payment.failed", "work.created:refund_approver"])
    task_id = eng.start("refund", REFUND_DAMAGED_ORDER_INPUT, actor="portal", version=1)
    assert eng.run(task_id, model=ScriptedModel(refund_damaged_order(1))).state == "awaiting_approval"
    prepared = eng.load(task_id).prepared
    assert prepared is not None
    eng.approve(task_id, actor="dana", prepared_digest=prepared["digest"])
    books.arm("payments.refund", "remote_error")
    eng.run(task_id)
    found = {d.message.kind: json.loads(d.message.body) for d in eng.store.deliveries()}
    assert found["work.created"]["data"]["roles"] == ["refund_approver"]
    failed = found["payment.failed"]["data"]
    assert (failed["task_id"], failed["tool"], failed["code"]) == (task_id, "payments_refund", "TOOL_REMOTE_ERROR")
    failure = next(e for e in eng.history(task_id) if e.trigger == "failed")
    assert failed["action_id"] == failure.data["action_id"]


@pytest.mark.parametrize("url", ["memory://", "db"])
def test_a_breaker_that_opens_writes_one_message_in_the_same_write(db_url: str, url: str) -> None:
    with Engine(db_url if url == "db" else url, Registry(WORKFLOWS), authoriser=StaticRoles(ROLES)) as e:
        subscribed(e, "http://127.0.0.1:9/h", ["breaker.opened"])
        settings = BreakerSettings(failures=2, cool_down_seconds=60)
        for _ in range(4):  # the second failure opens it; the ones after find it open already
            flow: Any = e.store  # every store is a FlowStore too (`engine.store.protocol`)
            flow.breaker_failed("openai:gpt-test", settings, e.outbox.for_breaker)
        (sent,) = e.store.deliveries()
        assert sent.message.kind == "breaker.opened"
        assert json.loads(sent.message.body)["data"] == {"key": "openai:gpt-test", "failures": 2}
