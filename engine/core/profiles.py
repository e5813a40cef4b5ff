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
"""

from __future__ import annotations

import fnmatch
import os
import tomllib
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any, Literal

from engine.core.errors import Code, RailyardError
from engine.core.model_settings import SETTING_NAMES, check_setting

NativeSchema = Literal["strict", "loose", "json_object", "none"]
#: `named` is a tool_choice naming one tool; an empty set means the field must not be sent at all.
ChoiceMode = Literal["auto", "none", "required", "named"]
ALL_MODES: frozenset[str] = frozenset({"auto", "none", "required", "named"})


@dataclass(frozen=True)
class CapabilityProfile:
    name: str
    wire: Literal["openai", "anthropic"]
    models: tuple[str, ...] = ("*",)
    native_schema: NativeSchema = "none"
    schema_with_tools: bool = False
    tool_choice_thinking_off: frozenset[str] = ALL_MODES
    tool_choice_thinking_on: frozenset[str] = ALL_MODES
    strict_tools: bool = False
    can_disable_thinking: bool = True
    reasoning_passback: bool = False
    description: str = ""

    def tool_choices(self, thinking: bool) -> frozenset[str]:
        return self.tool_choice_thinking_on if thinking else self.tool_choice_thinking_off

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
    ),
    CapabilityProfile(
        "anthropic",
        "anthropic",
        ("claude-*",),
        native_schema="none",
        tool_choice_thinking_on=NO_FORCING,
        reasoning_passback=True,
        description="extended thinking accepts only auto/none; thinking blocks passed back",
    ),
    CapabilityProfile(
        "gemini",
        "openai",
        ("gemini-*",),
        native_schema="strict",
        schema_with_tools=False,
        reasoning_passback=True,
        description="response_schema; JSON output with function tools refused before Gemini 3",
    ),
    CapabilityProfile(
        "deepseek",
        "openai",
        ("deepseek-*",),
        native_schema="json_object",
        tool_choice_thinking_on=NO_FORCING,
        reasoning_passback=True,
        description="json_object only; 'Thinking mode does not support this tool_choice'",
    ),
    CapabilityProfile(
        "qwen",
        "openai",
        ("qwen*", "qwq-*"),
        native_schema="none",
        tool_choice_thinking_on=NO_FORCING,
        description="tool_choice required/object refused in thinking mode",
    ),
    CapabilityProfile(
        "glm",
        "openai",
        ("glm-*",),
        native_schema="json_object",
        tool_choice_thinking_off=frozenset({"auto"}),
        tool_choice_thinking_on=frozenset({"auto"}),
        description="tool_choice supports only auto",
    ),
    CapabilityProfile(
        "minimax",
        "openai",
        ("minimax-*", "MiniMax-*", "abab*"),
        native_schema="none",
        tool_choice_thinking_off=frozenset(),
        tool_choice_thinking_on=frozenset(),
        description="no tool_choice field at all; response_format silently ignored",
    ),
    CapabilityProfile(
        "mistral",
        "openai",
        ("mistral-*", "magistral-*", "codestral-*", "ministral-*"),
        native_schema="strict",
        schema_with_tools=False,
        description="json_schema; tool_choice any/required and named",
    ),
    CapabilityProfile(
        "ollama",
        "openai",
        ("llama*", "qwen2*", "phi*", "gemma*", "ollama/*"),
        native_schema="loose",
        tool_choice_thinking_off=frozenset(),
        tool_choice_thinking_on=frozenset(),
        description="format/response_format without strict mode; tool_choice treated as unsupported",
    ),
)


def _profiles_file(path: str | None) -> dict[str, Any] | None:
    """The profiles file at `path` (or RAILYARD_PROFILES_FILE) as TOML, or None when there is none."""
    path = path or os.environ.get("RAILYARD_PROFILES_FILE") or None
    if not path:
        return None
    try:
        return tomllib.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise RailyardError(f"cannot read profiles file {path}: {exc}", code=Code.CONFIG_INVALID) from None


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
        unknown = set(values) - known
        if unknown:
            raise RailyardError(f"profile {name}: unknown settings {sorted(unknown)}", code=Code.CONFIG_INVALID)
        converted: dict[str, Any] = {
            k: frozenset(v) if k.startswith("tool_choice") else tuple(v) if k == "models" else v
            for k, v in values.items()
        }
        try:
            base = profiles.get(name) or CapabilityProfile(name=name, wire=converted.pop("wire"))
            profiles[name] = replace(base, **converted)
        except (KeyError, TypeError) as exc:
            raise RailyardError(f"profile {name}: {exc}", code=Code.CONFIG_INVALID) from None
    return profiles


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
