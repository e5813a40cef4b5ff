"""What a person is shown of a task whose workflow restricts fields (`Workflow.restricted`, issue #28).

A workflow names fields of its input model and tools' results (whole, or field by field) that only the roles it
names may see. Whether a caller is one of them is decided in `engine.core.access.sees_restricted` (the trusted
process, the auditor and the named roles are); here is what everyone else is shown instead: the same task, the
same events, with every restricted value replaced by `RESTRICTED`, and nothing else changed. The log is never
touched: an event shown here keeps the hashes of the event as stored (which its shown data no longer matches:
only the stored event proves itself; `engine.audit.export` says which paths it withheld).

A restricted value is withheld where the workflow declares it (the start event's `input`, a tool's outcome and
the result the model saw, the facts a fork carries, the task's input and facts) and, if it is text of
`SCRUB_LENGTH` characters or more, wherever else it was copied: a model that quotes the customer's message in
its proposal, an approver's comment, the conversation a fork carries. Shorter values (an order id, a status) are
withheld only where declared: searched for everywhere they would blank out words that are not theirs.

Pure: every function here is over the definition, the caller and the data; the read side, the pages, the API,
the CLI and the export call it, and none of them works out a role for itself.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Iterable, Mapping
from typing import Any

from engine.core.access import Caller, sees_restricted
from engine.core.definition import Restricted, Workflow
from engine.core.events import Event
from engine.core.payloads import EventData, as_event_data
from engine.core.task import TaskState

#: What a person without the role is shown in place of a restricted value, on every page, API answer, CLI read
#: and export. Not `[redacted]` (`engine.core.arguments.REDACTED`): that one marks a sensitive value the log
#: never held; this one a value the log holds and this reader may not see.
RESTRICTED = "[restricted]"
#: Restricted text at least this long is also withheld where it was copied into other text.
SCRUB_LENGTH = 8
#: Keys whose values the engine writes itself (identifiers, digests, names from the definition): never a copy of
#: anyone's words, never searched (a digest may hold any run of hex digits).
_IDENTIFIERS = frozenset(
    {
        "action_id",
        "catalog",
        "catalog_digest",
        "digest",
        "from_digest",
        "hash",
        "kind",
        "mode",
        "model",
        "policy_version",
        "prev_hash",
        "profile",
        "required_role",
        "strategy",
        "task_id",
        "to_digest",
        "tool",
        "workflow",
    }
)


def withholding(
    definition: Workflow,
    caller: Caller | None,
    events: Iterable[Event] = (),
    task: TaskState | None = None,
) -> Withholding | None:
    """What `caller` may not be shown of a task of `definition` (None: they see it whole), having learned the
    restricted values of its `events` and of `task`, so that a copy of one is withheld wherever it appears."""
    restricted = definition.restricted
    if restricted is None or sees_restricted(definition, caller):
        return None
    found = Withholding(restricted)
    for event in events:
        found.learn(event)
    if task is not None:
        found.learn_task(task)
    return found


class Withholding:
    """The restricted values of one task, as its log is read, and the task and events shown without them.

    `learn` each event in order (an export streams them: a value is withheld from the event it first appears in
    on); `event`, `task`, `input`, `facts` and `pending` answer what is shown."""

    def __init__(self, restricted: Restricted) -> None:
        self.restricted = restricted
        self._secrets: set[str] = set()
        self._tools: dict[str, str] = {}  # action id -> tool: whose result an outcome is
        self._pattern: re.Pattern[str] | None = None

    # -- learning what is restricted ---------------------------------------------------------------
    def learn(self, event: Event) -> None:
        """The restricted values `event` brings (the input it starts with, a tool's result) and its action ids."""
        data = event.data
        for key in ("prepared", "intent"):
            call = data.get(key)
            if isinstance(call, Mapping) and isinstance(call.get("action_id"), str):
                self._tools[call["action_id"]] = str(call.get("tool"))
        if isinstance(data.get("input"), Mapping):
            self._learn_input(data["input"])
        carried = data.get("carried")
        if isinstance(carried, Mapping) and isinstance(carried.get("facts"), Mapping):
            self._learn_facts(carried["facts"])
        tool = self._tool_of(data)
        result = data.get("tool_result")
        if isinstance(result, Mapping) and "result" in result:
            self._learn_result(tool, result["result"])
        outcome = data.get("outcome")
        if isinstance(outcome, Mapping) and outcome.get("result") is not None:
            self._learn_result(tool, outcome["result"])

    def learn_task(self, task: TaskState) -> None:
        self._learn_input(task.input)
        self._learn_facts(task.facts)

    def _learn_input(self, values: Mapping[str, Any]) -> None:
        for name in self.restricted.input:
            if name in values:
                self._learn_value(values[name])

    def _learn_facts(self, facts: Mapping[str, Any]) -> None:
        for key, value in facts.items():
            if key.startswith("tool:"):
                self._learn_result(key.removeprefix("tool:"), value)

    def _learn_result(self, tool: str | None, result: Any) -> None:
        fields = self._result_fields(tool)
        if fields is None:
            return
        if not fields or not isinstance(result, Mapping):
            self._learn_value(result)
            return
        for name in fields:
            if name in result:
                self._learn_value(result[name])

    def _learn_value(self, value: Any) -> None:
        if isinstance(value, str):
            if len(value) >= SCRUB_LENGTH and value not in self._secrets:
                self._secrets.add(value)
                self._pattern = None
        elif isinstance(value, Mapping):
            for item in value.values():
                self._learn_value(item)
        elif isinstance(value, list):
            for item in value:
                self._learn_value(item)

    def _tool_of(self, data: EventData) -> str | None:
        result = data.get("tool_result")
        if isinstance(result, Mapping) and isinstance(result.get("tool"), str):
            return str(result["tool"])
        action = data.get("action_id")
        return self._tools.get(action) if isinstance(action, str) else None

    def _result_fields(self, tool: str | None) -> frozenset[str] | None:
        """The restricted fields of `tool`'s result (empty: all of it; None: none). A result whose tool cannot be
        told is withheld whole if the workflow restricts any result."""
        if tool is None:
            return frozenset() if self.restricted.results else None
        return self.restricted.result_fields(tool)

    # -- what is shown -------------------------------------------------------------------------------
    def input(self, values: Mapping[str, Any]) -> dict[str, Any]:
        """A task's input as shown: restricted fields replaced, copies of restricted text withheld."""
        shown = self._input(values, "input", [])
        return dict(self._scrub(shown, "input", []))

    def facts(self, facts: Mapping[str, Any]) -> dict[str, Any]:
        """A task's facts as shown: the restricted parts of each tool's latest result, and copies, withheld."""
        return dict(self._scrub(self._facts(facts, "facts", []), "facts", []))

    def value(self, value: Any) -> Any:
        """Any other value a reader is shown (a prepared call, a reason): copies of restricted text withheld."""
        return self._scrub(value, "", [])

    def data(self, data: EventData) -> tuple[EventData, tuple[str, ...]]:
        """An event's data as shown, and the paths in it whose values were withheld (`input.message`,
        `tool_result.result.body`, `turn.messages.0.content`)."""
        paths: list[str] = []
        out: dict[str, Any] = dict(data)
        if isinstance(out.get("input"), Mapping):
            out["input"] = self._input(out["input"], "input", paths)
        tool = self._tool_of(data)
        result = out.get("tool_result")
        if isinstance(result, Mapping) and "result" in result:
            out["tool_result"] = {**result, "result": self._result(tool, result["result"], "tool_result.result", paths)}
        outcome = out.get("outcome")
        if isinstance(outcome, Mapping) and outcome.get("result") is not None:
            out["outcome"] = {**outcome, "result": self._result(tool, outcome["result"], "outcome.result", paths)}
        carried = out.get("carried")
        if isinstance(carried, Mapping) and isinstance(carried.get("facts"), Mapping):
            out["carried"] = {**carried, "facts": self._facts(carried["facts"], "carried.facts", paths)}
        shown = self._scrub(out, "", paths)
        return as_event_data(shown), tuple(dict.fromkeys(paths))

    def event(self, event: Event) -> Event:
        """`event` as shown, having learned what it brings. Its hashes are the stored event's."""
        self.learn(event)
        data, paths = self.data(event.data)
        return dataclasses.replace(event, data=data) if paths else event

    def events(self, events: Iterable[Event]) -> list[Event]:
        return [self.event(e) for e in events]

    def task(self, task: TaskState) -> TaskState:
        """A folded task as shown: its input, facts, conversation, prepared call and cancel request without
        restricted values (who started it, who proposed the call and its digest are as they are)."""
        self.learn_task(task)
        return dataclasses.replace(
            task,
            input=self.input(task.input),
            facts=self.facts(task.facts),
            visit=self.value(task.visit),
            prepared=self.value(task.prepared),
            cancel_requested=self.value(task.cancel_requested),
            effect=self.value(task.effect),
        )

    def pending(self, item: Mapping[str, Any]) -> dict[str, Any]:
        """An approval waiting (`engine.core.approvals.pending_view`) as shown."""
        out = dict(item)
        if isinstance(out.get("input"), Mapping):
            out["input"] = self.input(out["input"])
        return dict(self._scrub(out, "", []))

    # -- the replacements -----------------------------------------------------------------------------
    def _input(self, values: Mapping[str, Any], path: str, paths: list[str]) -> dict[str, Any]:
        out = dict(values)
        for name in self.restricted.input:
            if name in out:
                out[name] = RESTRICTED
                paths.append(f"{path}.{name}")
        return out

    def _facts(self, facts: Mapping[str, Any], path: str, paths: list[str]) -> dict[str, Any]:
        out = dict(facts)
        for key, value in facts.items():
            if key.startswith("tool:"):
                out[key] = self._result(key.removeprefix("tool:"), value, f"{path}.{key}", paths)
        return out

    def _result(self, tool: str | None, result: Any, path: str, paths: list[str]) -> Any:
        fields = self._result_fields(tool)
        if fields is None or result is None:
            return result
        if not fields or not isinstance(result, Mapping):
            paths.append(path)
            return {k: RESTRICTED for k in result} if isinstance(result, Mapping) else RESTRICTED
        out = dict(result)
        for name in sorted(fields):
            if name in out:
                out[name] = RESTRICTED
                paths.append(f"{path}.{name}")
        return out

    def _compiled(self) -> re.Pattern[str] | None:
        if self._pattern is None and self._secrets:
            forms: set[str] = set()
            for secret in self._secrets:
                # As written, and as it reads inside JSON text (a tool call's `arguments`, a quoted object).
                forms.update({secret, json.dumps(secret)[1:-1], json.dumps(secret, ensure_ascii=False)[1:-1]})
            ordered = sorted(forms, key=lambda s: (-len(s), s))
            self._pattern = re.compile("|".join(re.escape(s) for s in ordered))
        return self._pattern

    def _scrub(self, value: Any, path: str, paths: list[str]) -> Any:
        pattern = self._compiled()
        if pattern is None:
            return value
        return _scrubbed(value, pattern, path, paths)


def _scrubbed(value: Any, pattern: re.Pattern[str], path: str, paths: list[str]) -> Any:
    if isinstance(value, str):
        if pattern.search(value) is None:
            return value
        paths.append(path)
        return pattern.sub(RESTRICTED, value)
    if isinstance(value, Mapping):
        return {
            k: v if k in _IDENTIFIERS else _scrubbed(v, pattern, f"{path}.{k}" if path else str(k), paths)
            for k, v in value.items()
        }
    if isinstance(value, list):
        return [_scrubbed(v, pattern, f"{path}.{i}" if path else str(i), paths) for i, v in enumerate(value)]
    return value
