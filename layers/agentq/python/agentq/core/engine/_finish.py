"""Ending a task without a step: before its next call (a cap, the task's timeout), or with its
call cut at the timeout. Written by the loop and the LLM turn alike."""

from __future__ import annotations

from agentq.core.engine._holds import BudgetHolds
from agentq.core.engine._session import Session
from agentq.core.engine._stops import stop_error
from agentq.core.engine.conversation import final_text
from agentq.core.engine.result import RunResult
from agentq.core.models import TaskStatus
from agentq.core.ports import TaskLeases


def finish_without_step(
    tasks: TaskLeases, holds: BudgetHolds, s: Session, status: TaskStatus, *, note: str = "", release: bool = True,
    result: str | None = None,
) -> RunResult:  # fmt: skip
    """End the task before its next call (a cap, the timeout), or with its call cut: the hold
    goes back (``release=False``: the cut counted it as spent), the status and the partial
    result (``result``, else the last text the model said) are written under the lease.
    ``note`` is added to the error's message."""
    if release:
        holds.release(s)
    error = stop_error(s, status)
    if note:
        error = {**error, "message": error["message"] + note}
    kept = result if result is not None else final_text(s.messages)
    tasks.transition(s.task_id, status, lease=s.lease, result=kept, error=error)
    s.task = s.task.model_copy(update={"status": status, **({} if release else {"inflight": None})})
    return RunResult(s.task_id, "finished", status=status, error=error)
