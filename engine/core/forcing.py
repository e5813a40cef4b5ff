"""The forcing ladder: how to ask a model for exactly one allowed action, given what the provider accepts.

Pure: from the definition, the task and the capability profile it builds the
request; nothing here calls a model. Rungs, highest first:

1. `native_schema`: the provider's native JSON-schema output (strict or loose).
2. `named_tool`: `tool_choice` naming the one allowed tool (a state with one action).
3. `required`: the allowed set as tools, `tool_choice: required`.
4. `auto_reminder`: the allowed set as tools, `tool_choice: auto` (or no field at all
   where the provider takes none), and a reminder to call exactly one.
5. `json_instructions`: no tools; the schema in the instructions, JSON mode where offered.

A rung is skipped when the profile (with thinking on or off) does not allow it,
and when this task already saw the provider refuse it (`demoted`). A refused
strict schema is a shape of its own (`STRICT_SCHEMA`): it rules out `strict`
everywhere, not the rung.

A provider that accepts a request and the model ignores it is the other way a
rung fails: prose where a call or JSON was asked, a call of no offered tool,
JSON that ignores the envelope. The next attempt then escalates (`escalate`), in
the order the profile declares: restate the mode's reminder in the role the
provider obeys, or move to the next rung down. A rung that finally worked after
escalating is remembered (`worked`) like a refused one, so the next visit starts
there.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum
from functools import lru_cache
from typing import Any, Literal

from pydantic import BaseModel

from engine.core.definition import Action, Agent, Workflow
from engine.core.errors import Code
from engine.core.fold import NOTE_FACT
from engine.core.model_interface import Message, ModelRequest, ResponseSchema, ToolSpec
from engine.core.payloads import Escalated
from engine.core.profiles import CapabilityProfile
from engine.core.task import TaskState
from engine.core.tools.results import (
    NOTE_NOTICE,
    RESULT_NOTICE,
    wrap_error_for_model,
    wrap_for_model,
    wrap_note_for_model,
)


class Rung(StrEnum):
    NATIVE_SCHEMA = "native_schema"
    NAMED_TOOL = "named_tool"
    REQUIRED = "required"
    AUTO_REMINDER = "auto_reminder"
    JSON_INSTRUCTIONS = "json_instructions"


#: Which conversation mode a rung puts the model in; a reminder marks each change of mode.
MODE_OF_RUNG = {
    Rung.NATIVE_SCHEMA: "structured",
    Rung.NAMED_TOOL: "tools",
    Rung.REQUIRED: "tools",
    Rung.AUTO_REMINDER: "tools_auto",
    Rung.JSON_INSTRUCTIONS: "structured",
}


#: A rung's place on the ladder: a visit only ever moves down it.
RANK = {rung: index for index, rung in enumerate(Rung)}


#: Not a rung but a shape every rung may carry: a strict JSON schema (`response_format` strict, strict tools).
STRICT_SCHEMA = "strict_schema"
#: Not a rung but the one optional shape of the bottom rung: JSON mode (`response_format: json_object`). Once
#: refused, `json_instructions` is sent with the schema in the instructions only, which no provider can refuse.
JSON_MODE = "json_mode"


def demotion_key(profile: CapabilityProfile, model: str, thinking: bool, rung: Rung | str) -> str:
    """How a refused rung (or `STRICT_SCHEMA`), or one that worked after escalating, is remembered: per
    (profile, model, thinking)."""
    return f"{profile.name}:{model}:{'thinking' if thinking else 'plain'}:{rung}"


def refused_shape(
    profile: CapabilityProfile, model: str, thinking: bool, rung: Rung, request: ModelRequest, code: Code
) -> str:
    """What a request-shape refusal rules out: a schema refusal of a request that carried a strict schema rules
    out strict schemas (the rung is sent again, loose, and strict tools lose `strict`); any other rules out the
    rung (and its class, see `refused_with`)."""
    strict = (request.response_schema is not None and request.response_schema.mode == "strict") or any(
        tool.strict for tool in request.tools
    )
    if code is Code.SCHEMA_UNSUPPORTED and strict:
        return demotion_key(profile, model, thinking, STRICT_SCHEMA)
    if rung is Rung.JSON_INSTRUCTIONS:  # the bottom rung is never ruled out: only its JSON mode can be
        return demotion_key(profile, model, thinking, JSON_MODE)
    return demotion_key(profile, model, thinking, rung)


def ladder(profile: CapabilityProfile, thinking: bool, n_actions: int) -> list[Rung]:
    """Every rung the profile allows for this request, highest first (the last one always works)."""
    modes = profile.tool_choices(thinking)
    rungs: list[Rung] = []
    if profile.native_schema in ("strict", "loose"):
        rungs.append(Rung.NATIVE_SCHEMA)
    if n_actions == 1 and "named" in modes:
        rungs.append(Rung.NAMED_TOOL)
    if "required" in modes:
        rungs.append(Rung.REQUIRED)
    rungs.append(Rung.AUTO_REMINDER)
    rungs.append(Rung.JSON_INSTRUCTIONS)
    return rungs


#: Rungs a provider refuses together: one that rejects a forced tool choice (a named tool, or `required`) rejects
#: every forced form, so a refusal of either rules out both for that (profile, model, thinking).
REFUSED_TOGETHER: tuple[frozenset[Rung], ...] = (frozenset({Rung.NAMED_TOOL, Rung.REQUIRED}),)


def refused_with(rung: Rung) -> frozenset[Rung]:
    """The rungs a refusal of `rung` rules out: its class (`REFUSED_TOGETHER`), or itself."""
    return next((group for group in REFUSED_TOGETHER if rung in group), frozenset({rung}))


def open_rungs(
    profile: CapabilityProfile, model: str, thinking: bool, n_actions: int, demoted: Iterable[str]
) -> list[Rung]:
    """The ladder without the rungs a refusal so far rules out (each refusal rules out its class)."""
    refused = set(demoted)
    ruled_out = {
        other
        for rung in Rung
        if demotion_key(profile, model, thinking, rung) in refused
        for other in refused_with(rung)
    }
    return [rung for rung in ladder(profile, thinking, n_actions) if rung not in ruled_out]


def choose_rung(
    profile: CapabilityProfile,
    model: str,
    thinking: bool,
    n_actions: int,
    demoted: Iterable[str],
    start: Rung | None = None,
) -> Rung:
    """The highest open rung, no higher than `start` (where escalation, or what worked before, put the task)."""
    floor = RANK[start] if start is not None else 0
    for rung in open_rungs(profile, model, thinking, n_actions, demoted):
        if RANK[rung] >= floor:
            return rung
    return Rung.JSON_INSTRUCTIONS


def remembered_rung(profile: CapabilityProfile, model: str, thinking: bool, worked: Iterable[str]) -> Rung | None:
    """Where a new visit starts: the lowest rung that worked after escalating for this (profile, model, thinking)."""
    remembered = set(worked)
    if not remembered:
        return None
    found = [rung for rung in Rung if demotion_key(profile, model, thinking, rung) in remembered]
    return max(found, key=RANK.__getitem__, default=None)


#: Codes that say the answer ignored the rung, whatever it was asked: no action (prose), not JSON, a call of a
#: tool that was not offered. `OUTPUT_SCHEMA_INVALID` joins them on the structured rungs when the envelope
#: itself was wrong (an error of type `ENVELOPE_ERROR`), the one thing the rung asked for; a bad value inside a
#: well-formed envelope, like a bad argument of a tool call, is an ordinary mistake repaired on the same rung.
IGNORED_THE_RUNG = frozenset({Code.NO_ACTION, Code.OUTPUT_NOT_JSON, Code.ACTION_UNKNOWN, Code.ACTION_NOT_ALLOWED})
#: The `type` of the error `proposal` reports for a structured answer that is not `{"action", "arguments"}`.
ENVELOPE_ERROR = "envelope"


def ignored(code: Code | None, rung: Rung, errors: Iterable[dict[str, Any]] = ()) -> bool:
    """Whether an answer with `code` did not comply with `rung` (as opposed to a compliant answer that was wrong)."""
    if code in IGNORED_THE_RUNG:
        return True
    return (
        code is Code.OUTPUT_SCHEMA_INVALID
        and MODE_OF_RUNG[rung] == "structured"
        and any(error.get("type") == ENVELOPE_ERROR for error in errors)
    )


@dataclass(frozen=True)
class Escalation:
    """What the next attempt changes after an ignored rung: `reminder` restates it, `rung` moves down."""

    source: Rung
    target: Rung
    step: Literal["reminder", "rung"]
    why: Code

    def to_dict(self) -> Escalated:
        return {"from": str(self.source), "to": str(self.target), "step": self.step, "why": str(self.why)}


def escalate(
    profile: CapabilityProfile,
    model: str,
    thinking: bool,
    n_actions: int,
    demoted: Iterable[str],
    rung: Rung,
    code: Code | None,
    done: int,
    errors: Iterable[dict[str, Any]] = (),
) -> Escalation | None:
    """The escalation after an answer on `rung` that ended in `code`, or None when the answer complied.

    `done` is how many escalations this visit already made: the profile's `escalation` order is followed
    step by step and its last step repeats. A `rung` step at the bottom of the ladder restates instead.
    """
    if code is None or not ignored(code, rung, errors):
        return None
    step = profile.escalation[min(done, len(profile.escalation) - 1)]
    if step == "rung":
        lower = [r for r in open_rungs(profile, model, thinking, n_actions, demoted) if RANK[r] > RANK[rung]]
        if lower:
            return Escalation(rung, lower[0], "rung", code)
    return Escalation(rung, rung, "reminder", code)


def model_actions(state: Agent) -> list[Action]:
    """The actions the model may propose: the state's own, in order (one per name)."""
    seen: dict[str, Action] = {}
    for action in state.actions:
        seen.setdefault(action.name, action)
    return list(seen.values())


_NO_ARGUMENTS: dict[str, Any] = {"type": "object", "properties": {}, "additionalProperties": False}


@lru_cache(maxsize=512)
def _schema_json(model: type[BaseModel]) -> str:
    # pydantic rebuilds a schema on every call (~100 µs, half an agent step's own CPU); a definition's
    # argument models are immutable, so build each once. Kept as text: every caller gets its own copy.
    return json.dumps(model.model_json_schema())


def tool_spec(action: Action, strict: bool) -> ToolSpec:
    schema = json.loads(_schema_json(action.args)) if action.args is not None else dict(_NO_ARGUMENTS)
    return ToolSpec(action.name, action.description or action.name, schema, strict=strict)


def envelope_schema(actions: list[Action]) -> dict[str, Any]:
    """The JSON shape a structured answer takes: `{"action": NAME, "arguments": {...}}`.

    Each argument model's `$defs` are hoisted to the root so references resolve.
    """
    defs: dict[str, Any] = {}
    variants = []
    for action in actions:
        spec = tool_spec(action, strict=False).parameters
        defs.update(spec.pop("$defs", {}))
        variants.append(spec)
    schema: dict[str, Any] = {
        "type": "object",
        "properties": {
            "action": {"type": "string", "enum": [a.name for a in actions]},
            "arguments": variants[0] if len(variants) == 1 else {"anyOf": variants},
        },
        "required": ["action", "arguments"],
        "additionalProperties": False,
    }
    if defs:
        schema["$defs"] = defs
    return schema


def system_prompt(definition: Workflow, state: Agent, actions: list[Action]) -> str:
    """Stable for a (definition, state): the prefix every request of a visit shares."""
    lines = [
        f"You are the agent of workflow {definition.ref}, in state {state.base!r}.",
        definition.description,
        definition.state(state.base).description,
        "Choose exactly one of these actions and give its arguments:",
    ]
    lines += [f"- {a.name}: {a.description or '(no description)'}" for a in actions]
    lines.append("Identity (who acts, for which customer) comes from the system, never from your arguments.")
    lines.append(RESULT_NOTICE)
    if definition.notes_to_model:
        lines.append(NOTE_NOTICE)
    return "\n".join(line for line in lines if line)


#: The newest notes a model is sent (`Workflow.notes_to_model`): context for the step, not the whole discussion.
NOTES_SENT = 10


def task_context(task: TaskState) -> str:
    """The task's input and what happened so far, as data in fixed tags; tool results in tags of their own."""
    facts = {k: v for k, v in task.facts.items() if not k.startswith(("tool:", "tool_error:", NOTE_FACT))}
    body = json.dumps({"input": task.input, "facts": facts}, ensure_ascii=False, sort_keys=True)
    parts = [f"<task_context>\n{body}\n</task_context>"]
    notes = sorted(
        (int(k.removeprefix(NOTE_FACT)), v)
        for k, v in task.facts.items()
        if k.startswith(NOTE_FACT) and k.removeprefix(NOTE_FACT).isdigit() and isinstance(v, dict)
    )
    parts += [wrap_note_for_model(str(v.get("by", "")), str(v.get("text", ""))) for _, v in notes[-NOTES_SENT:]]
    for key, value in sorted(task.facts.items()):
        if key.startswith("tool:") and isinstance(value, dict):
            parts.append(wrap_for_model(key.removeprefix("tool:"), value))
        elif key.startswith("tool_error:") and isinstance(value, dict):
            parts.append(
                wrap_error_for_model(key.removeprefix("tool_error:"), Code[value["code"]], value.get("message"))
            )
    return "\n".join(parts)


def reminder(mode: str, actions: list[Action]) -> str:
    names = ", ".join(a.name for a in actions)
    if mode == "structured":
        return (
            "<system-reminder>Answer now with only one JSON object: "
            f'{{"action": one of [{names}], "arguments": {{...}}}}. No other text.</system-reminder>'
        )
    if mode == "tools_auto":
        return (
            f"<system-reminder>Call exactly one of these tools now: {names}. Do not answer in text.</system-reminder>"
        )
    return f"<system-reminder>Use the tools again: call exactly one of {names}.</system-reminder>"


def reminder_message(profile: CapabilityProfile, mode: str, actions: list[Action]) -> Message:
    """A mode's reminder, in the role the provider obeys best (the profile's `reminder_role`)."""
    return Message(profile.reminder_role, reminder(mode, actions))


def build_request(
    definition: Workflow,
    task: TaskState,
    profile: CapabilityProfile,
    model: str,
    thinking: bool,
    rung: Rung,
    demoted: Iterable[str] = (),
) -> tuple[ModelRequest, list[Message]]:
    """The request for this turn, and the messages this turn adds to the visit (a reminder, or none).

    `demoted` are the shapes refused so far: once strict schemas were refused, none is sent strict; once JSON
    mode was refused, `json_instructions` goes without it.

    The visit's messages are replayed as they were recorded, so each request
    extends the previous one: nothing is ever deleted or reordered.
    """
    state = definition.state(task.state)
    assert isinstance(state, Agent)
    actions = model_actions(state)
    mode = MODE_OF_RUNG[rung]
    added: list[Message] = []
    previous = task.visit.get("mode")
    if mode != previous and (mode != "tools" or previous is not None):
        added.append(reminder_message(profile, mode, actions))
    history = [Message.from_dict(m) for m in task.visit.get("messages", [])]
    messages = (
        Message("system", system_prompt(definition, state, actions)),
        Message("user", task_context(task)),
        *history,
        *added,
    )
    tools: tuple[ToolSpec, ...] = ()
    tool_choice: str | None = None
    response_schema: ResponseSchema | None = None
    strict = demotion_key(profile, model, thinking, STRICT_SCHEMA) not in set(demoted)
    if rung is Rung.NATIVE_SCHEMA:
        mode_name = "strict" if profile.native_schema == "strict" and strict else "loose"
        response_schema = ResponseSchema("action", envelope_schema(actions), mode_name)  # type: ignore[arg-type]
    elif rung is Rung.JSON_INSTRUCTIONS:
        instructions = "<output_schema>\n" + json.dumps(envelope_schema(actions), sort_keys=True) + "\n</output_schema>"
        added_instr = Message("user", instructions)
        if not any(m.content == instructions for m in history):
            added.append(added_instr)
            messages = (*messages, added_instr)
        if profile.native_schema != "none" and demotion_key(profile, model, thinking, JSON_MODE) not in set(demoted):
            response_schema = ResponseSchema("action", {}, "json_object")
    else:
        tools = tuple(tool_spec(a, strict=profile.strict_tools and strict) for a in actions)
        choices = profile.tool_choices(thinking)
        if rung is Rung.NAMED_TOOL:
            tool_choice = actions[0].name
        elif rung is Rung.REQUIRED:
            tool_choice = "required"
        else:
            tool_choice = "auto" if "auto" in choices else None
    request = ModelRequest(
        model=model,
        messages=tuple(messages),
        tools=tools,
        tool_choice=tool_choice,
        response_schema=response_schema,
        thinking=thinking,
        parallel_tool_calls=False if tools and profile.strict_tools else None,
        thinking_switch=profile.thinking_switch(model, thinking),
    )
    return request, added


def rung_table(profiles: dict[str, CapabilityProfile]) -> list[dict[str, Any]]:
    """Every profile with the first rung it gets, thinking off and on, for one and for several actions.

    `railyard providers` prints it and docs/providers.md shows it (a test keeps them equal).
    """
    rows = []
    for profile in profiles.values():
        row = profile.to_dict()
        for label, thinking in (("off", False), ("on", True)):
            row[f"rung_thinking_{label}"] = str(ladder(profile, thinking, n_actions=2)[0])
            row[f"rung_thinking_{label}_one_action"] = str(ladder(profile, thinking, n_actions=1)[0])
            row[f"escalation_thinking_{label}"] = escalation_path(profile, thinking, n_actions=2)
        rows.append(row)
    return rows


def escalation_path(profile: CapabilityProfile, thinking: bool, n_actions: int, max_repairs: int = 3) -> list[str]:
    """The attempts a model that ignores every rung gets, the first and one per repair: `RUNG`, or
    `RUNG+reminder` where the step restated the reminder on the same rung."""
    rung = choose_rung(profile, "", thinking, n_actions, ())
    path = [str(rung)]
    for done in range(max_repairs):
        step = escalate(profile, "", thinking, n_actions, (), rung, Code.NO_ACTION, done)
        assert step is not None  # NO_ACTION always ignores the rung
        rung = step.target
        path.append(f"{rung}+reminder" if step.step == "reminder" else str(rung))
    return path


def escalation_table_markdown(profiles: dict[str, CapabilityProfile]) -> str:
    """Each profile's escalation order and what it makes of a model that ignores every rung (docs/providers.md)."""

    def path(steps: list[str]) -> str:
        return " → ".join(f"`{step}`" for step in steps)

    lines = [
        "| profile | reminder role | escalation order | attempts, thinking off | attempts, thinking on |",
        "| --- | --- | --- | --- | --- |",
    ]
    for profile in profiles.values():
        order = ", ".join(f"`{step}`" for step in profile.escalation) + " (the last repeats)"
        lines.append(
            f"| `{profile.name}` | {profile.reminder_role} | {order} "
            f"| {path(escalation_path(profile, False, 2))} | {path(escalation_path(profile, True, 2))} |"
        )
    return "\n".join(lines)


def thinking_table_markdown(profiles: dict[str, CapabilityProfile]) -> str:
    """Each profile's thinking switch, as the body fields sent, and its always-thinking models (docs/providers.md)."""

    def body(fields: dict[str, Any]) -> str:
        return f"`{json.dumps(fields, sort_keys=True)}`" if fields else "(nothing sent)"

    lines = [
        "| profile | thinking on sends | thinking off sends | other forms, by model | always thinking |",
        "| --- | --- | --- | --- | --- |",
    ]
    for p in profiles.values():
        by_model = "; ".join(f"`{pattern}`: {body(fields)}" for pattern, fields in p.thinking_on_by_model.items())
        always = ", ".join(f"`{pattern}`" for pattern in p.always_thinking)
        lines.append(
            f"| `{p.name}` | {body(p.thinking_on)} | {body(p.thinking_off)} | {by_model or '-'} | {always or '-'} |"
        )
    return "\n".join(lines)


def rung_table_markdown(profiles: dict[str, CapabilityProfile]) -> str:
    def modes(values: list[str]) -> str:
        return ", ".join(f"`{v}`" for v in values) or "(field not sent)"

    lines = [
        "| profile | wire | native schema | tool_choice, thinking off | tool_choice, thinking on "
        "| rung, thinking off (several / one action) | rung, thinking on (several / one action) |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rung_table(profiles):
        lines.append(
            f"| `{r['name']}` | {r['wire']} | {r['native_schema']} | {modes(r['tool_choice_thinking_off'])} "
            f"| {modes(r['tool_choice_thinking_on'])} | `{r['rung_thinking_off']}` / "
            f"`{r['rung_thinking_off_one_action']}` | `{r['rung_thinking_on']}` / "
            f"`{r['rung_thinking_on_one_action']}` |"
        )
    return "\n".join(lines)
