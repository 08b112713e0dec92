"""Per-version quality over time, from online evaluation (``core.aliases.OnlineEval``): each
sampled task's grade is counted once in its agent version's hourly bucket (``storage.quality``),
so a console or a CLI compares a canary with its stable version from a few counters a version
an hour, never from the tasks themselves.

``GradeTally`` is what one grade adds; ``QualityBucket`` is a bucket as read, with its rates.
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal

from pydantic import Field

from agentq.core.models import StrictModel

HOUR_SECONDS = 3600
MAX_HOURS = 24 * 31  # what one read may cover: a month of hours


def hour_of(at: float) -> int:
    """The hour (since the epoch) a grade started in: its bucket."""
    return int(at // HOUR_SECONDS)


@dataclass(frozen=True)
class GradeTally:
    """One online grade, as its version's bucket counts it."""

    tenant: str
    agent: str
    version: int
    task_id: str
    step: int  # the grade's step: a task's answers are graded (and counted) one by one
    hour: int
    passed: bool
    score: float | None  # None: the grade failed (an error, counted apart, never as a fail)
    task_cost_usd: Decimal  # what the task spent on its own before the grade
    grade_cost_usd: Decimal  # what the grade spent (the grading model)
    grade_tokens: int


class QualityBucket(StrictModel):
    """One agent version's online grades of one hour."""

    agent: str
    version: int
    hour: int = Field(description="hours since the epoch (the bucket starts at hour * 3600)")
    start: float = Field(description="the hour's start, seconds since the epoch")
    graded: int = Field(description="answers graded (a grade that failed included)")
    passed: int = Field(description="graded at or above the bar")
    errors: int = Field(description="grades that failed (the grader raised, timed out, returned nonsense, no budget)")
    pass_rate: float | None = Field(description="passed / (graded - errors); None when nothing was scored")
    mean_score: float | None
    task_cost_usd: Decimal = Field(description="what the graded tasks spent, grading apart")
    mean_task_cost_usd: Decimal | None = Field(description="task_cost_usd per graded answer")
    grade_cost_usd: Decimal = Field(description="what grading them spent (in the tasks' budgets, shown apart)")
    grade_tokens: int


def bucket_of(
    agent: str, version: int, hour: int, *, graded: int, passed: int, errors: int, score_sum: Decimal,
    task_cost: Decimal, grade_cost: Decimal, grade_tokens: int,
) -> QualityBucket:  # fmt: skip
    scored = graded - errors
    return QualityBucket(
        agent=agent, version=version, hour=hour, start=float(hour * HOUR_SECONDS), graded=graded, passed=passed,
        errors=errors, pass_rate=passed / scored if scored > 0 else None,
        mean_score=float(score_sum) / scored if scored > 0 else None, task_cost_usd=task_cost,
        mean_task_cost_usd=(task_cost / graded).quantize(Decimal("0.000001")) if graded else None,
        grade_cost_usd=grade_cost, grade_tokens=grade_tokens,
    )  # fmt: skip
