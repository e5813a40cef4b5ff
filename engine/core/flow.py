"""Flow control for model calls, the decisions only: the circuit breaker, quotas, and who goes first.

Every worker process on a database shares one breaker and one set of quota buckets per (provider, model[, API
key]), kept in rows (`engine.store.protocol.FlowStore`); `engine.runtime.flow` does the I/O around a call. What
is decided here takes numbers and returns numbers, with the clock passed in, so that a test can drive a breaker
through a cool-down or a bucket through a minute without waiting for either:

- **Breaker.** `failures` transient failures in a row (a timeout, a 5xx, a dropped connection: the provider is
  unwell, not the request) open it; while open, calls wait until `cool_down_seconds` after it opened; then one
  caller claims the probe (`half_open`), and its success closes the breaker, its failure opens it again.
- **Quotas.** A token bucket per row with three levels (requests, input tokens, output tokens) refilled at the
  per-minute rates and capped at `burst_seconds` worth of them, plus a count of calls in flight. A call takes
  one request and its estimated tokens before it is sent, and is settled with what the provider reports.
- **Who goes first.** Calls refused for quota join a queue: higher priority first; within a priority, the
  groups (tenants, or workflows for tasks of no tenant) share by what each was served lately (fair share over
  a sliding minute): a group that was served less goes first until it has caught up, so one group's batch
  cannot starve another, and a newcomer is not held to half of a quota another has been using all along.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from typing import Any, Literal

from engine.core.errors import Code, RailyardError
from engine.core.model_interface import ModelRequest, Usage
from engine.core.text import closest

BreakerState = Literal["closed", "open", "half_open"]

#: The codes a breaker counts: the provider (or the way to it) failed, whatever the request was.
#: `RATE_LIMITED` is not among them: a 429 is the provider working as agreed, and the quota's pause answers it.
BREAKER_CODES = frozenset({Code.PROVIDER_TIMEOUT, Code.PROVIDER_ERROR})

#: Output tokens reserved for a call that sets no `max_output_tokens`: settled with the real count afterwards.
DEFAULT_OUTPUT_ESTIMATE = 1024
#: Characters per token of the estimate: a prompt's tokens are its characters over this (a rough English mean,
#: on the safe side for code and JSON). Only the reservation uses it; settling corrects it.
CHARS_PER_TOKEN = 3.5


# -- settings ------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class BreakerSettings:
    """When the breaker of a (provider, model) opens and for how long. `failures = 0` turns it off."""

    failures: int = 5
    cool_down_seconds: float = 30.0
    #: How long a probe call may take before another caller may probe instead (its worker died, say).
    probe_seconds: float = 120.0


@dataclass(frozen=True)
class Limits:
    """A provider's limits for one (provider, model[, API key]): None is no limit on that measure."""

    requests_per_minute: float | None = None
    input_tokens_per_minute: float | None = None
    output_tokens_per_minute: float | None = None
    concurrent_calls: int | None = None
    #: How much of a minute's quota may be spent at once, in seconds of it: the bucket's depth. Providers count
    #: in short windows too; a full minute's burst at once is what gets 429s.
    burst_seconds: float = 2.0
    #: Whether each API key gets its own bucket (a provider's limits are often per key, or per organisation).
    per_api_key: bool = False

    @property
    def empty(self) -> bool:
        return (
            self.requests_per_minute is None
            and self.input_tokens_per_minute is None
            and self.output_tokens_per_minute is None
            and self.concurrent_calls is None
        )

    def capacity(self, per_minute: float | None) -> float:
        """The bucket's depth for a per-minute rate: `burst_seconds` of it, at least one request's worth."""
        if per_minute is None:
            return math.inf
        return max(per_minute * self.burst_seconds / 60.0, 1.0)


@dataclass(frozen=True)
class FlowSettings:
    """Everything flow control is told: the breaker, the quotas by `provider:model` pattern, and each workflow's
    priority (a task's own, given at start, wins)."""

    breaker: BreakerSettings = field(default_factory=BreakerSettings)
    quotas: Mapping[str, Limits] = field(default_factory=dict)
    priorities: Mapping[str, int] = field(default_factory=dict)

    def limits_for(self, provider: str, model: str) -> Limits | None:
        """The limits of `provider:model`: an exact entry first, else the first pattern that matches."""
        spec = f"{provider}:{model}"
        if spec in self.quotas:
            return self.quotas[spec]
        for pattern, limits in self.quotas.items():
            if fnmatch.fnmatchcase(spec, pattern):
                return limits
        return None

    def priority_of(self, workflow: str) -> int:
        return self.priorities.get(workflow, 0)


QUOTA_NAMES = tuple(f.name for f in fields(Limits))
BREAKER_NAMES = tuple(f.name for f in fields(BreakerSettings))


def _refuse(where: str, message: str, setting: str) -> RailyardError:
    return RailyardError(f"{where}: {message}", code=Code.CONFIG_INVALID, setting=setting)


def _unknown(name: str, known: Iterable[str], kind: str, where: str) -> RailyardError:
    close = closest(name, known)
    hint = f" (did you mean {close!r}?)" if close else ""
    return _refuse(where, f"unknown {kind} {name!r}{hint}", name)


def _positive(value: Any, name: str, where: str, *, whole: bool = False) -> float:
    ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value) and value > 0
    if not ok or (whole and not float(value).is_integer()):
        kind = "a positive whole number" if whole else "a positive number"
        raise _refuse(where, f"{name} must be {kind}, not {value!r}", name)
    return int(value) if whole else float(value)


def parse_limits(values: Mapping[str, Any], where: str) -> Limits:
    """One quota table (`[quotas."openai:gpt-4o"]`), checked: CONFIG_INVALID names the closest setting."""
    if not isinstance(values, Mapping):
        raise _refuse(where, "a quota is a table of settings", "quotas")
    found: dict[str, Any] = {}
    for name, value in values.items():
        if name not in QUOTA_NAMES:
            raise _unknown(name, QUOTA_NAMES, "quota setting", where)
        if name == "per_api_key":
            if not isinstance(value, bool):
                raise _refuse(where, f"per_api_key must be true or false, not {value!r}", name)
            found[name] = value
        else:
            found[name] = _positive(value, name, where, whole=name == "concurrent_calls")
    return Limits(**found)


def parse_quotas(doc: Mapping[str, Any], where: str) -> dict[str, Limits]:
    """The `[quotas]` tables: `provider:model` (a pattern: `openai:gpt-4o*`) to its limits."""
    if not isinstance(doc, Mapping):
        raise _refuse(where, "quotas must be tables named provider:model", "quotas")
    out: dict[str, Limits] = {}
    for spec, values in doc.items():
        provider, _, model = str(spec).partition(":")
        if not provider or not model:
            raise _refuse(where, f"quota {spec!r} must be named provider:model (openai:gpt-4o-mini)", "quotas")
        out[str(spec)] = parse_limits(values, f"{where}, quota {spec}")
    return out


def parse_breaker(values: Mapping[str, Any], where: str) -> BreakerSettings:
    """The `[breaker]` table, checked."""
    if not isinstance(values, Mapping):
        raise _refuse(where, "breaker must be a table of settings", "breaker")
    found: dict[str, Any] = {}
    for name, value in values.items():
        if name not in BREAKER_NAMES:
            raise _unknown(name, BREAKER_NAMES, "breaker setting", where)
        if name == "failures":
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise _refuse(where, f"failures must be a whole number, 0 (off) or more, not {value!r}", name)
            found[name] = value
        else:
            found[name] = _positive(value, name, where)
    return BreakerSettings(**found)


#: The priorities a workflow or a task may have: higher goes first when a quota is short; 0 by default.
PRIORITIES = range(-1000, 1001)


def is_priority(value: Any) -> bool:
    return not isinstance(value, bool) and isinstance(value, int) and value in PRIORITIES


def with_declared(settings: FlowSettings, declared: Mapping[str, int]) -> FlowSettings:
    """`settings` with the priorities the workflows declare (`Workflow.priority`) under the operator's: a
    `[priorities]` entry (profiles file, RAILYARD_PRIORITIES) overrides what the code says, without a release."""
    return replace(settings, priorities={**{k: v for k, v in declared.items() if v}, **settings.priorities})


def parse_priorities(values: Mapping[str, Any], where: str) -> dict[str, int]:
    """The `[priorities]` table: workflow name to a whole number (higher goes first; default 0)."""
    if not isinstance(values, Mapping):
        raise _refuse(where, "priorities must be a table of workflow = number", "priorities")
    out: dict[str, int] = {}
    for workflow, value in values.items():
        if not is_priority(value):
            raise _refuse(where, f"priority of {workflow!r} must be a whole number from -1000 to 1000", "priorities")
        out[str(workflow)] = value
    return out


def check_priority(value: Any) -> int:
    """A task's priority at start: a whole number from -1000 to 1000 (CONFIG_INVALID otherwise)."""
    if not is_priority(value):
        raise RailyardError(
            f"priority must be a whole number from -1000 to 1000, not {value!r}", code=Code.CONFIG_INVALID
        )
    return int(value)


def merged(
    file: Mapping[str, Any] | None,
    env: Mapping[str, Any] | None,
    where_file: str = "the profiles file",
    given: Mapping[str, Any] | None = None,
) -> FlowSettings:
    """Flow settings from the profiles file's `[breaker]`, `[quotas]`, `[priorities]` tables, the environment's
    and the command line's (`given`; the same shapes), the later winning: per breaker setting, per quota entry
    (whole), per workflow."""
    layers = ((file or {}, where_file), (env or {}, "the environment"), (given or {}, "the command line"))
    breaker: dict[str, Any] = {}
    quotas: dict[str, Limits] = {}
    priorities: dict[str, int] = {}
    for layer, where in layers:
        if "breaker" in layer:
            parse_breaker(layer["breaker"], where)  # checked as a whole, then merged setting by setting
            breaker.update(layer["breaker"])
        if "quotas" in layer:
            quotas.update(parse_quotas(layer["quotas"], where))
        if "priorities" in layer:
            priorities.update(parse_priorities(layer["priorities"], where))
    return FlowSettings(parse_breaker(breaker, "flow settings"), quotas, priorities)


def quota_key(provider: str, model: str, limits: Limits | None, api_key: str | None) -> str:
    """The row a call counts against: `provider:model`, with a fingerprint of the API key when the limits are per
    key (never the key itself: the rows are readable by whoever reads the database)."""
    key = f"{provider}:{model}"
    if limits is not None and limits.per_api_key and api_key:
        key += "#" + hashlib.sha256(api_key.encode()).hexdigest()[:12]
    return key


# -- the breaker ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class BreakerRow:
    """A breaker as the database keeps it; `at` is the database's clock when it was read (epoch seconds)."""

    key: str
    state: BreakerState = "closed"
    failures: int = 0
    open_until: float = 0.0
    probe_until: float = 0.0
    changed_at: float = 0.0
    at: float = 0.0


Admit = Literal["go", "probe", "wait"]


def breaker_admits(row: BreakerRow | None, at: float) -> tuple[Admit, float]:
    """Whether a call may go now (`go`), may go as the one probe if it claims it first (`probe`), or must wait; and
    when to look again (epoch seconds) for a wait."""
    if row is None or row.state == "closed":
        return "go", at
    if row.state == "open":
        return ("probe", at) if at >= row.open_until else ("wait", row.open_until)
    # half open: one probe is out; another may probe only when that one is overdue
    return ("probe", at) if at >= row.probe_until else ("wait", min(row.probe_until, at + 5.0))


def breaker_failed(row: BreakerRow | None, key: str, at: float, settings: BreakerSettings) -> BreakerRow:
    """The breaker after one more transient failure: open from `failures` in a row, or from a failed probe. An
    open breaker stays open until its first cool-down ends: calls already in flight when it opened do not push
    the end further out."""
    row = row or BreakerRow(key)
    failures = row.failures + 1
    if row.state == "half_open" or (row.state == "closed" and failures >= settings.failures > 0):
        return replace(row, state="open", failures=failures, open_until=at + settings.cool_down_seconds, changed_at=at)
    return replace(row, failures=failures)


def breaker_succeeded(row: BreakerRow | None, key: str, at: float) -> BreakerRow:
    """The breaker after an answer: closed, and its count of failures in a row back to 0."""
    if row is None:
        return BreakerRow(key, changed_at=at)
    return replace(row, state="closed", failures=0, changed_at=at if row.state != "closed" else row.changed_at)


def counts_for_breaker(code: Code, status: int | None) -> bool:
    """Whether a failure says the provider is unwell: a timeout, a dropped connection (no status), a 5xx."""
    if code not in BREAKER_CODES:
        return False
    return code is Code.PROVIDER_TIMEOUT or status is None or status >= 500


# -- quotas --------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Amounts:
    """What one call takes from a bucket: a request, its prompt's tokens (estimated) and its answer's (reserved)."""

    requests: float = 1.0
    input_tokens: float = 0.0
    output_tokens: float = 0.0

    def within(self, limits: Limits) -> Amounts:
        """Never more than a full bucket: a call bigger than the burst waits for a full bucket, not forever."""
        return Amounts(
            min(self.requests, limits.capacity(limits.requests_per_minute)),
            min(self.input_tokens, limits.capacity(limits.input_tokens_per_minute)),
            min(self.output_tokens, limits.capacity(limits.output_tokens_per_minute)),
        )


def estimate(request: ModelRequest) -> Amounts:
    """What a request will take, before it is sent: its prompt's characters over `CHARS_PER_TOKEN` (messages,
    tools and schema as they go on the wire, near enough), and its `max_output_tokens` (or a default) of answer."""
    chars = 0
    for message in request.messages:
        chars += len(json.dumps(message.to_dict(), ensure_ascii=False, default=str))
    for tool in request.tools:
        chars += len(tool.name) + len(tool.description) + len(json.dumps(tool.parameters, default=str))
    if request.response_schema is not None:
        chars += len(json.dumps(request.response_schema.schema, default=str))
    output = request.max_output_tokens or DEFAULT_OUTPUT_ESTIMATE
    return Amounts(1.0, float(math.ceil(chars / CHARS_PER_TOKEN)), float(output))


def settlement(reserved: Amounts, usage: Usage | None) -> tuple[float, float]:
    """What to take (positive) or give back (negative) once the provider said what the call used: the reported
    count less the reservation, per measure; nothing where the provider reported nothing (the estimate stands)."""
    if usage is None:
        return 0.0, 0.0
    din = usage.input_tokens - reserved.input_tokens if usage.input_tokens is not None else 0.0
    dout = usage.output_tokens - reserved.output_tokens if usage.output_tokens is not None else 0.0
    return float(din), float(dout)


@dataclass(frozen=True)
class QuotaRow:
    """A quota bucket as the database keeps it (levels as of `refilled_at`), read at `at` (the database's clock)."""

    key: str
    requests: float
    input_tokens: float
    output_tokens: float
    in_flight: int
    in_flight_until: float
    refilled_at: float
    paused_until: float
    at: float = 0.0
    limits: str = ""


def refilled(level: float, per_minute: float | None, capacity: float, elapsed: float) -> float:
    """A level `elapsed` seconds after it was last written, at `per_minute`, never above `capacity`."""
    if per_minute is None:
        return math.inf
    return min(capacity, level + max(elapsed, 0.0) * per_minute / 60.0)


def in_flight_now(row: QuotaRow, at: float) -> int:
    """Calls in flight, as the row counts them: none once every call counted has passed its deadline (a worker
    that died mid-call gives its slots back when its calls would have timed out, at the latest)."""
    return 0 if row.in_flight_until < at else row.in_flight


def quota_take(row: QuotaRow, limits: Limits, amounts: Amounts, at: float, hold_seconds: float) -> QuotaRow | None:
    """The bucket after taking `amounts` at `at`, or None when it cannot give them now. The memory store runs this;
    the SQL stores run the same arithmetic in one UPDATE (`TAKE` of each dialect)."""
    if at < row.paused_until:
        return None
    elapsed = at - row.refilled_at
    levels = []
    for level, per_minute, amount in (
        (row.requests, limits.requests_per_minute, amounts.requests),
        (row.input_tokens, limits.input_tokens_per_minute, amounts.input_tokens),
        (row.output_tokens, limits.output_tokens_per_minute, amounts.output_tokens),
    ):
        now_level = refilled(level, per_minute, limits.capacity(per_minute), elapsed)
        if now_level < amount:
            return None
        levels.append(now_level - amount if math.isfinite(now_level) else 0.0)
    flying = in_flight_now(row, at)
    if limits.concurrent_calls is not None and flying >= limits.concurrent_calls:
        return None
    return replace(
        row,
        requests=levels[0],
        input_tokens=levels[1],
        output_tokens=levels[2],
        in_flight=flying + 1,
        in_flight_until=max(row.in_flight_until, at + hold_seconds),
        refilled_at=max(row.refilled_at, at),
    )


def quota_wait(row: QuotaRow, limits: Limits, amounts: Amounts, at: float) -> float:
    """Seconds until the bucket could give `amounts`, with nobody else taking meanwhile (at least a little: a
    refusal is never followed by a look at once)."""
    waits = [row.paused_until - at]
    elapsed = at - row.refilled_at
    for level, per_minute, amount in (
        (row.requests, limits.requests_per_minute, amounts.requests),
        (row.input_tokens, limits.input_tokens_per_minute, amounts.input_tokens),
        (row.output_tokens, limits.output_tokens_per_minute, amounts.output_tokens),
    ):
        if per_minute is None:
            continue
        short = amount - refilled(level, per_minute, limits.capacity(per_minute), elapsed)
        waits.append(short / (per_minute / 60.0))
    if limits.concurrent_calls is not None and in_flight_now(row, at) >= limits.concurrent_calls:
        waits.append(1.0)  # a slot frees when a call ends: look again soon
    return max(0.05, *waits)


def slot_seconds(limits: Limits, amounts: Amounts) -> float:
    """How long one call's worth of quota takes to refill: the interval between calls at the limit."""
    slots = [0.05]
    for per_minute, amount in (
        (limits.requests_per_minute, amounts.requests),
        (limits.input_tokens_per_minute, amounts.input_tokens),
        (limits.output_tokens_per_minute, amounts.output_tokens),
    ):
        if per_minute:
            slots.append(amount / (per_minute / 60.0))
    return max(slots)


def new_bucket(key: str, limits: Limits, at: float) -> QuotaRow:
    """A full bucket."""

    def full(per_minute: float | None) -> float:
        return limits.capacity(per_minute) if per_minute is not None else 0.0

    return QuotaRow(
        key,
        full(limits.requests_per_minute),
        full(limits.input_tokens_per_minute),
        full(limits.output_tokens_per_minute),
        0,
        0.0,
        at,
        0.0,
        at,
    )


#: Header names (lower case) of what a provider says is left of its quota: OpenAI's and Anthropic's.
REMAINING_HEADERS: dict[str, tuple[str, ...]] = {
    "requests": ("x-ratelimit-remaining-requests", "anthropic-ratelimit-requests-remaining"),
    "input_tokens": (
        "x-ratelimit-remaining-tokens",
        "anthropic-ratelimit-input-tokens-remaining",
        "anthropic-ratelimit-tokens-remaining",
    ),
    "output_tokens": ("anthropic-ratelimit-output-tokens-remaining",),
}


def remaining(headers: Mapping[str, str]) -> dict[str, float]:
    """What the provider's headers say is left, per measure (absent where they say nothing readable)."""
    lowered = {k.lower(): v for k, v in headers.items()}
    out: dict[str, float] = {}
    for measure, names in REMAINING_HEADERS.items():
        for name in names:
            raw = (lowered.get(name) or "").strip()
            try:
                value = float(raw)
            except ValueError:
                continue
            if math.isfinite(value) and value >= 0:
                out[measure] = value
                break
    return out


def adapted(row: QuotaRow, left: Mapping[str, float]) -> QuotaRow:
    """The bucket never holding more than the provider says is left: its own count is the one that binds."""
    return replace(
        row,
        requests=min(row.requests, left.get("requests", math.inf)),
        input_tokens=min(row.input_tokens, left.get("input_tokens", math.inf)),
        output_tokens=min(row.output_tokens, left.get("output_tokens", math.inf)),
    )


# -- who goes first ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Waiter:
    """A task waiting for quota on one key: its priority, its group (tenant, else workflow), since when, when it
    looks again, and how many calls its group was served from this key's line lately (`recent_serves`)."""

    key: str
    task_id: str
    priority: int
    group: str
    since: float
    until: float
    served: float = 0.0


#: The window over which a group's serves count for its fair share: a provider's quota is per minute.
SHARE_WINDOW_SECONDS = 60.0


def share_window(at: float) -> int:
    """The window `at` falls in: serves are counted per window (`recent_serves`)."""
    return int(at // SHARE_WINDOW_SECONDS)


def share_point(at: float) -> tuple[int, float]:
    """The window `at` falls in, and how much of the window before the sliding minute still covers."""
    now = share_window(at)
    return now, 1.0 - (at - now * SHARE_WINDOW_SECONDS) / SHARE_WINDOW_SECONDS


def recent_serves(window: int, in_window: int, in_window_before: int, at: float) -> float:
    """How many calls a group was served over the sliding minute before `at`, from its counts of the window it
    was last served in and of the one before (a sliding-window counter: the previous window weighted by how much
    of it the minute still covers). A group not served for two windows counts 0."""
    now, still = share_point(at)
    if window >= now:
        return in_window + in_window_before * still
    if window == now - 1:
        return in_window * still
    return 0.0


def queue(waiters: Sequence[Waiter]) -> list[Waiter]:
    """The waiters in the order they are served: higher priority first; within a priority, by fair share: a
    waiter's turn is its group's recent serves plus the number of its group's waiters ahead of it, so a group
    served less lately goes first until it has caught up, and groups served alike take turns (each group's
    first waiter, then each group's second, ...); each group's own in the order they came; ties by who has
    waited longest."""
    ranked: list[tuple[int, float, float, str, Waiter]] = []
    seen: dict[tuple[int, str], int] = {}
    for w in sorted(waiters, key=lambda w: (w.since, w.task_id)):
        rank = seen.get((w.priority, w.group), 0)
        seen[(w.priority, w.group)] = rank + 1
        ranked.append((-w.priority, w.served + rank, w.since, w.task_id, w))
    ranked.sort(key=lambda r: r[:4])
    return [r[4] for r in ranked]


@dataclass(frozen=True)
class Place:
    """A waiter's place in its line as a look decides with it (`Store.wait_join`): how many are served before it
    and are coming for their turn within the look's horizon (`coming`) or at all (`ahead`, `position`'s two
    readings), whether anyone else waits, and since when it has waited."""

    coming: int
    ahead: int
    others: bool
    since: float


def place_in(waiters: Sequence[Waiter], task_id: str, at: float, lookahead: float, grace: float) -> Place:
    """`task_id`'s `Place` in `waiters` (one line): what a store computes in its own statement (the SQL stores do
    it in the database, so a look never reads the whole line); the memory store and the tests use this."""
    line = queue(waiters)
    coming = ahead = 0
    since = at
    for w in line:
        if w.task_id == task_id:
            since = w.since
            break
        if at - grace <= w.until:
            ahead += 1
            if w.until <= at + lookahead:
                coming += 1
    return Place(coming, ahead, any(w.task_id != task_id for w in waiters), since)


def position(waiters: Sequence[Waiter], task_id: str, at: float, lookahead: float, grace: float = 5.0) -> int:
    """How many waiters are served before `task_id` and are coming for their turn: due back within `lookahead`
    seconds and not overdue by more than `grace` (a task that ended, was served on another path, or whose worker
    died is not waited for: it would otherwise hold every later waiter back until it is dropped)."""
    ahead = 0
    for w in queue(waiters):
        if w.task_id == task_id:
            return ahead
        if at - grace <= w.until <= at + lookahead:
            ahead += 1
    return ahead


def affordable(row: QuotaRow | None, limits: Limits, amounts: Amounts, at: float) -> int:
    """How many calls of `amounts` the bucket could let through now (an untouched bucket: a full one's worth)."""
    if row is None:
        row = new_bucket("", limits, at)
    if at < row.paused_until:
        return 0
    amounts = amounts.within(limits)
    counts: list[float] = []
    for level, per_minute, amount in (
        (row.requests, limits.requests_per_minute, amounts.requests),
        (row.input_tokens, limits.input_tokens_per_minute, amounts.input_tokens),
        (row.output_tokens, limits.output_tokens_per_minute, amounts.output_tokens),
    ):
        if per_minute is not None and amount > 0:
            counts.append(refilled(level, per_minute, limits.capacity(per_minute), at - row.refilled_at) // amount)
    if limits.concurrent_calls is not None:
        counts.append(limits.concurrent_calls - in_flight_now(row, at))
    return max(0, int(min(counts))) if counts else 1 << 30
