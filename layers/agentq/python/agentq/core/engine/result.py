"""What a run of a task ends with: the adapters (SQS worker, Lambda executor) act on it.

Its own module, importing nothing of the engine, so that ``observe`` (which reports it) and the
adapters can name it without importing the loop.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from agentq.core.errors import LeaseLost
from agentq.core.models import Task, TaskStatus

Outcome = Literal[
    "finished", "continue", "retry", "deferred", "lease_lost", "not_claimed", "stopped", "stopping", "waiting"
]
# A run that met a stop's mark (``stopping``) comes back after this long: by then the stop has
# moved the task to ``cancelled`` (the delivery ends it), or, killed before, left it to the
# delivery, which cancels it while the scope is stopped and claims it if it was resumed.
STOPPING_LOOK_AGAIN_SECONDS = 5


@dataclass
class RunResult:
    task_id: str
    outcome: Outcome
    status: TaskStatus | None = None
    steps_committed: int = 0
    resumed_from_step: int = 0
    error: dict[str, Any] | None = None
    claimed: Task | None = None  # the task as this run claimed it (latency figures)
    # Ended, or parked (idle, paused, waiting), while an older epoch's call may still be
    # charged: its hold is counted as spent after this (the dispatcher's ``release_holds``).
    lapsed_until: float | None = None
    approval_due: float | None = None  # paused on an approval that takes its default at this time
    batch_poll: float | None = None  # waiting on a batch (economy): look at it again in this many seconds
    remote_poll: float | None = None  # waiting on a remote A2A agent's task: look at it again in this many seconds


def lease_lost(task_id: str, exc: LeaseLost) -> RunResult:
    """Fenced out: by a cancel (the status moved: ``stopped``), by a stop's mark before its
    cancel (``stopping``: the task has not ended, and is looked at again) or by another worker."""
    if "stopping" in exc.details:
        error = {**exc.to_dict(), "code": "stopping", "retry_after": STOPPING_LOOK_AGAIN_SECONDS}
        return RunResult(task_id, "stopping", error=error)
    status = exc.details.get("status")
    return RunResult(task_id, "stopped" if status is not None else "lease_lost", status=status, error=exc.to_dict())
