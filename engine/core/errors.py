"""Every refusal Railyard can give, as one closed enum of stable codes.

Callers (the CLI, the HTTP API, a worker, an auditor's script) branch on the
code, never on message text, so a code is never renamed or reused. The
reference page `docs/errors.md` is checked against this enum by a test.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any


class Code(StrEnum):
    """Stable refusal and finding codes; `CODE_REFERENCE` below holds the reference text of each."""

    # Definitions and the registry
    DEFINITION_INVALID = "DEFINITION_INVALID"
    WORKFLOW_UNKNOWN = "WORKFLOW_UNKNOWN"
    VERSION_UNKNOWN = "VERSION_UNKNOWN"
    DEFINITION_MISSING = "DEFINITION_MISSING"
    DEFINITION_CHANGED = "DEFINITION_CHANGED"
    # Tasks and transitions
    TASK_NOT_FOUND = "TASK_NOT_FOUND"
    TASK_TERMINAL = "TASK_TERMINAL"
    TRIGGER_NOT_ALLOWED = "TRIGGER_NOT_ALLOWED"
    PAYLOAD_INVALID = "PAYLOAD_INVALID"
    DOMAIN_INVALID = "DOMAIN_INVALID"
    FORBIDDEN = "FORBIDDEN"
    CONCURRENCY_CONFLICT = "CONCURRENCY_CONFLICT"
    LEASE_LOST = "LEASE_LOST"
    # Model proposals (agent states): each spends a repair, except IDENTITY_OVERRIDE
    NO_ACTION = "NO_ACTION"
    OUTPUT_NOT_JSON = "OUTPUT_NOT_JSON"
    OUTPUT_SCHEMA_INVALID = "OUTPUT_SCHEMA_INVALID"
    ACTION_UNKNOWN = "ACTION_UNKNOWN"
    ACTION_NOT_ALLOWED = "ACTION_NOT_ALLOWED"
    MULTIPLE_ACTIONS = "MULTIPLE_ACTIONS"
    IDENTITY_OVERRIDE = "IDENTITY_OVERRIDE"
    REPAIRS_EXHAUSTED = "REPAIRS_EXHAUSTED"
    STATE_NOT_AGENT = "STATE_NOT_AGENT"
    MODEL_NOT_CONFIGURED = "MODEL_NOT_CONFIGURED"
    # Provider errors (a model call failed)
    TOOL_CHOICE_UNSUPPORTED = "TOOL_CHOICE_UNSUPPORTED"
    SCHEMA_UNSUPPORTED = "SCHEMA_UNSUPPORTED"
    RATE_LIMITED = "RATE_LIMITED"
    CONTEXT_OVERFLOW = "CONTEXT_OVERFLOW"
    PROVIDER_TIMEOUT = "PROVIDER_TIMEOUT"
    PROVIDER_AUTH = "PROVIDER_AUTH"
    CONTENT_FILTERED = "CONTENT_FILTERED"
    TRUNCATED = "TRUNCATED"
    EMPTY_RESPONSE = "EMPTY_RESPONSE"
    PROVIDER_ERROR = "PROVIDER_ERROR"
    # Tools
    TOOL_NOT_ALLOWED = "TOOL_NOT_ALLOWED"
    TOOL_ARGUMENT_INVALID = "TOOL_ARGUMENT_INVALID"
    TOOL_FORBIDDEN = "TOOL_FORBIDDEN"
    TOOL_NOT_FOUND = "TOOL_NOT_FOUND"
    TOOL_TIMEOUT = "TOOL_TIMEOUT"
    TOOL_REMOTE_ERROR = "TOOL_REMOTE_ERROR"
    TOOL_RESULT_INVALID = "TOOL_RESULT_INVALID"
    TOOL_EXECUTION_UNKNOWN = "TOOL_EXECUTION_UNKNOWN"
    OUTCOME_UNSETTLED = "OUTCOME_UNSETTLED"
    AGENT_STEP_LIMIT_EXCEEDED = "AGENT_STEP_LIMIT_EXCEEDED"
    INTERNAL_ERROR = "INTERNAL_ERROR"
    # Approvals
    APPROVAL_STALE = "APPROVAL_STALE"
    APPROVAL_FORBIDDEN = "APPROVAL_FORBIDDEN"
    TASK_NOT_AWAITING_APPROVAL = "TASK_NOT_AWAITING_APPROVAL"
    # Definition versions
    MIGRATION_INVALID = "MIGRATION_INVALID"
    # Configuration and callers
    CONFIG_INVALID = "CONFIG_INVALID"
    ACTOR_REQUIRED = "ACTOR_REQUIRED"
    # The store
    SCHEMA_MISSING = "SCHEMA_MISSING"
    DATABASE_ERROR = "DATABASE_ERROR"
    # Integrity of a task's log (found on load, and by replay)
    HASH_MISMATCH = "HASH_MISMATCH"
    SEQ_GAP = "SEQ_GAP"
    ILLEGAL_TRANSITION = "ILLEGAL_TRANSITION"
    INTENT_UNSETTLED = "INTENT_UNSETTLED"
    OUTCOME_WITHOUT_INTENT = "OUTCOME_WITHOUT_INTENT"
    STATE_MISMATCH = "STATE_MISMATCH"
    SNAPSHOT_MISMATCH = "SNAPSHOT_MISMATCH"
    ARCHIVE_MISSING = "ARCHIVE_MISSING"


#: One line per code: what it means and what the caller should do. docs/errors.md mirrors it.
CODE_REFERENCE: dict[Code, str] = {
    Code.DEFINITION_INVALID: "A workflow definition failed validation; every problem is listed at once.",
    Code.WORKFLOW_UNKNOWN: "No workflow of that name is registered (check RAILYARD_WORKFLOWS).",
    Code.VERSION_UNKNOWN: "The workflow exists but not in the version asked for.",
    Code.DEFINITION_MISSING: "A stored task is pinned to a name@version the running code does not define.",
    Code.DEFINITION_CHANGED: (
        "The definition's content digest differs from the one the task recorded when it "
        "started: the code changed without a new version."
    ),
    Code.TASK_NOT_FOUND: "No task with that id exists in this database.",
    Code.TASK_TERMINAL: "The task is in a terminal state; nothing can leave it.",
    Code.TRIGGER_NOT_ALLOWED: "The trigger is not one the task's current state allows.",
    Code.PAYLOAD_INVALID: "The payload (or start input) does not match its schema; the log is unchanged.",
    Code.DOMAIN_INVALID: "A domain guard of the transition refused it; the log is unchanged.",
    Code.FORBIDDEN: "The actor does not hold the role the transition requires.",
    Code.CONCURRENCY_CONFLICT: (
        "The task is no longer at the seq the command was decided on (another writer appended first, or the "
        "caller's expected_seq / If-Match is stale); nothing was written. Human commands are never retried into "
        "another meaning: look at the task again (the message names its state now) and decide again."
    ),
    Code.NO_ACTION: "The model answered without proposing an action (no tool call, empty output); a repair follows.",
    Code.OUTPUT_NOT_JSON: "The model's arguments or JSON answer do not parse as a JSON object; a repair follows.",
    Code.OUTPUT_SCHEMA_INVALID: (
        "The proposal's arguments fail the action's schema (types, extra fields); a repair follows."
    ),
    Code.ACTION_UNKNOWN: "The model named an action the workflow does not have; a repair follows.",
    Code.ACTION_NOT_ALLOWED: "The model named an action the current state does not allow it; a repair follows.",
    Code.MULTIPLE_ACTIONS: "The model proposed several actions in one turn; exactly one is allowed; a repair follows.",
    Code.IDENTITY_OVERRIDE: (
        "A proposal or payload tried to set an identity field (actor, tenant, customer, role): identity comes "
        "only from the trusted caller. A model that does this is handed to a human at once."
    ),
    Code.REPAIRS_EXHAUSTED: (
        "The model used its repair budget in this state; the task moved to the state's on_exhausted target."
    ),
    Code.STATE_NOT_AGENT: "A model step was asked for a task that is not in an agent state.",
    Code.MODEL_NOT_CONFIGURED: (
        "A model step needs a model: set RAILYARD_MODEL or pass one (scripted:PATH, openai:M, anthropic:M)."
    ),
    Code.TOOL_CHOICE_UNSUPPORTED: (
        "The provider refused the request's tool_choice; the ladder moves one rung down (no repair spent)."
    ),
    Code.SCHEMA_UNSUPPORTED: (
        "The provider refused native structured output; the ladder moves one rung down (no repair spent)."
    ),
    Code.RATE_LIMITED: (
        "The provider rate-limited the call; retried with backoff within a budget, never spending repairs."
    ),
    Code.CONTEXT_OVERFLOW: "The request exceeds the model's context window; not retried.",
    Code.PROVIDER_TIMEOUT: "The provider did not answer in time; retried with backoff within a budget.",
    Code.PROVIDER_AUTH: "The provider refused the credentials; not retried.",
    Code.CONTENT_FILTERED: "The provider's content filter stopped the answer; not retried.",
    Code.TRUNCATED: "The answer was cut at the output-token limit; not retried.",
    Code.EMPTY_RESPONSE: "The provider (or the scripted model, out of turns) returned nothing at all.",
    Code.PROVIDER_ERROR: "Any other provider failure, including an error event inside a 200 stream; not retried.",
    Code.TOOL_NOT_ALLOWED: "The tool is not one this state's actions may call.",
    Code.TOOL_ARGUMENT_INVALID: "The tool's arguments do not validate or normalise (types, money, time zones, enums).",
    Code.TOOL_FORBIDDEN: "The caller does not hold the role the tool requires.",
    Code.TOOL_NOT_FOUND: "The catalog has no tool of that name.",
    Code.TOOL_TIMEOUT: "The tool did not answer within its timeout.",
    Code.TOOL_REMOTE_ERROR: "The tool's remote system failed; details are in the server log only.",
    Code.TOOL_RESULT_INVALID: "The tool's result does not match its result model; it is not passed on.",
    Code.TOOL_EXECUTION_UNKNOWN: (
        "A write tool's outcome could not be established, even by reconciliation: a human decides."
    ),
    Code.OUTCOME_UNSETTLED: (
        "A write's outcome is open (its intent has no outcome yet, or the outcome was unknown): the task may not "
        "end, and a write the remote can neither deduplicate nor reconcile is not sent again, until it settles. "
        "A retry reconciles by action id; `railyard settle` records what an operator verified; a cancel waits."
    ),
    Code.AGENT_STEP_LIMIT_EXCEEDED: (
        "A task budget (model turns, tool calls, repeats of one call, deadline) ran out; the task moved to the "
        "workflow's limit state and the event names the budget."
    ),
    Code.INTERNAL_ERROR: (
        "A step raised an unexpected exception on every try; after the worker's retry limit the task moved to "
        "the limit state, the exception class in the event (the text in the server log)."
    ),
    Code.APPROVAL_STALE: "The approver named a prepared-call digest that is not the one awaiting approval.",
    Code.APPROVAL_FORBIDDEN: (
        "The approver lacks the role, or is the actor who started or proposed the task (separation of duties)."
    ),
    Code.TASK_NOT_AWAITING_APPROVAL: "The task is not in an approval state (already decided, cancelled, or elsewhere).",
    Code.MIGRATION_INVALID: (
        "A migration to another version was refused: the same version, a state map naming states that do not "
        "exist, the task's current state not in the map, a terminal task, or no reason given."
    ),
    Code.CONFIG_INVALID: "A setting is unusable (a workflow module that does not import, an unreadable roles file).",
    Code.ACTOR_REQUIRED: "Every write names the actor who made it; an empty or over-long actor is refused.",
    Code.LEASE_LOST: (
        "A worker's lease on the task was taken over (it expired and another worker claimed it): its append is "
        "refused even if its expected_seq still matches."
    ),
    Code.SCHEMA_MISSING: "The database has no Railyard schema: run `railyard db upgrade`.",
    Code.DATABASE_ERROR: "The database refused or failed the operation; details are in the server log.",
    Code.HASH_MISMATCH: "An event's hash or prev_hash does not match the chain: the log was edited.",
    Code.SEQ_GAP: "Event sequence numbers are not 1, 2, 3, ... without gaps or repeats.",
    Code.ILLEGAL_TRANSITION: (
        "Replay found an event the pinned definition does not allow: wrong source state, a trigger the state does "
        "not have, a target the trigger cannot reach, or guards other than the definition's."
    ),
    Code.INTENT_UNSETTLED: (
        "Replay found a task that reached a terminal state while a write's intent had no settled outcome: an "
        "effect may have happened that the log does not record."
    ),
    Code.OUTCOME_WITHOUT_INTENT: (
        "Replay found a write's outcome (succeeded or unknown) for an action id whose intent the log never "
        "recorded: the call was made outside the protocol, or its intent was removed."
    ),
    Code.STATE_MISMATCH: "The task row disagrees with the state folded from its events.",
    Code.SNAPSHOT_MISMATCH: "A snapshot disagrees with the fold of the events it claims to cache.",
    Code.ARCHIVE_MISSING: (
        "An archived task's file is not in the archive directory (RAILYARD_ARCHIVE_DIR), or does not hold its "
        "log: the task's history cannot be proven until the file is put back."
    ),
}


class RailyardError(Exception):
    """Base of every refusal: a stable `code`, a human message and structured details."""

    code: Code = Code.DATABASE_ERROR

    def __init__(self, message: str, *, code: Code | None = None, **details: Any) -> None:
        super().__init__(message)
        if code is not None:
            self.code = code
        self.message = message
        self.details = details

    def to_dict(self) -> dict[str, Any]:
        """The JSON shape every interface prints: `{code, message, details}`."""
        return {"code": str(self.code), "message": self.message, "details": self.details}

    def __str__(self) -> str:
        return f"{self.code}: {self.message}"


class Refused(RailyardError):
    """A domain refusal: the request was understood and declined; the log is unchanged."""


class DefinitionError(RailyardError):
    """A workflow definition is invalid. `problems` lists every defect found, not just the first."""

    code = Code.DEFINITION_INVALID

    def __init__(self, workflow: str, problems: list[str]) -> None:
        self.problems = list(problems)
        lines = "\n".join(f"  - {p}" for p in self.problems)
        super().__init__(f"workflow {workflow} is invalid:\n{lines}", workflow=workflow, problems=self.problems)


class ConcurrencyConflict(RailyardError):
    """Another writer got there first: nothing was written; reload and decide again."""

    code = Code.CONCURRENCY_CONFLICT

    def __init__(self, task_id: str, expected: int, actual: int | None, state: str | None = None) -> None:
        self.task_id = task_id
        self.expected = expected
        self.actual = actual
        self.state = state
        where = f"; it is now in {state!r} at seq {actual}" if state is not None else f", found {actual}"
        details: dict[str, Any] = {"task_id": task_id, "expected": expected, "actual": actual}
        if state is not None:
            details["state"] = state
        super().__init__(
            f"task {task_id} moved on since seq {expected}{where}"
            if state is not None
            else f"task {task_id}: expected seq {expected}{where}",
            **details,
        )


class StoreError(RailyardError):
    """A database failure, mapped to a code at the store boundary (the raw text goes to logs only)."""

    code = Code.DATABASE_ERROR


class IntegrityError(RailyardError):
    """A task's stored log does not hold together (edited, truncated, or out of step with its row)."""


class LeaseLost(ConcurrencyConflict):
    """The worker's lease was taken over: its write is refused (a fencing token, not only the seq)."""

    code = Code.LEASE_LOST

    def __init__(self, task_id: str, expected: int, actual: int | None, epoch: int, current_epoch: int) -> None:
        super().__init__(task_id, expected, actual)
        self.message = f"task {task_id}: lease epoch {epoch} was taken over (now {current_epoch})"
        self.details.update(epoch=epoch, current_epoch=current_epoch)
