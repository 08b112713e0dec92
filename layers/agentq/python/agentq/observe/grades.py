"""A grade of an answer against its task's outcome (``core.engine._grade``), told to each place
that shows what a task did: a metric (``grades`` by result), an event on the bus
(``TaskGraded``), and the OpenTelemetry event of the GenAI semantic conventions,
``gen_ai.evaluation.result``, on the grade step's span (``gen_ai.evaluation.name``,
``gen_ai.evaluation.score.value``, ``gen_ai.evaluation.score.label`` pass/fail,
``gen_ai.evaluation.explanation``, ``error.type`` when a judge failed)."""

from __future__ import annotations

import logging
import os
import time
from typing import TYPE_CHECKING, Literal

from agentq.observe import emf, otel
from agentq.observe.events import emit_event

if TYPE_CHECKING:
    from agentq.core.models import GradeStep, Task


def evaluation_attributes(task: Task, step: GradeStep) -> dict[str, str | float | int]:
    """``gen_ai.evaluation.result``'s attributes (and agentq's: the attempt and the bar)."""
    outcome = task.submission.outcome
    judged = [c.name for c in step.checks] or ([outcome.grader] if outcome and outcome.grader else [])
    attributes: dict[str, str | float | int] = {
        "gen_ai.evaluation.name": ("outcome " + " + ".join(j for j in judged if j))[:200],
        "gen_ai.evaluation.score.label": "pass" if step.passed else "fail",
        "agentq.grade.attempt": step.attempt,
        "agentq.grade.max_attempts": step.max_attempts,
        "agentq.grade.bar": step.bar,
    }
    if step.score is not None:
        attributes["gen_ai.evaluation.score.value"] = step.score
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
