"""Evaluation cases taken from the log: the model's view when a task entered an agent state, made safe to share.

A case is what the model was given to decide on in one visit to an agent state: the task's input and what had
happened so far (its facts, tool results included), with the action the model's accepted proposal named in
that visit as the expected answer. It is plain JSON, reviewable in a pull request, so before it leaves the
database everything that names a person or is not everyone's to read is taken out: identity fields (who acts,
for whom: `IDENTITY_FIELDS`) and every copy of their values, the fields the workflow restricts (replaced as a
reader without the role is shown them, `engine.core.visibility`), and the input's sensitive fields (which the
log never holds, redacted again should a definition have changed).

Running a case (`engine.runtime.evals`) rebuilds the task from it against the current definition, so the real
forcing ladder, schema checks and guards decide on it. Pure: no database, no model.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from engine.core.arguments import IDENTITY_FIELDS, REDACTED, redact
from engine.core.canonical import GENESIS_HASH
from engine.core.definition import Agent, Workflow
from engine.core.errors import Code, Refused
from engine.core.events import Event
from engine.core.forcing import model_actions
from engine.core.quality import base_state, leaves_state
from engine.core.task import Status, TaskState
from engine.core.visibility import Withholding

#: The format every case file names, so a file from a later, different format is refused rather than misread.
FORMAT = "railyard-eval/1"
#: A value of an identity field is also taken out where it was copied into text, when it is at least this long
#: (shorter ones, an id like `c1`, would blank out parts of words that are not theirs).
SCRUB_LENGTH = 4


def capture_point(events: Sequence[Event], state: str) -> tuple[int, str | None] | None:
    """Where to take a case of `state` from a task's log: the seq of the event that began the last visit to it in
    which the model took a turn, and the action its accepted proposal named (None: the visit accepted none).
    None when the model never took a turn in `state`."""
    found: tuple[int, str | None] | None = None
    entry: int | None = None
    turned, accepted = False, None
    for event in events:
        entering = base_state(event.to_state) == state and (event.from_state is None or leaves_state(event))
        if entering:
            entry, turned, accepted = event.seq, False, None
        elif entry is not None and event.from_state is not None and base_state(event.from_state) == state:
            turned = turned or "turn" in event.data
            proposal = event.data.get("proposal")
            if isinstance(proposal, dict) and accepted is None and proposal.get("action"):
                accepted = str(proposal["action"])
            if turned:
                found = (entry, accepted)
            if leaves_state(event):
                entry = None
    return found


def accepted_answer(events: Sequence[Event], seq: int, state: str) -> dict[str, Any] | None:
    """The accepted proposal of the visit to `state` that began at `seq` (`capture_point`): its action and its
    arguments as the log holds them (sensitive fields redacted). None: the visit accepted none."""
    for event in events:
        if event.seq <= seq or event.from_state is None or base_state(event.from_state) != state:
            continue
        proposal = event.data.get("proposal")
        if isinstance(proposal, dict) and proposal.get("action"):
            return {"action": str(proposal["action"]), "args": dict(event.data.get("args") or {})}
        if leaves_state(event):
            break
    return None


def case_of(
    definition: Workflow,
    task: TaskState,
    *,
    expected: str | None,
    source: Mapping[str, Any],
    answer: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The case file of `task` as it stood when it entered the agent state it is in (`capture_point`): safe to
    share. `source` says where it was taken from (the task id and seq), for whoever reviews it."""
    state = definition.state(task.state)
    if not isinstance(state, Agent):
        raise Refused(
            f"{definition.ref} state {task.state!r} is not an agent state", code=Code.STATE_NOT_AGENT, state=task.state
        )
    shown = Withholding(definition.restricted).task(task) if definition.restricted is not None else task
    values = _identities({"input": shown.input, "facts": shown.facts})
    context = _scrubbed({"input": redact(definition.input, dict(shown.input)), "facts": shown.facts}, values)
    return {
        "format": FORMAT,
        "workflow": definition.name,
        "version": definition.version,
        "state": task.state,
        "source": dict(source),
        "input": context["input"],
        "facts": context["facts"],
        "actions": {
            action.name: action.args.model_json_schema() if action.args is not None else None
            for action in model_actions(state)
        },
        "expected": {"action": expected} if expected is not None else None,
        # The accepted answer itself, for the reviewer and as the right answer `eval generate` starts from.
        **({"answer": _scrubbed(dict(answer), values)} if answer is not None else {}),
    }


def task_of(definition: Workflow, case: Mapping[str, Any]) -> TaskState:
    """The task a case puts before the model: in the case's state of `definition`, at the start of a visit."""
    if case.get("format") != FORMAT:
        raise Refused(f"not a {FORMAT} case file", code=Code.EVAL_INVALID, format=case.get("format"))
    name = str(case.get("state"))
    state = definition.state(name) if definition.has_state(name) else None
    if not isinstance(state, Agent):
        raise Refused(f"{definition.ref} has no agent state {name!r}", code=Code.EVAL_INVALID, state=name)
    return TaskState(
        task_id=f"eval:{case.get('source', {}).get('task_id', 'case')}",
        workflow=definition.name,
        version=definition.version,
        digest=definition.digest,
        state=state.name,
        status=Status.RUNNABLE,
        seq=0,
        last_hash=GENESIS_HASH,
        input=dict(case.get("input") or {}),
        facts=dict(case.get("facts") or {}),
        visit={"repairs": 0, "mode": None, "messages": [], "demoted": []},
        usage={},
    )


def expected_action(case: Mapping[str, Any]) -> str | None:
    expected = case.get("expected")
    return str(expected["action"]) if isinstance(expected, Mapping) and expected.get("action") else None


#: What a predicate on an argument may say of it (`expected.arguments`: a field path, then one or more of these).
PREDICATE_OPS = frozenset({"equals", "in", "not_in", "min", "max", "max_length", "present", "absent"})


@dataclass(frozen=True, slots=True)
class Expectation:
    """What a case expects of a model's answer, read from its `expected`: any of them may be left out.

    `action`: the action the accepted proposal names. `arguments`: a predicate on that proposal's arguments, by
    field path (`{"amount": {"max": 500}, "evidence_ids": {"present": true}}`). `first_try`: the model's first
    answer is the one accepted (no repair: what the adversarial cases of `engine.core.adversarial` ask)."""

    action: str | None = None
    arguments: Mapping[str, Mapping[str, Any]] | None = None
    first_try: bool = False

    @property
    def any(self) -> bool:
        return self.action is not None or self.arguments is not None or self.first_try

    def unmet(self, action: str | None, args: Mapping[str, Any] | None, first_try_accepted: bool) -> list[str]:
        """Why an answer does not meet this expectation (empty: it does). `action` None: none was accepted."""
        why = []
        if self.action is not None and action != self.action:
            why.append(f"action {action or 'none'}, not {self.action}")
        if self.first_try and not first_try_accepted:
            why.append("not accepted at the first try")
        if self.arguments is not None:
            if action is None:
                why.append("no arguments to check: no answer was accepted")
            else:
                why.extend(_predicate_fails(self.arguments, args or {}))
        return why


def expectation(case: Mapping[str, Any]) -> Expectation:
    """The case's `expected`, checked: refused with EVAL_INVALID when it says something a run cannot check."""
    expected = case.get("expected")
    if expected is None:
        return Expectation()
    if not isinstance(expected, Mapping) or set(expected) - {"action", "arguments", "first_try"}:
        raise Refused(
            "a case's expected is an object of action, arguments and first_try",
            code=Code.EVAL_INVALID,
            expected=expected,
        )
    arguments = expected.get("arguments")
    if arguments is not None and not (
        isinstance(arguments, Mapping)
        and all(isinstance(p, Mapping) and p and set(p) <= PREDICATE_OPS for p in arguments.values())
    ):
        raise Refused(
            f"expected.arguments maps field paths to predicates of {', '.join(sorted(PREDICATE_OPS))}",
            code=Code.EVAL_INVALID,
            arguments=arguments,
        )
    action = expected.get("action")
    return Expectation(str(action) if action else None, arguments, bool(expected.get("first_try", False)))


_MISSING = object()


def _at(args: Mapping[str, Any], path: str) -> Any:
    value: Any = args
    for part in path.split("."):
        if not isinstance(value, Mapping) or part not in value:
            return _MISSING
        value = value[part]
    return value


def _predicate_fails(predicate: Mapping[str, Mapping[str, Any]], args: Mapping[str, Any]) -> list[str]:
    why = []
    for path, ops in predicate.items():
        value = _at(args, path)
        for op, want in ops.items():
            if op in ("present", "absent"):
                if (value is not _MISSING) != (bool(want) == (op == "present")):
                    why.append(f"{path} is {'absent' if value is _MISSING else 'present'}")
            elif value is _MISSING:
                why.append(f"{path} is absent")
                break
            elif not _holds(op, value, want):
                why.append(f"{path} = {value!r} fails {op} {want!r}")
    return why


def _holds(op: str, value: Any, want: Any) -> bool:
    try:
        if op == "equals":
            return bool(value == want)
        if op == "in":
            return value in want
        if op == "not_in":
            return value not in want
        if op == "min":
            return bool(value >= want)
        if op == "max":
            return bool(value <= want)
        return bool(len(value) <= want)  # max_length
    except TypeError:  # a comparison the value's type does not allow: the value is not what was expected
        return False


def baseline_for(baseline: Mapping[str, Mapping[str, Any]], name: str) -> Mapping[str, Any] | None:
    """The baseline's totals a variant is compared with: its own, or the baseline's only ones (None: neither)."""
    if name in baseline:
        return baseline[name]
    return next(iter(baseline.values())) if len(baseline) == 1 else None


def regressions(
    baseline: Mapping[str, Mapping[str, Any]], current: Mapping[str, Mapping[str, Any]], max_regression: float
) -> list[str]:
    """The gate: why a run does worse than its baseline (empty: it does not), given each run's totals by variant
    (`totals`, as `eval run --json` prints them under `models`).

    Each variant of the current run is compared with the baseline's variant of the same name, or, when the
    baseline holds one variant, with that one (a baseline of the model in production, two candidates against it).
    A share (expectations met, cases accepted at the first try) that fell by more than `max_regression` (a share:
    0.05 is five points) is a regression."""
    if not baseline:
        raise Refused("the baseline holds no run", code=Code.EVAL_INVALID)
    why = []
    for name, figures in sorted(current.items()):
        base = baseline_for(baseline, name)
        if base is None:
            raise Refused(
                f"the baseline has no figures for {name}, and several others ({', '.join(sorted(baseline))})",
                code=Code.EVAL_INVALID,
                variant=name,
            )
        for share, label in (("met_share", "expectations met"), ("first_try_share", "cases accepted at the first try")):
            was, now_ = base.get(share), figures.get(share)
            if isinstance(was, int | float) and isinstance(now_, int | float) and was - now_ > max_regression + 1e-9:
                why.append(f"{name}: {label} {now_:.0%}, the baseline {was:.0%} (down {was - now_:.0%})")
    return why


def _identities(value: Any, found: set[str] | None = None) -> set[str]:
    """The values of identity fields anywhere in `value` (strings, and numbers as they would be written)."""
    found = set() if found is None else found
    if isinstance(value, Mapping):
        for key, item in value.items():
            if key in IDENTITY_FIELDS and isinstance(item, str | int) and not isinstance(item, bool):
                found.add(str(item))
            _identities(item, found)
    elif isinstance(value, list):
        for item in value:
            _identities(item, found)
    return found


def _scrubbed(value: Any, identities: set[str]) -> Any:
    """`value` with identity fields redacted, and their values wherever copied (whole, or inside long text)."""
    if isinstance(value, Mapping):
        return {k: REDACTED if k in IDENTITY_FIELDS else _scrubbed(v, identities) for k, v in value.items()}
    if isinstance(value, list):
        return [_scrubbed(item, identities) for item in value]
    if isinstance(value, str):
        if value in identities:
            return REDACTED
        for found in sorted(identities, key=len, reverse=True):
            if len(found) >= SCRUB_LENGTH:
                value = value.replace(found, REDACTED)
        return value
    return value
