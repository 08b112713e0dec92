"""Two runs compared: what ``GET /tasks/{id}/compare/{other_id}`` answers and ``agentq diff``
and the console's compare page show, computed here only, so there is one diff.

A step is its kind and what it said or did (an LLM turn's text and the tools it called, each tool
call's name, input and output, a person's message, a grade's score and verdict), read from the
trace as the API shows it (``trace_view``): timings, epochs, workers and ids, which differ between
any two runs, never count as a difference, so a fork from step N is the same as its original up
to N. Steps are paired by position; the first pair that differs is where the runs diverged.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from agentq.api.models import (
    MAX_COMPARED_STEPS,
    MAX_TRACE_PAGE,
    RunDelta,
    RunStep,
    RunTotals,
    StepPair,
    TaskComparison,
    TaskView,
)
from agentq.api.task_view import task_view
from agentq.api.trace_view import trace_page
from agentq.core.models import Task
from agentq.storage.container import Storage


def _cut(text: str, n: int = 60) -> str:
    text = " ".join(text.split())
    return text if len(text) <= n else text[: n - 1] + "…"


def steps_of(events: list[Any]) -> list[dict[str, Any]]:
    """The committed steps of a trace, in order, each with what makes it the same as another
    (``said``) and a line for people (``what``)."""
    by_step: dict[int, dict[str, Any]] = {}
    for event in events:
        kind = event.type
        if kind == "transition" or getattr(event, "orphan", False):
            continue
        step = by_step.setdefault(event.step, {"step": event.step, "kind": None, "said": [], "tokens": 0, "cost": "0"})
        if kind == "llm_call":
            step["kind"] = "llm" if event.purpose == "turn" else "compact"
            step["said"] = [event.text, event.tool_calls]
            step["tokens"], step["cost"] = event.tokens.total, event.cost_usd
            step["what"] = f"{event.model}: {_cut(event.text)}" + (
                f" -> {', '.join(event.tool_calls)}" if event.tool_calls else ""
            )
        elif kind == "tool_call":
            step["kind"] = "tools"
            step["said"].append([event.name, event.input, event.output, event.is_error])
            step["what"] = ", ".join(f"{c[0]}" for c in step["said"])
        elif kind == "message":
            step["kind"] = "message"
            step["said"].append(event.text)
            step["what"] = f"message: {_cut(event.text)}"
        elif kind == "grade":
            step["kind"] = "grade"
            step["said"] = [event.score, event.passed]
            step["tokens"], step["cost"] = event.tokens.total, event.cost_usd
            step["what"] = f"grade {event.score} ({'passed' if event.passed else 'below the bar'})"
    return [by_step[n] for n in sorted(by_step)]


def totals(view: TaskView, steps: list[dict[str, Any]]) -> RunTotals:
    grade = view.grade
    return RunTotals(
        task_id=view.task_id,
        status=view.status.value,
        model=f"{view.provider}/{view.model}",
        steps=len(steps),
        llm_calls=sum(1 for s in steps if s["kind"] in ("llm", "compact")),
        tool_calls=sum(len(s["said"]) for s in steps if s["kind"] == "tools"),
        tokens_in=view.tokens.input,
        tokens_out=view.tokens.output,
        cost_usd=view.cost_usd,
        grade=None if grade is None else grade.score,
        passed=None if grade is None else grade.passed,
        forked_from=view.forked_from,
    )


def _shown(step: dict[str, Any] | None) -> RunStep | None:
    if step is None:
        return None
    return RunStep(kind=step["kind"], what=step.get("what"), tokens=step["tokens"], cost=step["cost"])


def compare(
    view_a: TaskView, events_a: list[Any], view_b: TaskView, events_b: list[Any], *, complete: bool = True
) -> TaskComparison:
    """The two tasks' totals, each step side by side, and the first step that differs (None:
    the same steps, in the same order)."""
    a, b = steps_of(events_a)[:MAX_COMPARED_STEPS], steps_of(events_b)[:MAX_COMPARED_STEPS]
    rows, diverged = [], None
    for i in range(max(len(a), len(b))):
        left, right = (a[i] if i < len(a) else None), (b[i] if i < len(b) else None)
        same = left is not None and right is not None and (left["kind"], left["said"]) == (right["kind"], right["said"])
        where = (left or right or {}).get("step")
        if not same and diverged is None:
            diverged = where
        rows.append(StepPair(step=where, same=same, a=_shown(left), b=_shown(right)))
    ta, tb = totals(view_a, a), totals(view_b, b)
    delta = RunDelta(
        steps=tb.steps - ta.steps,
        tool_calls=tb.tool_calls - ta.tool_calls,
        tokens=tb.tokens_in + tb.tokens_out - ta.tokens_in - ta.tokens_out,
        cost_usd=str(Decimal(tb.cost_usd) - Decimal(ta.cost_usd)),
    )
    return TaskComparison(a=ta, b=tb, delta=delta, diverged_at=diverged, steps=rows, complete=complete)


def _trace(store: Storage, task: Task) -> tuple[list[Any], bool]:
    """The task's trace events up to its first MAX_COMPARED_STEPS steps (and whether that is all)."""
    events: list[Any] = []
    cursor: str | None = None
    while True:
        page = trace_page(store, task, limit=MAX_TRACE_PAGE, cursor=cursor)
        events.extend(page.events)
        if not page.next_cursor:
            return events, True
        if len({e.step for e in events if e.type != "transition"}) > MAX_COMPARED_STEPS:
            return events, False
        cursor = page.next_cursor


def compare_tasks(store: Storage, task_a: Task, task_b: Task) -> TaskComparison:
    """Two tasks the caller may see, compared from their views and traces as the API shows them."""
    events_a, whole_a = _trace(store, task_a)
    events_b, whole_b = _trace(store, task_b)
    return compare(task_view(store, task_a), events_a, task_view(store, task_b), events_b, complete=whole_a and whole_b)
