"""How each model behaves in each state, folded from task logs: pure, no database, no clock.

Every model turn is an event whose `data.turn` says how the engine asked (the rung), who answered and what the
answer came to (its code, the errors the model was told, the tokens). Folding those events gives, per
(workflow, version, state, provider, model, rung), the figures `railyard quality` prints (`TurnFigures`); folding
every event of a task gives the time it spent in each state, waits for people included (`StateFigures`). Both are
recomputed from the log for any period, so they are exact: nothing is sampled or kept on the side.

A turn belongs to the agent state it was asked in: a repair's turn (asked in `S~force`) is a turn of `S`. A
state's time runs from the event that entered it to the first event that left it; a repair, a demotion or a
note that stays in the state does not end it, and `S~force` is `S`. The generated wait states (`S~handoff`,
`S~provider_error`) are states of their own: the time a task waits there is an operator's, not the model's.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from engine.core.definition import DEMOTE, FORCE_SUFFIX, HAND_OFF, PROVIDER_ERROR, REPAIR
from engine.core.errors import Code
from engine.core.events import Event
from engine.core.payloads import EventData, Turn
from engine.core.rows import TaskRow

#: The self-loop an agent state takes when the provider asked the engine to wait (rate limits): a retry of the
#: same request, not an answer, so it is counted apart (`retries`) and never as a turn.
BACKOFF = "backoff"
#: The path of a schema error on the proposal as a whole (a wrong envelope, an argument that is not an object).
ROOT = "(root)"
#: A field the schema does not have, as a metric's label names it (`failed_fields(bounded=True)`).
EXTRA = "(extra)"
#: The token kinds a turn's `usage` may report, in the order the figures list them.
TOKEN_KINDS = ("input_tokens", "output_tokens", "cached_tokens", "reasoning_tokens")
#: Triggers of turns in which the model gave no answer: the provider refused the request or failed.
_UNANSWERED = frozenset({PROVIDER_ERROR, DEMOTE})


#: A model's prices (`CapabilityProfile.price`: money per million tokens by kind), looked up by the turn's profile
#: name and model name; None where none is known.
Prices = Callable[[str, str], Mapping[str, float] | None]


def turn_cost(usage: Mapping[str, Any], price: Mapping[str, float]) -> float:
    """What a turn's tokens cost at `price` (per million tokens): input and output, and the input read from the
    provider's cache at its own price where the profile names one (else as any input)."""
    cached = int(usage.get("cached_tokens", 0)) if "cached" in price else 0
    spent = (
        (int(usage.get("input_tokens", 0)) - cached) * price["input"]
        + cached * price.get("cached", 0.0)
        + int(usage.get("output_tokens", 0)) * price["output"]
    )
    return spent / 1_000_000


def base_state(state: str) -> str:
    """The declared state `state` belongs to for these figures: `S` for the repair state `S~force`, else itself."""
    return state.removesuffix(FORCE_SUFFIX)


def field_path(loc: Sequence[Any]) -> str:
    """An error's location as the field it names: `items[].sku` for `["items", 3, "sku"]` (every item of a list is
    the same field of the schema), `(root)` for the proposal as a whole."""
    path = ""
    for part in loc:
        if isinstance(part, int) and not isinstance(part, bool):
            path += "[]"
        else:
            path += f".{part}" if path else str(part)
    return path or ROOT


def guard_of(error: Mapping[str, Any]) -> str:
    """The guard a domain rejection names: `decide` records each as `GUARD: reason` (the guard's short name)."""
    named = error.get("guard")
    if isinstance(named, str) and named:
        return named
    guard, sep, _ = str(error.get("msg", "")).partition(": ")
    return guard if sep and guard else "(unnamed)"


def proposal_code(data: EventData, turn: Turn) -> str | None:
    """What a turn's answer came to: its code, or for a hand-off after the repairs ran out the code of the last
    refused proposal (the turn's errors are that proposal's)."""
    code = turn.get("code")
    if code == Code.REPAIRS_EXHAUSTED and data.get("last_code"):
        return data["last_code"]
    return code


@dataclass(frozen=True, slots=True)
class Outcome:
    """What an answered turn came to beside its code: the counts `railyard quality` and the metrics both take
    from it, so the two never count a turn differently."""

    repair: bool
    hand_off: bool
    escalated: bool
    #: The guards that refused the answer (DOMAIN_INVALID), by their short names.
    guards: frozenset[str]


def turn_outcome(event: Event, turn: Turn, code: str | None) -> Outcome | None:
    """The outcome of a turn the model answered (None: a provider error or a refused request shape, no answer)."""
    if event.trigger in _UNANSWERED:
        return None
    errors = turn.get("errors", []) if code == Code.DOMAIN_INVALID else []
    return Outcome(
        repair=event.trigger == REPAIR,
        hand_off=event.trigger == HAND_OFF,
        escalated="escalated" in turn,
        guards=frozenset(guard_of(e) for e in errors if isinstance(e, dict)),
    )


def failed_fields(data: EventData, *, bounded: bool = False) -> frozenset[str]:
    """The fields a model turn's answer failed the schema on (empty: it did not fail the schema): each field path
    once, however many errors name it. An answer that failed the schema as a whole is `(root)`.

    `bounded`: only names the schema has, for a metric's label (a field the model made up is `(extra)`: its name is
    the model's, and a label's values must stay few)."""
    turn = data.get("turn")
    if not isinstance(turn, dict) or proposal_code(data, turn) != Code.OUTPUT_SCHEMA_INVALID:
        return frozenset()
    errors = [e for e in turn.get("errors", []) if isinstance(e, dict)]
    paths = {EXTRA if bounded and _made_up(e) else field_path(e.get("loc") or []) for e in errors}
    return frozenset(paths or {ROOT})


def _made_up(error: Mapping[str, Any]) -> bool:
    """Whether a schema error is about a field the schema does not have (pydantic's type for it; `decide`'s message
    for a payload given to an action that takes none)."""
    return error.get("type") == "extra_forbidden" or error.get("msg") == "unexpected argument"


@dataclass(frozen=True, slots=True)
class TurnTag:
    """What a person reading a task's timeline is told of a model turn: the rung it was asked on, and whether it
    answered the first ask of an attempt (not a repair's), which is what first-try compliance counts."""

    rung: str
    answered: bool
    first_try: bool

    @property
    def label(self) -> str:
        said = "first-try answer" if self.first_try else "answer to a repair" if self.answered else "no answer"
        return f"rung {self.rung} · {said}"


def turn_tag(event: Event) -> TurnTag | None:
    """The tag of a model turn's event (None: the event is no model turn, or a backoff: the same ask made again)."""
    turn = event.data.get("turn")
    if not isinstance(turn, dict) or event.from_state is None or event.trigger == BACKOFF:
        return None
    answered = event.trigger not in _UNANSWERED
    return TurnTag(str(turn.get("strategy", "")), answered, answered and not event.from_state.endswith(FORCE_SUFFIX))


def leaves_state(event: Event) -> bool:
    """Whether `event` ends a visit to the state the task was in: a move to another state (`S` to `S~force` and
    back is no move). The first event of a log leaves nothing."""
    return event.from_state is not None and base_state(event.from_state) != base_state(event.to_state)


def entered_at(log: Sequence[Event]) -> datetime | None:
    """When the task whose log this is (in order, to its last event) entered the state it is in: the time of the
    event that moved it there. None for an empty log."""
    if not log:
        return None
    state = base_state(log[-1].to_state)
    for event in reversed(log):
        if event.from_state is None or base_state(event.from_state) != state:
            return event.at
    return log[0].at


def percentile(values: Sequence[float], q: float) -> float | None:
    """The nearest-rank percentile of `values` (None when there are none): a value that was observed, so a figure
    in the report can be found again in the log."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(math.ceil(q * len(ordered)) - 1, 0)]


@dataclass(frozen=True, slots=True, order=True)
class TurnKey:
    """What the turn figures are grouped by."""

    workflow: str
    version: int
    state: str
    provider: str
    model: str
    rung: str


@dataclass(slots=True)
class TurnFigures:
    """What the turns of one `TurnKey` came to, counted event by event."""

    #: Model turns: every event with a turn (answered or not), backoffs excepted.
    turns: int = 0
    #: Turns the model answered (a proposal, valid or not): not a provider error, not a refused request shape.
    answered: int = 0
    #: Answers accepted as the state's action.
    accepted: int = 0
    #: Answers that were the first of a visit's attempt (not asked in `S~force`), and of those the accepted ones.
    first_tries: int = 0
    first_try_accepted: int = 0
    #: `repair` events: an answer refused with a repair left.
    repairs: int = 0
    #: Answers after which the ladder was moved (a reminder or the next rung down).
    escalations: int = 0
    #: Answers that were not JSON (OUTPUT_NOT_JSON).
    parse_failures: int = 0
    #: Answers that failed the action's schema (OUTPUT_SCHEMA_INVALID), by field path: a turn counts once a field.
    schema_failures: Counter[str] = field(default_factory=Counter)
    #: Answers a domain guard refused (DOMAIN_INVALID), by guard.
    domain_rejections: Counter[str] = field(default_factory=Counter)
    #: `hand_off` events: the task left for a person or the state's on_exhausted target.
    hand_offs: int = 0
    #: `provider_error` events (the call failed for good) and `demote` events (the provider refused the shape).
    provider_errors: int = 0
    demotions: int = 0
    #: `backoff` events: the same request made again later; not turns.
    retries: int = 0
    #: Every code the turns ended in (the refused proposal's, or the provider's), by code.
    codes: Counter[str] = field(default_factory=Counter)
    #: Tokens the provider reported, by kind (`TOKEN_KINDS`).
    tokens: Counter[str] = field(default_factory=Counter)
    #: What those tokens cost at the profile's prices, and how many turns reported tokens for a model it has no
    #: price for (their cost is not in `cost`).
    cost: float = 0.0
    unpriced: int = 0

    @property
    def first_try_compliance(self) -> float | None:
        """Of the first tries, the share accepted (None: no first try)."""
        return self.first_try_accepted / self.first_tries if self.first_tries else None

    @property
    def repairs_per_turn(self) -> float | None:
        return self.repairs / self.turns if self.turns else None

    def to_dict(self) -> dict[str, Any]:
        return {
            "turns": self.turns,
            "answered": self.answered,
            "accepted": self.accepted,
            "first_tries": self.first_tries,
            "first_try_accepted": self.first_try_accepted,
            "first_try_compliance": _rounded(self.first_try_compliance),
            "repairs": self.repairs,
            "repairs_per_turn": _rounded(self.repairs_per_turn),
            "escalations": self.escalations,
            "parse_failures": self.parse_failures,
            "schema_failures": dict(sorted(self.schema_failures.items())),
            "domain_rejections": dict(sorted(self.domain_rejections.items())),
            "hand_offs": self.hand_offs,
            "provider_errors": self.provider_errors,
            "demotions": self.demotions,
            "retries": self.retries,
            "codes": dict(sorted(self.codes.items())),
            "tokens": {kind: self.tokens[kind] for kind in TOKEN_KINDS if kind in self.tokens},
            "cost": _money(self.cost),
            "unpriced": self.unpriced,
        }


@dataclass(frozen=True, slots=True, order=True)
class StateKey:
    """What the state times are grouped by."""

    workflow: str
    version: int
    state: str


@dataclass(slots=True)
class StateFigures:
    """The visits to one state that ended in the period: how long each lasted, and what its model turns spent."""

    seconds: list[float] = field(default_factory=list)
    #: Input plus output tokens of the model turns made in those visits.
    tokens: int = 0
    #: What those turns cost at the profiles' prices; `unpriced` counts the visits with a turn of a model that has
    #: no price (their cost is not in `cost`, and the cost per visit is not given).
    cost: float = 0.0
    unpriced: int = 0

    @property
    def visits(self) -> int:
        return len(self.seconds)

    def to_dict(self) -> dict[str, Any]:
        return {
            "visits": self.visits,
            "p50_seconds": _rounded(percentile(self.seconds, 0.5)),
            "p95_seconds": _rounded(percentile(self.seconds, 0.95)),
            "tokens": self.tokens,
            "tokens_per_visit": _rounded(self.tokens / self.visits) if self.visits else None,
            "cost": _money(self.cost),
            "cost_per_visit": self.cost_per_visit,
        }

    @property
    def cost_per_visit(self) -> float | None:
        """What a visit cost on average (None: no visit, or a visit with a turn no price is known for)."""
        return _money(self.cost / self.visits) if self.visits and not self.unpriced else None


@dataclass(frozen=True, slots=True)
class Period:
    """`since <= at < until`; an open end is no bound."""

    since: datetime | None = None
    until: datetime | None = None

    def holds(self, at: datetime) -> bool:
        return (self.since is None or at >= self.since) and (self.until is None or at < self.until)


@dataclass(frozen=True, slots=True)
class Quality:
    """The figures of a period: per turn key, and per state."""

    turns: Mapping[TurnKey, TurnFigures]
    states: Mapping[StateKey, StateFigures]

    def to_dict(self) -> dict[str, Any]:
        """The `--json` form: lists sorted by their keys, so two runs over the same log print the same bytes."""
        return {
            "turns": [{**_fields(key), **self.turns[key].to_dict()} for key in sorted(self.turns)],
            "states": [{**_fields(key), **self.states[key].to_dict()} for key in sorted(self.states)],
        }


def _fields(key: TurnKey | StateKey) -> dict[str, Any]:
    return {name: getattr(key, name) for name in key.__slots__}


def _rounded(value: float | None) -> float | None:
    return round(value, 4) if value is not None else None


def _money(value: float) -> float:
    """A cost rounded where it stops meaning anything (a millionth of the currency), so `--json` is stable."""
    return round(value, 6)


def model_matches(wanted: str | None, model: str) -> bool:
    """Whether a turn's `provider:model` is the model asked for: named whole, or by the model's name alone."""
    if wanted is None:
        return True
    return wanted == model or wanted == model.partition(":")[2]


@dataclass(slots=True)
class _Visit:
    state: str
    version: int
    entered: datetime
    tokens: int = 0
    cost: float = 0.0
    unpriced: bool = False
    #: Whether a turn of the model asked for was made in it (what `--model` keeps of the state times).
    answered_by_model: bool = False


class QualityFold:
    """Folds task logs, a task row then its events in log order (what `Auditor.logs` streams), into `Quality`.

    `period` bounds what is counted: a turn by its event's time, a visit by the time it ended (an open visit is not
    counted). With `model`, only that model's turns, and only the visits of agent states it answered in.
    """

    def __init__(self, period: Period = Period(), model: str | None = None, prices: Prices | None = None) -> None:
        self.period = period
        self.model = model
        self.prices = prices
        self._turns: dict[TurnKey, TurnFigures] = {}
        self._states: dict[StateKey, StateFigures] = {}
        self._workflow = ""
        self._version = 0
        self._visit: _Visit | None = None

    def task(self, row: TaskRow) -> None:
        """A new task's log follows."""
        self._workflow, self._version, self._visit = row.workflow, row.version, None

    def event(self, event: Event) -> None:
        """The task's next event."""
        data = event.data
        self._version = _version_after(data, self._version)
        turn = data.get("turn")
        if isinstance(turn, dict) and event.from_state is not None:
            self._turn(event, data, turn)
        if event.from_state is None or self._visit is None:
            self._enter(event)
        elif leaves_state(event):
            self._leave(event)
            self._enter(event)

    def result(self) -> Quality:
        return Quality(dict(self._turns), dict(self._states))

    def _turn(self, event: Event, data: EventData, turn: Turn) -> None:
        model = str(turn.get("model", ""))
        if not model_matches(self.model, model):
            return
        provider, _, name = model.partition(":")
        key = TurnKey(
            self._workflow,
            self._version,
            base_state(event.from_state or ""),
            provider,
            name,
            str(turn.get("strategy", "")),
        )
        spent = turn.get("usage") or {}
        price = self.prices(str(turn.get("profile", "")), name) if self.prices is not None and spent else None
        cost = turn_cost(spent, price) if price is not None else 0.0
        unpriced = self.prices is not None and bool(spent) and price is None
        if self._visit is not None:
            self._visit.tokens += int(spent.get("input_tokens", 0)) + int(spent.get("output_tokens", 0))
            self._visit.cost += cost
            self._visit.unpriced |= unpriced
            self._visit.answered_by_model = True
        if not self.period.holds(event.at):
            return
        figures = self._turns.get(key)
        if figures is None:
            figures = self._turns[key] = TurnFigures()
        if event.trigger == BACKOFF:
            figures.retries += 1
            return
        figures.turns += 1
        for kind in TOKEN_KINDS:
            if kind in spent:
                figures.tokens[kind] += int(spent[kind])  # type: ignore[literal-required]
        figures.cost += cost
        figures.unpriced += unpriced
        code = proposal_code(data, turn)
        if code:
            figures.codes[code] += 1
        outcome = turn_outcome(event, turn, code)
        if outcome is None:
            if event.trigger == PROVIDER_ERROR:
                figures.provider_errors += 1
            else:
                figures.demotions += 1
            return
        figures.answered += 1
        first = not (event.from_state or "").endswith(FORCE_SUFFIX)
        figures.first_tries += first
        if code is None:
            figures.accepted += 1
            figures.first_try_accepted += first
        figures.repairs += outcome.repair
        figures.hand_offs += outcome.hand_off
        figures.escalations += outcome.escalated
        figures.schema_failures.update(failed_fields(data))
        figures.parse_failures += code == Code.OUTPUT_NOT_JSON
        figures.domain_rejections.update(outcome.guards)

    def _enter(self, event: Event) -> None:
        self._visit = _Visit(base_state(event.to_state), self._version, event.at)

    def _leave(self, event: Event) -> None:
        visit = self._visit
        assert visit is not None
        if not self.period.holds(event.at) or (self.model is not None and not visit.answered_by_model):
            return
        key = StateKey(self._workflow, visit.version, visit.state)
        figures = self._states.get(key)
        if figures is None:
            figures = self._states[key] = StateFigures()
        figures.seconds.append((event.at - visit.entered).total_seconds())
        figures.tokens += visit.tokens
        figures.cost += visit.cost
        figures.unpriced += visit.unpriced


def _version_after(data: EventData, version: int) -> int:
    """The version a task is on after an event: a start or a fork names it (`name@version`), a migration moves it."""
    moved = data.get("to_version")
    if isinstance(moved, int):
        return moved
    named = data.get("workflow")
    if isinstance(named, str) and named.rpartition("@")[2].isdigit():
        return int(named.rpartition("@")[2])
    return version


def fold_quality(
    logs: Iterable[TaskRow | Event], period: Period = Period(), model: str | None = None, prices: Prices | None = None
) -> Quality:
    """The figures of task logs streamed as rows each followed by its events (`Auditor.logs`), costed at `prices`
    (None: no cost)."""
    fold = QualityFold(period, model, prices)
    for item in logs:
        if isinstance(item, TaskRow):
            fold.task(item)
        else:
            fold.event(item)
    return fold.result()
