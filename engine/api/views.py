"""What the pages show, computed from events and definitions: pure functions, no I/O, no HTML.

An approver decides on the prepared call, so amounts are shown as money
(`40.00 EUR`), not as the minor units the call carries; the evidence is what
the tools returned; the model's reason is what it wrote. All of it is untrusted
text, and stays text: the templates escape it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from pydantic import BaseModel

from engine.audit.reads import path_visits
from engine.core.events import Event
from engine.core.payloads import event_code
from engine.core.summary import compact, summarise

#: ISO 4217 currencies whose minor unit is not a hundredth (the default exponent is 2).
_EXPONENT = {
    "BIF": 0,
    "CLP": 0,
    "DJF": 0,
    "GNF": 0,
    "ISK": 0,
    "JPY": 0,
    "KMF": 0,
    "KRW": 0,
    "PYG": 0,
    "RWF": 0,
    "UGX": 0,
    "VND": 0,
    "VUV": 0,
    "XAF": 0,
    "XOF": 0,
    "XPF": 0,
    "BHD": 3,
    "IQD": 3,
    "JOD": 3,
    "KWD": 3,
    "LYD": 3,
    "OMR": 3,
    "TND": 3,
}
#: The description `engine.tools.types.MinorUnits` gives a field: how a schema says "this is money".
_MINOR_UNITS_HINT = "in minor units"
_MONEY_SUFFIXES = ("_cents", "_minor", "_minor_units")


def format_money(minor: int, currency: str) -> str:
    """`4000, "EUR"` -> `40.00 EUR`; `1500, "JPY"` -> `1,500 JPY`; thousands separated."""
    exponent = _EXPONENT.get(currency.upper(), 2)
    sign = "-" if minor < 0 else ""
    whole, part = divmod(abs(minor), 10**exponent)
    text = f"{whole:,}" + (f".{part:0{exponent}d}" if exponent else "")
    return f"{sign}{text} {currency}"


def money_fields(schema: Mapping[str, Any] | None, names: Iterable[str]) -> set[str]:
    """The argument names that hold minor units: declared so in the JSON schema, or named `*_cents`/`*_minor`."""
    props = (schema or {}).get("properties", {})
    found = {n for n in names if n.endswith(_MONEY_SUFFIXES)}
    for name, prop in props.items():
        if isinstance(prop, dict) and _MINOR_UNITS_HINT in str(prop.get("description", "")):
            found.add(name)
    return found


@dataclass(frozen=True, slots=True)
class Shown:
    """One argument as shown: its name and its display text (money formatted, the rest as JSON)."""

    name: str
    text: str
    money: bool = False


def display_arguments(arguments: Mapping[str, Any], schema: Mapping[str, Any] | None = None) -> list[Shown]:
    """Arguments in display form. Money needs a currency beside it (`currency` field, or a `{amount, currency}`)."""
    currency = arguments.get("currency") if isinstance(arguments.get("currency"), str) else None
    money = money_fields(schema, arguments)
    out: list[Shown] = []
    for name, value in arguments.items():
        if name in money and isinstance(value, int) and not isinstance(value, bool) and currency:
            out.append(Shown(name, format_money(value, currency), money=True))
        elif (
            isinstance(value, Mapping)
            and set(value) == {"amount", "currency"}
            and isinstance(value["amount"], int)
            and isinstance(value["currency"], str)
        ):
            out.append(Shown(name, format_money(value["amount"], value["currency"]), money=True))
        else:
            out.append(Shown(name, value if isinstance(value, str) else compact(value)))
    return out


def schema_of(model: type[BaseModel] | None) -> dict[str, Any] | None:
    return model.model_json_schema() if model is not None else None


def when(at: datetime) -> str:
    return at.strftime("%Y-%m-%d %H:%M:%S UTC")


@dataclass(frozen=True, slots=True)
class Row:
    """One event of the timeline as the task page and the inbox show it."""

    seq: int
    at: str
    actor: str
    from_state: str
    trigger: str
    to_state: str
    code: str | None
    summary: str


#: How much of an event's summary the timeline and the inbox show.
TIMELINE_WIDTH = 160


def timeline(events: Iterable[Event]) -> list[Row]:
    return [
        Row(
            e.seq,
            when(e.at),
            e.actor,
            e.from_state or "",
            e.trigger,
            e.to_state,
            event_code(e.data),
            summarise(e, TIMELINE_WIDTH),
        )
        for e in events
    ]


def path_of(events: Iterable[Event]) -> tuple[list[dict[str, Any]], Counter[tuple[str, str, str]], str | None]:
    """The transitions taken (in order), how often each edge was taken, and the state the task ended in."""
    events = list(events)
    visits, current = path_visits(events)
    steps = [
        {"seq": e.seq, "from_state": e.from_state, "trigger": e.trigger, "to_state": e.to_state}
        for e in events
        if e.from_state is not None
    ]
    return steps, visits, current


@dataclass(frozen=True, slots=True)
class Evidence:
    """What the tools returned: the facts the guards read and the approver should see."""

    tool: str
    fields: list[Shown]


def evidence(facts: Mapping[str, Any]) -> list[Evidence]:
    out = []
    for key, value in facts.items():
        if key.startswith("tool:") and isinstance(value, Mapping):
            out.append(Evidence(key.removeprefix("tool:"), display_arguments(value)))
    return out


@dataclass(frozen=True, slots=True)
class Reason:
    """Why the model proposed the call: the `reason` it gave as an argument, and what it wrote in that turn."""

    argument: str | None
    text: list[str] = field(default_factory=list)
    proposed_by: str | None = None
    seq: int | None = None


def model_reason(events: Iterable[Event], digest: str | None) -> Reason:
    """From the event that prepared the call awaiting approval (the newest one carrying its digest)."""
    proposing: Event | None = None
    for e in events:
        prepared = e.data.get("prepared")
        if isinstance(prepared, Mapping) and (digest is None or prepared.get("digest") == digest):
            proposing = e
    if proposing is None:
        return Reason(None)
    raw = proposing.data.get("args")
    args: Mapping[str, Any] = raw if isinstance(raw, Mapping) else {}
    argument = next((str(args[k]) for k in ("reason", "rationale", "justification") if k in args), None)
    turn = proposing.data.get("turn")
    messages = (turn.get("messages") if turn is not None else None) or []
    text = [
        str(m.get("content"))
        for m in messages
        if isinstance(m, Mapping) and m.get("role") == "assistant" and m.get("content")
    ]
    return Reason(argument, text, proposing.actor, proposing.seq)
