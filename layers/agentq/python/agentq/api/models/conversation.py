"""A conversation with a task: a message sent to it, its messages, an interrupt, a close."""

from __future__ import annotations

from decimal import Decimal

from pydantic import Field

from agentq.api.models.base import (
    ApiModel,
)
from agentq.core.models import (
    MAX_MESSAGE_CHARS,
    StrictModel,
    TaskStatus,
)
from agentq.core.models.submission import EndUser


class MessageRequest(StrictModel):
    """A person's message to a task, and optionally more budget for the turns it starts."""

    text: str = Field(min_length=1, max_length=MAX_MESSAGE_CHARS, description="what the agent reads as your turn")
    user: EndUser | None = Field(
        default=None,
        description="the end user sending it: the task's own (a key that may name users; a token acts as its own)",
    )
    add_tokens: int = Field(
        strict=True,
        default=0,
        ge=0,
        le=1_000_000_000,
        description="raise the task's token cap with the message (only if it is taken)",
    )
    add_steps: int = Field(strict=True, default=0, ge=0, le=10_000, description="raise max_steps with the message")
    add_usd: Decimal = Field(
        default=Decimal(0), ge=0, le=1_000_000, decimal_places=6, description="raise the money cap with the message"
    )


class MessageAccepted(ApiModel):
    task_id: str
    message_id: str
    seq: int = Field(description="the message's place among the task's messages: the order the agent reads them in")
    status: TaskStatus = Field(description="the task's status once it took the message")
    reopened: bool = Field(description="the message continued an answered or interrupted task (queued to run again)")
    interrupting: bool = Field(description="the task's double_texting policy is interrupt: the turn in flight stops")
    replayed: bool = Field(description="the same Idempotency-Key had already sent this message: nothing new was sent")


class MessageView(ApiModel):
    message_id: str
    seq: int
    text: str
    sent_at: float
    delivered: bool = Field(description="the agent has it in its conversation (a step committed it)")


class MessageList(ApiModel):
    task_id: str
    messages: list[MessageView]
    next_cursor: str | None = Field(
        default=None, description="pass as ?cursor= for the next page; null at the end (of the messages when read)"
    )


class InterruptResult(ApiModel):
    task_id: str
    status: TaskStatus = Field(description="the task's status when the interrupt was recorded (idle: already stopped)")


class CloseResult(ApiModel):
    task_id: str
    closed: bool
