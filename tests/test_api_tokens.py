"""Tokens that expire, a tokens file read again when it changes, and `railyard tokens list` (issue #28): people and
their roles change on a running server, without a restart, and a revoked or expired token stops working at once,
page sessions opened with it included."""

from __future__ import annotations

import json
import os
import tomllib
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from engine import Code, Engine, RailyardError, Registry
from engine.api import create_app
from engine.api.tokens import TokensFile, TokenTable, hash_token, parse_tokens, toml_entry
from engine.cli import app as cli
from tests.support.api import login, to_approval
from tests.support.sample_workflows import all_workflows
from tests.support.shop import Ledger, make_workflow

NOW = datetime(2026, 12, 3, 12, 0, tzinfo=UTC)


def entry(actor: str, roles: list[str], expires: datetime | None = None) -> str:
    return toml_entry(actor, roles, hash_token(f"tok-{actor}"), expires)


def write(path: Path, *entries: str) -> None:
    """Rewrite the file as an operator's editor would, so that its stamp changes even within one clock tick."""
    path.write_text("\n".join(entries), encoding="utf-8")
    stamp = path.stat().st_mtime_ns + 1_000_000
    os.utime(path, ns=(stamp, stamp))


def test_an_expired_token_is_no_token_and_a_bad_expiry_is_refused() -> None:
    parsed = parse_tokens(
        {
            "token": [
                {"actor": "dana", "roles": ["approver"], "sha256": hash_token("tok-dana"), "expires": NOW},
                {"actor": "erin", "roles": [], "sha256": hash_token("tok-erin"), "expires": "2027-01-01T00:00:00Z"},
            ]
        }
    )
    table = TokenTable(parsed.principals(), clock=lambda: NOW)  # the moment dana's token expires
    assert table.authenticate("tok-dana") is None and table.by_hash(hash_token("tok-dana")) is None
    assert table.authenticate("tok-erin") is not None
    with pytest.raises(RailyardError) as caught:
        parse_tokens({"token": [{"actor": "a", "sha256": hash_token("x"), "expires": "next week"}]})
    assert caught.value.code is Code.CONFIG_INVALID and "expires must be a date-time" in caught.value.message


def test_a_changed_file_takes_effect_on_the_next_request_and_a_broken_edit_keeps_the_last_good_one(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "tokens.toml"
    write(path, entry("dana", ["approver"]))
    tokens = TokensFile(path, every_seconds=0)
    assert tokens.authenticate("tok-dana") is not None and tokens.authenticate("tok-erin") is None
    write(path, entry("erin", ["approver", "operator"]))  # dana revoked, erin added
    assert tokens.authenticate("tok-dana") is None
    assert tokens.roles_of("erin") == {"approver", "operator"}
    write(path, "[[token]]\nactor = ")  # saved halfway through an edit
    assert tokens.authenticate("tok-erin") is not None  # the last good table stays in force, and says so
    assert "not usable" in caplog.text


def test_a_running_server_follows_its_tokens_file(db_url: str, tmp_path: Path) -> None:
    path = tmp_path / "tokens.toml"
    write(path, entry("ann", []), entry("dana", ["refund_approver"]))
    tokens = TokensFile(path, every_seconds=0)
    shop = make_workflow(Ledger(tmp_path / "ledger.db"))
    with (
        Engine(db_url, Registry([shop, *all_workflows()]), authoriser=tokens) as engine,
        TestClient(create_app(engine, tokens, session_secret="s"), follow_redirects=False) as client,
    ):
        task_id = to_approval(engine)
        digest = engine.load(task_id).prepared["digest"]  # type: ignore[index]
        assert client.get("/api/me", headers={"Authorization": "Bearer tok-dana"}).status_code == 200
        login(client, "dana")
        # dana leaves: her entry is deleted; her token and the page session she opened with it stop working.
        write(path, entry("ann", []), entry("erin", ["refund_approver"]))
        gone = client.get("/api/me", headers={"Authorization": "Bearer tok-dana"})
        assert (gone.status_code, gone.json()["code"]) == (401, "ACTOR_REQUIRED")
        assert client.get("/inbox").headers["location"].startswith("/login")
        # erin is granted the role by the same edit: her approval is the engine's to check, and it passes.
        approved = client.post(
            f"/api/tasks/{task_id}/approve", json={"digest": digest}, headers={"Authorization": "Bearer tok-erin"}
        )
        assert approved.status_code == 200, approved.text
        last = engine.history(task_id)[-1]
        assert (last.actor, last.trigger, last.data["approval"]["role"]) == ("erin", "approve", "refund_approver")


def test_tokens_new_writes_an_expiry_and_tokens_list_shows_the_file(tmp_path: Path) -> None:
    runner = CliRunner()
    made = runner.invoke(cli, ["tokens", "new", "--actor", "dana", "--role", "refund_approver", "--expires", "90d"])
    assert made.exit_code == 0, made.output
    body = made.stdout.split("\n", 2)[2]  # the token line, a blank line, then the entry
    [dana] = parse_tokens(tomllib.loads(body)).principals()
    assert dana.expires is not None and timedelta(days=89) < dana.expires - datetime.now(UTC) <= timedelta(days=90)
    past = runner.invoke(cli, ["tokens", "new", "--actor", "dana", "--expires", "2000-01-01"])
    assert past.exit_code == 2 and "not a time to come" in past.output
    path = tmp_path / "tokens.toml"
    write(path, body, entry("old", ["auditor"], datetime(2020, 1, 1, tzinfo=UTC)))
    listed = runner.invoke(cli, ["tokens", "list", str(path), "--json"])
    assert listed.exit_code == 0, listed.output
    rows = {r["actor"]: r for r in json.loads(listed.stdout)}
    assert (rows["old"]["expired"], rows["dana"]["expired"], rows["dana"]["roles"]) == (
        True,
        False,
        ["refund_approver"],
    )
    assert "tok-" not in listed.stdout  # never a token, only hashes
    table = runner.invoke(cli, ["tokens", "list", str(path)])
    assert "(expired)" in table.stdout and "never" not in table.stdout
