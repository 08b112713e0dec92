"""Why the next LLM call must not start (a cap, the task's timeout, the end of a time slice or
a worker shutting down), and what the task's error then says. Pure: read by the loop before
each call and by the tools turn, whose commit ends the task in the same write when it must."""

from __future__ import annotations

import time
from typing import Any, Literal

from agentq.core.engine._session import Session
from agentq.core.models import TaskStatus
from agentq.core.pricing import usd_text

Stop = TaskStatus | Literal["slice"]


def stop_reason(s: Session, slice_margin_seconds: float) -> Stop | None:
    """Why the next LLM call must not start: a cap, the task timeout, or the time slice."""
    constraints = s.task.submission.constraints
    now = time.time()
    if s.llm_turns >= constraints.max_steps:
        return TaskStatus.COST_EXCEEDED
    if now >= timeout_at(s, now):
        return TaskStatus.TIMED_OUT
    if s.deadline is not None and now >= s.deadline - slice_margin_seconds:
        return "slice"
    if s.stop is not None and s.stop.is_set():
        return "slice"
    return None


def timeout_at(s: Session, now: float | None = None) -> float:
    """When the task times out: its start plus ``constraints.timeout_seconds``. The next call
    does not start after it, and the call in flight is cut at it (``_cut``)."""
    started = s.task.started_at or (time.time() if now is None else now)
    return started + s.task.submission.constraints.timeout_seconds


def stop_error(s: Session, status: TaskStatus) -> dict[str, Any]:
    c = s.task.submission.constraints
    if status is TaskStatus.TIMED_OUT:
        return {"code": "timeout", "message": f"task ran past its timeout of {c.timeout_seconds}s"}
    if s.llm_turns >= c.max_steps:
        return {"code": "max_steps_exceeded", "message": f"task used all {c.max_steps} steps{_go_on('add_steps')}"}
    return budget_error(s)


def budget_error(s: Session) -> dict[str, Any]:
    """Why a call's hold was refused: the root's budget, of tokens or of money, and by how much
    (``s.short``: the least the call could hold, and what was left; absent when no hold was
    refused, as when a person declines a soft threshold)."""
    c = s.task.submission.constraints
    short = s.short
    if short is not None and short.of == "money":
        root = c.max_cost_usd if s.task.parent_id is None else None
        cap = f" (${root})" if root is not None else ""
        needed, available = usd_text(short.needed), usd_text(short.available)
        return {
            "code": "budget_exceeded",
            "message": f"money budget of the root task is exhausted{cap}: the next call could cost up to ${needed} "
            f"and ${available} is left{_go_on('add_usd')}",
            "needed_usd": needed,
            "available_usd": available,
        }
    error = {
        "code": "budget_exceeded",
        "message": f"token budget of the root task is exhausted (cap {c.max_tokens}){_go_on('add_tokens')}",
    }
    if short is None:
        return error
    return {
        **error,
        "message": f"token budget of the root task is exhausted (cap {c.max_tokens}): the next call needs at least "
        f"{short.needed} tokens and {short.available} are left{_go_on('add_tokens')}",
        "needed_tokens": short.needed,
        "available_tokens": short.available,
    }


def _go_on(field: str) -> str:
    """How a task stopped by a cap goes on: a raise of that cap resumes it from its checkpoint,
    and a follow-up message may carry the raise itself (a person reading the error learns both)."""
    return f"; raise it ({field}) to resume from the checkpoint, or send a follow-up message with {field}"
