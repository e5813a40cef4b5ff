"""Model adapters, capability profiles and the forcing ladder."""

from __future__ import annotations

from engine.core.errors import Code, RailyardError
from engine.core.model_errors import ModelError
from engine.core.model_interface import ModelAdapter, ModelRequest, ModelResponse
from engine.core.model_settings import ModelSettings
from engine.core.profiles import CapabilityProfile, load_profiles, profile_for
from engine.providers.scripted import ScriptedModel

__all__ = [
    "CapabilityProfile",
    "ModelAdapter",
    "ModelError",
    "ModelRequest",
    "ModelResponse",
    "ScriptedModel",
    "adapter_from_spec",
    "load_profiles",
    "profile_for",
]


def adapter_from_spec(spec: str, settings: ModelSettings | None = None) -> ModelAdapter:
    """`scripted:PATH`, `openai:MODEL` (OPENAI_BASE_URL serves any compatible provider) or `anthropic:MODEL`.

    `settings` (default: `ModelSettings()`) say how a provider is called; a scripted model calls none. The
    environment and the profiles file are applied above, by `engine.runtime.models.open_model`.
    """
    s = settings or ModelSettings()
    extra_body = dict(s.extra_body) or None
    kind, _, rest = spec.partition(":")
    if not rest:
        raise RailyardError(
            f"model {spec!r}: expected scripted:PATH, openai:MODEL or anthropic:MODEL", code=Code.CONFIG_INVALID
        )
    if kind == "scripted":
        return ScriptedModel.from_file(rest)
    if kind == "openai":
        from engine.providers.openai_adapter import OpenAIAdapter

        return OpenAIAdapter(rest, timeout=s.timeout_seconds, retries=s.retries, stream=s.stream, extra_body=extra_body)
    if kind == "anthropic":
        from engine.providers.anthropic_adapter import AnthropicAdapter

        return AnthropicAdapter(
            rest, timeout=s.timeout_seconds, retries=s.retries, stream=s.stream, extra_body=extra_body
        )
    raise RailyardError(f"unknown model provider {kind!r} in {spec!r}", code=Code.CONFIG_INVALID)
