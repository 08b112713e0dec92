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
    """Why a call's hold was refused: the root's budget, of tokens, of money or of both, and by
    how much (``s.shortfall``: the least the call could hold against what was left, for each
    unit that is short). Without a refusal (a person declined a soft threshold) it names none."""
    c = s.task.submission.constraints
    short = s.shortfall
    of_tokens, of_money = short is not None and short.of_tokens, short is not None and short.of_money
    figures: dict[str, Any] = {}
    said: list[str] = []
    if short is not None and of_tokens:
        figures.update(needed_tokens=short.needed_tokens, available_tokens=short.available_tokens)
        said.append(f"needs at least {short.needed_tokens} tokens and {short.available_tokens} are left")
    if short is not None and short.counted_input is not None and (of_tokens or of_money):
        figures.update(counted_input_tokens=short.counted_input)
        said.append(f"reads {short.counted_input} input tokens as its provider counted them")
    if short is not None and of_money:
        needed, available = usd_text(short.needed_micros), usd_text(short.available_micros)
        figures.update(needed_usd=needed, available_usd=available)
        said.append(f"could cost up to ${needed} and ${available} is left")
    usd = f"${c.max_cost_usd}" if s.task.parent_id is None and c.max_cost_usd is not None else None
    if of_tokens and of_money:
        caps = f"cap {c.max_tokens}" + (f", {usd}" if usd else "")
        what, raise_with = f"token and money budgets of the root task are exhausted ({caps})", "add_tokens and add_usd"
    elif of_money:
        what, raise_with = "money budget of the root task is exhausted" + (f" ({usd})" if usd else ""), "add_usd"
    else:
        what, raise_with = f"token budget of the root task is exhausted (cap {c.max_tokens})", "add_tokens"
    why = f": the next call {' and '.join(said)}" if said else ""
    return {"code": "budget_exceeded", "message": f"{what}{why}{_go_on(raise_with)}", **figures}


def _go_on(field: str) -> str:
    """How a task stopped by a cap goes on: a raise of that cap resumes it from its checkpoint,
    and a follow-up message may carry the raise itself (a person reading the error learns both)."""
    them = "them" if " and " in field else "it"
    return f"; raise {them} ({field}) to resume from the checkpoint, or send a follow-up message with {field}"
