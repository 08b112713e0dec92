"""A task's statuses, in a module of their own so that code that only names a status (the
storage seam's lease fence) does not load pydantic and the models (``core.models``, which
re-exports these, holds the legal moves between them: ``ALLOWED_TRANSITIONS``)."""

from __future__ import annotations

import enum


class TaskStatus(enum.StrEnum):
    QUEUED = "queued"
    BLOCKED = "blocked"  # waiting for the tasks it depends on (no message, no compute)
    RUNNING = "running"
    WAITING = "waiting"  # children running
    PAUSED = "paused"  # human approval
    IDLE = "idle"  # interrupted by a person: holds no compute and waits for their next message
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    COST_EXCEEDED = "cost_exceeded"
    TIMED_OUT = "timed_out"
    FAILED_OUTCOME = "failed_outcome"  # answered, but its outcome's grade stayed below the bar (core.grading)

    @property
    def terminal(self) -> bool:
        return self in TERMINAL_STATUSES


TERMINAL_STATUSES = frozenset(
    {
        TaskStatus.SUCCEEDED,
        TaskStatus.FAILED,
        TaskStatus.CANCELLED,
        TaskStatus.COST_EXCEEDED,
        TaskStatus.TIMED_OUT,
        TaskStatus.FAILED_OUTCOME,
    }
)
