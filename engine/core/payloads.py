"""What an event's `data` holds: one declared type per record, over the JSON the log stores.

The types are `TypedDict`s, so they describe the stored objects as they are: the
bytes, the hashes and existing databases are untouched, and a reader that goes
through `EventData` is checked by mypy against what the engine writes. Each
field says which events carry it and what it means (the `Doc` in its
annotation); `docs/concepts.md` "What an event records" is generated from them
by `tools/gen_events_doc.py`, and a test holds the page to the code.

A stored event may carry keys this module does not declare (an edited row, a
future version's field): readers look keys up with `.get` and ignore the rest.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, Literal, NotRequired, TypedDict, cast


@dataclass(frozen=True, slots=True)
class Doc:
    """What a field means (`text`) and which events carry it (`carried_by`), for the generated reference."""

    text: str
    carried_by: str = ""


class TokenUsage(TypedDict, total=False):
    """The token counts the provider reported for one turn; a count it did not report is absent, never 0."""

    input_tokens: Annotated[int, Doc("tokens the provider counted in the request, its cached part included")]
    output_tokens: Annotated[int, Doc("tokens the provider counted in the answer, its reasoning included")]
    cached_tokens: Annotated[int, Doc("of the input, the tokens read from the provider's prompt cache")]
    reasoning_tokens: Annotated[int, Doc("of the output, the tokens of the model's reasoning")]


#: An escalation's keys, in the functional syntax because one of them is a Python keyword.
Escalated = TypedDict(
    "Escalated",
    {
        "from": Annotated[str, Doc("the rung the answer ignored")],
        "to": Annotated[str, Doc("the rung the next attempt uses (the same one when the step is `reminder`)")],
        "step": Annotated[
            Literal["reminder", "rung"],
            Doc("`reminder`: the mode's reminder restated in the profile's role; `rung`: the next rung down"),
        ],
        "why": Annotated[str, Doc("the code that showed the rung was ignored (`NO_ACTION`, `OUTPUT_NOT_JSON`, ...)")],
    },
)
Escalated.__doc__ = "What the next attempt changes after an answer that ignored the rung it was asked on."


class Turn(TypedDict):
    """One model turn: how the engine asked, and what it made of the answer."""

    strategy: Annotated[str, Doc("the forcing rung the request used (`native_schema`, `named_tool`, `required`, ...)")]
    model: Annotated[str, Doc("`provider:model` of the adapter that answered")]
    profile: Annotated[str, Doc("the capability profile the rung was chosen from")]
    thinking: Annotated[bool, Doc("whether the request thought: as asked, and always for a model that always thinks")]
    mode: Annotated[str, Doc("the structured-output mode of the rung")]
    code: NotRequired[
        Annotated[str | None, Doc("what the turn ended in (`NO_ACTION`, `RATE_LIMITED`, ...); null: accepted")]
    ]
    messages: NotRequired[Annotated[list[dict[str, Any]], Doc("the messages this turn added to the conversation")]]
    usage: NotRequired[Annotated[TokenUsage, Doc("token counts, when the provider answered and reported them")]]
    attempts: NotRequired[
        Annotated[int, Doc("provider calls it took: always when the turn failed, else when an error was retried")]
    ]
    seconds: NotRequired[
        Annotated[
            float, Doc("when the turn failed, the seconds its provider calls took, backoff between them included")
        ]
    ]
    provider_message: NotRequired[
        Annotated[str, Doc("when the turn failed, the provider's own words (secrets redacted, at most 300 characters)")]
    ]
    retried: NotRequired[
        Annotated[
            list[dict[str, Any]],
            Doc(
                "each provider call made again, in order: the error's `code`, HTTP `status` and `message` (as "
                "`provider_message`), and the seconds `waited` before the next call"
            ),
        ]
    ]
    errors: NotRequired[Annotated[list[dict[str, Any]], Doc("what was wrong with the proposal, as the model was told")]]
    demoted: NotRequired[
        Annotated[str, Doc("the request shape the provider refused, not sent again for this task and model")]
    ]
    shared: NotRequired[
        Annotated[
            bool,
            Doc(
                "with `demoted`, false when the error's fields did not name the shape: other tasks of the process "
                "keep sending it until this task's next call, sent without it, is answered"
            ),
        ]
    ]
    escalated: NotRequired[
        Annotated[Escalated, Doc("on a `repair` after an answer that ignored the rung: what the next attempt changes")]
    ]
    worked: NotRequired[
        Annotated[str, Doc("the rung that worked after escalating, where the next visit for this model starts")]
    ]
    learned: NotRequired[
        Annotated[
            list[str],
            Doc(
                "what other tasks of this process found for this model (refused shapes, rungs that worked) "
                "that moved this turn's request from the one the task's own log would make"
            ),
        ]
    ]
    thinking_switch: NotRequired[
        Annotated[
            dict[str, Any],
            Doc("the provider's body fields that switched thinking on or off, as sent (they win over an extra body)"),
        ]
    ]


class PreparedCallData(TypedDict):
    """A prepared tool call (`PreparedToolCall.to_dict()`): exactly what will run, sealed by its digest."""

    task_id: Annotated[str, Doc("the task that makes the call")]
    action_id: Annotated[str, Doc("the idempotency key: the same for every attempt of this call")]
    tool: Annotated[str, Doc("the catalog tool")]
    kind: Annotated[Literal["read", "write"], Doc("whether the call changes anything outside")]
    arguments: Annotated[dict[str, Any], Doc("the normalised arguments")]
    catalog: Annotated[str, Doc("the catalog the tool was taken from")]
    catalog_digest: Annotated[str, Doc("the digest of that catalog")]
    policy_version: Annotated[str, Doc("the tool policy the call was checked against")]
    required_role: Annotated[str | None, Doc("the role an approver of this call needs")]
    digest: Annotated[str, Doc("sha256 of the fields above: what an approver approves")]


class RetryRecord(TypedDict):
    """A durable retry of a provider call: when the next call is due, and the budget it spends."""

    n: Annotated[int, Doc("which backoff of the visit this is, from 1")]
    due_at: Annotated[str, Doc("when the next call may be made (UTC): the task is put off until then")]
    since: Annotated[str, Doc("when the visit's first backoff was recorded (UTC): the budget's time counts from it")]
    budget: Annotated[dict[str, Any], Doc("the agent state's retry budget: `count` backoffs within `within_seconds`")]


class Outcome(TypedDict):
    """What one run of a tool came to."""

    outcome: Annotated[Literal["succeeded", "failed", "unknown"], Doc("the outcome, also the event's trigger")]
    result: Annotated[dict[str, Any] | None, Doc("the tool's answer, when it succeeded")]
    code: Annotated[str | None, Doc("why it failed or is unknown (`TOOL_TIMEOUT`, `TOOL_REMOTE_ERROR`, ...)")]
    message: Annotated[str | None, Doc("a short message with the code")]
    duration_ms: Annotated[int, Doc("how long the call took")]


class ToolError(TypedDict):
    code: Annotated[str, Doc("the outcome's code")]
    message: Annotated[str | None, Doc("its message")]


class ToolResult(TypedDict):
    """What the model may see of a tool's outcome (kept apart from arguments, shown only inside tags)."""

    tool: Annotated[str, Doc("the tool")]
    result: NotRequired[Annotated[dict[str, Any] | None, Doc("its answer, when it succeeded")]]
    error: NotRequired[Annotated[ToolError, Doc("its code and message, when it did not")]]


class Reconciled(TypedDict):
    """What asking the remote about an action id (`reconcile`) found, when it settles nothing yet."""

    outcome: Annotated[Literal["not_found", "unknown"], Doc("`not_found`: it never happened; `unknown`: no answer")]
    action_id: Annotated[str, Doc("the action id asked about")]


class Asserted(TypedDict):
    by: Annotated[str, Doc("the operator who verified the outcome")]
    evidence: Annotated[str, Doc("where the verification can be checked")]


class Settled(TypedDict):
    """An operator's recorded assertion about a write whose outcome was open."""

    action_id: Annotated[str, Doc("the write's action id")]
    tool: Annotated[str, Doc("its tool")]
    outcome: Annotated[Literal["executed", "not_executed"], Doc("what the operator verified")]
    evidence: Annotated[str, Doc("where the verification can be checked")]
    was: Annotated[str, Doc("the write's status before: `pending` or `unknown`")]


class Risk(TypedDict):
    check: Annotated[str, Doc("the risk check's recorded name")]
    reason: Annotated[str, Doc("why it sent the task to the action's risk target")]


class Proposal(TypedDict):
    action: Annotated[str, Doc("the action the model proposed")]


class StoodIn(TypedDict):
    """A person fired one of an agent state's actions in the model's place."""

    role: Annotated[str, Doc("the role that let them stand in for the model (`model_override_role`)")]


class ApprovalRecord(TypedDict):
    """Who decided on a prepared call, as what, and on which digest."""

    actor: Annotated[str, Doc("the approver")]
    role: Annotated[str, Doc("the role they decided as")]
    decision: Annotated[Literal["approve", "reject"], Doc("the verdict")]
    comment: Annotated[str, Doc("their comment")]
    digest: Annotated[str | None, Doc("the prepared call's digest they decided on")]


class ForkOrigin(TypedDict):
    """Where a fork came from: replay checks the source still holds this hash at this seq."""

    task_id: Annotated[str, Doc("the source task")]
    seq: Annotated[int, Doc("the seq of the source's event the fork starts after")]
    hash: Annotated[str, Doc("that event's hash")]
    workflow: Annotated[str, Doc("the `name@version` the source was on at that seq")]
    digest: Annotated[str, Doc("that version's digest")]


class Carried(TypedDict):
    """The source's state as of the fork's seq, as its fold says (replay folds the source and compares)."""

    state: Annotated[str, Doc("the state the source was in, where the fork starts")]
    facts: Annotated[dict[str, Any], Doc("the accumulated context guards read")]
    visit: Annotated[dict[str, Any], Doc("the current visit (an agent's conversation and repairs, a tool's attempts)")]
    prepared: Annotated[PreparedCallData | None, Doc("the newest prepared call")]
    prepared_by: Annotated[str | None, Doc("who proposed it")]
    usage: Annotated[dict[str, Any], Doc("the budget counters")]
    effect: Annotated[dict[str, Any] | None, Doc("the newest write and what it came to")]
    started_by: Annotated[str, Doc("who started the source (separation of duties holds in the fork too)")]
    tenant: NotRequired[Annotated[str, Doc("the tenant the source belongs to, and so the fork (absent: none)")]]


class ChildRecord(TypedDict):
    """A child task a child state starts, and, once it ended, what it came to (`engine.core.children`)."""

    task_id: Annotated[str, Doc("the child's task id, derived from the parent's id and the action id")]
    action_id: Annotated[str, Doc("the start's action id: the same for every attempt to start this child")]
    workflow: NotRequired[Annotated[str, Doc("on `spawn`: the `name@version` the child is pinned to")]]
    digest: NotRequired[Annotated[str, Doc("on `spawn`: that version's digest")]]
    input: NotRequired[Annotated[dict[str, Any], Doc("on `spawn`: the child's input, built by code")]]
    holds: NotRequired[
        Annotated[
            bool,
            Doc("on `spawn`: true when the parent holds the child (its cancel waits for the child's end recorded)"),
        ]
    ]
    state: NotRequired[Annotated[str, Doc("on the child's end: the terminal state it ended in")]]
    seq: NotRequired[Annotated[int, Doc("on the child's end: the seq of its last event")]]
    hash: NotRequired[Annotated[str, Doc("on the child's end: that event's hash (replay checks the child holds it)")]]
    result: NotRequired[
        Annotated[dict[str, Any] | None, Doc("on the child's end: the typed result read from its final state")]
    ]
    code: NotRequired[
        Annotated[str, Doc("on the child's end: why its result could not be read (CHILD_RESULT_INVALID)")]
    ]


class FanOutRecord(TypedDict):
    """The children a fan-out starts (one per item, in order), and, once all ended, how its join came out
    (`engine.core.fanout`)."""

    action_id: Annotated[str, Doc("the intent's action id; each child's is derived from it and its item's index")]
    children: Annotated[list[ChildRecord], Doc("one record per item, in the order of the items")]
    workflow: NotRequired[Annotated[str, Doc("on `spawn`: the `name@version` the children are pinned to")]]
    digest: NotRequired[Annotated[str, Doc("on `spawn`: that version's digest")]]
    join: NotRequired[Annotated[str, Doc("on `spawn`: `all`, `any` or `quorum:K`")]]
    on_child_failure: NotRequired[Annotated[str, Doc("on `spawn`: `fail_fast` or `collect`")]]
    outcome: NotRequired[
        Annotated[str, Doc("on the end: `joined` or `failed`, what the children's ends decide (replay checks it)")]
    ]


class ParentLink(TypedDict):
    """The parent a child task was started by: replay checks the parent's log names this child at this seq."""

    task_id: Annotated[str, Doc("the parent task")]
    seq: Annotated[int, Doc("the seq of the parent's `spawn` event, the intent this child fulfils")]
    action_id: Annotated[str, Doc("the start's action id")]
    workflow: Annotated[str, Doc("the `name@version` the parent was on")]
    state: Annotated[str, Doc("the parent's child state, which waits for this task's end")]


class NoteRecord(TypedDict):
    """A person's note on a task: text for colleagues, untrusted, sent to a model only when the workflow says so."""

    text: Annotated[str, Doc("the note, as written (at most 2,000 characters)")]


class ClaimRecord(TypedDict):
    """Who is on a task's work item: recorded in the log as well as in the queue's side table."""

    until: NotRequired[Annotated[str, Doc("on `work_claimed`: when the claim runs out unless renewed (UTC)")]]
    taken_from: NotRequired[Annotated[str, Doc("on `work_claimed`: whose live claim this one took over")]]
    reason: NotRequired[Annotated[str, Doc("on `work_claimed`: why it was taken over, in the person's words")]]


class _StepKeys(TypedDict, total=False):
    # start
    workflow: Annotated[str, Doc("the `name@version` the task is pinned to", "`start`, `fork`")]
    digest: Annotated[str, Doc("that version's digest", "`start`, `fork`")]
    input: Annotated[
        dict[str, Any], Doc("the task's input, validated by the workflow's input model", "`start`, `fork`")
    ]
    tenant: Annotated[
        str,
        Doc("the tenant the task belongs to, from the trusted caller who started it (absent: none)", "`start`"),
    ]
    parent: Annotated[
        ParentLink, Doc("the parent task, seq and action id that started this child task", "`start` of a child")
    ]
    # fork and redrive (operators)
    forked_from: Annotated[ForkOrigin, Doc("the source task, seq and hash the fork starts from", "`fork`")]
    carried: Annotated[Carried, Doc("the source's state as of that seq", "`fork`")]
    reset: Annotated[
        dict[str, Any],
        Doc(
            "the budget counters the event starts again, with the values they had (`started_at`: the deadline's "
            "start; on `redrive` also `turns`, `calls`, `repeats` and, with token budgets, the token counts)",
            "`fork`, `redrive`",
        ),
    ]
    redrive_from_seq: Annotated[
        int, Doc("the seq of the event that last entered the state the task is sent back to", "`redrive`")
    ]
    # an action of the workflow (fired by a person, a caller or the model)
    args: Annotated[
        dict[str, Any],
        Doc("the action's arguments, sensitive fields redacted", "an action with an argument model; `cancel`"),
    ]
    guards: Annotated[list[str], Doc("the recorded names of the guards that let it through", "an action with guards")]
    risk: Annotated[Risk, Doc("the risk check that routed it to the action's risk target", "a risky action")]
    prepared: Annotated[PreparedCallData, Doc("the tool call it prepared", "an action that prepares a call")]
    proposal: Annotated[Proposal, Doc("the action a model turn proposed and the engine accepted", "a model's action")]
    stood_in: Annotated[
        StoodIn, Doc("a person fired the model's action in its place, holding this role", "a person's agent action")
    ]
    approval: Annotated[ApprovalRecord, Doc("the approver's decision", "`approve`, `reject`")]
    settled: Annotated[Settled, Doc("the operator's assertion about an open write", "`settle`")]
    requested_at_seq: Annotated[
        int | None, Doc("the seq of the `cancel_requested` this cancel answers", "`cancel` after a write settled")
    ]
    # records about a task where it stands (`engine.core.remarks`): they never move it
    note: Annotated[NoteRecord, Doc("a person's note", "`comment`")]
    claim: Annotated[ClaimRecord, Doc("the claim on the work item", "`work_claimed`, `work_released`")]
    # agent states
    turn: Annotated[
        Turn,
        Doc(
            "the model turn", "every model turn: `repair`, `demote`, `backoff`, `hand_off`, `provider_error`, an action"
        ),
    ]
    last_code: Annotated[str, Doc("the code of the last refused proposal", "`hand_off` after the repairs ran out")]
    retry: Annotated[RetryRecord, Doc("the durable retry: when the next call is due", "`backoff`")]
    retries_spent: Annotated[
        RetryRecord,
        Doc(
            "the last backoff of the visit, when the state's retry budget ran out before this failure",
            "`provider_error` after backoffs",
        ),
    ]
    # tool states
    intent: Annotated[PreparedCallData, Doc("the call about to run, recorded before it runs", "`call`")]
    attempt: Annotated[int, Doc("which attempt of this call", "`call`")]
    requested_at: Annotated[str, Doc("when the attempt (or the child's start) was made (UTC)", "`call`, `spawn`")]
    outcome: Annotated[Outcome, Doc("what the run came to", "`succeeded`, `failed`, `unknown`")]
    action_id: Annotated[str, Doc("the call's action id", "`succeeded`, `failed`, `unknown`")]
    tool_result: Annotated[ToolResult, Doc("what the model may see of it", "`succeeded`, `failed`, `unknown`")]
    reconciled: Annotated[
        Reconciled | bool,
        Doc(
            "`true` on an outcome found by asking the remote; on `reconcile`, what asking found",
            "an outcome after `reconcile`; `reconcile`",
        ),
    ]
    asserted: Annotated[Asserted, Doc("who verified the outcome and where the proof is", "an outcome from `settle`")]
    # child states
    child: Annotated[
        ChildRecord,
        Doc(
            "the child task: its intent (`spawn`), its existence (`spawned`), what it ended in (`child_...`)",
            "`spawn`, `spawned`, `child_...`",
        ),
    ]
    fan_out: Annotated[
        FanOutRecord,
        Doc(
            "a fan-out's children: their intents (`spawn`), their existence (`spawned`), the join (`child_...`)",
            "`spawn`, `spawned`, `child_joined`, `child_failed`, `child_unrouted` of a fan-out",
        ),
    ]
    # limits and failures
    code: Annotated[str, Doc("why the task was handed off", "`limit`")]
    budget: Annotated[
        Literal["deadline", "model_turns", "tool_calls", "repeats", "tokens", "state_tokens"],
        Doc("the budget that ran out", "`limit`"),
    ]
    used: Annotated[int, Doc("how much of it was used", "`limit`")]
    limit: Annotated[int, Doc("the workflow's limit", "`limit`")]
    tool: Annotated[str, Doc("the tool whose calls with the same arguments ran out", "`limit` on repeats")]
    agent_state: Annotated[str, Doc("the agent state whose turns spent its tokens", "`limit` on state_tokens")]
    limit_seconds: Annotated[float, Doc("the deadline, in seconds from the start", "`limit` on the deadline")]
    error: Annotated[str, Doc("the exception class a failing step raised", "`limit` after repeated failures")]
    failures: Annotated[int, Doc("how many times the step failed", "`limit` after repeated failures")]


#: A migration's keys, in the functional syntax because one of them is a Python keyword.
_MigrationKeys = TypedDict(
    "_MigrationKeys",
    {
        "from": Annotated[str, Doc("the `name@version` the task left", "`migrate`")],
        "to": Annotated[str, Doc("the `name@version` the task moved to", "`migrate`")],
        "from_digest": Annotated[str, Doc("the digest of the version it left", "`migrate`")],
        "to_version": Annotated[int, Doc("the version it moved to", "`migrate`")],
        "to_digest": Annotated[str, Doc("that version's digest", "`migrate`")],
        "state_map": Annotated[dict[str, str], Doc("old state to new state, as the operator gave it", "`migrate`")],
        "reason": Annotated[str, Doc("why, in the operator's words", "`migrate`, `fork`, `redrive`")],
    },
    total=False,
)


class EventData(_StepKeys, _MigrationKeys, total=False):
    """Every key an event's `data` may hold. Which keys an event has depends on its trigger (`carried_by`)."""


#: The nested records, in the order the reference lists them.
RECORDS: tuple[type, ...] = (
    Turn,
    Escalated,
    TokenUsage,
    PreparedCallData,
    RetryRecord,
    Outcome,
    ToolResult,
    ToolError,
    Reconciled,
    Asserted,
    Settled,
    Risk,
    Proposal,
    StoodIn,
    ApprovalRecord,
    ForkOrigin,
    Carried,
    ChildRecord,
    FanOutRecord,
    ParentLink,
    NoteRecord,
    ClaimRecord,
)


def as_event_data(value: dict[str, Any]) -> EventData:
    """The decoded JSON of a stored data column, as the event data it is meant to be.

    The one place a stored object becomes `EventData`: a JSON object read back is taken as written, and
    replay's hash check is what says whether it was.
    """
    return cast(EventData, value)


def event_code(data: EventData) -> str | None:
    """The code an event carries, wherever its kind of step records it: a limit's, a model turn's, a tool outcome's
    (or the tool error the model saw). The CLI's code column, the API's, the demo and the transition log use it."""
    found = data.get("code")
    if not found:
        turn = data.get("turn")
        found = turn.get("code") if isinstance(turn, dict) else None
    if not found:
        outcome = data.get("outcome")
        found = outcome.get("code") if isinstance(outcome, dict) else None
    if not found:
        result = data.get("tool_result")
        error = result.get("error") if isinstance(result, dict) else None
        found = error.get("code") if isinstance(error, dict) else None
    return str(found) if found else None
