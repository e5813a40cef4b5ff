"""Capability profiles: what each provider accepts, with thinking on and off.

A flat "supports tool_choice" flag cannot say "only when thinking is off", so
every mode is per (profile, thinking). The facts come from
`shared/reference/providers.md`; where a fact is uncertain, a user flips it in
a TOML file named by RAILYARD_PROFILES_FILE without a code change:

    [profiles.anthropic]
    native_schema = "strict"          # newer models

    [profiles.my-gateway]             # a new profile
    wire = "openai"
    models = ["my-model-*"]
    tool_choice_thinking_off = ["auto"]

Thinking is a request parameter: `thinking_on` / `thinking_off` are the body
fields that switch it (`thinking_on_by_model` where a model takes another
form), and a model matching `always_thinking` thinks whatever the flag says.
`escalation` is the order of what the engine changes after an answer that
ignored the rung it was asked on; `reminder_role` is the role its reminders
take (`system` only where the wire and the provider accept one mid-conversation).
"""

from __future__ import annotations

import copy
import fnmatch
import os
import tomllib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Literal

from engine.core.errors import Code, RailyardError
from engine.core.model_settings import SETTING_NAMES, check_setting
from engine.core.text import closest

NativeSchema = Literal["strict", "loose", "json_object", "none"]
#: `named` is a tool_choice naming one tool; an empty set means the field must not be sent at all.
ChoiceMode = Literal["auto", "none", "required", "named"]
ALL_MODES: frozenset[str] = frozenset({"auto", "none", "required", "named"})
ReminderRole = Literal["system", "user"]
#: What an escalation may change: restate the current mode's reminder, or move to the next rung of the ladder.
ESCALATION_STEPS: frozenset[str] = frozenset({"reminder", "rung"})
#: Restate first (it keeps the rung and costs nothing the provider could refuse), then force harder; the last repeats.
DEFAULT_ESCALATION: tuple[str, ...] = ("reminder", "rung")


@dataclass(frozen=True)
class CapabilityProfile:
    name: str
    wire: Literal["openai", "anthropic"]
    models: tuple[str, ...] = ("*",)
    native_schema: NativeSchema = "none"
    #: Deprecated, no effect: no rung sends a native schema together with tools. Accepted so files keep loading.
    schema_with_tools: bool = False
    tool_choice_thinking_off: frozenset[str] = ALL_MODES
    tool_choice_thinking_on: frozenset[str] = ALL_MODES
    strict_tools: bool = False
    #: False: no model of the profile can be switched off, so each is treated as always thinking (`thinks`).
    can_disable_thinking: bool = True
    #: Deprecated, no effect: reasoning an adapter can pass back (Anthropic's signed blocks) always is.
    reasoning_passback: bool = False
    description: str = ""
    reminder_role: ReminderRole = "user"
    escalation: tuple[str, ...] = DEFAULT_ESCALATION
    always_thinking: tuple[str, ...] = ()
    # Body fields, so unhashed: a profile is compared, never used as a key.
    thinking_on: dict[str, Any] = field(default_factory=dict, hash=False)
    thinking_off: dict[str, Any] = field(default_factory=dict, hash=False)
    thinking_on_by_model: dict[str, dict[str, Any]] = field(default_factory=dict, hash=False)
    #: What the provider charges, by model name pattern: a table of `input` and `output` (and optionally `cached`,
    #: for input tokens read from the provider's cache), each in money per million tokens. Optional: with none, the
    #: quality figures count tokens and no cost (`railyard quality`).
    prices: dict[str, dict[str, float]] = field(default_factory=dict, hash=False)

    def price(self, model: str) -> Mapping[str, float] | None:
        """The prices of `model`: the first pattern of `prices` it matches (None: none does)."""
        for pattern, table in self.prices.items():
            if fnmatch.fnmatchcase(model, pattern):
                return table
        return None

    def tool_choices(self, thinking: bool) -> frozenset[str]:
        return self.tool_choice_thinking_on if thinking else self.tool_choice_thinking_off

    def thinks(self, model: str, requested: bool) -> bool:
        """Whether a request to `model` thinks: as asked, except that a model that always thinks is never off.

        Everything downstream (the ladder, what is remembered, the event) uses this value, so that a
        reasoning model run without the flag is never sent a forced tool choice its thinking mode rejects.
        """
        if requested or not self.can_disable_thinking:
            return True
        return any(fnmatch.fnmatchcase(model, pattern) for pattern in self.always_thinking)

    def thinking_switch(self, model: str, thinking: bool) -> dict[str, Any]:
        """The body fields that switch thinking on or off for `model` (a copy: adapters may merge into it)."""
        if not thinking:
            return copy.deepcopy(self.thinking_off) if self.thinking_off else {}
        for pattern, fields_on in self.thinking_on_by_model.items():
            if fnmatch.fnmatchcase(model, pattern):
                return copy.deepcopy(fields_on)
        return copy.deepcopy(self.thinking_on)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            out[f.name] = (
                sorted(value) if isinstance(value, frozenset) else list(value) if isinstance(value, tuple) else value
            )
        return out


NO_FORCING = frozenset({"auto", "none"})

BUILTIN_PROFILES: tuple[CapabilityProfile, ...] = (
    CapabilityProfile(
        "openai",
        "openai",
        ("gpt-*", "o1*", "o3*", "o4*", "*"),
        native_schema="strict",
        schema_with_tools=True,
        strict_tools=True,
        description="strict json_schema; tool_choice required/named; no known thinking limit",
        reminder_role="system",
        always_thinking=("o1*", "o3*", "o4*", "*-thinking*"),
        thinking_on={"reasoning_effort": "medium"},
    ),
    CapabilityProfile(
        "anthropic",
        "anthropic",
        ("claude-*",),
        native_schema="none",
        tool_choice_thinking_on=NO_FORCING,
        reasoning_passback=True,
        description="extended thinking accepts only auto/none; thinking blocks passed back",
        # Adaptive-only models refuse `enabled` and `disabled` alike: they always think.
        always_thinking=("claude-opus-4-7*", "claude-opus-4-8*", "claude-mythos-*"),
        thinking_on={"thinking": {"type": "enabled", "budget_tokens": 2048}},
        thinking_on_by_model={
            pattern: {"thinking": {"type": "adaptive"}}
            for pattern in (
                "claude-opus-4-6*",
                "claude-sonnet-4-6*",
                "claude-opus-4-7*",
                "claude-opus-4-8*",
                "claude-mythos-*",
            )
        },
    ),
    CapabilityProfile(
        "gemini",
        "openai",
        ("gemini-*",),
        native_schema="strict",
        schema_with_tools=False,
        reasoning_passback=True,
        description="response_schema; JSON output with function tools refused before Gemini 3",
        always_thinking=("gemini-2.5-pro*", "gemini-3*", "*-thinking*"),
        # Dynamic budget; no `include_thoughts`: through this wire the thoughts would arrive inside the content.
        thinking_on={"extra_body": {"google": {"thinking_config": {"thinking_budget": -1}}}},
        thinking_off={"extra_body": {"google": {"thinking_config": {"thinking_budget": 0}}}},
    ),
    CapabilityProfile(
        "deepseek",
        "openai",
        ("deepseek-*",),
        native_schema="json_object",
        tool_choice_thinking_on=NO_FORCING,
        reasoning_passback=True,
        description="json_object only; 'Thinking mode does not support this tool_choice'",
        reminder_role="system",
        always_thinking=("deepseek-reasoner*", "deepseek-r1*"),
        thinking_on={"thinking": {"type": "enabled"}},
        thinking_off={"thinking": {"type": "disabled"}},
    ),
    CapabilityProfile(
        "qwen",
        "openai",
        ("qwen*", "qwq-*"),
        native_schema="none",
        tool_choice_thinking_on=NO_FORCING,
        description="tool_choice required/object refused in thinking mode",
        always_thinking=("qwq-*", "qwen*-thinking*"),
        thinking_on={"enable_thinking": True},
        thinking_off={"enable_thinking": False},
    ),
    CapabilityProfile(
        "glm",
        "openai",
        ("glm-*",),
        native_schema="json_object",
        tool_choice_thinking_off=frozenset({"auto"}),
        tool_choice_thinking_on=frozenset({"auto"}),
        description="tool_choice supports only auto",
        reminder_role="system",
        always_thinking=("*-thinking*",),
        thinking_on={"thinking": {"type": "enabled"}},
        thinking_off={"thinking": {"type": "disabled"}},
    ),
    CapabilityProfile(
        "minimax",
        "openai",
        ("minimax-*", "MiniMax-*", "abab*"),
        native_schema="none",
        tool_choice_thinking_off=frozenset(),
        tool_choice_thinking_on=frozenset(),
        description="no tool_choice field at all; response_format silently ignored",
        reminder_role="system",
        always_thinking=("MiniMax-M*", "minimax-m*"),  # interleaved thinking, no switch
    ),
    CapabilityProfile(
        "mistral",
        "openai",
        ("mistral-*", "magistral-*", "codestral-*", "ministral-*"),
        native_schema="strict",
        schema_with_tools=False,
        description="json_schema; tool_choice any/required and named",
        always_thinking=("magistral-*",),
    ),
    CapabilityProfile(
        "ollama",
        "openai",
        ("llama*", "qwen2*", "phi*", "gemma*", "ollama/*"),
        native_schema="loose",
        tool_choice_thinking_off=frozenset(),
        tool_choice_thinking_on=frozenset(),
        description="format/response_format without strict mode; tool_choice treated as unsupported",
        # `reasoning_effort: "none"` would turn a thinking model off, but models that cannot think may refuse it.
        thinking_on={"reasoning_effort": "medium"},
    ),
)


def with_switch(extra_body: dict[str, Any] | None, switch: dict[str, Any]) -> dict[str, Any]:
    """A user's extra body fields with the thinking switch merged in, the switch winning on every field it sets.

    Nested tables merge (Gemini's switch lives under `extra_body.google`, beside a user's other `google`
    fields), so the turn's `thinking_switch` is exactly what the body carries; thinking is set with
    `--thinking`, never by an extra body.
    """
    merged = copy.deepcopy(extra_body) if extra_body else {}
    for key, value in switch.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = with_switch(merged[key], value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged


def _profiles_file(path: str | None) -> dict[str, Any] | None:
    """The profiles file at `path` (or RAILYARD_PROFILES_FILE) as TOML, or None when there is none."""
    path = path or os.environ.get("RAILYARD_PROFILES_FILE") or None
    if not path:
        return None
    try:
        doc = tomllib.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise RailyardError(f"cannot read profiles file {path}: {exc}", code=Code.CONFIG_INVALID) from None
    # A misspelt table (`[profile.deepseek]`) would otherwise be a file that silently sets nothing.
    problems = [_unknown(key, FILE_TABLES, "table") for key in doc if key not in FILE_TABLES]
    tables = doc.get("profiles", {})
    if not isinstance(tables, dict) or not all(isinstance(v, dict) for v in tables.values()):
        problems.append("[profiles.NAME] must be tables of settings")
    if problems:
        raise RailyardError(f"profiles file {path}: " + "; ".join(problems), code=Code.CONFIG_INVALID)
    return doc


#: The tables a profiles file may hold: capability profiles and model settings, and flow control's
#: (`engine.core.flow`: the breaker, quotas and workflows' priorities, read by `flow_tables`).
FILE_TABLES = ("profiles", "breaker", "quotas", "priorities")


def flow_tables(path: str | None = None) -> dict[str, Any]:
    """The profiles file's flow-control tables (`[breaker]`, `[quotas."provider:model"]`, `[priorities]`) as
    written; `engine.core.flow.merged` checks them."""
    doc = _profiles_file(path) or {}
    return {name: doc[name] for name in ("breaker", "quotas", "priorities") if name in doc}


def _unknown(name: str, known: Iterable[str], kind: str) -> str:
    """`unknown setting 'x'` with the known name it is most likely a slip for."""
    close = closest(name, known)
    return f"unknown {kind} {name!r}" + (f" (did you mean {close!r}?)" if close else "")


def profile_settings(path: str | None = None) -> dict[str, dict[str, Any]]:
    """The model settings (`engine.core.model_settings.SETTING_NAMES`) each profile of the file sets, checked."""
    doc = _profiles_file(path) or {}
    return {
        name: {k: check_setting(k, v, f"profile {name}") for k, v in values.items() if k in SETTING_NAMES}
        for name, values in doc.get("profiles", {}).items()
    }


def load_profiles(path: str | None = None) -> dict[str, CapabilityProfile]:
    """The built-in profiles, overridden or extended by the TOML file at `path` (or RAILYARD_PROFILES_FILE)."""
    profiles = {p.name: p for p in BUILTIN_PROFILES}
    doc = _profiles_file(path)
    if doc is None:
        return profiles
    known = {f.name for f in fields(CapabilityProfile)} - {"name"}
    for name, values in doc.get("profiles", {}).items():
        values = {k: v for k, v in values.items() if k not in SETTING_NAMES}  # read by `profile_settings`
        unknown = sorted(set(values) - known)
        if unknown:
            slips = "; ".join(_unknown(k, known | set(SETTING_NAMES), "setting") for k in unknown)
            raise RailyardError(f"profile {name}: {slips}", code=Code.CONFIG_INVALID)
        converted: dict[str, Any] = {
            k: frozenset(v) if k.startswith("tool_choice") else tuple(v) if k in _TUPLES else v
            for k, v in values.items()
        }
        try:
            base = profiles.get(name) or CapabilityProfile(name=name, wire=converted.pop("wire"))
            profiles[name] = _checked(replace(base, **converted))
        except (KeyError, TypeError, ValueError) as exc:
            raise RailyardError(f"profile {name}: {exc}", code=Code.CONFIG_INVALID) from None
    return profiles


_TUPLES = frozenset({"models", "escalation", "always_thinking"})
#: What a model's prices may name (`CapabilityProfile.prices`).
PRICE_KINDS = frozenset({"input", "output", "cached"})


def _checked(profile: CapabilityProfile) -> CapabilityProfile:
    """A profile from a file, refused where a value could only mislead the ladder."""
    if unknown := set(profile.escalation) - ESCALATION_STEPS:
        raise ValueError(f"escalation steps {sorted(unknown)}; known: {sorted(ESCALATION_STEPS)}")
    if not profile.escalation:
        raise ValueError("escalation needs at least one step")
    by_model = profile.thinking_on_by_model
    if not isinstance(by_model, dict) or not all(
        isinstance(sent, dict) for sent in (profile.thinking_on, profile.thinking_off, *by_model.values())
    ):
        raise ValueError("thinking_on, thinking_off and each thinking_on_by_model value are tables of body fields")
    if not isinstance(profile.prices, dict) or not all(
        isinstance(table, dict)
        and {"input", "output"} <= set(table) <= PRICE_KINDS
        and all(isinstance(v, int | float) and not isinstance(v, bool) and v >= 0 for v in table.values())
        for table in profile.prices.values()
    ):
        raise ValueError(
            "prices is a table of model patterns, each a table of input and output (and optionally cached): "
            "money per million tokens, at least 0"
        )
    if profile.reminder_role not in ("system", "user"):
        raise ValueError(f"reminder_role {profile.reminder_role!r}; known: system, user")
    if profile.reminder_role == "system" and profile.wire == "anthropic":
        # The Messages API has one top-level system prompt: a reminder there would rewrite the cached prefix.
        raise ValueError("the anthropic wire takes no system message mid-conversation: reminder_role must be user")
    return profile


def profile_for(provider: str, model: str, profiles: dict[str, CapabilityProfile] | None = None) -> CapabilityProfile:
    """The profile for `provider:model`: a profile named like the provider, else the first whose models match.

    `openai:deepseek-chat` (an OpenAI-compatible endpoint) gets the DeepSeek profile: the
    model name decides, because the limits are the model's, not the wire format's.
    """
    profiles = profiles if profiles is not None else load_profiles()
    for profile in profiles.values():
        if profile.name != "openai" and any(fnmatch.fnmatchcase(model, pat) for pat in profile.models):
            return profile
    if provider in profiles:
        return profiles[provider]
    raise RailyardError(f"no capability profile for {provider}:{model}", code=Code.CONFIG_INVALID)


def profile_prices(profiles: Mapping[str, CapabilityProfile]) -> Callable[[str, str], Mapping[str, float] | None]:
    """A model's prices by its profile's name and its own (`engine.core.quality.Prices`): what `railyard quality`
    and the workflow page cost turns at."""

    def price(profile: str, model: str) -> Mapping[str, float] | None:
        found = profiles.get(profile)
        return found.price(model) if found is not None else None

    return price
