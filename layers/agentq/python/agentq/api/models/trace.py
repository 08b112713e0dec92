"""A task's history as the API shows it: the trace (transitions, LLM calls, tool calls,
messages) and the pages of its event stream."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field

from agentq.api.models.base import (
    ApiModel,
)
from agentq.core.models import (
    FallbackNote,
    TaskStatus,
)

# -------------------------------------------------------------------- trace


class TransitionEvent(ApiModel):
    type: Literal["transition"] = "transition"
    at: float
    event: Literal[
        "created",
        "forked",
        "blocked",
        "claimed",
        "approval_requested",
        "approval_decided",
        "spawned",
        "retry_scheduled",
        "follow_up",
        "interrupt_requested",
        "interrupted",
        "fallback",
        "finished",
    ]
    status: TaskStatus | None = Field(default=None, description="the status the task entered")
    worker: str | None = None
    epoch: int | None = None
    detail: dict[str, Any] = Field(
        default_factory=dict,
        description="claimed: `takeover` (it took over a run in progress: a resume; false: a new run of a task "
        "queued again); follow_up (a message reopened the answered or interrupted task), interrupt_requested "
        "and interrupted (the task stopped, idle): `after_step`, and the message's number `message`; fallback (a "
        "fallback took over at `step`): `from` and `to` (provider, model) and `reason`",
    )


class LLMTokens(ApiModel):
    input: int
    output: int
    cache_creation: int
    cache_read: int
    total: int


class LLMCallEvent(ApiModel):
    type: Literal["llm_call"] = "llm_call"
    at: float = Field(description="commit time (an orphan call: its end)")
    step: int
    epoch: int
    model: str
    started_at: float
    duration_ms: int
    tokens: LLMTokens
    reserved_tokens: int
    cost_usd: str
    stop_reason: str | None
    attempts: int
    text: str = Field(description="the assistant text of the turn")
    tool_calls: list[str] = Field(description="names of the tools it asked for")
    batched: bool = Field(default=False, description="answered through the Message Batches API (economy, half price)")
    purpose: Literal["turn", "compaction"] = Field(
        default="turn",
        description="turn: the agent's own turn; compaction: a summary of the conversation so far, which the "
        "conversation goes on from (its text is the summary)",
    )
    orphan: bool = Field(
        description="a call whose step was never committed (its worker lost the lease, or the task was "
        "interrupted while it answered); paid for all the same"
    )
    provider: str | None = Field(default=None, description="the provider that answered (null: recorded before it was)")
    fallback_from: FallbackNote | None = Field(
        default=None,
        description="a fallback took over at this call: the model the turn wanted first (provider, model) and why "
        "it did not answer (reason: circuit_open, or its call's error code after the retries)",
    )
    orphan_reason: Literal["lease_lost", "interrupted", "timed_out", "commit_failed"] | None = Field(
        default=None,
        description="an orphan's why: lease_lost (its worker lost the task to another), interrupted (a person "
        "interrupted the task while the model answered: the answer was discarded), timed_out (the task's timeout "
        "cut the call, whose answer came after all), commit_failed (the store failed a write of its commit, "
        "throttled or down: a later run calls again); null for a committed call",
    )
    truncated: bool


class ToolCallEvent(ApiModel):
    type: Literal["tool_call"] = "tool_call"
    at: float = Field(description="commit time of the tool results step")
    step: int
    epoch: int
    tool_use_id: str
    name: str
    input: dict[str, Any] | None
    output: str
    is_error: bool
    status: str = Field(description="ok, error, timeout, unknown_outcome (side effect of a dead worker), replayed")
    side_effects: bool
    started_at: float
    duration_ms: int
    truncated: bool
    policy: dict[str, Any] | None = Field(
        default=None,
        description="the policy rules that took part (docs/POLICIES.md): `decision` (allow, deny, ask), the deciding "
        "`rule` with its `version`, `effect` and `message`, and `log_only`: what shadowed rules would have decided",
    )


class MessageEvent(ApiModel):
    type: Literal["message"] = "message"
    at: float = Field(description="commit time of the step that delivered the message into the conversation")
    step: int
    epoch: int
    message_id: str
    seq: int
    text: str
    sent_at: float
    truncated: bool


class GradeEvent(ApiModel):
    """An answer graded against the task's outcome (a grade step: ``core.engine._grade``)."""

    type: Literal["grade"] = "grade"
    at: float = Field(description="commit time of the grade step")
    step: int
    epoch: int
    attempt: int
    max_attempts: int
    score: float | None = Field(description="0 to 1; null when a grader failed")
    bar: float
    passed: bool
    feedback: str
    error: dict[str, Any] | None = Field(description="code, message: a grader that failed")
    checks: list[dict[str, Any]] = Field(description="each judge: kind (code, rubric), name, score, feedback, "
                                         "usage and cost_usd of a grading model")  # fmt: skip
    tokens: LLMTokens = Field(description="the grading model's tokens (counted in the task's, shown apart)")
    cost_usd: str
    started_at: float
    duration_ms: int
    replayed: bool = Field(description="graded by a worker that stopped before the step committed; not run again")


TraceEvent = Annotated[
    TransitionEvent | LLMCallEvent | ToolCallEvent | MessageEvent | GradeEvent, Field(discriminator="type")
]


class TracePage(ApiModel):
    task_id: str
    user: str | None = Field(
        default=None, description="the end user the task (and its tree) acts for; null: none named"
    )
    events: list[TraceEvent]
    next_cursor: str | None = Field(description="pass as ?cursor= for the next page; null at the end")


class TaskEvent(ApiModel):
    """One event of a task's stream (``api/events.py`` lists the types)."""

    id: str | None = Field(description="the cursor after this event (send as Last-Event-ID or ?after=); null: "
                           "uncommitted (a live text delta), which moves no cursor")  # fmt: skip
    type: str = Field(description="task.created, task.status, agent.message, agent.tool_results, task.retry, "
                      "approval.requested, approval.decided, task.spawned, budget.raised, message.received, "
                      "user.message, task.interrupt_requested, conversation.closed, agent.moved, agent.grade, "
                      "agent.message_delta")  # fmt: skip
    task_id: str
    tree_path: str | None = Field(default=None, description="in a tree's stream, the task's place in the tree: "
                                  "'' the root, '2' its second sub-agent, '2.1' that one's first; null otherwise")  # fmt: skip
    user: str | None = Field(default=None, description="the end user the task (and its tree) acts for")
    at: float
    committed: bool
    data: dict[str, Any]


class EventPage(ApiModel):
    task_id: str
    events: list[TaskEvent] = Field(description="in commit order (a tree: each task's in its commit order, merged "
                                    "by time, a sub-agent's after the spawn that made it)")  # fmt: skip
    next_cursor: str | None = Field(description="pass as ?after= for what follows; null before any event")
    done: bool = Field(description="every watched task has ended and no event follows")
