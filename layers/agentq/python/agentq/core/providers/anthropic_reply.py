"""A Messages API reply checked before anything reads it, and turned into the engine's shape.

The SDK hands back whatever a 200 carried (another JSON shape, a list, a string) without
validating it, and a budget must never be settled from a usage that is not there: a reply that
is not a Message is a ``MalformedReply``. Shared by the Anthropic API and Bedrock
(``anthropic_provider``), whose streams and batches read it too.
"""

from __future__ import annotations

from typing import Any

import pydantic
from pydantic import BaseModel, ConfigDict, Field

from agentq.core.models import Usage
from agentq.core.providers.base import LLMResponse
from agentq.core.providers.retry import MalformedReply, distinct_tool_uses

# What the engine persists and replays. Anything else the SDK adds (citations, caller,
# toolset_name, ...) would make stored steps depend on the SDK version that wrote them.
BLOCK_KEYS = ("type", "text", "id", "name", "input", "thinking", "signature", "data",
              "content", "encrypted_content", "tool_changes")  # fmt: skip
_BLOCK_FIELDS: dict[str, dict[str, type]] = {
    "text": {"text": str},
    "tool_use": {"id": str, "name": str, "input": dict},
    # Extended thinking: kept whole (the signature too) and sent back unchanged, as the API
    # requires of the assistant turn before a tool result; a redacted block is opaque data.
    "thinking": {"thinking": str, "signature": str},
    "redacted_thinking": {"data": str},
}


class _Block(BaseModel):
    model_config = ConfigDict(extra="allow")
    type: str

    @pydantic.model_validator(mode="after")
    def _complete(self) -> _Block:
        """The fields the engine reads of a text or tool_use block are there, of their type."""
        extra = self.model_extra or {}
        for name, kind in _BLOCK_FIELDS.get(self.type, {}).items():
            if not isinstance(extra.get(name), kind):
                raise ValueError(f"a {self.type} block needs {name} ({kind.__name__})")
        return self


class _CacheCreation(BaseModel):
    ephemeral_5m_input_tokens: int | None = Field(default=None, ge=0)
    ephemeral_1h_input_tokens: int | None = Field(default=None, ge=0)


class _Iteration(BaseModel):
    type: str
    input_tokens: int = Field(default=0, ge=0)
    output_tokens: int = Field(default=0, ge=0)
    cache_creation_input_tokens: int | None = Field(default=None, ge=0)
    cache_read_input_tokens: int | None = Field(default=None, ge=0)


class _Usage(BaseModel):
    input_tokens: int = Field(ge=0)
    output_tokens: int = Field(ge=0)
    cache_creation_input_tokens: int | None = Field(default=None, ge=0)
    cache_read_input_tokens: int | None = Field(default=None, ge=0)
    cache_creation: _CacheCreation | None = None  # the writes by TTL, when the API splits them
    iterations: list[_Iteration] | None = None  # native compaction: its call's usage is here only


class _Message(BaseModel):
    """What the engine reads of a Messages API reply; anything else the reply holds is ignored."""

    id: str | None = None
    content: list[_Block]
    stop_reason: str | None = None
    model: str
    usage: _Usage


def to_llm_response(message: Any, attempts: int) -> LLMResponse:
    """Turn an SDK ``Message`` into the provider-neutral shape the engine stores; raises
    ``MalformedReply`` when the reply is not a Message (the SDK does not check a 200's shape).

    Usage is copied field for field, never derived, because budgets and cost are charged from
    it; the cache fields are ``None`` when caching was not involved and count as zero.
    """
    if not isinstance(message, BaseModel):
        raise MalformedReply(f"a JSON {type(message).__name__}, not an object")
    try:
        reply = _Message.model_validate(message.model_dump(exclude_none=True, warnings=False))
    except pydantic.ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "reply"
        raise MalformedReply(f"{where}: {first['msg']}") from None
    usage = reply.usage
    # A native compaction's own call is billed but reported apart from the top-level usage.
    compactions = [i for i in usage.iterations or [] if i.type == "compaction"]
    return LLMResponse(
        content=distinct_tool_uses([_plain_block(block) for block in reply.content]),
        stop_reason=reply.stop_reason,
        model=reply.model,
        response_id=reply.id,
        finish_reason=reply.stop_reason,
        usage=Usage(
            input_tokens=usage.input_tokens + sum(i.input_tokens for i in compactions),
            output_tokens=usage.output_tokens + sum(i.output_tokens for i in compactions),
            cache_creation_input_tokens=(usage.cache_creation_input_tokens or 0)
            + sum(i.cache_creation_input_tokens or 0 for i in compactions),
            cache_read_input_tokens=(usage.cache_read_input_tokens or 0)
            + sum(i.cache_read_input_tokens or 0 for i in compactions),
            cache_creation_1h_input_tokens=min(
                (usage.cache_creation.ephemeral_1h_input_tokens or 0) if usage.cache_creation else 0,
                usage.cache_creation_input_tokens or 0,
            ),
        ),
        attempts=attempts,
    )


def _plain_block(block: _Block) -> dict[str, Any]:
    dumped: dict[str, Any] = block.model_dump(exclude_none=True)
    return {key: dumped[key] for key in BLOCK_KEYS if key in dumped}
