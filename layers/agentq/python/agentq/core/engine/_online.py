"""Online evaluation in the grade turn (``core.aliases.OnlineEval``): a task its alias sampled
(``TaskSubmission.online``) has its answer graded once, by the same durable grade step as an
outcome (``_grade``), but the grade only observes:

- the task ends ``succeeded`` with its answer whatever the grade (below the bar, a failed
  grader, no budget left for the grading call): it is never retried, never ends otherwise;
- the grading model's call is held in the task tree's budget and counted there (shown apart on
  the grade, as an outcome's), but a budget or a tenant hour that cannot cover it skips the
  grade (an error counted apart), never stops or delays the task;
- the grade is counted once in its agent version's hourly bucket (``storage.quality``), before
  the grade step commits: a worker killed between the two counts again on resume, and the
  bucket's marker makes that a no-op.

A task with an outcome of its own is graded by that outcome (which does gate it); sampled, its
last grade (the one that ends it) is what its version's bucket counts, with no second call.
"""

from __future__ import annotations

import logging
import time
from decimal import Decimal

from agentq.core.agents import parse_ref
from agentq.core.engine._session import Session
from agentq.core.faults import crash_point
from agentq.core.models import CompactStep, GradeStep, LLMStep, OutcomeSpec, TaskSubmission
from agentq.core.ports import QualityBook
from agentq.core.quality import GradeTally, hour_of

log = logging.getLogger("agentq.engine")


def observes_only(sub: TaskSubmission) -> bool:
    """The task is graded for online evaluation alone: its grade cannot gate it."""
    return sub.outcome is None and sub.online is not None


def grading_outcome(sub: TaskSubmission) -> OutcomeSpec | None:
    """What the task's answers are graded with: its own outcome, else its alias's sample."""
    if sub.outcome is not None:
        return sub.outcome
    return sub.online.grade if sub.online is not None else None


def skipped(outcome: OutcomeSpec, why: str) -> GradeStep:
    """The grade of a sampled answer that was not graded (its call could not be held)."""
    return GradeStep(
        attempt=1, max_attempts=1, bar=outcome.bar, score=None, passed=False, started_at=time.time(), duration_ms=0,
        error={"code": "grade_skipped", "message": why},
    )  # fmt: skip


def own_cost(s: Session) -> Decimal:
    """What the task spent on its own so far: META's at the claim, and this run's steps since."""
    spent = s.task.cost_usd
    for record in s.steps[len(s.steps) - s.committed :] if s.committed else []:
        if isinstance(record.body, LLMStep | CompactStep | GradeStep):
            spent += record.body.cost_usd
    return spent


def count(quality: QualityBook, s: Session, step: GradeStep) -> None:
    """Count the grade of step ``s.next_step`` in the bucket of the version the task runs
    (once: see the module). A task that names no version (sampled through an alias, it always
    does) is not counted."""
    sub = s.task.submission
    if sub.online is None or sub.agent is None:
        return
    name, version = parse_ref(sub.agent)
    if not isinstance(version, int):
        return
    tally = GradeTally(
        tenant=s.task.tenant, agent=name, version=version, task_id=s.task_id, step=s.next_step,
        hour=hour_of(step.started_at), passed=step.passed, score=step.score, task_cost_usd=own_cost(s),
        grade_cost_usd=step.cost_usd, grade_tokens=step.usage.total,
    )  # fmt: skip
    if not quality.count(tally):
        log.info("online grade counted before", extra={"task_id": s.task_id, "step": s.next_step})
    crash_point("after_online_count")  # counted, the grade step not committed: a resume counts it no more
