"""The legal moves between task statuses: one table, which the store turns into DynamoDB
conditions, and the edges only a person's message may take."""

from __future__ import annotations

from agentq.core.status import TERMINAL_STATUSES, TaskStatus

# The one table of legal transitions. The store turns the "from" side into a DynamoDB
# condition, so an illegal transition is refused by the database, not by caller discipline.
# cost_exceeded -> queued is the budget-raise resume; failed -> queued is a DLQ redrive;
# queued -> timed_out is a sub-agent still waiting for a slot when its parent's fan-out gave up on
# it (``control.subtrees.time_out_subagent``): it never runs after its parent was told it ended.
ALLOWED_TRANSITIONS: dict[TaskStatus, frozenset[TaskStatus]] = {
    TaskStatus.BLOCKED: frozenset({TaskStatus.QUEUED, TaskStatus.CANCELLED}),
    TaskStatus.QUEUED: frozenset({TaskStatus.RUNNING, TaskStatus.CANCELLED, TaskStatus.FAILED, TaskStatus.TIMED_OUT}),
    TaskStatus.RUNNING: frozenset(
        {
            TaskStatus.WAITING,
            TaskStatus.PAUSED,
            TaskStatus.QUEUED,
            TaskStatus.IDLE,
            *TERMINAL_STATUSES,
        }
    ),
    TaskStatus.WAITING: frozenset(
        {TaskStatus.RUNNING, TaskStatus.QUEUED, TaskStatus.CANCELLED, TaskStatus.FAILED, TaskStatus.TIMED_OUT}
    ),
    TaskStatus.PAUSED: frozenset({TaskStatus.RUNNING, TaskStatus.QUEUED, TaskStatus.CANCELLED, TaskStatus.TIMED_OUT}),
    TaskStatus.IDLE: frozenset({TaskStatus.QUEUED, TaskStatus.CANCELLED, TaskStatus.TIMED_OUT}),
    TaskStatus.SUCCEEDED: frozenset({TaskStatus.QUEUED}),  # a follow-up message continues the conversation
    TaskStatus.CANCELLED: frozenset(),
    TaskStatus.TIMED_OUT: frozenset(),
    TaskStatus.FAILED: frozenset({TaskStatus.QUEUED}),
    TaskStatus.COST_EXCEEDED: frozenset({TaskStatus.QUEUED}),
    TaskStatus.FAILED_OUTCOME: frozenset(),  # the answer and its last grade are the task's end
}


# What only a person's message leaves (``storage.messages``): an answered or interrupted
# conversation goes on. A generic ``transition`` never takes these edges.
REOPENED_BY_MESSAGE = frozenset({TaskStatus.SUCCEEDED, TaskStatus.IDLE})


def sources_of(target: TaskStatus) -> list[TaskStatus]:
    """Statuses from which ``target`` may be entered."""
    return [src for src, dsts in ALLOWED_TRANSITIONS.items() if target in dsts]
