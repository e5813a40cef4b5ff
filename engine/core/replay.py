"""Replay: check that a task's stored log proves what happened, without calling any model or tool.

Pure: `LogCheck` is fed a task's row, its events and its snapshots in seq order,
one at a time (from the database, or from an export file), and keeps only the
state folded so far, so a log of any length is checked in constant memory. The
reading lives in `engine.audit.reads` (database) and `engine.audit.export` (files).

What it checks, each finding with a stable code:

- the hash chain: every event's hash recomputed from its content with the same
  `chain_hash` that sealed it, `prev_hash` links, seq 1, 2, 3, ... without gaps
  (`HASH_MISMATCH`, `SEQ_GAP`);
- the definition: the registry still defines the pinned `name@version`
  (`DEFINITION_MISSING`) with the digest the task recorded (`DEFINITION_CHANGED`);
- every transition was legal in that definition: from the state the fold says the
  task was in, a trigger that state has, to a target that trigger can reach, with
  the guards (and risk check) the definition names (`ILLEGAL_TRANSITION`);
- the fold from zero equals the task row (state, seq, last hash, status) and
  every snapshot at its seq (`STATE_MISMATCH`, `SNAPSHOT_MISMATCH`);
- no effect outside the log: a task that ends while a write's intent has no
  settled outcome (`INTENT_UNSETTLED`), and a write's outcome recorded for an
  action id whose intent the log never held (`OUTCOME_WITHOUT_INTENT`).

Replay goes on after a finding wherever it can, so one edit shows all its effects
(an edited event is a `HASH_MISMATCH`; if the edit changed the transition it is
also an `ILLEGAL_TRANSITION` or a `STATE_MISMATCH`).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol

from engine.core.canonical import GENESIS_HASH, canonical_json
from engine.core.chain import Finding, link_findings
from engine.core.definition import (
    CHILD_TRIGGER_PREFIX,
    FORK,
    MIGRATE,
    REDRIVE,
    SPAWNED,
    START,
    Action,
    Tool,
    Workflow,
    guard_name,
)
from engine.core.effects import is_open
from engine.core.errors import Code
from engine.core.events import Event
from engine.core.fold import Fold, initial, predates_effects
from engine.core.forks import concerns_writes, repeat_hazard, writes
from engine.core.records import quick_init
from engine.core.remarks import REMARKS
from engine.core.rows import Snapshot, TaskRow
from engine.core.task import TaskState

#: How replay finds the definition a task is pinned to (`Registry.find`).
Lookup = Callable[[str, int], Workflow | None]
#: How replay checks a fork's origin against its source: given the fork's first event, the findings (the driver
#: reads the source's log, `engine.audit.reads.origin_check`; the judgement is `engine.core.forks.origin_findings`).
OriginCheck = Callable[[Event], list[Finding]]
#: Checks an event that links a task to another (a child's first event naming its parent; a parent's `spawned` and
#: its record of a child's end) against the other task's log, with the definition the event was judged by (None when
#: it could not be loaded): `engine.audit.reads.link_check`, judging with `engine.core.children`.
LinkCheck = Callable[[Event, Workflow | None], list[Finding]]
#: The triggers of a parent's events that name a child that exists (besides its end, `child_...`).
LINKING = frozenset({SPAWNED})


@quick_init
@dataclass(frozen=True, slots=True)
class ReplayReport:
    """What replay found for one task: `findings` is empty when its log proves its state."""

    task_id: str
    workflow: str
    events: int
    findings: tuple[Finding, ...]

    @property
    def ok(self) -> bool:
        return not self.findings

    @property
    def codes(self) -> list[str]:
        """The distinct codes found, in the order first seen."""
        return list(dict.fromkeys(str(f.code) for f in self.findings))

    def to_dict(self) -> dict[str, Any]:
        return {
            "task_id": self.task_id,
            "workflow": self.workflow,
            "events": self.events,
            "ok": self.ok,
            "findings": [f.to_dict() for f in self.findings],
        }


class Standing(Protocol):
    """Where a task stands before an event: all that judging the event needs (a `TaskState`, a `Fold`)."""

    @property
    def state(self) -> str: ...

    @property
    def terminal(self) -> bool: ...


def illegal(definition: Workflow, task: Standing, event: Event) -> str | None:
    """Why `event` cannot be a transition of `task` (the fold before it) under `definition`; None if it can.

    The same table `decide` chooses from (`Workflow.candidates`): the source state,
    the trigger, a target that trigger can reach, and the guards the chosen action
    names, which `decide` records. Guards are not run again: their inputs may be
    redacted in the log, and what they answered then is what the log proves.
    """
    if task.terminal:
        return f"nothing leaves terminal state {task.state!r}, but {event.trigger!r} did"
    if event.from_state != task.state:
        return f"recorded as leaving {event.from_state!r}, but the task was in {task.state!r}"
    candidates = definition.candidates(task.state, event.trigger)
    if not candidates:
        return (
            f"trigger {event.trigger!r} is not allowed in state {task.state!r} "
            f"(allowed: {', '.join(definition.triggers(task.state, system=True))})"
        )
    routed = [a for a in candidates if event.to_state in a.targets()]
    if not routed:
        targets = sorted({t for a in candidates for t in a.targets()})
        return f"{event.trigger!r} from {task.state!r} leads to {', '.join(targets)}, not {event.to_state!r}"
    recorded = event.data.get("guards", [])
    if not any(_as_decided(action, event, recorded) for action in routed):
        expected = [[guard_name(g) for g in a.guards] for a in routed]
        return f"recorded guards {recorded} and risk are not those {event.trigger!r} has here: {expected}"
    return None


def _as_decided(action: Action, event: Event, recorded: Any) -> bool:
    """Whether `decide` taking `action` would have recorded these guards and, on a risk route, this risk check."""
    if recorded != [guard_name(g) for g in action.guards]:
        return False
    if action.risk is not None and event.to_state == action.risk_target != action.target:
        risk = event.data.get("risk")
        return isinstance(risk, dict) and risk.get("check") == guard_name(action.risk)
    return True


#: Outcomes that say a write took effect, or may have: each needs that write's intent before it.
_EFFECT_CLAIMS = frozenset({"succeeded", "unknown"})

#: No guards recorded, which `illegal` reads as an empty list.
_UNRECORDED: list[str] = []


def _verdict_key(rules: Workflow, task: Standing, event: Event) -> tuple[Any, ...] | None:
    """What `illegal`'s verdict depends on, for remembering legal ones; None for data too odd to remember.

    A log repeats a handful of transitions, so each is judged once. Only legal keys
    are kept, and a legal key's guards and risk check are the definition's own, so
    the set stays as small as the definitions' transition tables.
    """
    data = event.data
    guards, risk = data.get("guards", _UNRECORDED), data.get("risk")
    check = None
    if risk is not None:
        if type(risk) is not dict:
            return None
        check = risk.get("check")
        if check is not None and type(check) is not str:
            return None
    # Most transitions have no guards: then there is nothing to look at one by one.
    if type(guards) is not list or (guards and not all(type(g) is str for g in guards)):
        return None
    return (rules, task.state, event.from_state, event.trigger, event.to_state, tuple(guards), check)


class LogCheck:
    """One task's log, checked as it streams past: feed `event` and `snapshot` in seq order, then `finish`.

    `row` is the task's stored head (the `tasks` row, or an export's task line);
    None when it could not be read, which leaves only the chain to check. The
    definition is the one the start event pinned, and after a `migrate` event the
    one that event names: each stretch of the log is judged by its own version.
    """

    def __init__(
        self,
        row: TaskRow | None,
        lookup: Lookup,
        task_id: str = "",
        legal: set[tuple[Any, ...]] | None = None,
        origin: OriginCheck | None = None,
        links: LinkCheck | None = None,
    ) -> None:
        self.row = row
        self.lookup = lookup
        self.task_id = row.task_id if row is not None else task_id
        self.ref = f"{row.workflow}@{row.version}" if row is not None else ""
        self.findings: list[Finding] = []
        self.count = 0
        self.expected_seq = 1
        self.prev_hash = GENESIS_HASH
        self.first: Event | None = None
        self.last: Event | None = None
        #: The fold so far and the definition it follows; None before the start event, and from the point
        #: where the log can no longer be judged (a missing or changed definition, an unfollowable event).
        self.fold: Fold | None = None
        self.rules: Workflow | None = None
        self.unchecked = row is None
        #: Transitions already found legal (see `_verdict_key`); `replay_stream` shares one set across tasks.
        self.legal: set[tuple[Any, ...]] = legal if legal is not None else set()
        #: Checks a fork's first event against its source; None: a fork's origin is not checked (an export's
        #: reader that does not hold the source says so itself).
        self.origin = origin
        #: Checks the links between a parent and its children both ways; None: they are not checked. The events
        #: that carry a link, with the definition each was judged by, are checked when the log is finished.
        self.links = links
        self.linked: list[tuple[Event, Workflow | None]] = []
        #: The states the log has entered so far: a `redrive` goes back to one of them.
        self.visited: set[str] = set()
        self.seen_before = False
        #: The events that concern writes (`forks.concerns_writes`), and the action id of the call the task held
        #: when it last entered each state: what a redrive's write rules are judged on, without the whole log.
        self.write_events: list[Event] = []
        self.held_on_entry: dict[str, str | None] = {}
        #: Events shown with values withheld (an export made `--as` a reader without the role): their seqs, and
        #: the paths withheld; reported once, as FIELDS_WITHHELD, when the log is finished.
        self.withheld_seqs: list[int] = []
        self.withheld_paths: dict[str, None] = {}

    def add(self, code: Code, seq: int, message: str) -> None:
        """Record a finding; readers of a log (an export's lines, say) add what only they can see."""
        self.findings.append(Finding(code, seq, message))

    def _resolve(self, name: str, version: int, digest: str, seq: int) -> Workflow | None:
        """The definition `name@version` as the log pinned it at `seq`, or None after reporting why not."""
        definition = self.lookup(name, version)
        if definition is None:
            self.add(
                Code.DEFINITION_MISSING,
                seq,
                f"the registry does not define {name}@{version}: transitions, "
                "state and snapshots from here on cannot be checked, only "
                "the hash chain",
            )
            return None
        if definition.digest != digest:
            self.add(
                Code.DEFINITION_CHANGED,
                seq,
                f"{name}@{version} as loaded has digest {definition.digest[:12]}, the task recorded "
                f"{digest[:12]}: the code changed without a new version; transitions, state and snapshots "
                "are not checked against rules the task did not run on",
            )
            return None
        return definition

    def _stop(self) -> None:
        self.fold = None
        self.rules = None
        self.unchecked = True

    def resume(self, task: TaskState) -> bool:
        """Go on from `task`, the fold at a snapshot some other check verifies (a stretch of a long log).

        False, and nothing changed, when the snapshot names a state its definition does not have: it
        cannot be a fold of this log (the stretch that ends there reports it), so nothing can start from it.
        """
        rules = self._resolve(task.workflow, task.version, task.digest, task.seq)
        if rules is not None and not rules.has_state(task.state):
            return False
        self.expected_seq = task.seq + 1
        self.prev_hash = task.last_hash
        if rules is None:
            self._stop()
            return True
        self.fold, self.rules, self.unchecked = Fold(rules, task), rules, False
        return True

    def event(self, event: Event, withheld: Sequence[str] = ()) -> None:
        """Check one event (the next in seq order) and fold it.

        `withheld`: the paths of its data shown as `[restricted]` (`engine.core.visibility`): its hash cannot be
        recomputed from what is shown (FIELDS_WITHHELD); its seq, its link, its legality and the fold still are
        checked (none of them reads a restricted value)."""
        self.count += 1
        if withheld:
            self.withheld_seqs.append(event.seq)
            self.withheld_paths.update(dict.fromkeys(withheld))
        if type(event.seq) is not int:  # SQLite stores what it is given: an edited row can hold text here
            self.add(Code.SEQ_GAP, self.expected_seq, f"expected seq {self.expected_seq}, found {event.seq!r}")
            self.expected_seq += 1
            self.prev_hash = event.hash
            self.last = event
            self._stop()
            return
        content = not withheld
        if (
            event.seq != self.expected_seq
            or event.prev_hash != self.prev_hash
            or (content and event.computed_hash() != event.hash)
        ):
            self.findings.extend(link_findings(event, self.expected_seq, self.prev_hash, content=content))
        self.expected_seq = event.seq + 1
        self.prev_hash = event.hash
        if self.first is None:
            self.first = event
        self.last = event
        if self.links is not None and (
            event.trigger in LINKING or event.trigger.startswith(CHILD_TRIGGER_PREFIX) or "parent" in event.data
        ):
            self.linked.append((event, self.rules))
        if self.unchecked:
            return
        self.seen_before = event.to_state in self.visited
        if not self.seen_before:
            self.visited.add(event.to_state)
        if concerns_writes(event):
            self.write_events.append(event)
        folding, rules = self.fold, self.rules
        if folding is None or rules is None:
            self._start(event)
            return
        if event.trigger == MIGRATE:
            self._migrate(rules, folding, event)
            return
        if event.trigger == REDRIVE:
            self._redrive(rules, folding, event)
            return
        if event.trigger in REMARKS:
            self._remark(folding, event)
            self._fold(rules, folding, event)
            return
        seen = _verdict_key(rules, folding, event)
        if seen is None or seen not in self.legal:
            reason = illegal(rules, folding, event)
            if reason is None:
                if seen is not None:
                    self.legal.add(seen)
            else:
                self.add(Code.ILLEGAL_TRANSITION, event.seq, reason)
        self._fold(rules, folding, event)

    def _start(self, event: Event) -> None:
        row = self.row
        assert row is not None
        if event.seq != 1 or event.trigger not in (START, FORK) or event.from_state is not None:
            self.add(
                Code.ILLEGAL_TRANSITION,
                event.seq,
                f"the log does not begin with a start event (found {event.trigger!r} at seq {event.seq})",
            )
            self._stop()
            return
        ref, digest = event.data.get("workflow"), event.data.get("digest")
        name, _, version = str(ref).rpartition("@")
        if name != row.workflow or not version.isdigit() or not isinstance(digest, str):
            self.add(
                Code.STATE_MISMATCH, 1, f"the task row is a task of {row.workflow}, its start event records {ref!r}"
            )
            self._stop()
            return
        rules = self._resolve(name, int(version), digest, 1)
        if rules is None:
            self._stop()
            return
        if event.trigger == START and event.to_state != rules.initial_state:
            self.add(
                Code.ILLEGAL_TRANSITION,
                1,
                f"started in {event.to_state!r}, but {rules.ref} starts in {rules.initial_state!r}",
            )
        if event.trigger == FORK:
            carried = event.data.get("carried")
            if not rules.has_state(event.to_state):
                self.add(Code.ILLEGAL_TRANSITION, 1, f"forked into {event.to_state!r}, which {rules.ref} does not have")
            elif not isinstance(carried, dict) or carried.get("state") != event.to_state:
                self.add(Code.ILLEGAL_TRANSITION, 1, f"forked into {event.to_state!r}, not the state it carries")
        if not rules.has_state(event.to_state):
            self._stop()
            return
        linked = event if event.prev_hash == GENESIS_HASH else replace(event, prev_hash=GENESIS_HASH)
        try:
            first = initial(rules, linked)
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            self.add(
                Code.ILLEGAL_TRANSITION,
                1,
                f"the fork does not carry a state that can be followed ({type(exc).__name__})",
            )
            self._stop()
            return
        if event.trigger == FORK and is_open(first.effect):
            self.add(Code.ILLEGAL_TRANSITION, 1, "the fork carries a write whose outcome is open")
        self.rules = rules
        self.fold = Fold(rules, first)
        self.held_on_entry[first.state] = first.prepared["action_id"] if first.prepared is not None else None

    def _migrate(self, rules: Workflow, task: Fold, event: Event) -> None:
        """A `migrate` event: legal from where the task stood, and from here on judged by the version it names."""
        data = event.data
        state_map = data.get("state_map") or {}
        if task.terminal:
            self.add(Code.ILLEGAL_TRANSITION, event.seq, f"a terminal task (in {task.state!r}) was migrated")
        elif event.from_state != task.state:
            self.add(
                Code.ILLEGAL_TRANSITION,
                event.seq,
                f"migrated from {event.from_state!r}, but the task was in {task.state!r}",
            )
        elif not isinstance(state_map, dict) or state_map.get(task.state) != event.to_state:
            self.add(
                Code.ILLEGAL_TRANSITION,
                event.seq,
                f"the migration's state map does not send {task.state!r} to {event.to_state!r}",
            )
        if data.get("from") != rules.ref or data.get("from_digest") != rules.digest:
            self.add(
                Code.ILLEGAL_TRANSITION,
                event.seq,
                f"the migration says it left {data.get('from')!r}, the task was on {rules.ref}",
            )
        version, digest = data.get("to_version"), data.get("to_digest")
        if not isinstance(version, int) or not isinstance(digest, str):
            self.add(Code.ILLEGAL_TRANSITION, event.seq, "the migration does not name the version it moved to")
            self._stop()
            return
        target = self._resolve(task.task.workflow, version, digest, event.seq)
        if target is None:
            self._stop()
            return
        self.rules = task.definition = target
        self._fold(target, task, event)

    def _remark(self, task: Fold, event: Event) -> None:
        """A note or a claim (`engine.core.remarks`): recorded where the task stood, never after it ended."""
        if task.terminal:
            self.add(
                Code.ILLEGAL_TRANSITION, event.seq, f"{event.trigger!r} recorded after terminal state {task.state!r}"
            )
        elif event.from_state != task.state or event.to_state != task.state:
            self.add(
                Code.ILLEGAL_TRANSITION,
                event.seq,
                f"{event.trigger!r} recorded as {event.from_state!r} to {event.to_state!r}, but a remark leaves the "
                f"task where it was, in {task.state!r}",
            )

    def _redrive(self, rules: Workflow, task: Fold, event: Event) -> None:
        """A `redrive` event: from a hand-off or limit state, back to an agent or tool state the log entered."""
        if task.terminal:
            self.add(Code.ILLEGAL_TRANSITION, event.seq, f"a terminal task (in {task.state!r}) was redriven")
        elif event.from_state != task.state:
            self.add(
                Code.ILLEGAL_TRANSITION,
                event.seq,
                f"redriven from {event.from_state!r}, but the task was in {task.state!r}",
            )
        elif task.state not in rules.redrive_sources():
            self.add(Code.ILLEGAL_TRANSITION, event.seq, f"redriven from {task.state!r}, not a hand-off or limit state")
        elif event.to_state not in rules.redrive_targets() or not self.seen_before:
            self.add(
                Code.ILLEGAL_TRANSITION,
                event.seq,
                f"redriven to {event.to_state!r}, not an agent or tool state the task was in before",
            )
        else:
            problem = self._redrive_writes(rules, task, event)
            if problem is not None:
                self.add(Code.ILLEGAL_TRANSITION, event.seq, f"a redrive the engine refuses: {problem}")
        self._fold(rules, task, event)

    def _redrive_writes(self, rules: Workflow, task: Fold, event: Event) -> str | None:
        """The engine's write rules for a redrive (`Engine.redrive`), judged again from the log: a tool-state
        target runs only the call the task held when it last entered it, and no write runs a second time."""
        held = task.prepared["action_id"] if task.prepared is not None else None
        if isinstance(rules.state(event.to_state), Tool) and self.held_on_entry.get(event.to_state) != held:
            return (
                f"it runs the call held now (action {held}), not the one the task held when it last entered "
                f"{event.to_state!r} (action {self.held_on_entry.get(event.to_state)})"
            )
        if is_open(task.effect):
            return "a write's outcome was open"
        entered = event.data.get("redrive_from_seq")
        if type(entered) is not int:
            return "it does not say which seq last entered its target"
        return repeat_hazard(writes(self.write_events, entered), entered, held, source_live=False)

    def _fold(self, rules: Workflow, task: Fold, event: Event) -> None:
        """Apply the event as recorded, even after a finding, so later events are judged where the log says."""
        if not rules.has_state(event.to_state):
            self._stop()
            return
        if event.seq != task.seq + 1 or event.prev_hash != task.last_hash:
            task.resync(event.seq - 1, event.prev_hash)
        try:
            if event.trigger in _EFFECT_CLAIMS:
                self._claimed_effect(task, event)
            task.step(event)
            if event.from_state != event.to_state:
                self.held_on_entry[event.to_state] = task.prepared["action_id"] if task.prepared is not None else None
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            self.add(
                Code.ILLEGAL_TRANSITION,
                event.seq,
                f"its data does not hold what {event.trigger!r} "
                f"records ({type(exc).__name__}): the log cannot be "
                "followed further",
            )
            self._stop()
            return
        if task.terminal and is_open(task.effect):
            effect = task.effect or {}
            self.add(
                Code.INTENT_UNSETTLED,
                event.seq,
                f"the task ended in {event.to_state!r} while write {effect.get('tool')} (action "
                f"{effect.get('action_id')}) was {effect.get('status')}: its effect is not in the log",
            )

    def _claimed_effect(self, task: Fold, event: Event) -> None:
        """An outcome saying a write happened (or may have) must follow that write's recorded intent."""
        action_id = event.data.get("action_id")
        prepared = task.prepared
        if (
            prepared is None
            or prepared.get("kind") != "write"
            or action_id is None
            or prepared["action_id"] != action_id
        ):
            return
        effect = task.effect
        if effect is None or effect.get("action_id") != action_id:
            self.add(
                Code.OUTCOME_WITHOUT_INTENT,
                event.seq,
                f"{event.trigger!r} is recorded for write {prepared.get('tool')} (action {action_id}), whose "
                "intent the log does not hold",
            )

    def snapshot(self, snapshot: Snapshot) -> None:
        """Check a snapshot right after the event at its seq was fed."""
        last = self.last
        if last is None or last.seq != snapshot.seq:
            self.add(
                Code.SNAPSHOT_MISMATCH, snapshot.seq, f"a snapshot at seq {snapshot.seq}, where the log has no event"
            )
            return
        if snapshot.hash != last.hash:
            self.add(
                Code.SNAPSHOT_MISMATCH, snapshot.seq, "the snapshot's hash is not the hash of the event at its seq"
            )
            return
        folding = self.fold
        if folding is None or folding.seq != snapshot.seq:
            return  # the fold could not be followed here: the findings above say why
        folded = canonical_json(folding.record().to_doc())
        if snapshot.doc == folded:
            return
        try:
            stored, ours = json.loads(snapshot.doc), json.loads(folded)
            if isinstance(stored, dict) and predates_effects(stored):  # written before effects were folded
                ours = {k: v for k, v in ours.items() if k not in ("effect", "cancel_requested")}
            same = stored == ours
        except ValueError:
            same = False
        if not same:
            self.add(
                Code.SNAPSHOT_MISMATCH,
                snapshot.seq,
                "the snapshot's state differs from the fold of the events up to its seq",
            )

    def finish(self) -> ReplayReport:
        """The report, once every event and snapshot was fed: the fold is compared with the task row."""
        row = self.row
        first = self.first
        if first is not None and first.seq == 1 and first.trigger == FORK and self.origin is not None:
            self.findings.extend(self.origin(first))
        if self.links is not None:
            for event, rules in self.linked:
                self.findings.extend(self.links(event, rules))
        if self.withheld_seqs:
            seqs = self.withheld_seqs
            listed = ", ".join(map(str, seqs[:10])) + (", ..." if len(seqs) > 10 else "")
            self.add(
                Code.FIELDS_WITHHELD,
                seqs[0],
                f"{len(seqs)} event(s) (seq {listed}) are shown with values withheld "
                f"({', '.join(list(self.withheld_paths)[:5])}{', ...' if len(self.withheld_paths) > 5 else ''}): "
                "their hashes cannot be recomputed from this export; an export made without --as, or as an "
                "auditor, proves them",
            )
        if self.count == 0:
            self.add(Code.SEQ_GAP, 1, "the task has no events")
        elif row is not None:
            task, last = self.fold.record() if self.fold is not None else None, self.last
            assert last is not None
            folded: tuple[Any, ...]
            stored: tuple[Any, ...]
            if task is not None:
                folded = (task.state, task.seq, task.last_hash, str(task.status), task.ref, task.digest, task.tenant)
                stored = (row.state, row.seq, row.last_hash, row.status, self.ref, row.digest, row.tenant)
            else:  # the fold was abandoned: what the last event says is still comparable
                folded = (last.to_state, last.seq, last.hash)
                stored = (row.state, row.seq, row.last_hash)
            if folded != stored:
                self.add(
                    Code.STATE_MISMATCH,
                    row.seq,
                    f"the task row says {_head(stored)}, its events fold to {_head(folded)}",
                )
        return ReplayReport(self.task_id, self.ref, self.count, tuple(self.findings))


def _head(values: tuple[Any, ...]) -> str:
    """`state@seq (hash ..., status, on name@version digest ...)`: the parts a row and a fold can disagree on."""
    text = f"{values[0]}@{values[1]} (hash {str(values[2])[:12]}"
    if len(values) <= 3:
        return text + ")"
    tenant = f", tenant {values[6]}" if values[6] is not None else ""
    return text + f", {values[3]}, on {values[4]} digest {str(values[5])[:12]}{tenant})"


def replay_stream(
    items: Iterable[TaskRow | Event | Snapshot],
    lookup: Lookup,
    origin: OriginCheck | None = None,
    links: LinkCheck | None = None,
) -> Iterator[ReplayReport]:
    """One report per task of a stream of task rows, each followed by its log (what `Store.audit_stream` reads)."""
    check: LogCheck | None = None
    legal: set[tuple[Any, ...]] = set()
    for item in items:
        if isinstance(item, Event):
            if check is None:
                check = LogCheck(None, lookup, item.task_id, legal, origin, links)
            check.event(item)
        elif isinstance(item, Snapshot):
            if check is None:
                check = LogCheck(None, lookup, item.task_id, legal, origin, links)
            check.snapshot(item)
        else:
            if check is not None:
                yield check.finish()
            check = LogCheck(item, lookup, legal=legal, origin=origin, links=links)
    if check is not None:
        yield check.finish()
