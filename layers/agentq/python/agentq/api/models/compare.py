"""Two runs compared (``GET /tasks/{id}/compare/{other_id}``, ``agentq diff``): each task's
totals, each step side by side, and the first step that differs (``api.run_diff``)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from agentq.api.models.base import ApiModel

MAX_COMPARED_STEPS = 2_000  # steps of each task compared; past them the comparison says complete: false


class RunTotals(ApiModel):
    task_id: str
    status: str
    model: str = Field(description="provider/model")
    steps: int = Field(description="committed steps compared")
    llm_calls: int
    tool_calls: int
    tokens_in: int
    tokens_out: int
    cost_usd: str
    grade: float | None = Field(description="the latest grade's score (null: no outcome, none yet, or a grader failed)")
    passed: bool | None
    forked_from: dict[str, Any] | None = Field(description="task_id and at_step of the task this one was forked from")


class RunStep(ApiModel):
    kind: Literal["llm", "compact", "tools", "message", "grade"] | None = Field(
        description="an LLM turn, a compaction, the turn's tool calls, a person's message, a grade"
    )
    what: str | None = Field(description="what it said or did, in a line")
    tokens: int
    cost: str


class StepPair(ApiModel):
    step: int | None
    same: bool = Field(description="both said and did the same (text, tool calls with input and output, a grade)")
    a: RunStep | None = Field(description="the first task's step (null: it has no step here)")
    b: RunStep | None


class RunDelta(ApiModel):
    steps: int = Field(description="b minus a")
    tool_calls: int
    tokens: int
    cost_usd: str


class TaskComparison(ApiModel):
    a: RunTotals
    b: RunTotals
    delta: RunDelta
    diverged_at: int | None = Field(description="the first step that differs (null: the same steps, in the same order)")
    steps: list[StepPair]
    complete: bool = Field(
        default=True,
        description=f"false: a task has more than {MAX_COMPARED_STEPS} steps, and only those were compared",
    )
