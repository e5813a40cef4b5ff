"""A model adapter from a spec, called with the settings its layers give: options > environment > profiles file.

`adapter_from_spec` builds an adapter from settings it is handed; this is where
the environment and the profiles file are read, so every process that calls a
model (`railyard run`, `worker`, `demo`, a worker started by `Engine` from
RAILYARD_MODEL) applies them the same way.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from engine.core.errors import Code, RailyardError
from engine.core.model_interface import ModelAdapter
from engine.core.model_settings import ModelSettings, Source, resolve
from engine.core.profiles import load_profiles, profile_for, profile_settings
from engine.providers import adapter_from_spec
from engine.runtime import config


def settings_for(profile: str, cli: Mapping[str, Any] | None = None) -> tuple[ModelSettings, dict[str, Source]]:
    """The settings a model of `profile` is called with, and the layer each value came from."""
    return resolve(cli=cli, env=config.model_settings(), file=profile_settings().get(profile))


def open_model(spec: str, cli: Mapping[str, Any] | None = None) -> ModelAdapter:
    """The adapter for `spec` (`openai:MODEL`, `anthropic:MODEL`, `scripted:PATH`) with its effective settings.

    A scripted model calls no provider: the settings do not apply to it, and options given for one are refused
    rather than silently ignored.
    """
    kind, _, model = spec.partition(":")
    if kind not in ("openai", "anthropic") or not model:
        if cli and any(v is not None for v in cli.values()):
            raise RailyardError(
                f"model {spec!r}: the timeout, retry, stream and extra-body options apply to openai: and "
                "anthropic: models only",
                code=Code.CONFIG_INVALID,
            )
        return adapter_from_spec(spec)
    settings, _ = settings_for(profile_for(kind, model, load_profiles()).name, cli)
    return adapter_from_spec(spec, settings)
