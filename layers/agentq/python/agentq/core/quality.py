"""Per-version quality over time, from online evaluation (``core.aliases.OnlineEval``): each
sampled task's grade is counted once in its agent version's hourly bucket (``storage.quality``),
and so is a sampled task that ends without an answer (``unanswered``: failed, timed out, over
its budget, cancelled, after a run of its version began), so a console or a CLI compares a
canary with its stable version from a few counters a version an hour, never from the tasks
themselves, and a canary whose tasks never answer shows as failing them, not as no data.

``GradeTally`` is what one grade (or one unanswered ending) adds; ``QualityBucket`` is a bucket
as read, with its rates; ``Spent`` is what a sampled task spent, its grading apart, and what its
counts added so far.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from pydantic import Field

from agentq.core.agents import parse_ref
from agentq.core.models import StrictModel, Task, TaskStatus

HOUR_SECONDS = 3600
MAX_HOURS = 24 * 31  # what one read may cover: a month of hours
# The endings without an answer: every one but succeeded and failed_outcome, which a grade makes.
UNANSWERED = frozenset({TaskStatus.FAILED, TaskStatus.CANCELLED, TaskStatus.COST_EXCEEDED, TaskStatus.TIMED_OUT})


def hour_of(at: float) -> int:
    """The hour (since the epoch) of ``at``, a grade's start or an unanswered task's end: its bucket."""
    return int(at // HOUR_SECONDS)


@dataclass(frozen=True)
class Spent:
    """What a sampled task spent: on its own (``task_usd``: its model calls and compactions)
    and on grading its answers (``grade_usd``, ``grade_tokens``: every grade, an outcome's
    attempts included). Its totals now are ``spent``; what its counts added to its version's
    buckets so far is ``counted``, kept on META's grade (``counted``) by the commit of the grade
    that counted last. A count adds the difference, so each dollar is counted once, in the
    count of the grade that ends its round, whatever number of grades (an outcome's attempts)
    or rounds (a conversation's answers) the task took."""

    task_usd: Decimal = Decimal(0)
    grade_usd: Decimal = Decimal(0)
    grade_tokens: int = 0

    def since(self, before: Spent) -> Spent:
        return Spent(
            self.task_usd - before.task_usd, self.grade_usd - before.grade_usd, self.grade_tokens - before.grade_tokens
        )

    def as_meta(self) -> dict[str, Any]:
        return {"task_usd": str(self.task_usd), "grade_usd": str(self.grade_usd), "grade_tokens": self.grade_tokens}


def spent(cost_usd: Decimal, grade: dict[str, Any] | None) -> Spent:
    """What a task spent, from its total ``cost_usd`` (grading included, as META counts it)
    and META's ``grade`` (the grading's totals over all of the task's grades)."""
    g = grade or {}
    grading = Decimal(str(g.get("cost_usd", "0")))
    tokens = int(g.get("tokens_in", 0)) + int(g.get("tokens_out", 0))
    return Spent(cost_usd - grading, grading, tokens)


def counted(grade: dict[str, Any] | None) -> Spent:
    """What the task's counts so far added to its version's buckets (META's grade's ``counted``)."""
    c = (grade or {}).get("counted") or {}
    return Spent(
        Decimal(str(c.get("task_usd", "0"))), Decimal(str(c.get("grade_usd", "0"))), int(c.get("grade_tokens", 0))
    )


@dataclass(frozen=True)
class GradeTally:
    """One online grade, as its version's bucket counts it."""

    tenant: str
    agent: str
    version: int
    task_id: str
    step: int | None  # the grade's step (a task's answers are graded and counted one by one); None: unanswered
    hour: int
    passed: bool
    score: float | None  # None: the grade failed (an error, counted apart, never as a fail), or unanswered
    task_cost_usd: Decimal  # what the task spent on its own since its last count (``Spent``), grading apart
    grade_cost_usd: Decimal  # what grading spent since then: every grade of the round (the grading model)
    grade_tokens: int

    def as_meta(self) -> dict[str, Any]:
        """As META's grade keeps a count not made yet (``uncounted``)."""
        return {**dataclasses.asdict(self), "task_cost_usd": str(self.task_cost_usd),
                "grade_cost_usd": str(self.grade_cost_usd)}  # fmt: skip

    @classmethod
    def from_meta(cls, raw: dict[str, Any]) -> GradeTally:
        return cls(
            tenant=str(raw["tenant"]), agent=str(raw["agent"]), version=int(raw["version"]),
            task_id=str(raw["task_id"]), step=None if raw.get("step") is None else int(raw["step"]),
            hour=int(raw["hour"]), passed=bool(raw["passed"]),
            score=None if raw.get("score") is None else float(raw["score"]),
            task_cost_usd=Decimal(str(raw["task_cost_usd"])), grade_cost_usd=Decimal(str(raw["grade_cost_usd"])),
            grade_tokens=int(raw["grade_tokens"]),
        )  # fmt: skip


def unanswered_tally(task: Task) -> GradeTally | None:
    """What ``task`` (META as it ended) adds to its version's bucket for ending without an
    answer: counted once a task (``storage.quality``), in the hour it ended, with what it spent
    since its last count (``Spent``: an outcome's grades of the round it never finished
    included). None when it is not counted so: not sampled, naming no version, ended with an
    answer (a grade counts it), or ended before any run of its version began (cancelled queued,
    for a failed dependency, skipped by its concurrency key: the version never saw it)."""
    sub = task.submission
    if sub.online is None or sub.agent is None or task.status not in UNANSWERED or task.claim_count < 1:
        return None
    name, version = parse_ref(sub.agent)
    if not isinstance(version, int):
        return None
    added = spent(task.cost_usd, task.grade).since(counted(task.grade))
    return GradeTally(
        tenant=task.tenant, agent=name, version=version, task_id=task.task_id, step=None,
        hour=hour_of(task.finished_at or task.updated_at or task.created_at), passed=False, score=None,
        task_cost_usd=added.task_usd, grade_cost_usd=added.grade_usd, grade_tokens=added.grade_tokens,
    )  # fmt: skip


class QualityBucket(StrictModel):
    """One agent version's online grades of one hour."""

    agent: str
    version: int
    hour: int = Field(description="hours since the epoch (the bucket starts at hour * 3600)")
    start: float = Field(description="the hour's start, seconds since the epoch")
    graded: int = Field(description="answers graded (a grade that failed included)")
    passed: int = Field(description="graded at or above the bar")
    errors: int = Field(description="grades that failed (the grader raised, timed out, returned nonsense, no budget)")
    unanswered: int = Field(
        description="sampled tasks that ended without an answer (failed, timed_out, cost_exceeded, cancelled) after a "
        "run of this version began: each counted once, in the hour it ended, as a fail of the pass rate"
    )
    pass_rate: float | None = Field(
        description="passed / (graded - errors + unanswered): a task that never answered is a fail, a grade that "
        "failed is left out; None when nothing was scored and nothing went unanswered"
    )
    mean_score: float | None = Field(description="over the scored grades (graded - errors); unanswered tasks apart")
    task_cost_usd: Decimal = Field(
        description="what the graded tasks spent on their own calls, no grading in it (a task answering more than "
        "once, in a conversation, counts at each grade what it spent since the one before)"
    )
    mean_task_cost_usd: Decimal | None = Field(description="task_cost_usd per graded answer or unanswered task")
    grade_cost_usd: Decimal = Field(
        description="what grading them spent, every grade (an outcome's earlier attempts too; in the tasks' budgets, "
        "shown apart)"
    )
    grade_tokens: int


def bucket_of(
    agent: str, version: int, hour: int, *, graded: int, passed: int, errors: int, unanswered: int,
    score_sum: Decimal, task_cost: Decimal, grade_cost: Decimal, grade_tokens: int,
) -> QualityBucket:  # fmt: skip
    scored = graded - errors
    judged = scored + unanswered  # the pass rate's denominator: an unanswered task is a fail
    counts = graded + unanswered
    return QualityBucket(
        agent=agent, version=version, hour=hour, start=float(hour * HOUR_SECONDS), graded=graded, passed=passed,
        errors=errors, unanswered=unanswered, pass_rate=passed / judged if judged > 0 else None,
        mean_score=float(score_sum) / scored if scored > 0 else None, task_cost_usd=task_cost,
        mean_task_cost_usd=(task_cost / counts).quantize(Decimal("0.000001")) if counts else None,
        grade_cost_usd=grade_cost, grade_tokens=grade_tokens,
    )  # fmt: skip
