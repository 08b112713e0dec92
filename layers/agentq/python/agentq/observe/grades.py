"""A grade of an answer against its task's outcome (``core.engine._grade``), told to each place
that shows what a task did: a metric (``grades`` by result), an event on the bus
(``TaskGraded``), and the OpenTelemetry event of the GenAI semantic conventions,
``gen_ai.evaluation.result``, on the grade step's span (``gen_ai.evaluation.name``: whose grade,
the task's ``outcome`` or ``online:<alias>``, and its judges; ``gen_ai.evaluation.score.value``
and ``gen_ai.evaluation.score.label`` pass/fail when the answer was scored;
``gen_ai.evaluation.explanation``; ``error.type`` instead of a score when a judge failed or the
grade was skipped or interrupted)."""

from __future__ import annotations

import logging
import os
import time
from typing import TYPE_CHECKING, Literal

from agentq.observe import emf, otel
from agentq.observe.events import emit_event

if TYPE_CHECKING:
    from agentq.core.models import GradeStep, Task


def evaluation_name(task: Task, step: GradeStep) -> str:
    """What evaluated the answer (``gen_ai.evaluation.name``, which the conventions require):
    whose grade it is (``outcome``: the task's own, which gates it; ``online:<alias>``: its
    alias's sample, which only observes: ``core.engine._online.grading_outcome``), then its judges
    (the checks that ran; none ran, as for a grade skipped or interrupted: the ones it names)."""
    sub = task.submission
    outcome = sub.outcome or (sub.online.grade if sub.online is not None else None)
    whose = "outcome" if sub.outcome is not None or sub.online is None else f"online:{sub.online.alias}"
    judged = [c.name for c in step.checks]
    if not judged and outcome is not None:
        judged = [outcome.grader] if outcome.grader else []
        if outcome.rubric is not None:
            judged.append("/".join(outcome.grading_model(sub.provider, sub.model)))
    return " ".join([whose, " + ".join(j for j in judged if j)]).strip()[:200]


def evaluation_attributes(task: Task, step: GradeStep) -> dict[str, str | float | int]:
    """``gen_ai.evaluation.result``'s attributes (and agentq's: the attempt and the bar). A grade
    that was never made (a judge's error, a grade skipped or interrupted) has ``error.type`` and
    neither a score nor a label: it says nothing of the answer (the quality buckets count it as
    an error, apart from fails)."""
    attributes: dict[str, str | float | int] = {
        "gen_ai.evaluation.name": evaluation_name(task, step),
        "agentq.grade.attempt": step.attempt,
        "agentq.grade.max_attempts": step.max_attempts,
        "agentq.grade.bar": step.bar,
    }
    if step.score is not None:
        attributes["gen_ai.evaluation.score.value"] = step.score
        attributes["gen_ai.evaluation.score.label"] = "pass" if step.passed else "fail"
    if step.feedback:
        attributes["gen_ai.evaluation.explanation"] = step.feedback[:1000]
    if step.error is not None:
        attributes["error.type"] = str(step.error.get("code", "grader_failed"))
    return attributes


def graded(task: Task, step: GradeStep, number: int) -> None:
    """Step ``number`` of ``task`` committed ``step``, a grade."""
    result: Literal["passed", "below_bar", "error"] = (
        "error" if step.error is not None else "passed" if step.passed else "below_bar"
    )
    emf.record_grade(result)
    otel.event("gen_ai.evaluation.result", evaluation_attributes(task, step))
    if os.environ.get("AGENTQ_EVENT_BUS"):
        emit_event(
            "TaskGraded",
            {"task_id": task.task_id, "tenant": task.tenant, "step": number, "attempt": step.attempt,
             "score": step.score, "passed": step.passed, "result": result, "at": round(time.time(), 3)},
            level=logging.DEBUG,
        )  # fmt: skip
