"""The pure parts of the HTTP layer (tokens file, money and reasons as shown), and `railyard serve` itself."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

from engine import Code, Event, RailyardError, migrations
from engine.api.auth import LoginThrottle
from engine.api.routes import safe_next
from engine.api.tokens import TokenTable, hash_token, load_tokens, parse_tokens, toml_entry
from engine.api.views import display_arguments, format_money, model_reason
from engine.core.payloads import as_event_data
from engine.core.summary import summarise
from engine.store import MemoryStore
from tests.support.api import free_port

REPO = Path(__file__).resolve().parent.parent
RAILYARD = Path(sys.executable).with_name("railyard")


def entry(actor: str = "dana", roles: list[str] | None = None, token: str = "secret") -> dict[str, object]:
    return {"actor": actor, "roles": roles if roles is not None else ["refund_approver"], "sha256": hash_token(token)}


def test_a_tokens_file_maps_hashes_to_actors_and_roles(tmp_path: Path) -> None:
    path = tmp_path / "tokens.toml"
    path.write_text(
        toml_entry("dana", ["refund_approver"], hash_token("t1"))
        + "\n"
        + toml_entry("audrey", ["auditor"], hash_token("t2")),
        encoding="utf-8",
    )
    table = load_tokens(path)
    dana = table.authenticate("t1")
    assert dana is not None and dana.actor == "dana" and not dana.read_only
    assert table.authenticate("t2").read_only  # type: ignore[union-attr]
    assert table.authenticate("t3") is None and table.authenticate("") is None
    assert table.roles_of("dana") == {"refund_approver"} and table.roles_of("nobody") == frozenset()
    assert "t1" not in path.read_text() and hash_token("t1") == hashlib.sha256(b"t1").hexdigest()


@pytest.mark.parametrize(
    ("doc", "problem"),
    [
        ({"token": [{**entry(), "token": "secret"}]}, "clear-text token is never stored"),
        ({"token": [{**entry(), "sha256": "abc"}]}, "sha256 must be 64 lowercase hex"),
        ({"token": [entry(actor="")]}, "actor must be"),
        ({"token": [entry(roles="admin")]}, "roles must be a list"),  # type: ignore[arg-type]
        ({"token": [entry(), entry(token="other", roles=["auditor"])]}, "different roles"),
        ({"token": [entry(), entry(actor="erin")]}, "listed twice"),
        ({"token": "x"}, "expected [[token]]"),
    ],
)
def test_a_bad_tokens_file_is_refused_with_every_problem(doc: dict[str, object], problem: str) -> None:
    with pytest.raises(RailyardError) as caught:
        parse_tokens(doc)
    assert caught.value.code is Code.CONFIG_INVALID and problem in caught.value.message


def test_an_unreadable_tokens_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(RailyardError) as caught:
        load_tokens(tmp_path / "missing.toml")
    assert caught.value.code is Code.CONFIG_INVALID


def test_the_token_helper_makes_a_token_and_its_entry() -> None:
    from typer.testing import CliRunner

    from engine.cli import app

    made = CliRunner().invoke(app, ["tokens", "new", "--actor", "dana", "--role", "refund_approver"])
    assert made.exit_code == 0 and made.stderr == ""
    printed = made.stdout
    token = printed.split(": ", 1)[1].split("\n", 1)[0]
    import tomllib

    table = parse_tokens(tomllib.loads(printed.split("\n\n", 1)[1]))
    assert table.authenticate(token).actor == "dana"  # type: ignore[union-attr]


def test_money_is_shown_in_major_units_with_its_currency() -> None:
    assert format_money(4_000, "EUR") == "40.00 EUR"
    assert format_money(123_456_789, "USD") == "1,234,567.89 USD"
    assert format_money(1_500, "JPY") == "1,500 JPY"
    assert format_money(1_234, "KWD") == "1.234 KWD"
    assert format_money(5, "EUR") == "0.05 EUR"
    shown = display_arguments(
        {"amount_cents": 4_000, "currency": "EUR", "note": "<b>", "total": {"amount": 99, "currency": "GBP"}}
    )
    assert [(s.name, s.text, s.money) for s in shown] == [
        ("amount_cents", "40.00 EUR", True),
        ("currency", "EUR", False),
        ("note", "<b>", False),
        ("total", "0.99 GBP", True),
    ]
    schema = {"properties": {"paid": {"type": "integer", "description": "An amount of money in minor units"}}}
    assert display_arguments({"paid": 250, "currency": "EUR"}, schema)[0].text == "2.50 EUR"
    assert display_arguments({"amount_cents": 250})[0].text == "250"  # no currency: not guessed


def _event(seq: int, trigger: str, data: dict[str, Any], actor: str = "model") -> Event:
    return Event(
        "t", seq, datetime(2026, 1, 1, tzinfo=UTC), actor, "a", trigger, "b", as_event_data(data), "0" * 64, "0" * 64
    )


def test_the_models_reason_comes_from_the_event_that_prepared_the_call() -> None:
    old = _event(2, "propose", {"args": {"reason": "first try"}, "prepared": {"digest": "d1"}})
    new = _event(
        3,
        "propose",
        {
            "args": {"reason": "damaged"},
            "prepared": {"digest": "d2"},
            "turn": {
                "messages": [
                    {"role": "assistant", "content": "Photos attached."},
                    {"role": "user", "content": "not the model"},
                ]
            },
        },
    )
    reason = model_reason([old, new], "d2")
    assert (reason.argument, reason.text, reason.seq) == ("damaged", ["Photos attached."], 3)
    assert model_reason([old], "d9").argument is None
    approval = {"approval": {"decision": "approve", "actor": "dana", "role": "r", "comment": "ok"}}
    assert summarise(_event(4, "approve", approval, actor="dana")) == "approve by dana as r: ok"


def test_railyard_serve_starts_the_api_on_the_port_given(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'serve.db'}"
    migrations.upgrade(url)
    tokens = tmp_path / "tokens.toml"
    tokens.write_text(toml_entry("dana", ["refund_approver"], hash_token("serve-token")), encoding="utf-8")
    port = free_port()
    env = {
        **os.environ,
        "RAILYARD_DATABASE_URL": url,
        "RAILYARD_TOKENS_FILE": str(tokens),
        "RAILYARD_WORKFLOWS": "tests.support.sample_workflows",
        "PYTHONPATH": str(REPO),
    }
    server = subprocess.Popen(
        [str(RAILYARD), "serve", "--port", str(port)],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                response = httpx.get(f"http://127.0.0.1:{port}/api/me", headers={"Authorization": "Bearer serve-token"})
                break
            except httpx.TransportError:
                if server.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(f"railyard serve did not answer: {server.communicate(timeout=5)[0]!r}")
                time.sleep(0.1)
        assert response.json() == {"actor": "dana", "roles": ["refund_approver"], "read_only": False, "tenants": None}
        names = [
            w["name"]
            for w in httpx.get(
                f"http://127.0.0.1:{port}/api/workflows", headers={"Authorization": "Bearer serve-token"}
            ).json()
        ]
        assert names == ["counter", "refund", "triage"]
    finally:
        server.terminate()
        server.wait(timeout=10)


def test_serve_without_a_tokens_file_refuses_to_start() -> None:
    env = {k: v for k, v in os.environ.items() if k != "RAILYARD_TOKENS_FILE"}
    done = subprocess.run([str(RAILYARD), "serve"], cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "CONFIG_INVALID" in done.stderr  # set up wrong: exit 2, like a usage error


def test_serve_with_a_body_limit_that_is_not_a_number_refuses_to_start(tmp_path: Path) -> None:
    tokens = tmp_path / "tokens.toml"
    tokens.write_text(toml_entry("dana", ["refund_approver"], hash_token("serve-token")), encoding="utf-8")
    env = {
        **os.environ,
        "RAILYARD_TOKENS_FILE": str(tokens),
        "RAILYARD_API_MAX_BODY": "1MB",
        "RAILYARD_DATABASE_URL": f"sqlite:///{tmp_path / 'never.db'}",
    }
    done = subprocess.run(
        [str(RAILYARD), "serve", "--port", str(free_port())],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and "CONFIG_INVALID" in done.stderr and "RAILYARD_API_MAX_BODY" in done.stderr
    assert not (tmp_path / "never.db").exists()  # refused before anything was opened


def test_an_actor_with_tokens_of_different_roles_is_refused() -> None:
    with pytest.raises(RailyardError):
        TokenTable.from_tokens({"a": ("dana", {"x"}), "b": ("dana", {"y"})})


def test_the_login_throttle_counts_failures_in_a_sliding_window() -> None:
    t0 = datetime(2026, 12, 1, 9, 0, tzinfo=UTC)
    clock = [t0]

    def after(seconds: int) -> None:
        clock[0] = t0 + timedelta(seconds=seconds)

    store = MemoryStore()
    throttle = LoginThrottle(store, per_account=2, per_address=3, window_seconds=60, clock=lambda: clock[0])
    assert throttle.retry_after(address="10.0.0.1", account="dana") is None
    throttle.failed(address="10.0.0.1", account="dana")
    after(10)
    throttle.failed(address="10.0.0.1", account="DANA")  # a name in any letter case is the same account
    assert throttle.retry_after(address="10.0.0.1", account="dana") == 50  # the first failure leaves at 60 s
    # The account is locked from that address only: whoever typed the name cannot lock its owner out elsewhere.
    assert throttle.retry_after(address="10.0.0.2", account="dana") is None
    # dana's two count once for the address: one person's typos do not lock out everyone behind it.
    assert throttle.retry_after(address="10.0.0.1", account=None) is None
    throttle.failed(address="10.0.0.1", account="erin")
    assert throttle.retry_after(address="10.0.0.1", account="ann") is None  # two of the address's three
    throttle.failed(address="10.0.0.1", account=None)  # an unnamed guess counts every time
    assert throttle.retry_after(address="10.0.0.1", account="ann") == 50  # the address has spent its three
    # Another server process over the same database sees the same failures.
    other = LoginThrottle(store, per_account=2, per_address=3, window_seconds=60, clock=lambda: clock[0])
    assert other.retry_after(address="10.0.0.1", account="dana") == 50
    after(60)  # the first failure leaves the window: one of dana's two, one of the address's three
    assert throttle.retry_after(address="10.0.0.1", account="dana") is None
    throttle.failed(address="10.0.0.3", account="dana")
    throttle.failed(address="10.0.0.3", account="dana")
    assert throttle.retry_after(address="10.0.0.3", account="dana") == 60
    throttle.succeeded(address="10.0.0.3", account="dana")  # clears dana's count from there, not the address's
    assert throttle.retry_after(address="10.0.0.3", account="dana") is None
    throttle.failed(address="10.0.0.3", account=None)
    assert throttle.retry_after(address="10.0.0.3", account=None) is None  # dana's two counted once: two of three
    throttle.failed(address="10.0.0.3", account=None)
    assert throttle.retry_after(address="10.0.0.3", account=None) == 60


def test_a_next_target_is_kept_only_if_it_is_a_path_on_this_server() -> None:
    assert safe_next("/tasks?state=review&q=C-1") == "/tasks?state=review&q=C-1"
    assert safe_next("/tasks/1d1b#timeline") == "/tasks/1d1b#timeline"
    for target in ("https://evil.example", "//evil.example", "/\\evil.example", "/%0d%0a", "/\tx", "/login?x=1", ""):
        expected = "/%0d%0a" if target == "/%0d%0a" else "/inbox"  # percent-escapes are only text in a path
        assert safe_next(target) == expected, target
