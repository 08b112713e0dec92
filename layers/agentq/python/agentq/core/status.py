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

# META's attribute naming when a ``waiting`` task's own next look is due (epoch seconds): set by
# the park that queues the look (a remote A2A agent's task, ``core.engine._remote``; an economy
# batch, ``core.engine._llm_batch``), by a batch look before it queues the next
# (``TaskTransitions.next_look``), and cleared by every other move. A look is a delayed message
# sent after the write commits, so a worker that dies between the two leaves the task waiting
# with nothing to wake it: the sweeper finds it by this (``queueing.sweeper``), and a look that
# arrives long before it is due is a stray (``queueing.dispatch._looks``).
LOOK_DUE = "look_due"

# META's attributes of a run that put its task off before its call (a deferral: an open circuit,
# a rate limit, a cap met, ``queueing.dispatch._notes``): ``silent_until``, when its delayed
# message is due (a deferral longer than SQS's 15-minute delay comes back in hops, each due at
# most 15 minutes on), so the sweeper counts the task's silence from then, not from its last
# write (``queueing.sweeper``); a delivery's retry sets it too, to when the queue brings it back.
# ``deferred_epoch``: the claim whose run deferred, so the claim after it takes a task that
# waited for its message, not a run in progress (no resume counted, no takeover shown:
# ``storage.leases``). Left in place afterwards: a past ``silent_until`` and an older epoch say
# nothing.
SILENT_UNTIL = "silent_until"
DEFERRED_EPOCH = "deferred_epoch"

# META's attribute naming when the sweeper last re-enqueued a stranded task (epoch seconds, the
# sweep's clock), written before its ``swept`` message is sent, conditional on the value the
# sweep listed (``TaskListing.mark_swept``): the task's silence counts from then, so the next
# sweep sends no second message while the first is on its way (in a backlog, a delay), and of
# two sweeps at once only one sends. Left in place: a later sign of life is later than it.
SWEPT_AT = "swept_at"
