"""Check stored event data against the declared payload types: every key declared, every value of its type.

mypy checks what the engine's code writes; this checks what actually reached the log, after JSON,
in the scenarios the tests run (the declared types are the contract the event reference documents).
"""

from __future__ import annotations

import types
from collections.abc import Iterable
from typing import Annotated, Any, Literal, NotRequired, Required, Union, get_args, get_origin, get_type_hints

from engine import Event
from engine.core.payloads import EventData


def undeclared(events: Iterable[Event]) -> list[str]:
    """What in these events' data the payload types do not declare, or declare with another type."""
    problems: list[str] = []
    for event in events:
        problems += [
            f"{event.task_id[:8]}#{event.seq} {event.trigger}: {p}" for p in _check(event.data, EventData, "data")
        ]
    return problems


def _check(value: Any, hint: Any, where: str) -> list[str]:
    origin = get_origin(hint)
    if origin in (Annotated, NotRequired, Required):
        return _check(value, get_args(hint)[0], where)
    if origin in (Union, types.UnionType):
        options = [_check(value, arg, where) for arg in get_args(hint)]
        return [] if any(not o for o in options) else min(options, key=len)
    if origin is Literal:
        return [] if value in get_args(hint) else [f"{where} is {value!r}, not one of {get_args(hint)}"]
    if origin is list:
        if not isinstance(value, list):
            return [f"{where} is not a list"]
        item = get_args(hint)[0] if get_args(hint) else Any
        return [p for i, v in enumerate(value) for p in _check(v, item, f"{where}[{i}]")]
    if origin is dict:
        if not isinstance(value, dict):
            return [f"{where} is not an object"]
        item = get_args(hint)[1] if get_args(hint) else Any
        return [p for k, v in value.items() for p in _check(v, item, f"{where}.{k}")]
    if isinstance(hint, type) and issubclass(hint, dict) and hasattr(hint, "__annotations__"):  # a TypedDict
        if not isinstance(value, dict):
            return [f"{where} is not an object"]
        fields = get_type_hints(hint, include_extras=True)
        total = getattr(hint, "__total__", True)
        problems = [f"{where}.{k} is not declared" for k in value if k not in fields]
        for key, field in fields.items():
            if key in value:
                problems += _check(value[key], field, f"{where}.{key}")
            elif total and get_origin(field) is not NotRequired:
                problems.append(f"{where}.{key} is missing")
        return problems
    if hint is Any:
        return []
    if hint is type(None):
        return [] if value is None else [f"{where} is {value!r}, not null"]
    if hint is float:
        return [] if isinstance(value, int | float) and not isinstance(value, bool) else [f"{where} is not a number"]
    if hint is int:
        return [] if isinstance(value, int) and not isinstance(value, bool) else [f"{where} is not an integer"]
    return [] if isinstance(value, hint) else [f"{where} is {type(value).__name__}, not {hint.__name__}"]
