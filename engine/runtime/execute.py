"""Run a prepared tool call (or reconcile a lost one) with a timeout, and map whatever happens to an outcome.

Tools' only I/O (their declarations are `engine.core.tools`). The rule it enforces:
a write whose effect is uncertain is `unknown`, never `failed`. A timeout, an
exception that is not `ToolFailed`, or an unusable result from a write may all
follow a remote that did act; calling `failed` would invite a second attempt
under a new action id, and a second refund. `unknown` sends the task to
reconciliation by the same action id. A read has no effect, so it simply fails.

What the model and the log see of a failure is a code and a short message (the
exception's class name at most); the exception text and traceback go to the
`railyard.tools` server log, the text cut to 200 characters.

The tool runs in a daemon worker thread. Past the timeout the engine stops
waiting; the thread cannot be killed and may still finish (its late result is
logged and discarded), so implementations should set their own network timeout
below `ToolInvocation.timeout`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

from engine.core.errors import Code, Refused
from engine.core.payloads import Outcome
from engine.core.tools.call import Acting, PreparedToolCall, ToolInvocation, ToolKind
from engine.core.tools.catalog import Reconciled, ToolDef, ToolFailed
from engine.core.tools.results import accept_result, clean_text

log = logging.getLogger("railyard.tools")
T = TypeVar("T")
#: The longest message about a failure that reaches the model or the log's event data.
MAX_MESSAGE = 200
_LOG_TEXT = 200


@dataclass(frozen=True)
class ToolOutcome:
    """What one run of a tool came to: the data of the outcome transition (`succeeded`, `failed`, `unknown`)."""

    outcome: Literal["succeeded", "failed", "unknown"]
    result: dict[str, Any] | None
    code: Code | None
    message: str | None
    duration_ms: int

    def to_dict(self) -> Outcome:
        return {
            "outcome": self.outcome,
            "result": self.result,
            "code": str(self.code) if self.code is not None else None,
            "message": self.message,
            "duration_ms": self.duration_ms,
        }


@dataclass
class _Call:
    """A call running in a daemon thread; `abandoned` (under `lock`) once the caller stopped waiting."""

    done: threading.Event
    lock: threading.Lock
    value: Any = None
    error: BaseException | None = None
    abandoned: bool = False


def _run_with_timeout(fn: Callable[[], T], timeout: float, label: str) -> _Call:
    call = _Call(threading.Event(), threading.Lock())

    def target() -> None:
        try:
            call.value = fn()
        except BaseException as exc:  # everything is reported, nothing escapes the thread
            call.error = exc
        finally:
            with call.lock:
                call.done.set()
                late = call.abandoned
            if late:
                log.warning(
                    "%s finished after its timeout (%s); its outcome was not used",
                    label,
                    "error" if call.error is not None else "returned",
                )

    threading.Thread(target=target, name=f"railyard-{label}", daemon=True).start()
    if not call.done.wait(timeout):
        with call.lock:
            # Finished just as the wait ran out: use its answer rather than declare it lost.
            call.abandoned = not call.done.is_set()
    return call


def _log_exception(label: str, exc: BaseException) -> None:
    log.warning("%s raised %s: %s", label, type(exc).__name__, clean_text(str(exc), _LOG_TEXT))
    log.debug("%s traceback", label, exc_info=(type(exc), exc, exc.__traceback__))


def _short(text: str) -> str:
    return clean_text(text, MAX_MESSAGE)


def _elapsed_ms(started: float) -> int:
    return int((time.monotonic() - started) * 1000)


def execute(tool: ToolDef, prepared: PreparedToolCall, acting: Acting = Acting()) -> ToolOutcome:
    """Run `prepared` with `tool`: never raises for anything the tool does, only for a mismatched call.

    succeeded: the result passed `accept_result`. A read tool fails on a timeout,
    an exception or an invalid result; a write tool fails only when it raises
    `ToolFailed`, and is `unknown` in the other cases.
    """
    if prepared.tool != tool.name or prepared.kind is not tool.kind:
        raise Refused(
            f"prepared call for {prepared.tool} ({prepared.kind}) given to tool {tool.name} ({tool.kind})",
            code=Code.DEFINITION_CHANGED,
            tool=tool.name,
            action_id=prepared.action_id,
        )
    label = f"tool {tool.name} action {prepared.action_id}"
    uncertain: Literal["failed", "unknown"] = "unknown" if tool.kind is ToolKind.WRITE else "failed"
    invocation = ToolInvocation(prepared, tool.timeout, acting)
    started = time.monotonic()
    call = _run_with_timeout(lambda: tool.run(invocation), tool.timeout, label)
    elapsed = _elapsed_ms(started)
    if call.abandoned:
        log.warning("%s: no answer within %ss", label, tool.timeout)
        return ToolOutcome(uncertain, None, Code.TOOL_TIMEOUT, f"no answer within {tool.timeout:g}s", elapsed)
    if isinstance(call.error, ToolFailed):
        log.info("%s failed: %s", label, clean_text(call.error.reason, _LOG_TEXT))
        return ToolOutcome("failed", None, Code.TOOL_REMOTE_ERROR, _short(call.error.reason), elapsed)
    if call.error is not None:
        _log_exception(label, call.error)
        return ToolOutcome(
            uncertain, None, Code.TOOL_REMOTE_ERROR, f"remote error ({_short(type(call.error).__name__)})", elapsed
        )
    try:
        result = accept_result(tool, call.value)
    except Refused as refusal:
        log.warning("%s: %s", label, clean_text(refusal.message, _LOG_TEXT))
        return ToolOutcome(uncertain, None, refusal.code, _short(refusal.message), elapsed)
    return ToolOutcome("succeeded", result, None, None, elapsed)


def reconcile(tool: ToolDef, action_id: str) -> Reconciled:
    """Ask the remote what became of `action_id`, with the tool's timeout; never raises.

    Anything short of a clear answer (no reconcile function, a timeout, an
    exception, a malformed answer, a result that fails the result model) is
    `unknown`: the caller must not call the tool again on it.
    """
    label = f"reconcile {tool.name} action {action_id}"
    if tool.reconcile is None:
        return Reconciled.unknown("the tool has no reconcile function", Code.TOOL_EXECUTION_UNKNOWN)
    reconciler = tool.reconcile
    call = _run_with_timeout(lambda: reconciler(action_id), tool.timeout, label)
    if call.abandoned:
        log.warning("%s: no answer within %ss", label, tool.timeout)
        return Reconciled.unknown(f"no answer within {tool.timeout:g}s", Code.TOOL_TIMEOUT)
    if call.error is not None:
        _log_exception(label, call.error)
        return Reconciled.unknown(f"remote error ({_short(type(call.error).__name__)})", Code.TOOL_REMOTE_ERROR)
    answer = call.value
    if not isinstance(answer, Reconciled):
        log.warning("%s: answered a %s, not a Reconciled", label, type(answer).__name__)
        return Reconciled.unknown("reconcile gave no usable answer", Code.TOOL_RESULT_INVALID)
    if answer.outcome == "succeeded":
        try:
            return Reconciled.succeeded(accept_result(tool, answer.result))
        except Refused as refusal:
            log.warning("%s: %s", label, clean_text(refusal.message, _LOG_TEXT))
            return Reconciled.unknown(_short(refusal.message), Code.TOOL_RESULT_INVALID)
    if answer.outcome == "failed":
        return Reconciled.failed(_short(answer.reason or "the remote recorded a failure"))
    if answer.outcome == "not_found":
        return Reconciled.not_found()
    return Reconciled.unknown(
        _short(answer.reason or "the remote cannot tell yet"), answer.code or Code.TOOL_EXECUTION_UNKNOWN
    )


def outcome_of(reconciled: Reconciled, duration_ms: int = 0) -> ToolOutcome | None:
    """The outcome a reconciliation establishes, or None for `not_found` (a new attempt, same action id)."""
    if reconciled.outcome == "not_found":
        return None
    if reconciled.outcome == "succeeded":
        result = reconciled.result
        data = dict(result) if isinstance(result, Mapping) else result.model_dump(mode="json") if result else None
        return ToolOutcome("succeeded", data, None, None, duration_ms)
    if reconciled.outcome == "failed":
        return ToolOutcome("failed", None, Code.TOOL_REMOTE_ERROR, reconciled.reason, duration_ms)
    return ToolOutcome("unknown", None, reconciled.code or Code.TOOL_EXECUTION_UNKNOWN, reconciled.reason, duration_ms)
