"""Read one model answer as a proposal and decide what it becomes: pure, no I/O.

Layers, in order, each with its code: one action at all (`NO_ACTION`,
`MULTIPLE_ACTIONS`), parse (`OUTPUT_NOT_JSON`), the action known and allowed
here (`ACTION_UNKNOWN`, `ACTION_NOT_ALLOWED`), then the engine's own `decide`:
identity fields (`IDENTITY_OVERRIDE`), schema (`OUTPUT_SCHEMA_INVALID`), domain
guards (`DOMAIN_INVALID`), permission. A repairable failure spends one repair
while the budget lasts, then hands the task off; the others hand off at once.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Literal

from engine.core.arguments import redact, sensitive_fields
from engine.core.decide import decide
from engine.core.definition import HAND_OFF, REPAIR, Agent, Workflow
from engine.core.errors import Code, Refused
from engine.core.forcing import ENVELOPE_ERROR, MODE_OF_RUNG, Rung, model_actions
from engine.core.model_interface import Message, ModelResponse, ToolCall
from engine.core.payloads import EventData
from engine.core.task import TaskState
from engine.core.text import clean

REPAIRABLE = frozenset(
    {
        Code.NO_ACTION,
        Code.OUTPUT_NOT_JSON,
        Code.OUTPUT_SCHEMA_INVALID,
        Code.ACTION_NOT_ALLOWED,
        Code.ACTION_UNKNOWN,
        Code.MULTIPLE_ACTIONS,
        Code.DOMAIN_INVALID,
    }
)
_FENCE = re.compile(r"^\s*```(?:json)?\s*(.*?)\s*```\s*$", re.DOTALL)
_REFUSAL_CODES = {
    Code.PAYLOAD_INVALID: Code.OUTPUT_SCHEMA_INVALID,
    Code.TOOL_ARGUMENT_INVALID: Code.OUTPUT_SCHEMA_INVALID,
    Code.TRIGGER_NOT_ALLOWED: Code.ACTION_NOT_ALLOWED,
}


@dataclass(frozen=True)
class TurnOutcome:
    """What one model turn becomes: exactly one event."""

    kind: Literal["accept", "repair", "hand_off"]
    trigger: str
    to_state: str
    code: Code | None
    data: EventData = field(default_factory=lambda: EventData())
    errors: list[dict[str, Any]] = field(default_factory=list)
    messages: list[Message] = field(default_factory=list)


class _Invalid(Exception):
    def __init__(self, code: Code, errors: list[dict[str, Any]] | None = None) -> None:
        super().__init__(code)
        self.code = code
        self.errors = errors or []


def _parse_object(text: str) -> dict[str, Any]:
    fenced = _FENCE.match(text)
    try:
        value = json.loads(fenced.group(1) if fenced else text)
    except (json.JSONDecodeError, RecursionError):
        raise _Invalid(Code.OUTPUT_NOT_JSON, [{"loc": [], "msg": "not valid JSON", "type": "json"}]) from None
    if not isinstance(value, dict):
        raise _Invalid(Code.OUTPUT_NOT_JSON, [{"loc": [], "msg": "expected a JSON object", "type": "json"}])
    return value


def extract(response: ModelResponse, rung: Rung) -> tuple[str, dict[str, Any]]:
    """The one (action, arguments) the answer proposes, or `_Invalid` with the first layer's code."""
    if len(response.tool_calls) > 1:
        raise _Invalid(
            Code.MULTIPLE_ACTIONS,
            [{"loc": [], "msg": f"{len(response.tool_calls)} calls; exactly one", "type": "count"}],
        )
    if response.tool_calls:
        call = response.tool_calls[0]
        return call.name, _parse_object(call.arguments or "{}")
    if MODE_OF_RUNG[rung] == "structured" and response.text.strip():
        envelope = _parse_object(response.text)
        action, arguments = envelope.get("action"), envelope.get("arguments", {})
        if not isinstance(action, str) or not isinstance(arguments, dict) or set(envelope) - {"action", "arguments"}:
            raise _Invalid(
                Code.OUTPUT_SCHEMA_INVALID,
                [{"loc": [], "msg": 'expected {"action": NAME, "arguments": {...}}', "type": ENVELOPE_ERROR}],
            )
        return action, arguments
    raise _Invalid(Code.NO_ACTION, [{"loc": [], "msg": "no action proposed", "type": "missing"}])


def interpret(definition: Workflow, task: TaskState, response: ModelResponse, rung: Rung, *, actor: str) -> TurnOutcome:
    """Decide what the model's answer becomes, and what is recorded of it."""
    state = definition.state(task.state)
    assert isinstance(state, Agent)
    allowed = [a.name for a in model_actions(state)]
    assistant = Message(
        "assistant",
        clean(response.text),
        tuple(
            ToolCall(c.id, clean(c.name, 200), clean(_redacted_arguments(state, c)), c.extra)
            for c in response.tool_calls
        ),
        reasoning=response.reasoning,
        reasoning_blocks=response.reasoning_blocks,
    )
    try:
        name, arguments = extract(response, rung)
        if name not in allowed:
            known = any(a.name == name for _, a in definition.transitions())
            raise _Invalid(
                Code.ACTION_NOT_ALLOWED if known else Code.ACTION_UNKNOWN,
                [{"loc": ["action"], "msg": "not an allowed action here", "type": "action"}],
            )
        try:
            decision = decide(definition, task, name, arguments, actor=actor, by_model=True)
        except Refused as refusal:
            code = _REFUSAL_CODES.get(refusal.code, refusal.code)
            errors = refusal.details.get("errors") or [
                {"loc": [], "msg": m, "type": str(code).lower()}
                for m in refusal.details.get("reasons", [refusal.message])
            ]
            raise _Invalid(code, errors) from None
    except _Invalid as invalid:
        return _refusal(state, task, invalid, assistant, response, allowed)
    data = decision.data.copy()
    data["proposal"] = {"action": name}
    return TurnOutcome("accept", decision.trigger, decision.to_state, None, data, messages=[assistant])


def _redacted_arguments(state: Agent, call: ToolCall) -> str:
    """The call's arguments as the log keeps them: sensitive fields of the named action hidden."""
    action = next((a for a in model_actions(state) if a.name == call.name), None)
    if action is None or not sensitive_fields(action.args):
        return call.arguments
    try:
        values = json.loads(call.arguments)
    except (json.JSONDecodeError, RecursionError):
        return call.arguments
    return json.dumps(redact(action.args, values)) if isinstance(values, dict) else call.arguments


def _refusal(
    state: Agent, task: TaskState, invalid: _Invalid, assistant: Message, response: ModelResponse, allowed: list[str]
) -> TurnOutcome:
    feedback = {"error": str(invalid.code), "errors": invalid.errors, "allowed_actions": allowed}
    text = json.dumps(feedback, ensure_ascii=False, sort_keys=True)
    if response.tool_calls:
        replies = [Message("tool", text, tool_call_id=c.id) for c in response.tool_calls]
    else:
        replies = [Message("user", f"<error>{text}</error>")]
    messages = [assistant, *replies]
    repairs = int(task.visit.get("repairs", 0))
    if invalid.code in REPAIRABLE and repairs < state.max_repairs:
        return TurnOutcome(
            "repair", REPAIR, f"{state.base}~force", invalid.code, errors=invalid.errors, messages=messages
        )
    code = invalid.code if invalid.code not in REPAIRABLE else Code.REPAIRS_EXHAUSTED
    data: EventData = {"last_code": str(invalid.code)} if code is Code.REPAIRS_EXHAUSTED else {}
    return TurnOutcome(
        "hand_off", HAND_OFF, state.exhausted_target, code, data, errors=invalid.errors, messages=messages
    )
