"""Every refusal Railyard can give, as one closed enum of stable codes.

Callers (the CLI, the HTTP API, a worker, an auditor's script) branch on the
code, never on message text, so a code is never renamed or reused. The
reference page `docs/errors.md` is checked against this enum by a test.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any


class Category(StrEnum):
    """What kind of refusal or finding a code is: the CLI's exit status and the audit tables are read from it."""

    DEFINITION = "definition"  # a workflow definition or the registry
    TASK = "task"  # a trigger refused on a task
    PROPOSAL = "proposal"  # a model's proposal refused (a repair follows)
    PROVIDER = "provider"  # a model call failed
    TOOL = "tool"  # a tool call or its outcome
    APPROVAL = "approval"  # an approval decision refused
    MIGRATION = "migration"  # a move to another version refused
    CONFIG = "config"  # the process is set up wrong (exit 2, like a usage error)
    USAGE = "usage"  # a command typed wrong: an unknown option, a missing argument (exit 2)
    INTERNAL = "internal"  # a bug: an error Railyard does not expect (exit 1)
    CALLER = "caller"  # the caller named no usable actor
    STORE = "store"  # the database
    INTEGRITY = "integrity"  # a stored log that does not hold together (exit 3)


class Code(StrEnum):
    """Stable refusal and finding codes. Each member carries its `category` and its `reference` text (what it
    means and what to do), so no table elsewhere has to repeat which codes are which."""

    category: Category
    reference: str

    def __new__(cls, value: str, category: Category, reference: str) -> Code:
        member = str.__new__(cls, value)
        member._value_ = value
        member.category = category
        member.reference = reference
        return member

    # Definitions and the registry
    DEFINITION_INVALID = (
        "DEFINITION_INVALID",
        Category.DEFINITION,
        "A workflow definition failed validation; every problem is listed at once.",
    )
    WORKFLOW_UNKNOWN = (
        "WORKFLOW_UNKNOWN",
        Category.DEFINITION,
        "No workflow of that name is registered (check RAILYARD_WORKFLOWS).",
    )
    VERSION_UNKNOWN = "VERSION_UNKNOWN", Category.DEFINITION, "The workflow exists but not in the version asked for."
    DEFINITION_MISSING = (
        "DEFINITION_MISSING",
        Category.DEFINITION,
        "A stored task is pinned to a name@version the running code does not define.",
    )
    DEFINITION_CHANGED = (
        "DEFINITION_CHANGED",
        Category.DEFINITION,
        "The definition's content digest differs from the one the task recorded when it started: the code"
        " changed without a new version.",
    )
    # Tasks and transitions
    TASK_NOT_FOUND = "TASK_NOT_FOUND", Category.TASK, "No task with that id exists in this database."
    TASK_ID_AMBIGUOUS = (
        "TASK_ID_AMBIGUOUS",
        Category.TASK,
        "The task id given is a prefix (8 characters or more) of more than one task's id: give more of it (the"
        " message names two of them).",
    )
    TASK_TERMINAL = "TASK_TERMINAL", Category.TASK, "The task is in a terminal state; nothing can leave it."
    WORK_CLAIMED = (
        "WORK_CLAIMED",
        Category.TASK,
        "Someone else is on this work item: their claim has not expired and the task has not moved since they "
        "took it (the message names them and until when). Leave it to them, or take it over with a reason.",
    )
    TASK_BUSY = (
        "TASK_BUSY",
        Category.TASK,
        "A worker is running the task's step right now (it holds the task's lease): a note or a claim written now "
        "would make the worker throw that step's work away and pay for it again. Nothing was written; try again "
        "once the step is recorded (the message says until when the lease runs at the latest).",
    )
    TRIGGER_NOT_ALLOWED = (
        "TRIGGER_NOT_ALLOWED",
        Category.TASK,
        "The trigger is not one the task's current state allows.",
    )
    PAYLOAD_INVALID = (
        "PAYLOAD_INVALID",
        Category.TASK,
        "The payload (or start input) does not match its schema; the log is unchanged.",
    )
    DOMAIN_INVALID = (
        "DOMAIN_INVALID",
        Category.TASK,
        "A domain guard of the transition refused it; the log is unchanged.",
    )
    FORBIDDEN = "FORBIDDEN", Category.TASK, "The actor does not hold the role the transition requires."
    TENANT_REQUIRED = (
        "TENANT_REQUIRED",
        Category.TASK,
        "The caller belongs to several tenants and did not say which one the new task is for (`tenant`); "
        "nothing was written.",
    )
    CONCURRENCY_CONFLICT = (
        "CONCURRENCY_CONFLICT",
        Category.TASK,
        "The task is no longer at the seq the command was decided on (another writer appended first, or "
        "the caller's expected_seq / If-Match is stale); nothing was written. Human commands are never "
        "retried into another meaning: look at the task again (the message names its state now) and "
        "decide again.",
    )
    LEASE_LOST = (
        "LEASE_LOST",
        Category.TASK,
        "A worker's lease on the task was taken over (it expired and another worker claimed it): its "
        "append is refused even if its expected_seq still matches.",
    )
    # Model proposals (agent states): each spends a repair, except IDENTITY_OVERRIDE
    NO_ACTION = (
        "NO_ACTION",
        Category.PROPOSAL,
        "The model answered without proposing an action (no tool call, empty output); a repair follows.",
    )
    OUTPUT_NOT_JSON = (
        "OUTPUT_NOT_JSON",
        Category.PROPOSAL,
        "The model's arguments or JSON answer do not parse as a JSON object; a repair follows.",
    )
    OUTPUT_SCHEMA_INVALID = (
        "OUTPUT_SCHEMA_INVALID",
        Category.PROPOSAL,
        "The proposal's arguments fail the action's schema (types, extra fields); a repair follows.",
    )
    ACTION_UNKNOWN = (
        "ACTION_UNKNOWN",
        Category.PROPOSAL,
        "The model named an action the workflow does not have; a repair follows.",
    )
    ACTION_NOT_ALLOWED = (
        "ACTION_NOT_ALLOWED",
        Category.PROPOSAL,
        "The model named an action the current state does not allow it; a repair follows.",
    )
    MULTIPLE_ACTIONS = (
        "MULTIPLE_ACTIONS",
        Category.PROPOSAL,
        "The model proposed several actions in one turn; exactly one is allowed; a repair follows.",
    )
    IDENTITY_OVERRIDE = (
        "IDENTITY_OVERRIDE",
        Category.PROPOSAL,
        "A proposal or payload tried to set an identity field (actor, tenant, customer, role): identity "
        "comes only from the trusted caller. A model that does this is handed to a human at once.",
    )
    REPAIRS_EXHAUSTED = (
        "REPAIRS_EXHAUSTED",
        Category.PROPOSAL,
        "The model used its repair budget in this state; the task moved to the state's on_exhausted target.",
    )
    STATE_NOT_AGENT = (
        "STATE_NOT_AGENT",
        Category.PROPOSAL,
        "A model step was asked for a task that is not in an agent state.",
    )
    MODEL_NOT_CONFIGURED = (
        "MODEL_NOT_CONFIGURED",
        Category.CONFIG,
        "A model step needs a model: set RAILYARD_MODEL or pass one (scripted:PATH, openai:M, anthropic:M); or the "
        "provider's SDK found no credentials (OPENAI_API_KEY, ANTHROPIC_API_KEY or the SDK's other sources).",
    )
    # Provider errors (a model call failed)
    TOOL_CHOICE_UNSUPPORTED = (
        "TOOL_CHOICE_UNSUPPORTED",
        Category.PROVIDER,
        "The provider refused the request's tool_choice; every forced form (a named tool and `required`) is ruled"
        " out for that model and thinking setting, and the ladder moves below them (no repair spent).",
    )
    SCHEMA_UNSUPPORTED = (
        "SCHEMA_UNSUPPORTED",
        Category.PROVIDER,
        "The provider refused a request's schema; a refused strict schema rules out strict schemas (the rung is"
        " sent again, loose), a refused loose one moves the ladder one rung down (no repair spent).",
    )
    RATE_LIMITED = (
        "RATE_LIMITED",
        Category.PROVIDER,
        "The provider rate-limited the call; retried, never sooner than its Retry-After: briefly in the process, then"
        " as durable `backoff` events within the state's retry budget, never spending repairs.",
    )
    CONTEXT_OVERFLOW = (
        "CONTEXT_OVERFLOW",
        Category.PROVIDER,
        "The request exceeds the model's context window; not retried.",
    )
    PROVIDER_TIMEOUT = (
        "PROVIDER_TIMEOUT",
        Category.PROVIDER,
        "The provider did not answer in time; retried briefly in the process, then as durable `backoff` events"
        " within the state's retry budget.",
    )
    PROVIDER_AUTH = "PROVIDER_AUTH", Category.PROVIDER, "The provider refused the credentials; not retried."
    CONTENT_FILTERED = (
        "CONTENT_FILTERED",
        Category.PROVIDER,
        "The provider's content filter stopped the answer; not retried.",
    )
    TRUNCATED = "TRUNCATED", Category.PROVIDER, "The answer was cut at the output-token limit; not retried."
    EMPTY_RESPONSE = (
        "EMPTY_RESPONSE",
        Category.PROVIDER,
        "The provider (or the scripted model, out of turns) returned nothing at all.",
    )
    PROVIDER_ERROR = (
        "PROVIDER_ERROR",
        Category.PROVIDER,
        "Any other provider failure (a server error, an error event inside a 200 stream whose fields name nothing"
        " more specific; see the classification table below). A server error (5xx, or an error type that says the"
        " server failed) or a failed or cut connection is retried like RATE_LIMITED; any other is not.",
    )
    # Tools
    TOOL_NOT_ALLOWED = "TOOL_NOT_ALLOWED", Category.TOOL, "The tool is not one this state's actions may call."
    TOOL_ARGUMENT_INVALID = (
        "TOOL_ARGUMENT_INVALID",
        Category.TOOL,
        "The tool's arguments do not validate or normalise (types, money, time zones, enums).",
    )
    TOOL_FORBIDDEN = "TOOL_FORBIDDEN", Category.TOOL, "The caller does not hold the role the tool requires."
    TOOL_NOT_FOUND = "TOOL_NOT_FOUND", Category.TOOL, "The catalog has no tool of that name."
    TOOL_TIMEOUT = "TOOL_TIMEOUT", Category.TOOL, "The tool did not answer within its timeout."
    TOOL_REMOTE_ERROR = (
        "TOOL_REMOTE_ERROR",
        Category.TOOL,
        "The tool's remote system failed; details are in the server log only.",
    )
    TOOL_RESULT_INVALID = (
        "TOOL_RESULT_INVALID",
        Category.TOOL,
        "The tool's result does not match its result model; it is not passed on.",
    )
    TOOL_EXECUTION_UNKNOWN = (
        "TOOL_EXECUTION_UNKNOWN",
        Category.TOOL,
        "A write tool's outcome could not be established, even by reconciliation: a human decides.",
    )
    OUTCOME_UNSETTLED = (
        "OUTCOME_UNSETTLED",
        Category.TOOL,
        "A write's outcome is open (its intent has no outcome yet, or the outcome was unknown): the task "
        "may not end, and a write the remote can neither deduplicate nor reconcile is not sent again, "
        "until it settles. A retry reconciles by action id; `railyard settle` records what an operator "
        "verified; a cancel waits.",
    )
    CHILD_INPUT_INVALID = (
        "CHILD_INPUT_INVALID",
        Category.TASK,
        "A child state's input builder gave an input the child workflow's input model refuses (or raised): no"
        " child was started, and the step fails like any other (a worker tries again, then hands the task to its"
        " limit state). Fix the builder in a new version of the parent workflow.",
    )
    CHILD_RESULT_INVALID = (
        "CHILD_RESULT_INVALID",
        Category.TASK,
        "A child ended, and its result could not be read into the child state's result model: the end is recorded"
        " with this code and the parent goes to the state's `otherwise` target.",
    )
    CHILD_BUDGET_EXCEEDED = (
        "CHILD_BUDGET_EXCEEDED",
        Category.TASK,
        "A child state would start more child tasks than the workflow's `Budgets.children` allows (a fan-out's N"
        " counts whole): no child was started and nothing was recorded; the step fails like any other (a worker"
        " tries again, then hands the task to its limit state).",
    )
    AGENT_STEP_LIMIT_EXCEEDED = (
        "AGENT_STEP_LIMIT_EXCEEDED",
        Category.TOOL,
        "A task budget (model turns, tool calls, repeats of one call, deadline) ran out; the task moved "
        "to the workflow's limit state and the event names the budget.",
    )
    INTERNAL_ERROR = (
        "INTERNAL_ERROR",
        Category.TOOL,
        "A step raised an unexpected exception on every try; after the worker's retry limit the task "
        "moved to the limit state, the exception class in the event (the text in the server log).",
    )
    # Approvals
    APPROVAL_STALE = (
        "APPROVAL_STALE",
        Category.APPROVAL,
        "The approver named a prepared-call digest that is not the one awaiting approval.",
    )
    DIGEST_TOO_SHORT = (
        "DIGEST_TOO_SHORT",
        Category.APPROVAL,
        "The digest given to approve is shorter than the 12 characters `railyard approvals` shows: give at least"
        " that much of it (or all 64).",
    )
    DIGEST_INVALID = (
        "DIGEST_INVALID",
        Category.APPROVAL,
        "The digest given to approve is not hexadecimal (a digest is 64 characters 0-9 and a-f, or the first 12"
        " or more of them): copy it again from `railyard approvals`.",
    )
    DIGEST_AMBIGUOUS = (
        "DIGEST_AMBIGUOUS",
        Category.APPROVAL,
        "The digest prefix given to approve matches more than one prepared call in the task's history: give"
        " more of it, so that it names the call you reviewed and no other.",
    )
    APPROVAL_FORBIDDEN = (
        "APPROVAL_FORBIDDEN",
        Category.APPROVAL,
        "The approver lacks the role, or is the actor who started or proposed the task (separation of duties).",
    )
    TASK_NOT_AWAITING_APPROVAL = (
        "TASK_NOT_AWAITING_APPROVAL",
        Category.APPROVAL,
        "The task is not in an approval state (already decided, cancelled, or elsewhere).",
    )
    # Definition versions
    MIGRATION_INVALID = (
        "MIGRATION_INVALID",
        Category.MIGRATION,
        "A migration to another version was refused: the same version, a state map naming states that do "
        "not exist, the task's current state not in the map, a terminal task, or no reason given.",
    )
    # Forks and redrives (Engine.fork, Engine.redrive)
    FORK_INVALID = (
        "FORK_INVALID",
        Category.TASK,
        "A fork was refused: the seq is not in the source's log, the state there is terminal (nothing would run),"
        " the target version lacks that state or fails the checks `migrate` makes, or no reason was given. The"
        " source is unchanged and no task was created.",
    )
    REDRIVE_INVALID = (
        "REDRIVE_INVALID",
        Category.TASK,
        "A redrive was refused: the task is not in a hand-off or limit state, the target is not an agent or tool"
        " state the task has visited, a tool target has no prepared call for its tool, or no reason was given;"
        " the log is unchanged.",
    )
    WRITE_WOULD_REPEAT = (
        "WRITE_WOULD_REPEAT",
        Category.TOOL,
        "A fork or redrive was refused because it could make a write a second time: a write's outcome is open"
        " there, or the log after that point holds a write that executed or may have (or, for a fork, a write"
        " the still-running source may yet make). The message names the tool, the action id and the seq; fork"
        " or redrive after that write's outcome is on record.",
    )
    # Configuration and callers
    CONFIG_INVALID = (
        "CONFIG_INVALID",
        Category.CONFIG,
        "A setting is unusable (a workflow module that does not import, an unreadable roles file).",
    )
    DATABASE_URL_INVALID = (
        "DATABASE_URL_INVALID",
        Category.CONFIG,
        "RAILYARD_DATABASE_URL is not a database URL Railyard can use (a misspelt scheme, `sqlite://` with two"
        " slashes, a bare path); the message names the problem and the expected forms: `sqlite:///relative.db`,"
        " `sqlite:////absolute/path.db`, `postgresql+psycopg://USER:PASSWORD@HOST:PORT/DATABASE`.",
    )
    DATABASE_UNREACHABLE = (
        "DATABASE_UNREACHABLE",
        Category.CONFIG,
        "The database server did not answer or refused the connection; the message names the host, port,"
        " database and user (never the password) and the server's reason. Start the server, or fix the URL.",
    )
    DATABASE_NOT_FOUND = (
        "DATABASE_NOT_FOUND",
        Category.CONFIG,
        "The database RAILYARD_DATABASE_URL names does not exist: no SQLite file at that path (only"
        " `railyard db upgrade` creates one), a folder that does not exist, or no such PostgreSQL database"
        " on the server (create it, then `railyard db upgrade`).",
    )
    DATABASE_FILE_INVALID = (
        "DATABASE_FILE_INVALID",
        Category.CONFIG,
        "The file RAILYARD_DATABASE_URL names is not a SQLite database (a text file, another program's file):"
        " point the URL at the right file.",
    )
    DATABASE_READ_ONLY = (
        "DATABASE_READ_ONLY",
        Category.CONFIG,
        "The database refused a write because it is read-only to this process (a SQLite file, or its folder, that"
        " this user may not write; a PostgreSQL replica or read-only transaction); the message names the file"
        " or server. Give this user write access, or point RAILYARD_DATABASE_URL at a writable database.",
    )
    USAGE_INVALID = (
        "USAGE_INVALID",
        Category.USAGE,
        "The command was typed wrong (an unknown option, a missing or malformed argument, bytes that are not"
        " text); the message says which, and `railyard COMMAND --help` shows the usage. Nothing was done.",
    )
    EXPORT_INVALID = (
        "EXPORT_INVALID",
        Category.USAGE,
        "The file given to `verify-export` is not an export at all (empty, or no line of it is an export line):"
        " nothing was checked. An export whose lines were edited is reported by its findings instead (exit 3).",
    )
    EVAL_INVALID = (
        "EVAL_INVALID",
        Category.USAGE,
        "An evaluation command cannot do what it was asked, and did nothing: `eval capture` was given a state in"
        " which the task never took a model turn, or `eval run` a file that is not a railyard-eval/1 case (or a"
        " case whose workflow or agent state this process does not define). The message says which.",
    )
    EVAL_REGRESSION = (
        "EVAL_REGRESSION",
        Category.PROPOSAL,
        "`eval run --max-regression` found a model or workflow version doing worse than the stored baseline: its"
        " share of expectations met, or of cases accepted at the first try, fell by more than the margin. The"
        " message names each variant, the share and the baseline's; the table above it shows the cases.",
    )
    UNEXPECTED_ERROR = (
        "UNEXPECTED_ERROR",
        Category.INTERNAL,
        "A command stopped on an error Railyard does not expect (a bug: please report it). The line names the"
        " exception; RAILYARD_DEBUG=1 prints its traceback. Every write is one transaction: none is half-done.",
    )
    ACTOR_REQUIRED = (
        "ACTOR_REQUIRED",
        Category.CALLER,
        "Every write names the actor who made it; an empty or over-long actor is refused.",
    )
    LOGIN_THROTTLED = (
        "LOGIN_THROTTLED",
        Category.CALLER,
        "Too many failed logins to the pages from this address or for this account: every login from it (or to"
        " it) is refused until the window in Retry-After has passed, even with a valid token.",
    )
    OIDC_REFUSED = (
        "OIDC_REFUSED",
        Category.CALLER,
        "A sign-in through OpenID Connect was refused and no session was opened: the provider's answer did not"
        " match the sign-in this browser started (state), or its ID token did not hold (signature, issuer, an"
        " audience other than this server's client id, expired, nonce), or the provider refused the code or the"
        " person. The message and `details.reason` say which; it counts as a failed login. Sign in again.",
    )
    OIDC_UNAVAILABLE = (
        "OIDC_UNAVAILABLE",
        Category.CALLER,
        "The OpenID Connect provider could not be reached, or answered something that is no OpenID provider's"
        " answer (its discovery document, its keys, its token endpoint); the message names which. Nothing was"
        " opened and no failed login is counted: try again once the provider is back.",
    )
    USER_NOT_FOUND = (
        "USER_NOT_FOUND",
        Category.CALLER,
        "No person of that name is kept in the database (`railyard users list` shows who is): nothing was changed.",
    )
    USER_EXISTS = (
        "USER_EXISTS",
        Category.CALLER,
        "The name is taken: by a person (in any letter case), by a live database token's actor, or, for a sign-in"
        " through another source (OpenID Connect), by a local person it may not take over. Nothing was changed.",
    )
    TOKEN_NOT_FOUND = (
        "TOKEN_NOT_FOUND",
        Category.CALLER,
        "No database token's sha256 starts with the prefix given, or the token it names was revoked already"
        " (`railyard tokens list` shows them; a token of the tokens file is revoked by deleting its entry).",
    )
    # Webhooks
    WEBHOOK_KIND_UNKNOWN = (
        "WEBHOOK_KIND_UNKNOWN",
        Category.CALLER,
        "A webhook subscription asked for a kind Railyard does not send (work.created[:ROLE], deadline.near:HOURS,"
        " task.ended, payment.failed, breaker.opened), or gave a kind a parameter it does not take. Nothing was kept.",
    )
    WEBHOOK_URL_INVALID = (
        "WEBHOOK_URL_INVALID",
        Category.CALLER,
        "A webhook's URL is not an http or https URL with a host. Nothing was kept.",
    )
    WEBHOOK_FORMAT_UNKNOWN = (
        "WEBHOOK_FORMAT_UNKNOWN",
        Category.CALLER,
        "A webhook's format is neither `standard` (Standard Webhooks JSON) nor `slack` (an incoming webhook's"
        " text). Nothing was kept.",
    )
    WEBHOOK_SECRET_INVALID = (
        "WEBHOOK_SECRET_INVALID",
        Category.CALLER,
        "A webhook secret given is not `whsec_` and base64 of 16 bytes or more. Nothing was kept.",
    )
    WEBHOOK_NOT_FOUND = (
        "WEBHOOK_NOT_FOUND",
        Category.CALLER,
        "No webhook subscription (or delivery, for `replay`) has that id (`railyard webhooks list` and"
        " `railyard webhooks deliveries` show them). Nothing was changed.",
    )
    # The store
    SCHEMA_MISSING = (
        "SCHEMA_MISSING",
        Category.CONFIG,
        "The database has no Railyard schema: run `railyard db upgrade`.",
    )
    SCHEMA_NOT_AT_HEAD = (
        "SCHEMA_NOT_AT_HEAD",
        Category.STORE,
        "The database's schema is not at the revision this release's migrations end at (`/readyz` answers 503): "
        "run `railyard db upgrade`, or, if a newer release migrated it, run that release.",
    )
    DATABASE_ERROR = (
        "DATABASE_ERROR",
        Category.STORE,
        "The database refused or failed the operation; details are in the server log.",
    )
    # Integrity of a task's log (found on load, and by replay)
    HASH_MISMATCH = (
        "HASH_MISMATCH",
        Category.INTEGRITY,
        "An event's hash or prev_hash does not match the chain: the log was edited.",
    )
    SEQ_GAP = "SEQ_GAP", Category.INTEGRITY, "Event sequence numbers are not 1, 2, 3, ... without gaps or repeats."
    ILLEGAL_TRANSITION = (
        "ILLEGAL_TRANSITION",
        Category.INTEGRITY,
        "Replay found an event the pinned definition does not allow: wrong source state, a trigger the "
        "state does not have, a target the trigger cannot reach, or guards other than the definition's.",
    )
    INTENT_UNSETTLED = (
        "INTENT_UNSETTLED",
        Category.INTEGRITY,
        "Replay found a task that reached a terminal state while a write's intent had no settled outcome:"
        " an effect may have happened that the log does not record.",
    )
    OUTCOME_WITHOUT_INTENT = (
        "OUTCOME_WITHOUT_INTENT",
        Category.INTEGRITY,
        "Replay found a write's outcome (succeeded or unknown) for an action id whose intent the log "
        "never recorded: the call was made outside the protocol, or its intent was removed.",
    )
    FORK_ORIGIN_MISMATCH = (
        "FORK_ORIGIN_MISMATCH",
        Category.INTEGRITY,
        "Replay found a fork whose first event does not match its source: the source's log holds another hash"
        " at the seq the fork names, or the state the fork carries is not the source's state as of that seq.",
    )
    FORK_ORIGIN_MISSING = (
        "FORK_ORIGIN_MISSING",
        Category.INTEGRITY,
        "Replay found a fork whose source task is gone from the database and its archives (or ends before the"
        " seq the fork names): where the fork came from cannot be proven.",
    )
    CHILD_LINK_MISMATCH = (
        "CHILD_LINK_MISMATCH",
        Category.INTEGRITY,
        "Replay found a link between a parent and a child task that does not hold both ways: a child whose first"
        " event names a parent whose log does not start it there (task id, seq, action id, workflow, input), or a"
        " parent whose log starts a child that names another parent or none.",
    )
    CHILD_MISSING = (
        "CHILD_MISSING",
        Category.INTEGRITY,
        "Replay found a parent whose log says a child exists (or ended), and no such task is in the database or its"
        " archives; or a child whose parent is gone from both.",
    )
    CHILD_RESULT_MISMATCH = (
        "CHILD_RESULT_MISMATCH",
        Category.INTEGRITY,
        "Replay found a parent that recorded a child's end which the child's log does not hold: another terminal"
        " state, seq or hash than the child's, or a result that is not what the child state's result model reads"
        " from the child's final state.",
    )
    STATE_MISMATCH = (
        "STATE_MISMATCH",
        Category.INTEGRITY,
        "The task row disagrees with the state folded from its events.",
    )
    SNAPSHOT_MISMATCH = (
        "SNAPSHOT_MISMATCH",
        Category.INTEGRITY,
        "A snapshot disagrees with the fold of the events it claims to cache.",
    )
    ARCHIVE_MISSING = (
        "ARCHIVE_MISSING",
        Category.INTEGRITY,
        "An archived task's file is not in the archive directory (RAILYARD_ARCHIVE_DIR), or does not hold"
        " its log: the task's history cannot be proven until the file is put back.",
    )
    FIELDS_WITHHELD = (
        "FIELDS_WITHHELD",
        Category.INTEGRITY,
        "An export shows some events with values withheld (`[restricted]`): it was made with `--as` for a reader"
        " whose roles may not see fields the workflow restricts. Their seq, links, legality and fold are checked;"
        " their hashes cannot be recomputed, so the export does not prove their content. Ask for an export made"
        " without --as, or as an auditor.",
    )
    # Against a signed checkpoint (railyard replay --checkpoint, verify-export --checkpoint, checkpoint verify)
    TASK_MISSING = (
        "TASK_MISSING",
        Category.INTEGRITY,
        "A task the signed checkpoint lists is gone from the database and from the archives: it was deleted.",
    )
    TASK_TRUNCATED = (
        "TASK_TRUNCATED",
        Category.INTEGRITY,
        "A task's log ends before the seq the signed checkpoint recorded: events were removed from its end.",
    )
    HEAD_REWRITTEN = (
        "HEAD_REWRITTEN",
        Category.INTEGRITY,
        "At the seq the signed checkpoint recorded, the task's log holds another event: its history was"
        " rewritten, even if every hash was recomputed.",
    )
    CHECKPOINT_INVALID = (
        "CHECKPOINT_INVALID",
        Category.INTEGRITY,
        "The checkpoint does not verify: its signature fails with the public key given, or its task list"
        " does not hash to the root it signs. Nothing can be proven with it.",
    )
    CHECKPOINT_NOT_EXTENDING = (
        "CHECKPOINT_NOT_EXTENDING",
        Category.INTEGRITY,
        "A newer checkpoint does not extend an older one: a task of the older one is missing from it, its"
        " head there does not descend from the older head in the database's logs, or it was taken earlier.",
    )


#: One line per code: what it means and what the caller should do (docs/errors.md is generated from it).
CODE_REFERENCE: dict[Code, str] = {code: code.reference for code in Code}
#: What replay, `verify-export` and `ReplayReport.findings` report: the integrity codes, and a pinned definition
#: the running code does not have (or has other code under).
REPLAY_FINDINGS: tuple[Code, ...] = tuple(
    code
    for code in Code
    if code.category is Category.INTEGRITY or code in (Code.DEFINITION_MISSING, Code.DEFINITION_CHANGED)
)


class RailyardError(Exception):
    """Base of every refusal: a stable `code`, a human message and structured details.

    `code` is required: an error cannot be raised without saying which one it is (its meaning is the code's
    `reference`, its kind the code's `category`).
    """

    code: Code

    def __init__(self, message: str, *, code: Code, **details: Any) -> None:
        super().__init__(message)
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

    def __init__(self, workflow: str, problems: list[str]) -> None:
        self.problems = list(problems)
        lines = "\n".join(f"  - {p}" for p in self.problems)
        super().__init__(
            f"workflow {workflow} is invalid:\n{lines}",
            code=Code.DEFINITION_INVALID,
            workflow=workflow,
            problems=self.problems,
        )


class ConcurrencyConflict(RailyardError):
    """Another writer got there first: nothing was written; reload and decide again."""

    def __init__(
        self,
        task_id: str,
        expected: int,
        actual: int | None,
        state: str | None = None,
        *,
        code: Code = Code.CONCURRENCY_CONFLICT,
        by: str | None = None,
        trigger: str | None = None,
        to_state: str | None = None,
    ) -> None:
        self.task_id = task_id
        self.expected = expected
        self.actual = actual
        self.state = state
        where = f"; it is now in {state!r} at seq {actual}" if state is not None else f", found {actual}"
        details: dict[str, Any] = {"task_id": task_id, "expected": expected, "actual": actual}
        if state is not None:
            details["state"] = state
        if by is not None:  # who changed it first, and how: what a person refused needs to hear, not only a seq
            details.update(changed_by=by, changed_with=trigger, changed_to=to_state)
            where = f"; {by} changed it ({trigger!r} to {to_state!r}){where}"
        super().__init__(
            f"task {task_id} moved on since seq {expected}{where}"
            if state is not None
            else f"task {task_id}: expected seq {expected}{where}",
            code=code,
            **details,
        )


class StoreError(RailyardError):
    """A database failure, mapped to a code at the store boundary (the raw text goes to logs only).

    `transient`: the database did not answer, or dropped the connection (the driver's operational errors), so the
    same write may go through once it does; a refused write (a constraint, a missing schema) is not.
    """

    transient: bool = False


class IntegrityError(RailyardError):
    """A task's stored log does not hold together (edited, truncated, or out of step with its row)."""


class LeaseLost(ConcurrencyConflict):
    """The worker's lease was taken over: its write is refused (a fencing token, not only the seq)."""

    def __init__(self, task_id: str, expected: int, actual: int | None, epoch: int, current_epoch: int) -> None:
        super().__init__(task_id, expected, actual, code=Code.LEASE_LOST)
        self.message = f"task {task_id}: lease epoch {epoch} was taken over (now {current_epoch})"
        self.details.update(epoch=epoch, current_epoch=current_epoch)
