"""agentq's task statuses as A2A 1.0's task states, by the protocol's JSON names: one mapping,
read by the A2A server's views (``api/a2a_views.py``) and by the push notifications the worker
queues (``queueing/a2a_push.py``), which must agree with what ``GetTask`` answers.

``queued``/``blocked`` are ``submitted`` (no compute yet); ``running``/``waiting`` (children
running) are ``working``; ``paused`` is ``input-required``, or ``auth-required`` when the pause
waits for a vault credential; ``idle`` (interrupted, waiting for a person's message) is
``input-required``; ``succeeded`` is ``completed``; ``cancelled`` is ``canceled``; every other
end is ``failed``."""

from __future__ import annotations

from agentq.core.models import TaskStatus

SUBMITTED, WORKING, COMPLETED, CANCELED, FAILED = (
    "TASK_STATE_SUBMITTED",
    "TASK_STATE_WORKING",
    "TASK_STATE_COMPLETED",
    "TASK_STATE_CANCELED",
    "TASK_STATE_FAILED",
)
INPUT_REQUIRED, AUTH_REQUIRED = "TASK_STATE_INPUT_REQUIRED", "TASK_STATE_AUTH_REQUIRED"


def state_name(status: TaskStatus, *, credential: bool = False) -> str:
    """The A2A state of a task in ``status`` (``credential``: a pause waits for a vault credential)."""
    if status in (TaskStatus.QUEUED, TaskStatus.BLOCKED):
        return SUBMITTED
    if status in (TaskStatus.RUNNING, TaskStatus.WAITING):
        return WORKING
    if status is TaskStatus.PAUSED:
        return AUTH_REQUIRED if credential else INPUT_REQUIRED
    if status is TaskStatus.IDLE:
        return INPUT_REQUIRED
    if status is TaskStatus.SUCCEEDED:
        return COMPLETED
    if status is TaskStatus.CANCELLED:
        return CANCELED
    return FAILED
