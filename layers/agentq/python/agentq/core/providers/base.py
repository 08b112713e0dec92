"""The one interface every LLM provider implements, in Anthropic Messages API shapes.

The engine speaks Messages API content blocks (text, tool_use, tool_result) whatever the
provider, because that is what both Anthropic and Bedrock (through the same SDK) take and
return; the scripted provider answers in the same shapes.
"""

from __future__ import annotations

from typing import Any, Protocol

from pydantic import BaseModel, Field

from agentq.core.models import Usage


class LLMRequest(BaseModel):
    model: str
    system: str | None = None
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] = Field(default_factory=list)  # {name, description, input_schema}
    max_tokens: int
    task_id: str = ""  # lets deterministic providers derive stable ids


class LLMResponse(BaseModel):
    content: list[dict[str, Any]]  # text / tool_use blocks as plain dicts
    stop_reason: str | None
    model: str
    usage: Usage
    attempts: int = 1  # provider calls made, retries included


class LLMProvider(Protocol):
    name: str

    def complete(self, request: LLMRequest) -> LLMResponse:
        """Return the assistant turn, or raise ``agentq.core.errors.ProviderError``."""
        ...
