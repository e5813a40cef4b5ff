"""No model answer paid for twice when the database blinks (issue #33).

Under a worker's lease, a turn whose append fails because the database did not answer keeps its sealed event
and appends it again (same seq, hash and lease epoch) until the database answers, for as long as the lease's
patience. A try whose write went through but whose acknowledgement was lost finds its own event and counts as
written. A conflict with another writer and a lost lease are still refused, and told apart.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import create_engine, text

from engine import Code, ConcurrencyConflict, Engine, ModelRequest, Registry, ScriptedModel, StaticRoles
from engine.core.canonical import now
from engine.core.errors import LeaseLost, StoreError
from engine.core.model_interface import ModelResponse
from engine.providers.scripted import call
from engine.runtime.agent import AgentRunner, RetryPolicy
from engine.runtime.leases import Lease, holding
from engine.store import open_store
from tests.support.postgres import truncate
from tests.support.provider_server import no_sleep
from tests.support.sample_workflows import ROLES, all_workflows

ONE_CALL = RetryPolicy(attempts=1, base_delay=0.0, sleep=no_sleep)


def _blink() -> StoreError:
    error = StoreError("the database did not answer", code=Code.DATABASE_UNREACHABLE)
    error.transient = True
    return error


class Blinking:
    """The real store, whose appends fail the way a dropped connection makes them fail: `before` the write
    reaches the database, or `after` it was written (the acknowledgement lost). `meanwhile` runs at the first
    failure (another writer moving the task, another worker taking the lease over)."""

    def __init__(self, real: Any, *, before: int = 0, after: int = 0, meanwhile: Callable[[], object] | None = None):
        self.real, self.before, self.after, self.meanwhile = real, before, after, meanwhile
        self.appends = 0

    def append(self, *args: Any, **kwargs: Any) -> None:
        self.appends += 1
        if self.before:
            self.before -= 1
            self._meanwhile()
            raise _blink()
        self.real.append(*args, **kwargs)
        if self.after:
            self.after -= 1
            self._meanwhile()
            raise _blink()

    def _meanwhile(self) -> None:
        if self.meanwhile is not None:
            meanwhile, self.meanwhile = self.meanwhile, None
            meanwhile()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)


@pytest.fixture
def real(db_url: str) -> Iterator[Any]:
    store = open_store(db_url)
    yield store
    store.close()


def _engine(store: Any) -> Engine:
    return Engine(store=store, registry=Registry(all_workflows()), authoriser=StaticRoles(ROLES))


def _turn(eng: Engine, task_id: str, model: ScriptedModel, *, patience: float = 10.0) -> Any:
    [claim] = eng.store.claim("w1", limit=1, lease_seconds=30)
    assert claim.task_id == task_id
    with holding(Lease(task_id, "w1", claim.epoch, patience=patience)):
        return AgentRunner(eng, model, retry=ONE_CALL).step(eng.load(task_id))


def test_an_answer_whose_append_failed_before_the_write_is_written_once_the_database_answers(real: Any) -> None:
    store = Blinking(real, before=3)
    eng = _engine(store)
    task_id = eng.start("counter", {}, actor="ann")
    model = ScriptedModel([call("tick", n=1)])
    task = _turn(eng, task_id, model)
    assert (task.seq, store.appends, len(model.requests)) == (2, 4, 1)  # 3 blinks, then the write
    assert [e.trigger for e in eng.history(task_id)] == ["start", "tick"]
    assert eng.replay(task_id).ok


def test_a_lost_acknowledgement_finds_its_own_event_and_writes_nothing_twice(real: Any) -> None:
    store = Blinking(real, after=1)
    eng = _engine(store)
    task_id = eng.start("counter", {}, actor="ann")
    model = ScriptedModel([call("tick", n=1)])
    task = _turn(eng, task_id, model)
    assert task.seq == 2 and len(model.requests) == 1
    assert [e.trigger for e in eng.history(task_id)] == ["start", "tick"]
    assert eng.replay(task_id).ok


def test_another_writer_meanwhile_is_still_a_conflict_not_taken_for_our_own(real: Any) -> None:
    eng = _engine(real)
    task_id = eng.start("counter", {}, actor="ann")
    other = _engine(real)
    store = Blinking(real, before=1, meanwhile=lambda: other.fire(task_id, "tick", {"n": 9}, actor="system:other"))
    eng.store = store
    with pytest.raises(ConcurrencyConflict) as refused:
        _turn(eng, task_id, ScriptedModel([call("tick", n=1)]))
    assert refused.value.code == Code.CONCURRENCY_CONFLICT
    assert [e.data.get("args") for e in eng.history(task_id)[1:]] == [{"n": 9}]


def test_a_lease_taken_over_meanwhile_is_lease_lost(real: Any) -> None:
    eng = _engine(real)
    task_id = eng.start("counter", {}, actor="ann")
    eng.store = Blinking(real, before=1, meanwhile=lambda: _steal(real, task_id))
    with pytest.raises(LeaseLost) as refused:
        _turn(eng, task_id, ScriptedModel([call("tick", n=1)]))
    assert refused.value.code == Code.LEASE_LOST
    assert [e.trigger for e in eng.history(task_id)] == ["start"]


def _steal(store: Any, task_id: str) -> None:
    """Another worker takes the lease over (it expired while the database was away)."""
    [claim] = store.claim("w2", limit=1, lease_seconds=30, at=now() + timedelta(seconds=31))
    assert claim.task_id == task_id


def test_without_a_lease_or_past_its_patience_the_failure_is_raised(real: Any) -> None:
    store = Blinking(real)
    eng = _engine(store)
    task_id = eng.start("counter", {}, actor="ann")
    store.before = 100
    with pytest.raises(StoreError):  # a person's command: no lease, no waiting
        eng.fire(task_id, "tick", {"n": 1}, actor="system:x")
    assert store.appends == 1  # one try
    with pytest.raises(StoreError):
        _turn(eng, task_id, ScriptedModel([call("tick", n=1)]), patience=0.3)
    assert [e.trigger for e in eng.history(task_id)] == ["start"]


class _DroppingModel(ScriptedModel):
    """Answers as scripted, then has PostgreSQL terminate every connection of the engine's pool: the append that
    follows meets a dead connection."""

    admin_url = ""

    async def complete(self, request: ModelRequest) -> ModelResponse:
        answer = await super().complete(request)
        admin = create_engine(self.admin_url, isolation_level="AUTOCOMMIT")
        with admin.connect() as conn:
            killed = conn.execute(
                text(
                    "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
                    " WHERE datname = current_database() AND pid <> pg_backend_pid()"
                    " AND application_name = 'railyard'"
                )
            ).scalar_one()
        admin.dispose()
        assert killed >= 1
        return answer


def test_a_real_dropped_connection_is_retried_and_the_answer_written_once(pg_database: str) -> None:
    """A real OperationalError on PostgreSQL between the model's answer and its append: the append tries again on
    a new connection, and the answer is written once, with one model call."""
    truncate(pg_database)
    with _engine(open_store(pg_database)) as eng:
        task_id = eng.start("counter", {}, actor="ann")
        model = _DroppingModel([call("tick", n=1)])
        model.admin_url = pg_database
        task = _turn(eng, task_id, model)
        assert task.seq == 2 and len(model.requests) == 1
        assert [e.trigger for e in eng.history(task_id)] == ["start", "tick"]
