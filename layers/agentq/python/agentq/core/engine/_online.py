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
  bucket's marker makes that a no-op. The count carries what the task spent since its last
  count (``core.quality.Spent``): its own calls without any grading, and every grade since (an
  outcome's earlier attempts of the round included); the grade step's commit keeps on META's
  grade what the counts have added (``counted``), so a resumed count adds the same and a later
  round's count adds only what that round spent. A count that cannot be made (its bucket kept
  busy past the retries, ``storage.quality``) never raises out of the commit: META's grade
  keeps it (``uncounted``) and the task's next grade or its ending (``queueing.endings``)
  makes it, the marker letting only one of them count.

A task with an outcome of its own is graded by that outcome (which does gate it); sampled, its
last grade (the one that ends it) is what its version's bucket counts, with no second call.
"""

from __future__ import annotations

import logging
import time
from decimal import Decimal
from typing import Any

from agentq.core.agents import parse_ref
from agentq.core.engine._session import Session
from agentq.core.faults import crash_point
from agentq.core.models import CompactStep, GradeStep, LLMStep, OutcomeSpec, TaskSubmission
from agentq.core.ports import QualityBook
from agentq.core.quality import GradeTally, counted, hour_of, spent

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


def spent_so_far(s: Session) -> Decimal:
    """What the task spent so far, grading included: META's at the claim, and this run's
    committed steps since (the grade being committed not among them)."""
    spent_usd = s.task.cost_usd
    for record in s.steps[len(s.steps) - s.committed :] if s.committed else []:
        if isinstance(record.body, LLMStep | CompactStep | GradeStep):
            spent_usd += record.body.cost_usd
    return spent_usd


def count(quality: QualityBook, s: Session, step: GradeStep, meta: dict[str, Any]) -> dict[str, Any] | None:
    """Count the grade of step ``s.next_step`` in the bucket of the version the task runs
    (once: see the module), with what the task spent since its last count (``core.quality.Spent``:
    its own cost without any grading, and every grade of the round); ``meta`` is META's grade as
    this step's commit writes it (the grading's totals with this grade). Answers what the commit
    adds to META's grade: what the task's counts have then added (``counted``), and the counts
    not made yet (``uncounted``: this one, or an earlier grade's, that ``counted_now`` could not
    make, for the next grade or the task's ending to make). None for a task that is not counted:
    not sampled, or naming no version (sampled through an alias, it always names one)."""
    sub = s.task.submission
    if sub.online is None or sub.agent is None:
        return None
    name, version = parse_ref(sub.agent)
    if not isinstance(version, int):
        return None
    now = spent(spent_so_far(s) + step.cost_usd, meta)
    added = now.since(counted(s.task.grade))
    tally = GradeTally(
        tenant=s.task.tenant, agent=name, version=version, task_id=s.task_id, step=s.next_step,
        hour=hour_of(step.started_at), passed=step.passed, score=step.score, task_cost_usd=added.task_usd,
        grade_cost_usd=added.grade_usd, grade_tokens=added.grade_tokens,
    )  # fmt: skip
    pending = [*(GradeTally.from_meta(t) for t in (s.task.grade or {}).get("uncounted", [])), tally]
    left = [t.as_meta() for t in pending if not counted_now(quality, t)]
    crash_point("after_online_count")  # counted, the grade step not committed: a resume counts it no more
    return {"counted": now.as_meta(), "uncounted": left}


def counted_now(quality: QualityBook, tally: GradeTally) -> bool:
    """Count ``tally``, never raising: an online grade never stops the task, and a count that
    cannot be made now (its hour's bucket kept busy by other grades past the retries, the
    store's error) is made later, by the task's next grade or its ending
    (``queueing.endings``), from META's grade; its marker makes whichever comes first the only
    one. False: not counted now."""
    try:
        if not quality.count(tally):
            log.info("online grade counted before", extra={"task_id": tally.task_id, "step": tally.step})
    except Exception:
        log.warning(
            "could not count an online grade now: left on the task for its ending to count",
            extra={"task_id": tally.task_id, "step": tally.step, "version": tally.version, "hour": tally.hour},
            exc_info=True,
        )
        return False
    return True
