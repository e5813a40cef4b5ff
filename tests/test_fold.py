"""The fold: one `Fold` stepped over many events is the same state `apply` gives one event at a time, and a
state it hands out never changes afterwards."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from engine.core.canonical import GENESIS_HASH, now
from engine.core.definition import START
from engine.core.events import Event, seal
from engine.core.fold import Fold, apply, fold, initial
from engine.core.payloads import as_event_data
from engine.core.task import TaskState
from tests.support.sample_workflows import COUNTER

#: What a counter's events can carry: a tick's arguments, a tool's result or error, a prepared call, a model turn.
DATA = st.one_of(
    st.builds(lambda n: {"args": {"n": n}}, st.integers(0, 9)),
    st.builds(lambda r: {"tool_result": {"tool": "lookup", "result": r}}, st.integers(0, 9)),
    st.builds(lambda e: {"tool_result": {"tool": "lookup", "error": {"code": e}}}, st.sampled_from(["A", "B"])),
    st.builds(lambda n: {"prepared": {"tool": "pay", "arguments": {"n": n}}}, st.integers(0, 9)),
    st.just({"turn": {"messages": [{"role": "assistant"}]}}),
)


def counter_log(datas: list[dict[str, Any]], *, finish: bool) -> list[Event]:
    """A counter task's log: start, a tick per data, and `finish` (to the terminal state) when asked."""
    at = now()
    events = [
        seal(
            task_id="t",
            seq=1,
            at=at,
            actor="ann",
            from_state=None,
            trigger=START,
            to_state="counting",
            data={"workflow": COUNTER.ref, "digest": COUNTER.digest, "input": {}},
            prev_hash=GENESIS_HASH,
        )
    ]
    steps = [("tick", "counting", data) for data in datas] + ([("finish", "done", {})] if finish else [])
    for trigger, target, data in steps:
        events.append(
            seal(
                task_id="t",
                seq=len(events) + 1,
                at=at,
                actor="model",
                from_state=events[-1].to_state,
                trigger=trigger,
                to_state=target,
                data=as_event_data(data),
                prev_hash=events[-1].hash,
            )
        )
    return events


@given(st.lists(DATA, max_size=12), st.booleans())
def test_stepping_one_fold_is_applying_event_by_event(datas: list[dict[str, Any]], finish: bool) -> None:
    events = counter_log(datas, finish=finish)
    one_by_one = [initial(COUNTER, events[0])]
    for event in events[1:]:
        one_by_one.append(apply(COUNTER, one_by_one[-1], event))
    assert fold(COUNTER, events) == one_by_one[-1]
    last = one_by_one[-1]
    assert last.terminal is finish and (last.seq, last.last_hash) == (events[-1].seq, events[-1].hash)
    # What the events say, read plainly: the last arguments per trigger, the newest tool outcome, the newest
    # prepared call, one turn counted per model turn.
    facts: dict[str, Any] = {}
    prepared = None
    for data in datas:
        if "args" in data:
            facts["tick"] = data["args"]
        if "tool_result" in data:
            facts.pop("tool:lookup", None), facts.pop("tool_error:lookup", None)
            result = data["tool_result"]
            facts["tool:lookup" if "result" in result else "tool_error:lookup"] = result.get(
                "result", result.get("error")
            )
        prepared = data.get("prepared", prepared)
    assert (last.facts, last.prepared) == (facts, prepared)
    assert last.usage["turns"] == sum("turn" in d for d in datas)
    # Records handed out along the way are never changed by the steps after them.
    before = copy.deepcopy(one_by_one)
    folding = Fold(COUNTER, one_by_one[0])
    handed_out = []
    for event in events[1:]:
        folding.step(event)
        handed_out.append(folding.record())
    assert handed_out == one_by_one[1:]
    assert one_by_one == before
    assert [copy.deepcopy(r) for r in handed_out] == handed_out


def test_a_record_keeps_its_facts_when_the_fold_goes_on() -> None:
    events = counter_log([{"args": {"n": 1}}, {"args": {"n": 2}}], finish=False)
    folding = Fold(COUNTER, initial(COUNTER, events[0]))
    folding.step(events[1])
    first = folding.record()
    folding.step(events[2])
    assert first.facts == {"tick": {"n": 1}} and folding.record().facts == {"tick": {"n": 2}}


def test_an_event_into_a_state_the_definition_lacks_is_refused_and_changes_nothing() -> None:
    events = counter_log([{"args": {"n": 1}}], finish=False)
    task: TaskState = initial(COUNTER, events[0])
    nowhere = seal(
        task_id="t",
        seq=2,
        at=now(),
        actor="model",
        from_state="counting",
        trigger="tick",
        to_state="nowhere",
        data={"args": {"n": 1}},
        prev_hash=events[0].hash,
    )
    folding = Fold(COUNTER, task)
    with pytest.raises(KeyError):
        folding.step(nowhere)
    assert folding.record() == task  # the step was refused before it changed anything
    with pytest.raises(KeyError):
        apply(COUNTER, task, nowhere)
