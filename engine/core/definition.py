"""Workflow definitions: the states, actions and rules a task of `name@version` obeys.

A `Workflow` is immutable and validated as it is built: every defect is
collected and reported in one `DefinitionError`, so an author fixes them in one
pass. A valid workflow carries a canonical content digest (sha256 over its
states, actions, argument schemas and transitions); every task stores the
digest it started on, which is how code changed under an unchanged version is
caught.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import timedelta
from enum import StrEnum
from typing import TYPE_CHECKING, Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field

from engine.core.arguments import IDENTITY_FIELDS
from engine.core.canonical import canonical_json, sha256_hex
from engine.core.effects import (
    CANCEL_REQUESTED,
    SETTLE,
    SettleArgs,
    cancel_requested_and_executed,
    cancel_requested_and_not_executed,
    cancel_was_requested,
    write_unsettled,
)
from engine.core.errors import DefinitionError
from engine.core.flow import is_priority
from engine.core.task import Status, TaskState

if TYPE_CHECKING:
    from engine.core.machine import CompiledMachine
    from engine.core.tools.catalog import ToolCatalog


class StateKind(StrEnum):
    AGENT = "agent"
    TOOL = "tool"
    APPROVAL = "approval"
    WAIT = "wait"
    CHILD = "child"
    TERMINAL = "terminal"


STATUS_OF_KIND: dict[StateKind, Status] = {
    StateKind.AGENT: Status.RUNNABLE,
    StateKind.TOOL: Status.RUNNABLE,
    StateKind.APPROVAL: Status.BLOCKED,
    StateKind.WAIT: Status.BLOCKED,
    # A child state holds no lease while its child runs; a worker looks at it when it is due (`engine.core.children`).
    StateKind.CHILD: Status.BLOCKED,
    StateKind.TERMINAL: Status.TERMINAL,
}

#: Triggers the engine itself owns; a definition cannot declare actions with these names.
START = "start"
CANCEL = "cancel"
EXPIRED = "expired"
TOOL_OUTCOMES = ("succeeded", "failed", "unknown")
CANCELLED_STATE = "cancelled"
# The agent sub-machine's triggers and generated states (see `Agent`).
REPAIR = "repair"
DEMOTE = "demote"
HAND_OFF = "hand_off"
PROVIDER_ERROR = "provider_error"
#: A provider call failed for a while: the task waits, in its state, until the event's `retry.due_at`.
BACKOFF = "backoff"
RETRY = "retry"
CALL = "call"
RECONCILE = "reconcile"
LIMIT = "limit"
LIMIT_STATE = "limit_exceeded"
#: An operator moved the task to another version of its workflow (`Engine.migrate`); the event names both.
MIGRATE = "migrate"
#: The first event of a task forked from another task's log at a seq (`Engine.fork`): it names the source, the
#: seq and the hash there, and carries the state as of that seq. Not `start`: a start folds from the input alone.
FORK = "fork"
#: An operator sent a handed-off or limit-state task back to a state it visited (`Engine.redrive`).
REDRIVE = "redrive"
#: A child state's protocol (`Child`, `engine.core.children`): the intent to start the child (`spawn`), the child
#: found or made (`spawned`), and the child's end, one trigger per route (`child_<its terminal state>`, and
#: `child_unrouted` for an end the state does not name).
SPAWN = "spawn"
SPAWNED = "spawned"
CHILD_TRIGGER_PREFIX = "child_"
UNROUTED = "unrouted"
#: Records people make about a task where it stands (`engine.core.remarks`): a note, and who is on its work item.
#: They never move the task and never make a decision stale.
COMMENT = "comment"
WORK_CLAIMED = "work_claimed"
WORK_RELEASED = "work_released"
#: The role that says, explicitly, that any signed-in person may fire a trigger (deny by default otherwise:
#: `engine.core.access`). Shown as such on the diagram and by `railyard workflows`.
ANYONE = "anyone"


#: How many child tasks a task may start when its budgets do not say (`Budgets.children`).
DEFAULT_CHILDREN = 100


@dataclass(frozen=True)
class Budgets:
    """Per-task limits; exceeding one moves the task to the workflow's limit state (AGENT_STEP_LIMIT_EXCEEDED).

    `repeats` bounds calls of one tool with the same normalised arguments: a model
    looping on `query_ticket` stops there, its steps kept in the log.

    `tokens` caps the tokens (input plus output, as the provider reported them) of
    all the task's model turns; `state_tokens` caps those of the turns in any one
    agent state (its repairs included), over the whole task. Both are checked
    before a turn: the turn that crosses a cap is kept, the next one is not made.
    """

    model_turns: int = 50
    tool_calls: int = 25
    repeats: int = 3
    deadline: timedelta | None = None
    tokens: int | None = None
    state_tokens: int | None = None
    #: How many child tasks the task may start in all (a fan-out's N counts whole, before any starts); None: the
    #: engine's default, `DEFAULT_CHILDREN`.
    children: int | None = None

    @property
    def child_limit(self) -> int:
        """How many child tasks a task may start in all."""
        return self.children if self.children is not None else DEFAULT_CHILDREN

    @property
    def counts_tokens(self) -> bool:
        """Whether the fold keeps token counters for these budgets (only then: older snapshots stay equal)."""
        return self.tokens is not None or self.state_tokens is not None

    def spec(self) -> dict[str, Any]:
        return {
            "model_turns": self.model_turns,
            "tool_calls": self.tool_calls,
            "repeats": self.repeats,
            "deadline_seconds": self.deadline.total_seconds() if self.deadline is not None else None,
            # Added later: present only when set, so the digests of definitions that do not use them stay put.
            **({"tokens": self.tokens} if self.tokens is not None else {}),
            **({"state_tokens": self.state_tokens} if self.state_tokens is not None else {}),
            **({"children": self.children} if self.children is not None else {}),
        }


@dataclass(frozen=True)
class RetryBudget:
    """How long an agent state keeps calling a provider that fails for a while (a rate limit, a 5xx, a dropped
    connection, a timeout) before the task goes where the state's `on_provider_error` says.

    Each `backoff` event (one durable wait, after the runner's quick in-process retries) spends one of `count`;
    `within` bounds the time from the visit's first backoff to the next try's due time. An answer from the model
    (a `repair`) gives the visit its whole budget back. Errors that calling again cannot fix (credentials, a
    refused request, a content filter) never spend it: they go to `on_provider_error` at once.
    """

    count: int = 10
    within: timedelta = timedelta(hours=1)

    def spec(self) -> dict[str, Any]:
        return {"count": self.count, "within_seconds": self.within.total_seconds()}


#: The budget an agent state has unless it declares its own.
RETRY_BUDGET = RetryBudget()

FORCE_SUFFIX = "~force"
HANDOFF_SUFFIX = "~handoff"
PROVIDER_ERROR_SUFFIX = "~provider_error"

_NAME = re.compile(r"^[a-z][a-z0-9_]{0,63}$")
#: The longest value of a searchable input field that the task lists keep (`Workflow.search_values`).
SEARCH_VALUE_LENGTH = 200
#: What no search can carry (`q` refuses control characters): a value holding one is not indexed.
_UNSEARCHABLE = re.compile(r"[\x00-\x1f\x7f]")


@dataclass(frozen=True, slots=True)
class GuardContext:
    """What a guard sees: the task as folded so far, the validated arguments, and the trusted actor."""

    task: TaskState
    args: BaseModel | None
    actor: str


#: A guard returns None to let the transition through, or a short reason to refuse it (DOMAIN_INVALID).
Guard = Callable[[GuardContext], str | None]


class CancelArgs(BaseModel):
    """Arguments of the built-in `cancel` trigger, available in every non-terminal state."""

    model_config = ConfigDict(extra="forbid")
    reason: str = Field(min_length=1, max_length=500)


@dataclass(frozen=True)
class Action:
    """A trigger a state allows: its argument model, its target, its guards and the role it needs.

    Two actions with the same name in one state are allowed only when every one
    of them has guards: the first (in declaration order) whose guards all pass wins.
    """

    name: str
    target: str
    args: type[BaseModel] | None = None
    guards: Sequence[Guard] = ()
    role: str | None = None
    description: str = ""
    #: Fired only by the engine itself (a tool outcome, a deadline), never by a caller of `fire`.
    system: bool = False
    #: The last layer: a risk check that, when it answers a reason, routes to `risk_target`
    #: (an approval state, say) instead of `target`. The proposal is valid; it just needs more eyes.
    risk: Guard | None = None
    risk_target: str | None = None
    #: The catalog tool this action's arguments are compiled into (a PreparedToolCall recorded in the
    #: event): what an approval then approves and a tool state runs.
    prepares: str | None = None

    def spec(self) -> dict[str, Any]:
        """The digest-relevant content of this action."""
        return {
            "name": self.name,
            "target": self.target,
            "args": self.args.model_json_schema() if self.args is not None else None,
            "guards": [guard_name(g) for g in self.guards],
            "role": self.role,
            "description": self.description,
            "risk": guard_name(self.risk) if self.risk is not None else None,
            "risk_target": self.risk_target,
            "prepares": self.prepares,
        }

    def targets(self) -> list[str]:
        """Where this action can lead: its target, and its risk route if it has one."""
        return [self.target, self.risk_target] if self.risk_target else [self.target]


@dataclass(frozen=True)
class Restricted:
    """Fields of a task that only the roles a workflow names are shown (issue #28); not `sensitive`, which keeps a
    value out of the log altogether.

    A restricted value is in the log, hashed and replayed like any other; what a person is *shown* of it depends
    on who they are. `input` names fields of the workflow's input model; `results` names a catalog tool (its
    whole result) or `tool.field` (one field of its result model). `roles` may see them; so does the `auditor`,
    who must be able to prove the history, and the trusted process (the Python API, the CLI without `--as`).
    Everyone else who may read the task is shown `RESTRICTED` in their place (`engine.core.visibility`).

    Presentation, not behaviour: not in the digest, so tightening it applies to the tasks already running.
    """

    roles: Sequence[str] = ()
    input: Sequence[str] = ()
    results: Sequence[str] = ()

    def __post_init__(self) -> None:
        for name in ("roles", "input", "results"):
            value = getattr(self, name)
            object.__setattr__(self, name, (value,) if isinstance(value, str) else tuple(value))

    def result_fields(self, tool: str) -> frozenset[str] | None:
        """The restricted fields of `tool`'s result: None when none is, empty when the whole result is."""
        whole = tool in self.results
        named = frozenset(r.partition(".")[2] for r in self.results if r.partition(".")[0] == tool and "." in r)
        if whole:
            return frozenset()
        return named or None


def guard_name(guard: Callable[..., Any]) -> str:
    return f"{getattr(guard, '__module__', '?')}.{getattr(guard, '__qualname__', repr(guard))}"


@dataclass(frozen=True)
class State:
    """A state of the machine. Use one of the kinds below, not this base."""

    name: str
    actions: Sequence[Action] = ()
    description: str = ""
    kind: ClassVar[StateKind]

    def outgoing(self) -> list[Action]:
        """Every transition leaving this state that the definition declares (built-ins excluded)."""
        return list(self.actions)

    def spec(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "kind": str(self.kind),
            "description": self.description,
            "actions": [a.spec() for a in self.actions],
        }


@dataclass(frozen=True)
class Agent(State):
    """The model proposes exactly one of `actions`; the engine checks it before it becomes a transition.

    The state compiles into a small sub-machine so every forcing attempt is an
    event: `S -> S~force` (`repair`) on an invalid proposal, at most
    `max_repairs` times per visit, then `hand_off` to `on_exhausted` (default: the
    generated hand-off state `S~handoff`); `demote` (a self-loop) when the provider
    refused the request's shape; `backoff` (a self-loop with a due time) when a
    call failed in a way that calling again may fix, within `retry_budget`;
    `provider_error` to `on_provider_error` (default: the generated `S~provider_error`)
    when a call failed for good or the budget ran out. `S~handoff` and
    `S~provider_error` wait for an operator to `retry` (back to `S`) or `cancel`.
    """

    max_repairs: int = 3
    on_exhausted: str | None = None
    #: Who may fire this state's actions in the model's place (else the workflow's `model_override_role`; an
    #: action's own `role` narrows it further). Unset everywhere: only the model proposes here.
    override_role: str | None = None
    #: How long a failing provider is called again, durably, before `provider_error` (`RetryBudget`).
    retry_budget: RetryBudget = RETRY_BUDGET
    #: Where `provider_error` goes; unset: the generated `S~provider_error`, where an operator retries or cancels.
    on_provider_error: str | None = None
    kind: ClassVar[StateKind] = StateKind.AGENT

    @property
    def base(self) -> str:
        """The declared agent state this state belongs to (itself, or the state it repairs)."""
        return self.name

    @property
    def exhausted_target(self) -> str:
        return self.on_exhausted or f"{self.base}{HANDOFF_SUFFIX}"

    @property
    def provider_error_target(self) -> str:
        return self.on_provider_error or f"{self.base}{PROVIDER_ERROR_SUFFIX}"

    def outgoing(self) -> list[Action]:
        return [
            *self.actions,
            Action(REPAIR, f"{self.base}{FORCE_SUFFIX}", system=True),
            Action(DEMOTE, self.name, system=True),
            Action(BACKOFF, self.name, system=True),
            Action(HAND_OFF, self.exhausted_target, system=True),
            Action(PROVIDER_ERROR, self.provider_error_target, system=True),
        ]

    def spec(self) -> dict[str, Any]:
        out = super().spec()
        out.update(max_repairs=self.max_repairs, on_exhausted=self.on_exhausted)
        # Added later: each present only when set, so the digests of definitions that do not use them stay put.
        if self.override_role:
            out["override_role"] = self.override_role
        if self.retry_budget != RETRY_BUDGET:
            out["retry_budget"] = self.retry_budget.spec()
        if self.on_provider_error:
            out["on_provider_error"] = self.on_provider_error
        return out


@dataclass(frozen=True)
class Repairing(Agent):
    """Generated: `S~force`, where the model repairs an invalid proposal for agent state `repairs`."""

    repairs: str = ""

    @property
    def base(self) -> str:
        return self.repairs


def agent_substates(state: Agent, retry_role: str | None = None) -> list[State]:
    """The states an agent state compiles into besides itself; `retry_role` may send the task back from the
    generated wait states (the workflow's operator: `Workflow.operator_of`)."""
    out: list[State] = [
        Repairing(
            f"{state.name}{FORCE_SUFFIX}",
            state.actions,
            f"Repairing a proposal in {state.name}.",
            state.max_repairs,
            state.on_exhausted,
            state.override_role,
            state.retry_budget,
            state.on_provider_error,
            repairs=state.name,
        ),
    ]
    if state.on_provider_error is None:
        out.append(
            Wait(
                f"{state.name}{PROVIDER_ERROR_SUFFIX}",
                [Action(RETRY, state.name, role=retry_role)],
                f"A model call in {state.name} failed for good; an operator retries or cancels.",
            )
        )
    if state.on_exhausted is None:
        out.append(
            Wait(
                f"{state.name}{HANDOFF_SUFFIX}",
                [Action(RETRY, state.name, role=retry_role)],
                f"The model could not produce a valid proposal in {state.name}; a human takes over.",
            )
        )
    return out


@dataclass(frozen=True)
class Tool(State):
    """The engine runs `tool`; its outcome (`succeeded`, `failed`, `unknown`) is the next transition."""

    tool: str = ""
    on_succeeded: str = ""
    on_failed: str = ""
    on_unknown: str = ""
    kind: ClassVar[StateKind] = StateKind.TOOL

    def outgoing(self) -> list[Action]:
        targets = (self.on_succeeded, self.on_failed, self.on_unknown)
        outcomes = (Action(o, t, system=True) for o, t in zip(TOOL_OUTCOMES, targets, strict=True) if t)
        # `call` records the intent (the prepared call) before the tool runs; `reconcile` records an answer
        # of the tool's reconcile(action_id) that did not settle the outcome. Both stay in the state.
        return [
            *self.actions,
            *outcomes,
            Action(CALL, self.name, system=True),
            Action(RECONCILE, self.name, system=True),
        ]

    def spec(self) -> dict[str, Any]:
        out = super().spec()
        out.update(tool=self.tool, on_succeeded=self.on_succeeded, on_failed=self.on_failed, on_unknown=self.on_unknown)
        return out


@dataclass(frozen=True)
class _Deadlined(State):
    deadline: timedelta | None = None
    on_expired: str | None = None

    def outgoing(self) -> list[Action]:
        out = list(self.actions)
        if self.on_expired:
            out.append(Action(EXPIRED, self.on_expired, system=True))
        return out

    def spec(self) -> dict[str, Any]:
        out = super().spec()
        out.update(
            deadline_seconds=self.deadline.total_seconds() if self.deadline is not None else None,
            on_expired=self.on_expired,
        )
        return out


@dataclass(frozen=True)
class Approval(_Deadlined):
    """Waits for a human holding `role` to take one of `actions` (each may name its own role)."""

    role: str = ""
    #: Separation of duties: by default whoever started the task or proposed the call may not approve it.
    allow_self_approval: bool = False
    kind: ClassVar[StateKind] = StateKind.APPROVAL

    def outgoing(self) -> list[Action]:
        # An approval action without a role of its own needs the state's role; `expired` is the system's.
        return [a if a.role or a.system else replace(a, role=self.role or None) for a in super().outgoing()]

    def spec(self) -> dict[str, Any]:
        out = super().spec()
        out["role"] = self.role
        out["allow_self_approval"] = self.allow_self_approval
        return out


@dataclass(frozen=True)
class Wait(_Deadlined):
    """Waits for an external signal (one of `actions`) or its deadline."""

    kind: ClassVar[StateKind] = StateKind.WAIT


#: Builds a child's input from the parent's folded state (code, never the model), or reads a child's result.
StateReader = Callable[["TaskState"], Mapping[str, Any]]


def child_trigger(route: str) -> str:
    """The trigger that records a child's end in `route` (a terminal state of the child, or `UNROUTED`)."""
    return f"{CHILD_TRIGGER_PREFIX}{route}"


#: Builds a fan-out's child inputs, one per item, in order, from the parent's folded state (code, never the model).
StateItems = Callable[["TaskState"], Sequence[Mapping[str, Any]]]


@dataclass(frozen=True)
class Quorum:
    """A fan-out's join (`Child.join`) that is met once `k` of its children ended in a state `succeeds` names."""

    k: int

    def __str__(self) -> str:
        return f"quorum:{self.k}"


#: A fan-out's joins besides `Quorum(k)`: every child succeeded, or one did.
JOINS = ("all", "any")
#: What a fan-out does when a child fails (`Child.on_child_failure`): `fail_fast` decides `failed` as soon as the
#: join can no longer be met and cancels the children still running; `collect` lets every child end, then decides.
CHILD_FAILURE_POLICIES = ("fail_fast", "collect")
#: A fan-out's routes (`Child.on` keys): the join was met, or it cannot be.
FAN_OUT_ROUTES = ("joined", "failed")


@dataclass(frozen=True)
class Child(State):
    """Starts a task of another workflow (`workflow`, `version`; newest when None, pinned at the start) and waits,
    holding no lease, until that child reaches a terminal state; where the child ended routes the parent.

    `input` builds the child's input from the parent's folded state: code, never the model (the model may only
    choose to come here). `on` maps a terminal state of the child to the parent's next state; an end it does not
    name goes to `otherwise`. `result`, a pydantic model, is the typed result recorded with the child's end, read
    from the child's final state by `read` (default: its state name and its facts' top-level keys the model has);
    the parent's guards and model then find it in `facts["child:STATE"]`.

    The start is an effect (`engine.core.children`): `spawn` records the intent with an action id, the child's id
    is derived from (parent, action id) so a worker that resumes after a crash finds the child instead of making
    a second, and `spawned` records that it exists. `deadline` (from the start) with `on_expired` ends the wait.

    A fan-out is a child state with `each` instead of `input`: `each` builds one child input per item (code, from
    the parent's folded state, never the model), and the state starts one child per item, all under one intent
    whose per-item action ids are derived from its own (`engine.core.fanout`). `join` is `"all"`, `"any"` or
    `Quorum(k)`: met once that many children ended in a state `succeeds` names. `on_child_failure` is
    `"fail_fast"` (decide `failed` as soon as the join cannot be met, and cancel the children still running) or
    `"collect"` (let every child end, so each failure is recorded). Either way the state records its end once
    every child has ended, with each child's end in the order of the items; `on` maps `joined` and `failed` to
    the parent's next states. The task's `Budgets.children` bounds N, refused whole before any child starts.

    Why a fan-out is this kind and not one of its own: it is the same protocol (an intent with an action id before
    any child exists, ids derived from it, the parent blocked holding nothing, cancel passed on to the children,
    links checked both ways), run by the same runner that the worker, the graph and replay already dispatch on;
    `each` only makes the one child N.
    """

    workflow: str = ""
    version: int | None = None
    input: StateReader | None = None
    on: Mapping[str, str] = field(default_factory=dict)
    otherwise: str = ""
    result: type[BaseModel] | None = None
    read: StateReader | None = None
    deadline: timedelta | None = None
    on_expired: str | None = None
    #: What becomes of a child still running when the parent is cancelled: `cancel` (its cancel is requested, under
    #: the rules of any cancel, and the parent's cancel completes when the child's end is recorded), `wait` (the
    #: parent's cancel waits for the child to end by itself) or `abandon` (the parent ends at once; the child runs
    #: on, still naming its parent). On the deadline, `cancel` requests the child's cancel; the others leave it.
    on_parent_end: str = "cancel"
    #: A fan-out: the child inputs, one per item (then `input` is None).
    each: StateItems | None = None
    join: str | Quorum = "all"
    on_child_failure: str = "fail_fast"
    #: A fan-out: the child's terminal states that count as success for the join.
    succeeds: tuple[str, ...] = ()
    kind: ClassVar[StateKind] = StateKind.CHILD

    @property
    def fans_out(self) -> bool:
        """Whether this state starts one child per item (`each`) rather than one child."""
        return self.each is not None

    def needed(self, n: int) -> int:
        """How many of a fan-out's `n` children must succeed for the join to be met."""
        if isinstance(self.join, Quorum):
            return self.join.k
        return n if self.join == "all" else min(1, n)

    @property
    def holds_child(self) -> bool:
        """Whether the child's start stays an open effect until its end is recorded (not for `abandon`)."""
        return self.on_parent_end != "abandon"

    def routes(self) -> dict[str, str]:
        """Each route's trigger and target: the named ends, then `otherwise`."""
        out = {child_trigger(end): target for end, target in self.on.items()}
        if self.otherwise:
            out[child_trigger(UNROUTED)] = self.otherwise
        return out

    def route_of(self, child_state: str) -> str:
        """The trigger that records a child that ended in `child_state`."""
        return child_trigger(child_state) if child_state in self.on else child_trigger(UNROUTED)

    def outgoing(self) -> list[Action]:
        out = [
            *self.actions,
            Action(SPAWN, self.name, system=True),
            Action(SPAWNED, self.name, system=True),
            *(Action(trigger, target, system=True) for trigger, target in self.routes().items()),
        ]
        if self.on_expired:
            out.append(Action(EXPIRED, self.on_expired, system=True))
        return out

    def spec(self) -> dict[str, Any]:
        out = super().spec()
        out.update(
            workflow=self.workflow,
            version=self.version,
            input=guard_name(self.input) if self.input is not None else None,
            on=dict(self.on),
            otherwise=self.otherwise,
            result=self.result.model_json_schema() if self.result is not None else None,
            read=guard_name(self.read) if self.read is not None else None,
            deadline_seconds=self.deadline.total_seconds() if self.deadline is not None else None,
            on_expired=self.on_expired,
            on_parent_end=self.on_parent_end,
        )
        if self.each is not None:  # only for a fan-out: the digests of single child states stay put
            out.update(
                each=guard_name(self.each),
                join=str(self.join),
                on_child_failure=self.on_child_failure,
                succeeds=list(self.succeeds),
            )
        return out


#: What a child state may do with a running child when the parent ends (`Child.on_parent_end`).
PARENT_END_POLICIES = ("cancel", "wait", "abandon")


@dataclass(frozen=True)
class Terminal(State):
    """Nothing leaves a terminal state."""

    kind: ClassVar[StateKind] = StateKind.TERMINAL


#: Where a decision card field is read: the task's input, the prepared call's arguments, the task's facts (a
#: tool's latest result is `facts.tool:NAME`), or the arguments of the step that brought the task to the state.
CARD_SOURCES = ("input", "prepared", "facts", "args")
#: How a card field is shown: as text, as money (minor units with a currency), as a date, as a link to a task,
#: or as JSON.
CARD_FORMATS = ("text", "money", "date", "task", "json")
CARD_SECTIONS = ("facts", "inputs", "evidence")


@dataclass(frozen=True)
class CardField:
    """One value a decision card shows: where it is read (`input.customer_id`, `prepared.amount`,
    `facts.tool:query_order.refundable`, `args.description`), its label and its format. Money takes its currency
    from `currency`: a path like the value's, or an ISO 4217 code."""

    name: str
    path: str
    label: str = ""
    format: str = "text"
    currency: str = ""
    section: str = "facts"


@dataclass(frozen=True)
class DecisionCard:
    """What a person deciding in one human state is shown first: a title line whose `{name}` placeholders are
    fields, and the fields themselves, in order. Presentation only: not in the workflow's digest."""

    title: str = ""
    fields: Sequence[CardField] = ()


def _validate_cards(wf: Workflow, names: Mapping[str, State]) -> list[str]:
    problems: list[str] = []
    for state, card in wf.cards.items():
        found = names.get(state)
        if found is None or found.kind not in (StateKind.APPROVAL, StateKind.WAIT):
            problems.append(f"decision card for {state!r}: not an approval or wait state of this workflow")
            continue
        known = {f.name for f in card.fields}
        problems.extend(
            f"decision card for {state!r}: title names {n!r}, which is not one of its fields"
            for n in re.findall(r"{([^{}]*)}", card.title)
            if n not in known
        )
        for f in card.fields:
            where = f"decision card for {state!r}, field {f.name!r}"
            if f.path.split(".")[0] not in CARD_SOURCES:
                problems.append(f"{where}: path {f.path!r} must start with one of {', '.join(CARD_SOURCES)}")
            if f.format not in CARD_FORMATS:
                problems.append(f"{where}: format {f.format!r} must be one of {', '.join(CARD_FORMATS)}")
            if f.section not in CARD_SECTIONS:
                problems.append(f"{where}: section {f.section!r} must be one of {', '.join(CARD_SECTIONS)}")
            if f.format == "money" and not f.currency:
                problems.append(f"{where}: money needs a currency (a path, or an ISO 4217 code)")
    return problems


@dataclass(frozen=True)
class Labels:
    """The words people read in place of identifiers: a state's, an action's (a button, a timeline line), a code's
    (`TOOL_TIMEOUT`: "the payment service did not answer in time") and a field's (an input or argument key).
    Any name without a label is shown as its identifier. Presentation only: never in the workflow's digest, never
    in the log, never sent to the model."""

    states: Mapping[str, str] = field(default_factory=dict)
    actions: Mapping[str, str] = field(default_factory=dict)
    codes: Mapping[str, str] = field(default_factory=dict)
    fields: Mapping[str, str] = field(default_factory=dict)

    def for_state(self, name: str | None) -> str:
        return self.states.get(name, name) if name is not None else ""

    def for_action(self, name: str) -> str:
        return self.actions.get(name, name)

    def for_code(self, name: str) -> str:
        return self.codes.get(name, name)

    def for_field(self, name: str) -> str:
        return self.fields.get(name, name)


def _validate_labels(wf: Workflow, names: Mapping[str, State]) -> list[str]:
    """A label for a state the workflow does not have is a typo that would silently show the identifier."""
    known = {*names, *(s.name for s in wf.all_states), wf.limit_state or LIMIT_STATE}
    problems = [f"label for state {n!r}: no such state" for n in wf.labels.states if n not in known]
    tables = (
        ("state", wf.labels.states),
        ("action", wf.labels.actions),
        ("code", wf.labels.codes),
        ("field", wf.labels.fields),
    )
    for kind, table in tables:
        problems.extend(
            f"label for {kind} {n!r} must be non-empty text"
            for n, v in table.items()
            if not isinstance(v, str) or not v.strip()
        )
    return problems


@dataclass(frozen=True, eq=False)
class Workflow:
    """A workflow definition `name@version`, validated and compiled as it is built.

    `states[0]` is the initial state unless `initial` names another. A terminal
    state `cancelled` and a `cancel` trigger (from every non-terminal state, role
    `cancel_role` if set) are added when the definition does not declare them,
    so every task can be stopped.
    """

    name: str
    version: int
    states: Sequence[State]
    initial: str | None = None
    input: type[BaseModel] | None = None
    description: str = ""
    cancel_role: str | None = None
    tools: ToolCatalog | None = None
    budgets: Budgets = field(default_factory=Budgets)
    #: Where a task goes when a budget runs out (default: a generated wait state `limit_exceeded`).
    limit_state: str | None = None
    #: Where a task goes when a write it had in flight took effect although a cancel was requested meanwhile
    #: (default: `cancelled`, whose log then shows the effect). A review state says "paid despite the cancel".
    effect_after_cancel: str | None = None
    #: Who may record what they verified about a write whose outcome is unknown (`settle`); default `cancel_role`.
    settle_role: str | None = None
    #: Input fields people look tasks up by (a customer id, an order id): the task lists show them and search them.
    #: Presentation, not behaviour: not in the digest, so declaring them later needs no new version.
    searchable: Sequence[str] = ()
    #: Who may send a handed-off or limit-state task back to a state it visited (`redrive`); default `settle_role`,
    #: else `cancel_role`.
    redrive_role: str | None = None
    #: What a decision card shows in each human state that declares one (`DecisionCard`). Presentation, not
    #: behaviour: not in the digest, like `searchable`.
    cards: Mapping[str, DecisionCard] = field(default_factory=dict)
    #: Who runs the workflow's tasks when they stop: cancel, settle, send back (`redrive`, `fork`) and `retry` a
    #: hand-off, wherever the narrower `cancel_role`, `settle_role` and `redrive_role` are unset. `ANYONE` lets any
    #: signed-in person; unset with one of them unset, the definition does not validate (deny by default).
    operator_role: str | None = None
    #: Who may fire an agent state's actions in the model's place (`Agent.override_role` narrows it per state);
    #: unset, only the model proposes. The event records the role the person stood in with.
    model_override_role: str | None = None
    #: The fields of its tasks (input fields, tool results) shown only to the roles it names (`Restricted`).
    #: Presentation, not behaviour: not in the digest, like `searchable`.
    restricted: Restricted | None = None
    #: Its tasks' place when a model quota is short (higher first, -1000 to 1000; a task's own, given at start,
    #: wins, and an operator's `[priorities]` setting overrides this). Scheduling, not behaviour: not in the
    #: digest, so changing it needs no new version.
    priority: int = 0
    #: The words people read for its states, actions, codes and fields (`Labels`), with the identifiers as the
    #: fallback. Presentation, not behaviour: not in the digest (like `priority` and `searchable`), so a label
    #: reworded or translated needs no new version and applies to the tasks already running.
    labels: Labels = field(default_factory=Labels)
    #: Whether people's notes on a task (`comment` events) reach its agent states' model, as untrusted human text
    #: inside tags. Off by default: a note is written for colleagues, and the model sees it only when the workflow
    #: says so. Behaviour: in the digest when set.
    notes_to_model: bool = False
    _all: tuple[State, ...] = field(init=False, repr=False)
    _by_name: dict[str, State] = field(init=False, repr=False)
    _table: dict[tuple[str, str], tuple[Action, ...]] = field(init=False, repr=False)
    _machine: CompiledMachine | None = field(init=False, repr=False, default=None)
    _digest: str = field(init=False, repr=False)
    _roles: frozenset[str] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        states = list(self.states)
        if not any(s.name == CANCELLED_STATE for s in states):
            states.append(Terminal(CANCELLED_STATE, description="Stopped by `cancel`."))
        needs_limit = any(s.kind in (StateKind.AGENT, StateKind.TOOL) for s in states)
        if needs_limit and self.limit_state is None and not any(s.name == LIMIT_STATE for s in states):
            states.append(Wait(LIMIT_STATE, description="A budget ran out; a human decides (or cancels)."))
        object.__setattr__(self, "states", tuple(states))
        object.__setattr__(self, "searchable", tuple(self.searchable))
        retry_role = self.operator_of(RETRY)
        generated = [sub for s in states if type(s) is Agent for sub in agent_substates(s, retry_role)]
        object.__setattr__(self, "_all", (*states, *generated))
        problems = _validate(self)
        if problems:
            raise DefinitionError(self.ref, problems)
        object.__setattr__(self, "_by_name", {s.name: s for s in self._all})
        object.__setattr__(self, "_table", _transition_table(self))
        object.__setattr__(self, "_digest", sha256_hex(canonical_json(self.spec())))
        object.__setattr__(self, "_roles", self._named_roles())

    # -- identity -------------------------------------------------------
    @property
    def ref(self) -> str:
        """`name@version`, the form every interface prints."""
        return f"{self.name}@{self.version}"

    @property
    def digest(self) -> str:
        return self._digest

    @property
    def initial_state(self) -> str:
        return self.initial or self.states[0].name

    @property
    def all_states(self) -> tuple[State, ...]:
        """The declared states and the ones the engine generates (agent sub-states)."""
        return self._all

    @property
    def machine(self) -> CompiledMachine:
        """The `transitions` machine of this version: compiled when first needed, then shared by all its tasks.

        Validation and the transition table need no machine, so a registry of many versions pays for the ones
        it uses. Two threads asking at once may both compile it; either result is the same machine.
        """
        compiled = self._machine
        if compiled is None:
            from engine.core.machine import Shape, compile_machine

            moves = list(self.transitions())
            compiled = compile_machine(
                Shape(
                    ref=self.ref,
                    states=[s.name for s in self.all_states],
                    initial=self.initial_state,
                    edges=[(source, action.name, target) for source, action in moves for target in action.targets()],
                    anyone=frozenset((source, action.name) for source, action in moves if action.role == ANYONE),
                    children={s.name: (s.workflow, s.version) for s in self.all_states if isinstance(s, Child)},
                )
            )
            object.__setattr__(self, "_machine", compiled)
        return compiled

    # -- who may act (engine.core.access decides with these) ------------------------------------------
    def operator_of(self, trigger: str) -> str | None:
        """The role that fires one of the engine's built-in human triggers: `cancel` (`cancel_role`), `settle`
        (`settle_role`, else `cancel_role`), `redrive`, `fork` and `retry` (`redrive_role`, else `settle_role`,
        else `cancel_role`); each falls back to `operator_role` (None: nobody may)."""
        chain: tuple[str | None, ...]
        if trigger == CANCEL:
            chain = (self.cancel_role,)
        elif trigger == SETTLE:
            chain = (self.settle_role, self.cancel_role)
        else:  # redrive, fork, retry: sending a task on again after it stopped
            chain = (self.redrive_role, self.settle_role, self.cancel_role)
        return next((r for r in chain if r), None) or self.operator_role

    def roles(self) -> frozenset[str]:
        """Every role the definition names (`ANYONE` included when it is used): who may read its tasks. Worked out
        once, as the version is built: every scoped read asks it of every definition."""
        return self._roles

    def _named_roles(self) -> frozenset[str]:
        named = {self.operator_role, self.model_override_role, self.cancel_role, self.settle_role, self.redrive_role}
        for state in self._all:
            named.update(a.role for a in state.actions)
            if isinstance(state, Approval):
                named.add(state.role)
            if isinstance(state, Agent):
                named.add(state.override_role)
        if self.restricted is not None:  # who may see its restricted fields reads its tasks
            named.update(self.restricted.roles)
        return frozenset(r for r in named if r)

    # -- queries the runtime uses -----------------------------------------
    def state(self, name: str) -> State:
        return self._by_name[name]

    @property
    def starts_children(self) -> bool:
        """Whether a state of this version starts child tasks (`Child`)."""
        return any(isinstance(s, Child) for s in self.states)

    def has_state(self, name: str) -> bool:
        return name in self._by_name

    def status_of(self, state: str) -> Status:
        return STATUS_OF_KIND[self._by_name[state].kind]

    def candidates(self, state: str, trigger: str) -> tuple[Action, ...]:
        """The transitions `trigger` may take from `state`, in declaration order (empty: not allowed)."""
        return self._table.get((state, trigger), ())

    def triggers(self, state: str, *, system: bool = False) -> list[str]:
        """The triggers a caller may fire in `state`, in declaration order (`system=True`: the engine's too)."""
        return [t for t in self.machine.triggers(state) if system or not all(a.system for a in self._table[(state, t)])]

    def search_values(self, input: Mapping[str, Any] | None) -> dict[str, str]:
        """The searchable fields of a task's `input` that hold a value, as text: what the task lists index. A value
        with a control character is left out: a search (`q`) never carries one, so it could never be found, and
        PostgreSQL's text refuses a NUL (the task itself keeps its input whole)."""
        out: dict[str, str] = {}
        for name in self.searchable:
            value = (input or {}).get(name)
            if isinstance(value, str | int) and not isinstance(value, bool) and str(value):
                text = str(value)[:SEARCH_VALUE_LENGTH]
                if not _UNSEARCHABLE.search(text):
                    out[name] = text
        return out

    def transitions(self) -> Iterable[tuple[str, Action]]:
        """Every (source, action) pair, built-ins included."""
        for (source, _trigger), actions in self._table.items():
            for action in actions:
                yield source, action

    def spec(self) -> dict[str, Any]:
        """The canonical content that the digest covers."""
        return {
            "name": self.name,
            "version": self.version,
            "initial": self.initial_state,
            "input": self.input.model_json_schema() if self.input is not None else None,
            "description": self.description,
            "cancel_role": self.cancel_role,
            "tools": {"ref": self.tools.ref, "digest": self.tools.digest} if self.tools is not None else None,
            "budgets": self.budgets.spec(),
            "limit_state": self.limit_state,
            "states": [s.spec() for s in self.states],
            # Added later: present only when set, so the digests of definitions that do not use them stay put.
            **({"effect_after_cancel": self.effect_after_cancel} if self.effect_after_cancel else {}),
            **({"settle_role": self.settle_role} if self.settle_role else {}),
            **({"redrive_role": self.redrive_role} if self.redrive_role else {}),
            **({"operator_role": self.operator_role} if self.operator_role else {}),
            **({"model_override_role": self.model_override_role} if self.model_override_role else {}),
            **({"notes_to_model": True} if self.notes_to_model else {}),
        }

    def redrive_sources(self) -> frozenset[str]:
        """The states an operator may `redrive` from: where the engine hands a task to a person because its agent
        or tool states could not go on (an agent's hand-off and provider-error states, a state named as an
        agent's `on_exhausted`, the limit state). Approval and other wait states have their own triggers."""
        out = {self.limit_state or LIMIT_STATE}
        for state in self.states:
            if isinstance(state, Agent):
                out.update({state.exhausted_target, state.provider_error_target})
        return frozenset(n for n in out if n in self._by_name and self._by_name[n].kind is not StateKind.TERMINAL)

    def redrive_targets(self) -> frozenset[str]:
        """The states a `redrive` may lead to: the declared agent and tool states."""
        return frozenset(s.name for s in self.states if s.kind in (StateKind.AGENT, StateKind.TOOL))


def _outgoing_with_builtins(wf: Workflow, state: State) -> list[Action]:
    out = [*_cancel_routes(wf, state), *state.outgoing()]
    if state.kind is not StateKind.TERMINAL:
        cancel_role = wf.operator_of(CANCEL)
        out.append(Action(CANCEL, CANCELLED_STATE, CancelArgs, role=cancel_role))
        # While a write's outcome is open a cancel is recorded as a request (`engine.effects`), and an operator
        # may record what they verified about the write; with a cancel waiting, that settles where the cancel says.
        out.append(
            Action(CANCEL_REQUESTED, state.name, CancelArgs, guards=(write_unsettled,), role=cancel_role, system=True)
        )
        settle_role = wf.operator_of(SETTLE)
        out.extend(
            [
                Action(
                    SETTLE,
                    wf.effect_after_cancel or CANCELLED_STATE,
                    SettleArgs,
                    guards=(cancel_requested_and_executed,),
                    role=settle_role,
                    system=True,
                ),
                Action(
                    SETTLE,
                    CANCELLED_STATE,
                    SettleArgs,
                    guards=(cancel_requested_and_not_executed,),
                    role=settle_role,
                    system=True,
                ),
                Action(SETTLE, state.name, SettleArgs, guards=(write_unsettled,), role=settle_role, system=True),
            ]
        )
    if state.kind in (StateKind.AGENT, StateKind.TOOL):
        out.append(Action(LIMIT, wf.limit_state or LIMIT_STATE, system=True))
    return out


def _cancel_routes(wf: Workflow, state: State) -> list[Action]:
    """A write tool state's outcomes when a cancel waits for them: before the plain ones, so they win when it does.
    A child state's ends likewise, when the parent's cancel waits for its child: the end is recorded and the cancel
    takes effect in the same event."""
    if isinstance(state, Child):
        if not state.holds_child:
            return []
        return [
            Action(trigger, CANCELLED_STATE, guards=(cancel_was_requested,), system=True) for trigger in state.routes()
        ]
    if not isinstance(state, Tool) or wf.tools is None or state.tool not in wf.tools:
        return []
    if str(wf.tools.get(state.tool).kind) != "write":
        return []
    return [
        Action("succeeded", wf.effect_after_cancel or CANCELLED_STATE, guards=(cancel_was_requested,), system=True),
        Action("failed", CANCELLED_STATE, guards=(cancel_was_requested,), system=True),
    ]


def _transition_table(wf: Workflow) -> dict[tuple[str, str], tuple[Action, ...]]:
    table: dict[tuple[str, str], list[Action]] = {}
    for state in wf.all_states:
        for action in _outgoing_with_builtins(wf, state):
            table.setdefault((state.name, action.name), []).append(action)
    return {k: tuple(v) for k, v in table.items()}


def _validate(wf: Workflow) -> list[str]:
    """Every problem with the definition, in a stable order. Empty means valid."""
    problems: list[str] = []
    if not _NAME.match(wf.name or ""):
        problems.append(f"workflow name {wf.name!r} must match {_NAME.pattern}")
    if not isinstance(wf.version, int) or isinstance(wf.version, bool) or wf.version < 1:
        problems.append(f"version {wf.version!r} must be an integer >= 1")
    if not is_priority(wf.priority):
        problems.append(f"priority {wf.priority!r} must be a whole number from -1000 to 1000")
    if wf.input is not None and not _forbids_extra(wf.input):
        problems.append(f"input model {wf.input.__name__} must set extra='forbid'")
    fields = set(wf.input.model_fields) if wf.input is not None else set()
    problems.extend(
        f"searchable field {n!r} is not a field of the input model" for n in wf.searchable if n not in fields
    )
    for budget in ("tokens", "state_tokens"):
        cap = getattr(wf.budgets, budget)
        if cap is not None and (not isinstance(cap, int) or isinstance(cap, bool) or cap < 1):
            problems.append(f"budget {budget} {cap!r} must be an integer >= 1 (or None: no cap)")

    names: dict[str, State] = {}
    for state in wf.states:
        if not _NAME.match(state.name or ""):
            problems.append(f"state name {state.name!r} must match {_NAME.pattern}")
        if state.name in names:
            problems.append(f"duplicate state name {state.name!r}")
        names[state.name] = state
    for state in wf.all_states[len(wf.states) :]:
        names.setdefault(state.name, state)
    if not wf.states:
        problems.append("a workflow needs at least one state")
        return problems

    initial = wf.initial or wf.states[0].name
    if initial not in names:
        problems.append(f"initial state {initial!r} is not defined")
    elif names[initial].kind is StateKind.TERMINAL:
        problems.append(f"initial state {initial!r} is terminal")

    for state in wf.states:
        problems.extend(_validate_state(wf, state, names))

    problems.extend(_validate_cards(wf, names))
    problems.extend(_validate_labels(wf, names))
    problems.extend(_validate_restricted(wf))
    if wf.operator_of(CANCEL) is None:
        problems.append(
            "triggers 'cancel', 'settle', 'redrive', 'fork' and 'retry' name no role: set operator_role (or "
            "cancel_role), or operator_role=ANYONE for any signed-in person"
        )
    if wf.effect_after_cancel is not None and wf.effect_after_cancel not in names:
        problems.append(f"effect_after_cancel names unknown state {wf.effect_after_cancel!r}")
    cancelled = names.get(CANCELLED_STATE)
    if cancelled is not None and cancelled.kind is not StateKind.TERMINAL:
        problems.append(f"state {CANCELLED_STATE!r} is where `cancel` leads: it must be terminal")

    if initial in names:
        unreachable = [s.name for s in wf.states if s.name not in _reachable(wf, initial, names)]
        problems.extend(f"state {n!r} is unreachable from {initial!r}" for n in unreachable)
    return problems


def _validate_state(wf: Workflow, state: State, names: dict[str, State]) -> list[str]:
    problems: list[str] = []
    where = f"state {state.name!r}"
    if state.kind is StateKind.TERMINAL:
        if state.actions:
            problems.append(f"{where} is terminal but has exits: {[a.name for a in state.actions]}")
        return problems
    if state.kind is StateKind.AGENT and not state.actions:
        problems.append(f"{where} is an agent state with no action")
    if isinstance(state, Tool):
        if not state.tool:
            problems.append(f"{where} is a tool state that names no tool")
        elif wf.tools is not None and state.tool not in wf.tools:
            problems.append(f"{where}: tool {state.tool!r} is not in the catalog {wf.tools.ref}")
        for outcome, target in (
            ("on_succeeded", state.on_succeeded),
            ("on_failed", state.on_failed),
            ("on_unknown", state.on_unknown),
        ):
            if not target:
                problems.append(f"{where} is a tool state with no {outcome} target")
        if state.actions:
            problems.append(f"{where} is a tool state: its exits are on_succeeded/on_failed/on_unknown")
        tool = wf.tools.get(state.tool) if wf.tools is not None and state.tool in wf.tools else None
        unknown = names.get(state.on_unknown)
        if (
            tool is not None
            and str(tool.kind) == "write"
            and unknown is not None
            and unknown.kind is StateKind.TERMINAL
        ):
            problems.append(
                f"{where}: on_unknown {state.on_unknown!r} is terminal, which would end the task with "
                f"the outcome of write {state.tool!r} unknown: send it to a state a person settles from"
            )
    if isinstance(state, Child):
        problems.extend(_validate_child(state, where))
    if isinstance(state, Approval) and not state.role:
        problems.append(f"{where} is an approval state with no role")
    if isinstance(state, Wait):
        problems.extend(
            f"{where}: trigger {a.name!r} names no role: say who may fire it (role=...), or role=ANYONE for any "
            "signed-in person"
            for a in state.actions
            if not a.role and not a.system
        )
    if isinstance(state, Approval | Wait):
        if state.kind is StateKind.APPROVAL and not state.actions:
            problems.append(f"{where} is an approval state with no action")
        if (state.deadline is None) != (state.on_expired is None):
            problems.append(f"{where}: deadline and on_expired go together")
        if state.deadline is not None and state.deadline <= timedelta(0):
            problems.append(f"{where}: deadline must be positive")

    if isinstance(state, Agent) and (not isinstance(state.max_repairs, int) or state.max_repairs < 0):
        problems.append(f"{where}: max_repairs must be an integer >= 0")
    if isinstance(state, Agent):
        budget = state.retry_budget
        if not isinstance(budget.count, int) or isinstance(budget.count, bool) or budget.count < 0:
            problems.append(f"{where}: retry_budget.count must be an integer >= 0")
        if not isinstance(budget.within, timedelta) or budget.within < timedelta(0):
            problems.append(f"{where}: retry_budget.within must be a duration >= 0")
    reserved = {
        START,
        CANCEL,
        EXPIRED,
        *TOOL_OUTCOMES,
        REPAIR,
        DEMOTE,
        HAND_OFF,
        PROVIDER_ERROR,
        BACKOFF,
        RETRY,
        CALL,
        RECONCILE,
        LIMIT,
        MIGRATE,
        FORK,
        REDRIVE,
        CANCEL_REQUESTED,
        SETTLE,
        SPAWN,
        SPAWNED,
        COMMENT,
        WORK_CLAIMED,
        WORK_RELEASED,
    }
    by_trigger: dict[str, list[Action]] = {}
    for action in state.actions:
        if not _NAME.match(action.name or ""):
            problems.append(f"{where}: action name {action.name!r} must match {_NAME.pattern}")
        if action.name in reserved:
            problems.append(f"{where}: action name {action.name!r} is reserved by the engine")
        if action.args is not None and not _forbids_extra(action.args):
            problems.append(f"{where}: action {action.name!r} argument model must set extra='forbid'")
        if action.args is not None and IDENTITY_FIELDS & set(action.args.model_fields):
            problems.append(
                f"{where}: action {action.name!r} declares identity fields "
                f"{sorted(IDENTITY_FIELDS & set(action.args.model_fields))}: identity comes from the trusted caller"
            )
        by_trigger.setdefault(action.name, []).append(action)
    for action in state.outgoing():
        for target in action.targets():
            if target not in names:
                problems.append(f"{where}: action {action.name!r} targets unknown state {target!r}")
        if action.prepares is not None and (wf.tools is None or action.prepares not in wf.tools):
            problems.append(
                f"{where}: action {action.name!r} prepares {action.prepares!r}, which is not in the "
                f"workflow's tool catalog"
            )
        if (action.risk is None) != (action.risk_target is None):
            problems.append(f"{where}: action {action.name!r}: risk and risk_target go together")
    for trigger, actions in by_trigger.items():
        if len(actions) < 2:
            continue
        if any(not a.guards for a in actions):
            problems.append(
                f"{where}: trigger {trigger!r} is shared by {len(actions)} transitions and not all have guards"
            )
        if len({a.args for a in actions}) > 1:
            problems.append(f"{where}: trigger {trigger!r} has transitions with different argument models")
    return problems


def _validate_child(state: Child, where: str) -> list[str]:
    """A child state names a workflow, builds its input by code, and routes every end of the child somewhere."""
    problems: list[str] = []
    if not _NAME.match(state.workflow or ""):
        problems.append(f"{where} is a child state: workflow {state.workflow!r} must match {_NAME.pattern}")
    if state.version is not None and (
        not isinstance(state.version, int) or isinstance(state.version, bool) or state.version < 1
    ):
        problems.append(f"{where}: version {state.version!r} must be an integer >= 1 (or None: the newest)")
    if state.each is not None:
        problems.extend(_validate_fan_out(state, where))
    elif not callable(state.input):
        problems.append(f"{where} is a child state with no input builder (input=a function of the parent's state)")
    if state.read is not None and not callable(state.read):
        problems.append(f"{where}: read must be a function of the child's final state")
    if state.result is not None and not _forbids_extra(state.result):
        problems.append(f"{where}: result model must be a pydantic model that sets extra='forbid'")
    if not state.otherwise:
        problems.append(f"{where} is a child state with no otherwise target (where an end `on` does not name goes)")
    for end in state.on:
        if state.each is not None:
            if end not in FAN_OUT_ROUTES:
                problems.append(f"{where}: a fan-out's routes are {', '.join(FAN_OUT_ROUTES)}, not {end!r}")
        elif not _NAME.match(end or "") or end == UNROUTED:
            problems.append(f"{where}: route {end!r} must name a terminal state of the child ({_NAME.pattern})")
    if state.actions:
        problems.append(f"{where} is a child state: its exits are `on`, `otherwise` and `on_expired`")
    if (state.deadline is None) != (state.on_expired is None):
        problems.append(f"{where}: deadline and on_expired go together")
    if state.deadline is not None and state.deadline <= timedelta(0):
        problems.append(f"{where}: deadline must be positive")
    if state.on_parent_end not in PARENT_END_POLICIES:
        problems.append(
            f"{where}: on_parent_end {state.on_parent_end!r} must be one of {', '.join(PARENT_END_POLICIES)}"
        )
    return problems


def _validate_restricted(wf: Workflow) -> list[str]:
    """Every name a `Restricted` declaration gives must be a field or tool the workflow has: a misspelt one would
    otherwise restrict nothing, silently."""
    found = wf.restricted
    if found is None:
        return []
    if not isinstance(found, Restricted):
        return [f"restricted must be a Restricted(...), not {type(found).__name__}"]
    problems: list[str] = []
    if not found.roles:
        problems.append("restricted fields name no role that may see them: set Restricted(roles=...)")
    if ANYONE in found.roles:
        problems.append("restricted fields cannot be shown to ANYONE: name the roles that may see them")
    fields = set(wf.input.model_fields) if wf.input is not None else set()
    for name in found.input:
        if name not in fields:
            problems.append(f"restricted input field {name!r} is not a field of the input model")
        elif name in wf.searchable:
            problems.append(
                f"restricted input field {name!r} is searchable: a search by its value would show whose task it is"
            )
    for name in found.results:
        tool, _, field_name = name.partition(".")
        if wf.tools is None or tool not in wf.tools:
            problems.append(f"restricted result {name!r}: tool {tool!r} is not in the workflow's tool catalog")
        elif field_name and field_name not in wf.tools.get(tool).result.model_fields:
            model = wf.tools.get(tool).result.__name__
            problems.append(f"restricted result {name!r}: {field_name!r} is not a field of {tool}'s result ({model})")
    return problems


def _forbids_extra(model: Any) -> bool:
    return isinstance(model, type) and issubclass(model, BaseModel) and model.model_config.get("extra") == "forbid"


def _reachable(wf: Workflow, initial: str, names: dict[str, State]) -> set[str]:
    seen = {initial}
    frontier = [initial]
    while frontier:
        state = names[frontier.pop()]
        for action in _outgoing_with_builtins(wf, state):
            for target in action.targets():
                if target in names and target not in seen:
                    seen.add(target)
                    frontier.append(target)
    return seen


def _validate_fan_out(state: Child, where: str) -> list[str]:
    """A fan-out builds its inputs by code, declares its join, its failure policy and what a child's success is."""
    problems: list[str] = []
    if not callable(state.each):
        problems.append(f"{where}: each must be a function of the parent's state giving one child input per item")
    if state.input is not None:
        problems.append(f"{where} is a fan-out: each builds the children's inputs, input must be None")
    if isinstance(state.join, Quorum):
        if isinstance(state.join.k, bool) or not isinstance(state.join.k, int) or state.join.k < 1:
            problems.append(f"{where}: Quorum(k) needs an integer k >= 1, not {state.join.k!r}")
    elif state.join not in JOINS:
        problems.append(f"{where}: join {state.join!r} must be one of {', '.join(JOINS)} or Quorum(k)")
    if state.on_child_failure not in CHILD_FAILURE_POLICIES:
        problems.append(
            f"{where}: on_child_failure {state.on_child_failure!r} must be one of {', '.join(CHILD_FAILURE_POLICIES)}"
        )
    if not state.succeeds or not all(_NAME.match(s or "") for s in state.succeeds):
        problems.append(f"{where} is a fan-out: succeeds must name the child's terminal states that count as success")
    if state.on_parent_end == "abandon":
        problems.append(f"{where} is a fan-out: on_parent_end must be cancel or wait (its end waits for every child)")
    return problems
