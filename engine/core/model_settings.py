"""How a model is called: request timeout, retries, streaming, extra body fields, and where each value came from.

A hung provider once held `railyard run` for three fixed 60-second timeouts,
and nothing short of Python could change that. Each setting now has four
layers, the first one that sets it winning: a command-line option (`railyard
run`, `worker`, `demo`), an environment variable, the model's profile in the
profiles file, the default here. `railyard providers --json` shows the result
and the layer of each value. The layers are read above (`engine.runtime`);
merging and checking them is this pure function.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from engine.core.errors import Code, RailyardError

#: Where a value came from, highest precedence first.
Source = Literal["cli", "env", "profiles_file", "default"]
#: The settings, as the profiles file and `railyard providers --json` name them.
SETTING_NAMES = ("timeout_seconds", "retries", "stream", "extra_body")


@dataclass(frozen=True)
class ModelSettings:
    """`timeout_seconds` bounds each provider call (connect, and each read of the answer or of a stream);
    `retries` is how many more calls the engine makes after a `RATE_LIMITED` or `PROVIDER_TIMEOUT` (the SDKs'
    own retries stay off); `stream` asks for a streamed answer; `extra_body` is merged into every request body
    (provider switches the engine does not know)."""

    timeout_seconds: float = 60.0
    retries: int = 2
    stream: bool = False
    extra_body: Mapping[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "timeout_seconds": self.timeout_seconds,
            "retries": self.retries,
            "stream": self.stream,
            "extra_body": dict(self.extra_body),
        }


def check_setting(name: str, value: Any, where: str) -> Any:
    """`value` as setting `name` takes it, or CONFIG_INVALID naming `where` it was given."""

    def refuse(expected: str) -> RailyardError:
        return RailyardError(
            f"{where}: {name} must be {expected}, not {value!r}", code=Code.CONFIG_INVALID, setting=name
        )

    if name == "timeout_seconds":
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value <= 0:
            raise refuse("a positive number of seconds")
        return float(value)
    if name == "retries":
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 20:
            raise refuse("a whole number from 0 to 20")
        return value
    if name == "stream":
        if not isinstance(value, bool):
            raise refuse("true or false")
        return value
    if name == "extra_body":
        if not isinstance(value, dict):
            raise refuse("a table (a JSON object)")
        return dict(value)
    raise RailyardError(f"{where}: unknown model setting {name!r}", code=Code.CONFIG_INVALID, setting=name)


def resolve(
    *, cli: Mapping[str, Any] | None = None, env: Mapping[str, Any] | None = None, file: Mapping[str, Any] | None = None
) -> tuple[ModelSettings, dict[str, Source]]:
    """The settings a model call uses, and the layer each came from: cli > env > profiles file > default.

    Each layer maps setting names to values (a value of None is not set); every value given is checked, even
    one a higher layer overrides, so a mistake in the file is found before the day the option is dropped.
    """
    values: dict[str, Any] = {}
    sources: dict[str, Source] = dict.fromkeys(SETTING_NAMES, "default")
    layers: tuple[tuple[Source, str, Mapping[str, Any] | None], ...] = (
        ("profiles_file", "the profiles file", file),
        ("env", "the environment", env),
        ("cli", "the command line", cli),
    )
    for source, where, layer in layers:  # lowest first: a higher layer overwrites
        for name, value in (layer or {}).items():
            if value is None:
                continue
            values[name] = check_setting(name, value, where)
            sources[name] = source
    return ModelSettings(**values), sources
