"""Frozen records that are cheap to build: replay and load build an `Event` and a `TaskState` per event.

A frozen dataclass's `__init__` sets each field with `object.__setattr__`, to get
past its own `__setattr__` that refuses changes. For a 15-field record that is
most of the cost of a fold step (1.7 µs of about 3 on the machine in
`docs/performance.md`). `quick_init` gives such a class an `__init__` with the
same signature, defaults and factories that sets each slot through its
descriptor instead, about twice as fast. Everything else stays the dataclass's:
the record is still frozen (assignment raises `FrozenInstanceError`), and
`dataclasses.replace`, equality and `repr` are unchanged.
"""

from __future__ import annotations

import dataclasses
from typing import Any, TypeVar

T = TypeVar("T")

_NOTHING = object()


def quick_init(cls: type[T]) -> type[T]:
    """Replace the `__init__` of a frozen, slotted dataclass (decorate it after `@dataclass`)."""
    params = getattr(cls, "__dataclass_params__", None)
    if params is None or not params.frozen or not hasattr(cls, "__slots__"):
        raise TypeError(f"{cls.__name__}: quick_init is for @dataclass(frozen=True, slots=True) classes")
    if hasattr(cls, "__post_init__"):
        raise TypeError(f"{cls.__name__}: quick_init does not run __post_init__")
    namespace: dict[str, Any] = {"_NOTHING": _NOTHING}
    signature: list[str] = []
    body: list[str] = []
    for field in dataclasses.fields(cls):  # type: ignore[arg-type]
        if field.kw_only:
            raise TypeError(f"{cls.__name__}.{field.name}: quick_init does not do keyword-only fields")
        name = field.name
        namespace[f"_set_{name}"] = getattr(cls, name).__set__
        has_factory = field.default_factory is not dataclasses.MISSING
        if has_factory:
            namespace[f"_factory_{name}"] = field.default_factory
        if not field.init:
            if has_factory:
                body.append(f"_set_{name}(self, _factory_{name}())")
            elif field.default is not dataclasses.MISSING:
                namespace[f"_default_{name}"] = field.default
                body.append(f"_set_{name}(self, _default_{name})")
            continue
        if has_factory:
            signature.append(f"{name}=_NOTHING")
            body.append(f"_set_{name}(self, _factory_{name}() if {name} is _NOTHING else {name})")
        elif field.default is not dataclasses.MISSING:
            namespace[f"_default_{name}"] = field.default
            signature.append(f"{name}=_default_{name}")
            body.append(f"_set_{name}(self, {name})")
        else:
            signature.append(name)
            body.append(f"_set_{name}(self, {name})")
    source = f"def __init__(self, {', '.join(signature)}):\n" + "".join(f"    {line}\n" for line in body or ["pass"])
    exec(source, namespace)
    init = namespace["__init__"]
    init.__qualname__ = f"{cls.__qualname__}.__init__"
    init.__doc__ = cls.__init__.__doc__
    cls.__init__ = init  # type: ignore[method-assign]
    return cls
