"""`quick_init` builds the same frozen records as the dataclass's own `__init__`, only faster."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import pytest

from engine import Status, TaskState
from engine.core.canonical import GENESIS_HASH, now
from engine.core.events import Event, seal
from engine.core.payloads import as_event_data
from engine.core.records import quick_init


@dataclass(frozen=True, slots=True)
class Plain:
    a: int
    b: str = "b"
    c: dict[str, Any] = field(default_factory=dict)
    d: list[int] | None = field(default=None, init=False, compare=False)


@quick_init
@dataclass(frozen=True, slots=True)
class Quick:
    a: int
    b: str = "b"
    c: dict[str, Any] = field(default_factory=dict)
    d: list[int] | None = field(default=None, init=False, compare=False)


def as_tuple(record: Any) -> tuple[Any, ...]:
    return tuple(getattr(record, f.name) for f in dataclasses.fields(record))


@pytest.mark.parametrize(
    ("args", "kwargs"), [((1,), {}), ((1, "x"), {}), ((1,), {"c": {"k": 1}}), ((), {"a": 2, "b": "y", "c": {}})]
)
def test_the_same_fields_defaults_and_factories_as_the_dataclass(args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    assert as_tuple(Quick(*args, **kwargs)) == as_tuple(Plain(*args, **kwargs))
    assert repr(Quick(*args, **kwargs)) == repr(Plain(*args, **kwargs)).replace("Plain", "Quick")


def test_each_record_gets_its_own_factory_value_and_stays_frozen() -> None:
    one, two = Quick(1), Quick(1)
    assert one == two and one.c is not two.c
    with pytest.raises(dataclasses.FrozenInstanceError):
        one.a = 2  # type: ignore[misc]
    assert dataclasses.replace(one, b="z") == Quick(1, "z")
    with pytest.raises(TypeError):
        Quick()  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        Quick(1, d=[1])  # type: ignore[call-arg]


def test_only_frozen_slotted_dataclasses_are_accepted() -> None:
    @dataclass(slots=True)
    class Mutable:
        a: int

    @dataclass(frozen=True)
    class Unslotted:
        a: int

    for cls in (Mutable, Unslotted):
        with pytest.raises(TypeError):
            quick_init(cls)


def test_events_and_task_states_build_as_before() -> None:
    event = seal(
        task_id="t",
        seq=1,
        at=now(),
        actor="ann",
        from_state=None,
        trigger="start",
        to_state="s",
        data=as_event_data({"x": 1}),
        prev_hash=GENESIS_HASH,
    )
    assert event.stored_data is None and event.computed_hash() == event.hash
    assert Event(**{f.name: getattr(event, f.name) for f in dataclasses.fields(event) if f.init}) == event
    state = TaskState("t", "w", 1, "d", "s", Status.RUNNABLE, 1, "h", {})
    assert (state.facts, state.visit, state.usage, state.started_by, state.prepared) == ({}, {}, {}, "", None)
    assert state.facts is not TaskState("t", "w", 1, "d", "s", Status.RUNNABLE, 1, "h", {}).facts
    assert TaskState.from_doc(state.to_doc()) == state
