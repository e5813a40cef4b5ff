"""Quality per state and per field, computed from the log (`railyard quality`, issue #34).

The seeded log is made by the engine itself, turn by turn, with scripted models and a clock the test moves: six
kinds of task whose every failure is known, so every figure has a hand count to match, on SQLite and PostgreSQL.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from engine import Code, Engine, Registry, StaticRoles, migrations
from engine.audit.quality import read_quality
from engine.cli import app
from engine.core.canonical import GENESIS_HASH
from engine.core.events import Event, seal
from engine.core.payloads import EventData, as_event_data
from engine.core.quality import (
    ROOT,
    Period,
    StateKey,
    TurnFigures,
    TurnKey,
    entered_at,
    field_path,
    fold_quality,
    guard_of,
    percentile,
)
from engine.core.rows import TaskRow
from engine.observability import hooks
from engine.observability.metrics import Metrics, StateClock
from engine.providers.scripted import ScriptedModel, call
from engine.store import MemoryStore
from tests.support.sample_workflows import ROLES, all_workflows
from workflows.expense import EXPENSE

runner = CliRunner()
T0 = datetime(2025, 1, 6, 9, 0, tzinfo=UTC)
USAGE = {"input_tokens": 100, "output_tokens": 10}
#: Cycles of the six kinds of task, each kind's scripted model alternating between two models; then LATE tasks
#: of the first kind, weeks later (what a period's start and end split off).
CYCLES, LATE = 66, 10
LATE_AT = T0 + timedelta(days=30)


class Clock:
    """The engine's clock, moved by the test: every event's time is known."""

    def __init__(self) -> None:
        self.at = T0

    def __call__(self) -> datetime:
        return self.at

    def tick(self, seconds: float) -> None:
        self.at += timedelta(seconds=seconds)


def answer(turn: dict[str, Any]) -> dict[str, Any]:
    return {**turn, "usage": USAGE}


GOOD = answer(call("propose", amount=50, reason="damaged"))
LARGE = answer(call("propose", amount=200, reason="damaged"))
NO_AMOUNT = answer(call("propose", amount=0, reason="damaged"))  # amount >= 1: the schema refuses it
NO_REASON = answer(call("propose", amount=50, reason=""))  # reason: at least one character
OVER_BALANCE = answer(call("propose", amount=600, reason="damaged"))  # the balance is 500: within_balance refuses
NOT_JSON = answer({"tool_calls": [{"name": "propose", "arguments": "{amount: 50"}]})
GIVE_UP = answer(call("give_up"))
AUTH = {"error": {"status": 401, "message": "invalid api key"}}


def turns(eng: Engine, clock: Clock, task_id: str, model: str, script: list[dict[str, Any]]) -> None:
    """Each answer of `script` in its own turn, two seconds apart."""
    scripted = ScriptedModel(script, model=model)
    for _ in script:
        clock.tick(2)
        eng.step(task_id, model=scripted)


def seed(eng: Engine, clock: Clock) -> None:
    """The log: per cycle one task of each kind, 15 turns; `LATE` tasks of the first kind at `LATE_AT`."""
    for cycle in range(CYCLES):
        one_cycle(eng, clock, "alpha" if cycle % 2 == 0 else "beta", cycle)
    clock.at = LATE_AT
    for _ in range(LATE):
        turns(eng, clock, eng.start("refund", {"customer": "c1", "balance": 500}, actor="ann"), "alpha", [GOOD])


def one_cycle(eng: Engine, clock: Clock, model: str, cycle: int) -> None:
    """One task of each kind, 15 turns of `model` (the approver's wait grows with `cycle`)."""
    order = {"customer": "c1", "balance": 500}
    # A: accepted at the first try (to auto_refund, where it stays).
    turns(eng, clock, eng.start("refund", order, actor="ann"), model, [GOOD])
    # B: two schema failures (amount, then reason), then accepted.
    turns(eng, clock, eng.start("refund", order, actor="ann"), model, [NO_AMOUNT, NO_REASON, GOOD])
    # C: arguments that are not JSON (the ladder restates its reminder), then accepted.
    turns(eng, clock, eng.start("refund", order, actor="ann"), model, [NOT_JSON, GOOD])
    # D: over the balance (two guards refuse), then a large refund that waits for an approver, who rejects it
    # after a wait that grows with the cycle.
    task = eng.start("refund", order, actor="ann")
    turns(eng, clock, task, model, [OVER_BALANCE, LARGE])
    clock.tick(60 * (cycle + 1))
    eng.reject(task, "dana", "not this time")
    # E: four schema failures on amount: three repairs, then the hand-off; an operator retries ten minutes
    # later, and the model gives up at once.
    task = eng.start("refund", order, actor="ann")
    turns(eng, clock, task, model, [NO_AMOUNT] * 4)
    clock.tick(600)
    eng.fire(task, "retry", actor="olga")
    turns(eng, clock, task, model, [GIVE_UP])
    # F: the provider refuses the key; an operator retries five minutes later; accepted at the first try.
    task = eng.start("refund", order, actor="ann")
    turns(eng, clock, task, model, [AUTH])
    clock.tick(300)
    eng.fire(task, "retry", actor="olga")
    turns(eng, clock, task, model, [GOOD])


def per_cycle(n: int, late: int = 0) -> dict[str, Any]:
    """The hand count of `n` cycles and `late` tasks of the first kind, in `TurnFigures.to_dict` form."""
    return {
        "turns": 15 * n + late,
        "answered": 14 * n + late,  # all but F's provider error
        "accepted": 6 * n + late,  # A, B, C, D, E's give_up, F
        "first_tries": 7 * n + late,  # A, B, C, D, E twice (before the hand-off, after the retry), F after its retry
        "first_try_accepted": 3 * n + late,  # A, E's give_up, F after its retry
        "first_try_compliance": round((3 * n + late) / (7 * n + late), 4),
        "repairs": 7 * n,  # B 2, C 1, D 1, E 3
        "repairs_per_turn": round(7 * n / (15 * n + late), 4),
        "escalations": n,  # C: arguments that are not JSON ignored the rung
        "parse_failures": n,
        "schema_failures": {"amount": 5 * n, "reason": n},  # B once each; E four times (the hand-off's answer too)
        "domain_rejections": {"small_amount": n, "within_balance": n},  # D: 600 is over the balance and not small
        "hand_offs": n,
        "provider_errors": n,
        "demotions": 0,
        "retries": 0,
        "codes": {"DOMAIN_INVALID": n, "OUTPUT_NOT_JSON": n, "OUTPUT_SCHEMA_INVALID": 6 * n, "PROVIDER_AUTH": n},
        "tokens": {"input_tokens": 100 * (14 * n + late), "output_tokens": 10 * (14 * n + late)},
        "cost": 0.0,  # no prices given
        "unpriced": 0,
    }


@pytest.fixture
def seeded(eng: Engine, monkeypatch: pytest.MonkeyPatch) -> Engine:
    clock = Clock()
    monkeypatch.setattr("engine.runtime.engine.now", clock)
    monkeypatch.setattr("engine.runtime.agent.now", clock)
    seed(eng, clock)
    return eng


def test_figures_over_a_thousand_turns_match_the_hand_counts_on_each_backend(seeded: Engine) -> None:
    figures = read_quality(seeded.audit)
    rows = figures.to_dict()["turns"]
    assert sum(row["turns"] for row in rows) == 1000
    assert {(row["workflow"], row["version"], row["state"], row["provider"], row["rung"]) for row in rows} == {
        ("refund", 2, "assessing", "scripted", "native_schema")
    }
    by_model = {row["model"]: {k: v for k, v in row.items() if k not in TurnKey.__slots__} for row in rows}
    assert by_model == {"alpha": per_cycle(CYCLES // 2, LATE), "beta": per_cycle(CYCLES // 2)}

    states = {row["state"]: row for row in figures.to_dict()["states"]}
    # Every visit to assessing ended; the tasks in auto_refund and the terminal states are still there.
    assert set(states) == {"assessing", "awaiting_approval", "assessing~handoff", "assessing~provider_error"}
    # A 2 s, B 6, C 4, D 4, E 8 then 2, F 2 then 2; and the late tasks 2 s each.
    assert states["assessing"]["visits"] == 8 * CYCLES + LATE
    assert (states["assessing"]["p50_seconds"], states["assessing"]["p95_seconds"]) == (2.0, 8.0)
    assert states["assessing"]["tokens"] == 110 * (14 * CYCLES + LATE)
    # D waits 60 s times its cycle's number for the approver, and the 2 s of its second turn before that.
    waits = states["awaiting_approval"]
    assert (waits["visits"], waits["p50_seconds"], waits["p95_seconds"]) == (CYCLES, 60 * 33.0, 60 * 63.0)
    assert (states["assessing~handoff"]["visits"], states["assessing~handoff"]["p95_seconds"]) == (CYCLES, 600.0)
    assert states["assessing~provider_error"]["p50_seconds"] == 300.0


def test_a_period_and_a_model_narrow_the_figures_to_what_happened_in_them(seeded: Engine) -> None:
    after = read_quality(seeded.audit, since=LATE_AT).to_dict()
    assert [(row["model"], row["turns"], row["first_try_accepted"]) for row in after["turns"]] == [
        ("alpha", LATE, LATE)
    ]
    assert [(row["state"], row["visits"]) for row in after["states"]] == [("assessing", LATE)]
    before = read_quality(seeded.audit, until=LATE_AT).to_dict()
    assert sum(row["turns"] for row in before["turns"]) == 1000 - LATE
    only_beta = read_quality(seeded.audit, model="scripted:beta").to_dict()
    assert [row["model"] for row in only_beta["turns"]] == ["beta"]
    assert read_quality(seeded.audit, model="beta").to_dict() == only_beta
    # Only the visits of agent states the model answered in: none of the approver's or the operators' waits.
    assert {row["state"] for row in only_beta["states"]} == {"assessing"}
    assert read_quality(seeded.audit, workflow="triage").to_dict() == {"turns": [], "states": []}


def test_cost_per_turn_and_per_completed_state_at_the_profiles_prices_match_the_hand_counts(seeded: Engine) -> None:
    """alpha is priced at 2 per million input tokens and 8 per million output tokens; beta has no price."""

    def prices(profile: str, model: str) -> dict[str, float] | None:
        return {"input": 2.0, "output": 8.0} if (profile, model) == ("openai", "alpha") else None

    figures = read_quality(seeded.audit, prices=prices).to_dict()
    by_model = {row["model"]: row for row in figures["turns"]}
    answered = 14 * (CYCLES // 2) + LATE  # alpha's turns that reported tokens: all but its provider errors
    each = (100 * 2.0 + 10 * 8.0) / 1_000_000
    assert (by_model["alpha"]["cost"], by_model["alpha"]["unpriced"]) == (round(answered * each, 6), 0)
    assert (by_model["beta"]["cost"], by_model["beta"]["unpriced"]) == (0.0, 14 * (CYCLES // 2))
    # Over every model, a visit with one of beta's turns has no price: no cost per visit is made up.
    assessing = next(row for row in figures["states"] if row["state"] == "assessing")
    assert assessing["cost"] == round(answered * each, 6) and assessing["cost_per_visit"] is None
    # alpha's visits alone: every turn priced.
    alpha = read_quality(seeded.audit, model="alpha", prices=prices).to_dict()["states"]
    visits = 8 * (CYCLES // 2) + LATE
    assert [(row["state"], row["visits"], row["cost_per_visit"]) for row in alpha] == [
        ("assessing", visits, round(answered * each / visits, 6))
    ]
    assert read_quality(seeded.audit).to_dict()["turns"][0]["cost"] == 0.0  # no prices, no cost


# -- the command ---------------------------------------------------------------------------------------------------
@pytest.fixture
def cli_db(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Engine]:
    url = f"sqlite:///{tmp_path / 'quality.db'}"
    roles = tmp_path / "roles.toml"
    roles.write_text('[users]\ndana = ["approver"]\nerin = ["expense_approver"]\n', encoding="utf-8")
    monkeypatch.setenv("RAILYARD_DATABASE_URL", url)
    monkeypatch.setenv("RAILYARD_WORKFLOWS", "tests.support.sample_workflows,workflows.expense")
    monkeypatch.setenv("RAILYARD_ROLES_FILE", str(roles))
    migrations.upgrade(url)
    registry = Registry([*all_workflows(), EXPENSE])
    with Engine(url, registry, authoriser=StaticRoles(ROLES)) as eng:
        yield eng


def invoke(*args: str) -> tuple[int, str, str]:
    result = runner.invoke(app, list(args))
    return result.exit_code, result.stdout, result.stderr


def expense_with_a_bad_amount(eng: Engine) -> None:
    task = eng.start("expense", {"employee": "eve", "limit_cents": 10_000}, actor="eve")
    claim = {"amount_cents": 1200, "currency": "EUR", "description": "train"}
    scripted = ScriptedModel([call("submit", **{**claim, "amount_cents": "12 euros"}), call("submit", **claim)])
    eng.step(task, model=scripted)
    eng.step(task, model=scripted)


def test_the_command_prints_the_per_field_failures_and_reads_only_what_the_reader_may(cli_db: Engine) -> None:
    expense_with_a_bad_amount(cli_db)
    refund = cli_db.start("refund", {"customer": "c1", "balance": 500}, actor="ann")
    cli_db.step(refund, model=ScriptedModel([GOOD]))

    code, out, _ = invoke("quality", "--json")
    assert code == 0, out
    rows = {row["workflow"]: row for row in json.loads(out)["turns"]}
    assert rows["expense"]["schema_failures"] == {"amount_cents": 1}
    assert (rows["expense"]["turns"], rows["expense"]["first_try_compliance"]) == (2, 0.0)
    assert rows["refund"]["first_try_compliance"] == 1.0

    code, out, _ = invoke("quality", "--workflow", "expense")
    assert code == 0
    assert "amount_cents 1 (50%)" in out and "refund" not in out

    # dana holds no role in expense: its turns are not hers to count, and asking for it is asking for nothing.
    code, out, _ = invoke("quality", "--json", "--as", "dana")
    assert code == 0
    assert {row["workflow"] for row in json.loads(out)["turns"]} == {"refund"}
    code, _, err = invoke("quality", "--workflow", "expense", "--as", "dana")
    assert (code, err.split(":")[0]) == (1, "WORKFLOW_UNKNOWN")
    assert invoke("quality", "--workflow", "nosuch", "--as", "dana")[2].replace("nosuch", "expense") == err
    code, out, _ = invoke("quality", "--json", "--workflow", "expense", "--as", "erin")
    assert code == 0 and [row["workflow"] for row in json.loads(out)["turns"]] == ["expense"]


def test_the_command_prices_turns_from_the_profiles_file(
    cli_db: Engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    task = cli_db.start("refund", {"customer": "c1", "balance": 500}, actor="ann")
    cli_db.step(task, model=ScriptedModel([GOOD], model="alpha"))
    code, out, _ = invoke("quality")
    assert code == 0 and "cost" not in out  # no prices: no cost column
    profiles = tmp_path / "profiles.toml"
    profiles.write_text('[profiles.openai.prices."alpha*"]\ninput = 2.0\noutput = 8.0\n', encoding="utf-8")
    monkeypatch.setenv("RAILYARD_PROFILES_FILE", str(profiles))
    code, out, _ = invoke("quality", "--json")
    assert code == 0
    assert [row["cost"] for row in json.loads(out)["turns"]] == [0.00028]
    code, out, _ = invoke("quality")
    assert "cost/visit" in out and "0.0003" in out
    profiles.write_text('[profiles.openai.prices."alpha*"]\ninput = -1\noutput = 8.0\n', encoding="utf-8")
    code, _, err = invoke("quality")
    assert (code, err.split(":")[0]) == (2, "CONFIG_INVALID") and "prices" in err


@pytest.mark.parametrize(
    ("args", "code"),
    [
        (("--workflow", "nosuch"), Code.WORKFLOW_UNKNOWN),
        (("--since", "last tuesday"), Code.USAGE_INVALID),
        (("--since", "2025-02-01", "--until", "2025-01-01"), Code.USAGE_INVALID),
    ],
)
def test_bad_input_is_refused_with_a_stable_code(cli_db: Engine, args: tuple[str, ...], code: Code) -> None:
    status, out, err = invoke("quality", *args)
    assert status == (1 if code.category.value == "definition" else 2)
    assert err.startswith(f"{code}: ") and len(err.strip().splitlines()) == 1 and out == ""


# -- the pure fold -------------------------------------------------------------------------------------------------
def test_an_error_location_names_the_schema_field_once_for_every_item_of_a_list() -> None:
    assert field_path(["amount_cents"]) == "amount_cents"
    assert field_path(["items", 3, "sku"]) == field_path(["items", 0, "sku"]) == "items[].sku"
    assert field_path([]) == ROOT
    assert guard_of({"msg": "within_limit: amount 1 exceeds the limit", "type": "domain_invalid"}) == "within_limit"
    assert guard_of({"msg": "no guard named here"}) == "(unnamed)"


def test_percentiles_are_observed_values_by_nearest_rank() -> None:
    assert percentile([], 0.5) is None
    assert percentile([5.0, 1.0, 3.0, 2.0], 0.5) == 2.0
    assert percentile([float(n) for n in range(1, 101)], 0.95) == 95.0


def log_of(*steps: tuple[str | None, str, str, EventData, float]) -> list[TaskRow | Event]:
    """A task's row and its events: (from, trigger, to, data, seconds after T0)."""
    events: list[Event] = []
    prev = GENESIS_HASH
    for seq, (source, trigger, target, data, seconds) in enumerate(steps, start=1):
        event = seal(
            task_id="t1",
            seq=seq,
            at=T0 + timedelta(seconds=seconds),
            actor="x",
            from_state=source,
            trigger=trigger,
            to_state=target,
            data=data,
            prev_hash=prev,
        )
        events.append(event)
        prev = event.hash
    row = TaskRow("t1", "w", 1, "d", steps[-1][2], "runnable", len(events), prev, T0, T0)
    return [row, *events]


def turn(code: str | None = None, **more: Any) -> EventData:
    """The data of a model turn of `p:m` on the `required` rung that ended in `code`."""
    asked = {"strategy": "required", "model": "p:m", "profile": "p", "thinking": False, "mode": "tools"}
    return as_event_data({"turn": {**asked, "code": code, **more}})


def test_a_backoff_is_a_retry_not_a_turn_and_a_migration_moves_the_version() -> None:
    figures = fold_quality(
        log_of(
            (None, "start", "s", {"workflow": "w@1"}, 0),
            ("s", "backoff", "s", turn("RATE_LIMITED"), 5),
            ("s", "repair", "s~force", turn("OUTPUT_SCHEMA_INVALID", errors=[{"loc": [], "msg": "x"}]), 10),
            ("s~force", "go", "t", turn(), 12),
            ("t", "migrate", "t", {"from": "w@1", "to": "w@2", "to_version": 2}, 20),
            ("t", "go", "u", {}, 30),
        )
    )
    key = TurnKey("w", 1, "s", "p", "m", "required")
    expected = TurnFigures(turns=2, answered=2, accepted=1, first_tries=1, repairs=1, retries=1)
    expected.schema_failures.update({ROOT: 1})
    expected.codes.update({"OUTPUT_SCHEMA_INVALID": 1})
    assert figures.turns == {key: expected}
    # s~force is s: one visit of 12 s; t was entered on version 1 and is counted there.
    assert {k: v.seconds for k, v in figures.states.items()} == {
        StateKey("w", 1, "s"): [12.0],
        StateKey("w", 1, "t"): [18.0],
    }
    assert fold_quality(log_of((None, "start", "s", {}, 0)), Period(since=T0 + timedelta(1))).to_dict() == {
        "turns": [],
        "states": [],
    }


# -- Prometheus ----------------------------------------------------------------------------------------------------
@pytest.fixture
def metrics() -> Iterator[Metrics]:
    hooks.disable()
    yield hooks.enable_metrics()
    hooks.disable()


def samples(metrics: Metrics, name: str, *labels: str) -> dict[tuple[str, ...], float]:
    """The samples of `name` by the values of `labels`, as Prometheus scrapes them."""
    from prometheus_client import generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    exposed = generate_latest(metrics.registry_for(None)).decode()
    return {
        tuple(sample.labels[label] for label in labels): sample.value
        for family in text_string_to_metric_families(exposed)
        for sample in family.samples
        if sample.name == name
    }


def test_the_state_time_histogram_times_a_wait_for_people_that_another_process_began(
    metrics: Metrics, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = Clock()
    monkeypatch.setattr("engine.runtime.engine.now", clock)
    with Engine(store=MemoryStore(), registry=Registry(all_workflows()), authoriser=StaticRoles(ROLES)) as eng:
        task = eng.start("refund", {"customer": "c1", "balance": 500}, actor="ann")
        extra = answer(call("propose", amount=50, reason="x", currency="EUR"))
        turns(eng, clock, task, "alpha", [NO_AMOUNT, extra, LARGE])
        assert samples(metrics, "railyard_state_seconds_sum", "workflow", "state") == {("refund", "assessing"): 6.0}
        hooks.disable()
        metrics = hooks.enable_metrics()  # another process: it did not see the task enter awaiting_approval
        clock.tick(3600)
        eng.reject(task, "dana", "no")
    seconds = samples(metrics, "railyard_state_seconds_sum", "workflow", "state")
    assert seconds == {("refund", "awaiting_approval"): 3600.0}


def test_schema_failures_are_counted_per_field_with_made_up_fields_as_one_label(metrics: Metrics) -> None:
    with Engine(store=MemoryStore(), registry=Registry(all_workflows()), authoriser=StaticRoles(ROLES)) as eng:
        task = eng.start("refund", {"customer": "c1", "balance": 500}, actor="ann")
        extra = call("propose", amount=0, reason="x", currency="EUR", note_to_self="hm")
        turns(eng, Clock(), task, "alpha", [NO_AMOUNT, extra, NO_REASON, GOOD])
    failures = samples(metrics, "railyard_schema_failures_total", "workflow", "state", "model", "field")
    assert failures == {
        ("refund", "assessing", "scripted:alpha", "amount"): 2.0,
        ("refund", "assessing", "scripted:alpha", "(extra)"): 1.0,
        ("refund", "assessing", "scripted:alpha", "reason"): 1.0,
    }
    timed = samples(metrics, "railyard_state_seconds_count", "workflow", "state")
    assert timed[("refund", "assessing")] == 1.0


def test_repairs_escalations_hand_offs_and_each_guards_rejections_are_counters_as_quality_counts_them(
    metrics: Metrics,
) -> None:
    """One task of each kind: the counters hold the hand count, which is what `railyard quality` gives too."""
    with Engine(store=MemoryStore(), registry=Registry(all_workflows()), authoriser=StaticRoles(ROLES)) as eng:
        one_cycle(eng, Clock(), "alpha", 0)
        figures = read_quality(eng.audit).to_dict()["turns"]
    labels = ("workflow", "state", "model")
    key = ("refund", "assessing", "alpha")
    assert samples(metrics, "railyard_turn_repairs_total", *labels) == {key: 7.0}  # B 2, C 1, D 1, E 3
    assert samples(metrics, "railyard_turn_escalations_total", *labels) == {key: 1.0}  # C's reminder
    assert samples(metrics, "railyard_turn_hand_offs_total", *labels) == {key: 1.0}  # E
    guards = samples(metrics, "railyard_domain_rejections_total", *labels, "guard")
    assert guards == {(*key, "small_amount"): 1.0, (*key, "within_balance"): 1.0}  # D: 600 is both
    (quality,) = [f for f in figures if f["state"] == "assessing"]
    assert (quality["repairs"], quality["escalations"], quality["hand_offs"]) == (7, 1, 1)
    assert quality["domain_rejections"] == {"small_amount": 1, "within_balance": 1}


def test_turns_tokens_and_cost_per_state_model_and_rung_are_scraped_from_metrics(
    metrics: Metrics, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A scripted run (a schema failure, then an accepted answer, 100 input and 10 output tokens each) on alpha,
    priced at 2 and 8 per million tokens: /metrics has the turns by code, the tokens and the cost under the turns'
    (workflow, version, state, provider, model, rung), and the visit's time under (workflow, state)."""
    import httpx

    from engine.api import TokenTable, create_app
    from tests.support.api import live_server

    profiles = tmp_path / "profiles.toml"
    profiles.write_text('[profiles.openai.prices."alpha*"]\ninput = 2.0\noutput = 8.0\n', encoding="utf-8")
    monkeypatch.setenv("RAILYARD_PROFILES_FILE", str(profiles))
    with Engine(store=MemoryStore(), registry=Registry(all_workflows()), authoriser=StaticRoles(ROLES)) as eng:
        app = create_app(eng, TokenTable.from_tokens({}), session_secret="s")
        with live_server(app) as base:
            task = eng.start("refund", {"customer": "c1", "balance": 500}, actor="ann")
            turns(eng, Clock(), task, "alpha", [NO_AMOUNT, GOOD])
            version = str(eng.get(task).version)
            text = httpx.get(f"{base}/metrics", timeout=10).text
    from prometheus_client.parser import text_string_to_metric_families

    found = [s for family in text_string_to_metric_families(text) for s in family.samples]

    def by(name: str, *labels: str) -> dict[tuple[str, ...], float]:
        out: dict[tuple[str, ...], float] = {}
        for sample in found:
            if sample.name == name:
                key = tuple(sample.labels[label] for label in labels)
                out[key] = out.get(key, 0.0) + sample.value
        return out

    key = ("refund", version, "assessing", "scripted", "alpha")
    labels = ("workflow", "version", "state", "provider", "model")
    rungs = {s.labels["rung"] for s in found if s.name == "railyard_turns_total"}
    assert rungs and "" not in rungs  # each turn under the rung it was asked at
    assert by("railyard_turns_total", *labels, "code") == {(*key, "OUTPUT_SCHEMA_INVALID"): 1.0, (*key, "none"): 1.0}
    assert by("railyard_turn_tokens_total", *labels, "type") == {(*key, "input"): 200.0, (*key, "output"): 20.0}
    (cost,) = by("railyard_turn_cost_total", *labels).items()
    assert cost[0] == key and cost[1] == pytest.approx(2 * (100 * 2.0 + 10 * 8.0) / 1_000_000)
    assert by("railyard_state_seconds_count", "workflow", "state") == {("refund", "assessing"): 1.0}


def test_the_state_clock_remembers_only_what_it_saw_event_after_event() -> None:
    log = [e for e in log_of(
        (None, "start", "s", {}, 0),
        ("s", "repair", "s~force", {}, 10),
        ("s~force", "go", "t", {}, 12),
        ("t", "go", "u", {}, 30),
    ) if isinstance(e, Event)]  # fmt: skip
    asked: list[int] = []

    def entered(upto: int) -> Callable[[], datetime | None]:
        def read() -> datetime | None:
            asked.append(upto)
            return entered_at(log[:upto])

        return read

    clock = StateClock()
    assert [clock.seen(e, entered(e.seq - 1)) for e in log] == [None, None, 12.0, 18.0]
    assert asked == []
    # A process that sees only the last event reads when t was entered from the log.
    assert StateClock().seen(log[3], entered(3)) == 18.0
    assert asked == [3]
    # One that missed an event in between does not trust what it remembers.
    clock = StateClock()
    clock.seen(log[0], None)
    assert clock.seen(log[2], entered(2)) == 12.0 and asked == [3, 2]
