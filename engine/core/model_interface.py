"""The provider-neutral model interface: what the engine asks, what a provider answers.

Adapters translate these to and from a provider's wire format and nothing
else: which tools to offer, which `tool_choice` to send and whether to ask for
native JSON are decided by the forcing ladder before the request is built, so
an adapter never second-guesses it and a test can assert the request exactly.
"""

from __future__ import annotations

from collections.abc import Awaitable
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

Role = Literal["system", "user", "assistant", "tool"]

#: `auto`, `none`, `required`, or the name of the one tool the model must call.
ToolChoice = Literal["auto", "none", "required"] | str


@dataclass(frozen=True, slots=True)
class ToolCall:
    """A tool call as the model produced it. `arguments` is the raw JSON text: parsing is a validation layer.

    `extra` keeps provider fields the call came with that must go back unchanged on
    later turns (Gemini's thought signatures ride on tool calls this way).
    """

    id: str
    name: str
    arguments: str
    extra: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"id": self.id, "name": self.name, "arguments": self.arguments}
        if self.extra:
            out["extra"] = self.extra
        return out


@dataclass(frozen=True, slots=True)
class ReasoningBlock:
    """One block of a thinking model's reasoning, as it must be passed back: its text and signature,
    or the opaque data of a redacted block."""

    text: str = ""
    signature: str | None = None
    redacted: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in (("text", self.text), ("signature", self.signature), ("redacted", self.redacted)) if v}


@dataclass(frozen=True, slots=True)
class Message:
    """One message of a conversation.

    `reasoning` is a thinking model's reasoning as text (OpenAI-compatible
    providers take it back as `reasoning_content`); `reasoning_blocks` are the
    signed (or redacted) blocks a provider such as Anthropic needs back verbatim.
    """

    role: Role
    content: str = ""
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str | None = None
    reasoning: str | None = None
    reasoning_blocks: tuple[ReasoningBlock, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"role": self.role, "content": self.content}
        if self.tool_calls:
            out["tool_calls"] = [c.to_dict() for c in self.tool_calls]
        if self.tool_call_id is not None:
            out["tool_call_id"] = self.tool_call_id
        if self.reasoning is not None:
            out["reasoning"] = self.reasoning
        if self.reasoning_blocks:
            out["reasoning_blocks"] = [b.to_dict() for b in self.reasoning_blocks]
        return out

    @classmethod
    def from_dict(cls, doc: dict[str, Any]) -> Message:
        return cls(
            role=doc["role"],
            content=doc.get("content", ""),
            tool_calls=tuple(
                ToolCall(c["id"], c["name"], c["arguments"], c.get("extra")) for c in doc.get("tool_calls", ())
            ),
            tool_call_id=doc.get("tool_call_id"),
            reasoning=doc.get("reasoning"),
            reasoning_blocks=tuple(
                ReasoningBlock(b.get("text", ""), b.get("signature"), b.get("redacted"))
                for b in doc.get("reasoning_blocks", ())
            ),
        )


@dataclass(frozen=True, slots=True)
class ToolSpec:
    """A tool offered to the model: an allowed action, with the JSON schema of its argument model."""

    name: str
    description: str
    parameters: dict[str, Any]
    strict: bool = False


SchemaMode = Literal["strict", "loose", "json_object"]


@dataclass(frozen=True, slots=True)
class ResponseSchema:
    """Native structured output: `strict`/`loose` send `schema`; `json_object` asks only for JSON."""

    name: str
    schema: dict[str, Any]
    mode: SchemaMode


@dataclass(frozen=True, slots=True)
class ModelRequest:
    model: str
    messages: tuple[Message, ...]
    tools: tuple[ToolSpec, ...] = ()
    tool_choice: ToolChoice | None = None  # None: the field is not sent at all
    response_schema: ResponseSchema | None = None
    thinking: bool = False
    max_output_tokens: int | None = None
    parallel_tool_calls: bool | None = None
    #: The provider's body fields that switch thinking on or off (the profile's), merged into the body as given.
    thinking_switch: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Usage:
    """Token counts as the provider reported them; None where it reported nothing (never a guessed 0).

    `input_tokens` is the whole prompt, cached part included (`cached_tokens`);
    `output_tokens` the whole answer, reasoning included (`reasoning_tokens`).
    """

    input_tokens: int | None = None
    output_tokens: int | None = None
    cached_tokens: int | None = None
    reasoning_tokens: int | None = None

    def to_dict(self) -> dict[str, int]:
        """The counts reported, by name; empty when the provider reported none."""
        counts = {
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
            "cached_tokens": self.cached_tokens,
            "reasoning_tokens": self.reasoning_tokens,
        }
        return {k: v for k, v in counts.items() if v is not None}


FinishReason = Literal["stop", "tool_calls", "length", "content_filter", "other"]


@dataclass(frozen=True, slots=True)
class ModelResponse:
    tool_calls: tuple[ToolCall, ...] = ()
    text: str = ""
    reasoning: str | None = None
    reasoning_blocks: tuple[ReasoningBlock, ...] = ()
    finish_reason: FinishReason = "stop"
    usage: Usage = field(default_factory=Usage)
    #: The model that answered and the provider's id of the answer, when the provider said (traces report them).
    response_model: str | None = None
    response_id: str | None = None


class ModelAdapter(Protocol):
    """One provider connection. `complete` returns a response or raises `ModelError`, never anything else.

    The adapters Railyard ships define `async def complete`: a worker awaits thousands of calls on one event
    loop. A plain `def complete` works too; the engine runs it on a thread of its own (`Offload.wait`), so it
    costs one thread per call in flight.
    """

    provider: str
    model: str

    def complete(self, request: ModelRequest) -> Awaitable[ModelResponse] | ModelResponse: ...
