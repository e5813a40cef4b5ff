"""Moving in-flight tasks between versions of a workflow: an explicit, logged, refusable migration."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from engine import Code, Engine, RailyardError, Registry, StaticRoles, migrations
from tests.support.payloads import undeclared
from tests.support.sample_workflows import REFUND_V1, REFUND_V2, ROLES

REPO = Path(__file__).resolve().parent.parent
ORDER = {"customer": "c1", "balance": 500}
SAME_STATES = {name: name for name in ("assessing", "awaiting_approval", "needs_human")}


@pytest.fixture(params=[1, 10], ids=["snapshot-every-event", "snapshot-every-10"])
def eng(db_url: str, request: pytest.FixtureRequest) -> Iterator[Engine]:
    with Engine(
        db_url, Registry([REFUND_V1, REFUND_V2]), authoriser=StaticRoles(ROLES), snapshot_every=request.param
    ) as engine:
        yield engine


def test_a_task_migrated_mid_flight_runs_on_under_the_new_version(eng: Engine) -> None:
    task_id = eng.start("refund", ORDER, actor="ann", version=1)
    eng.fire(task_id, "propose", {"amount": 300, "reason": "damaged"}, actor="model")
    assert (eng.get(task_id).version, eng.get(task_id).state) == (1, "awaiting_approval")

    after = eng.migrate(task_id, 2, SAME_STATES, actor="olga", reason="v2 rolls out to open refunds")
    assert (after.version, after.digest, after.state) == (2, REFUND_V2.digest, "awaiting_approval")
    event = eng.history(task_id)[-1]
    assert (event.trigger, event.actor, event.from_state, event.to_state) == (
        "migrate",
        "olga",
        "awaiting_approval",
        "awaiting_approval",
    )
    assert event.data["reason"] == "v2 rolls out to open refunds"
    assert undeclared([event]) == []
    assert (event.data["from"], event.data["to"], event.data["to_digest"]) == ("refund@1", "refund@2", REFUND_V2.digest)
    row = eng.store.row(task_id)
    assert row is not None and (row.version, row.digest) == (2, REFUND_V2.digest)

    # It goes on under v2, and a fresh load (from a snapshot or from zero) crosses the migration.
    eng.approve(task_id, actor="dana", prepared_digest=None)
    view = eng.get(task_id)
    assert (view.version, view.state) == (2, "executing")
    assert eng.load(task_id).facts["propose"] == {"amount": 300, "reason": "damaged"}  # the context carried over


def test_loading_from_zero_folds_each_side_with_its_own_version(db_url: str) -> None:
    with Engine(db_url, Registry([REFUND_V1, REFUND_V2]), authoriser=StaticRoles(ROLES), snapshot_every=1000) as eng:
        task_id = eng.start("refund", ORDER, actor="ann", version=1)
        eng.migrate(task_id, 2, SAME_STATES, actor="olga", reason="rollout")
        eng.fire(task_id, "note", {"note": "checked"}, actor="model")
        assert eng.store.snapshots(task_id) == []
        assert (eng.load(task_id).version, eng.load(task_id).seq) == (2, 3)
    # Without v1 in the code the migrated task cannot be folded from zero: refused, not guessed.
    with (
        Engine(db_url, Registry([REFUND_V2]), authoriser=StaticRoles(ROLES)) as only_v2,
        pytest.raises(RailyardError) as caught,
    ):
        only_v2.load(task_id)
    assert caught.value.code is Code.DEFINITION_MISSING


@pytest.mark.parametrize(
    ("to_version", "state_map", "reason", "why"),
    [
        (1, SAME_STATES, "again", "already on that version"),
        (2, {"nowhere": "assessing"}, "x", "does not have: nowhere"),
        (2, {"assessing": "nowhere"}, "x", "does not have: nowhere"),
        (2, {"needs_human": "needs_human"}, "x", "only mapped states move"),
        (2, SAME_STATES, "  ", "a reason is required"),
    ],
)
def test_a_migration_that_does_not_hold_is_refused_and_the_log_is_unchanged(
    eng: Engine, to_version: int, state_map: dict[str, str], reason: str, why: str
) -> None:
    task_id = eng.start("refund", ORDER, actor="ann", version=1)
    before = eng.history(task_id)
    with pytest.raises(RailyardError) as caught:
        eng.migrate(task_id, to_version, state_map, actor="olga", reason=reason)
    assert caught.value.code is Code.MIGRATION_INVALID
    assert why in caught.value.message
    assert eng.history(task_id) == before
    assert eng.get(task_id).version == 1


def test_ended_tasks_unknown_versions_and_anonymous_callers_are_refused(eng: Engine) -> None:
    task_id = eng.start("refund", ORDER, actor="ann", version=1)
    with pytest.raises(RailyardError) as caught:
        eng.migrate(task_id, 3, SAME_STATES, actor="olga", reason="x")
    assert caught.value.code is Code.VERSION_UNKNOWN
    with pytest.raises(RailyardError) as caught:
        eng.migrate(task_id, 2, SAME_STATES, actor="", reason="x")
    assert caught.value.code is Code.ACTOR_REQUIRED
    eng.cancel(task_id, actor="ann", reason="duplicate")
    with pytest.raises(RailyardError) as caught:
        eng.migrate(task_id, 2, {"cancelled": "cancelled"}, actor="olga", reason="x")
    assert caught.value.code is Code.MIGRATION_INVALID
    assert [e.trigger for e in eng.history(task_id)] == ["start", "cancel"]


def test_migrate_is_not_a_trigger_callers_can_fire(eng: Engine) -> None:
    task_id = eng.start("refund", ORDER, actor="ann", version=1)
    with pytest.raises(RailyardError) as caught:
        eng.fire(task_id, "migrate", {}, actor="olga")
    assert caught.value.code in (Code.TRIGGER_NOT_ALLOWED, Code.FORBIDDEN)
    assert len(eng.history(task_id)) == 1


def test_railyard_migrate(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/m.db"
    migrations.upgrade(url)
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "RAILYARD_DATABASE_URL": url,
        "RAILYARD_WORKFLOWS": "tests.support.sample_workflows",
    }
    exe = str(Path(sys.executable).with_name("railyard"))

    def railyard(*argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([exe, *argv], env=env, capture_output=True, text=True, timeout=60)

    task_id = railyard("start", "refund", "--version", "1", "--input", json.dumps(ORDER), "--as", "ann").stdout.strip()
    done = railyard(
        "migrate",
        task_id,
        "--to-version",
        "2",
        "--map",
        "assessing=assessing",
        "--as",
        "olga",
        "--reason",
        "rollout",
        "--json",
    )
    assert done.returncode == 0, done.stderr
    assert (json.loads(done.stdout)["version"], json.loads(done.stdout)["state"]) == (2, "assessing")
    refused = railyard(
        "migrate", task_id, "--to-version", "2", "--map", "assessing=assessing", "--as", "olga", "--reason", "again"
    )
    assert refused.returncode == 1 and "MIGRATION_INVALID" in refused.stderr
    bad = railyard("migrate", task_id, "--to-version", "1", "--map", "assessing", "--as", "olga", "--reason", "x")
    assert bad.returncode == 2


def test_refund_v1_migrated_to_v2_mid_flight_replays_and_exports_clean(db_url: str) -> None:
    from engine import ScriptedModel
    from engine.audit.export import export_lines, verify_export
    from tests.support.reference import fake_systems, reference_engine
    from workflows import REFUND_V1, REFUND_V2
    from workflows.scripts import REFUND_DAMAGED_ORDER_INPUT, refund_damaged_order

    with fake_systems(db_url) as books, reference_engine(db_url) as eng:
        task_id = eng.start("refund", REFUND_DAMAGED_ORDER_INPUT, actor="portal", version=1)
        assert eng.run(task_id, model=ScriptedModel(refund_damaged_order(1))).state == "awaiting_approval"
        every_state = {s.name: s.name for s in REFUND_V1.states}
        eng.migrate(task_id, 2, every_state, actor="olga", reason="refund@2: partial-refund rule")
        prepared = eng.load(task_id).prepared
        assert prepared is not None
        eng.approve(task_id, actor="dana", prepared_digest=prepared["digest"])
        done = eng.run(task_id)
        assert (done.state, done.version, done.digest) == ("completed", 2, REFUND_V2.digest)
        assert list(books.payments.executions().values()) == [1]

        [migrated] = [e for e in eng.history(task_id) if e.trigger == "migrate"]
        assert (migrated.actor, migrated.data["reason"]) == ("olga", "refund@2: partial-refund rule")
        assert (migrated.data["from"], migrated.data["to"]) == ("refund@1", "refund@2")
        report = eng.replay(task_id)
        assert report.ok, report.findings
        lines = [line.encode() for line in export_lines(eng.store.audit_stream(task_ids=[task_id]))]
        assert all(r.ok for r in verify_export(lines, eng.registry.find))
        # The old version is still needed to prove the first half: without it, replay says so.
        from engine import Registry

        only_v2 = Registry([REFUND_V2])
        assert "DEFINITION_MISSING" in [c for r in verify_export(lines, only_v2.find) for c in r.codes]


def test_only_the_workflows_operators_migrate_and_only_the_tasks_of_their_tenants(db_url: str) -> None:
    """Migrating sends a task on under other rules: it needs the role that sends a stopped task on (`redrive`'s,
    here `refund_operator`), and a task of a tenant the caller is not of is, to them, no task. Each refusal leaves
    the log as it was."""
    from workflows import REFUND_V1 as REFUND_1
    from workflows import REFUND_V2 as REFUND_2
    from workflows.scripts import REFUND_DAMAGED_ORDER_INPUT

    roles = {
        "olga": {"refund_operator"},
        "gus": {"refund_operator"},
        "dana": {"refund_approver"},
        "portal": {"customer_portal"},
    }
    authoriser = StaticRoles(roles, tenants={"gus": {"globex"}})
    with Engine(db_url, Registry([REFUND_1, REFUND_2]), authoriser=authoriser) as eng:
        task_id = eng.start("refund", REFUND_DAMAGED_ORDER_INPUT, actor="portal", version=1, tenant="acme")
        mapping = {s.name: s.name for s in REFUND_1.states}
        before = eng.history(task_id)
        for actor, code in (("bob", Code.FORBIDDEN), ("dana", Code.FORBIDDEN), ("gus", Code.TASK_NOT_FOUND)):
            with pytest.raises(RailyardError) as caught:
                eng.migrate(task_id, 2, mapping, actor=actor, reason="refund@2 rolls out")
            assert caught.value.code is code, actor
        assert eng.history(task_id) == before and eng.get(task_id).version == 1
        moved = eng.migrate(task_id, 2, mapping, actor="olga", reason="refund@2 rolls out")
        assert (moved.version, eng.history(task_id)[-1].actor) == (2, "olga")
