"""What the two kinds of look share (``remote_poll``: a task waiting on a remote agent's task;
``batch_poll``: one waiting on its economy batch): telling a stray look from the due one.

Each park that queues a look records when it is due (``Task.look_due``, ``core.status.LOOK_DUE``),
and so does each batch look that queues the next, before it sends it (a compare-and-set on the
due it read: of two looks of one due, only one queues the next). The sweeper
(``queueing.sweeper``) sends a look for a task still waiting well past that time (moving the due
to now first): its look was lost with a worker or a dispatcher that died between the write and
the send. A look that arrives while the task is waiting with its next look due well after now is
a stray of an earlier park or look (one the sweeper re-sent while the late one was still on its
way): it is deleted without a claim and without asking the provider, so two looks never go on as
two chains. SQS delivers a delayed message no sooner than its delay, so the due look is never
early by more than the clocks' skew (``EARLY_SLACK``)."""

from __future__ import annotations

import time

from agentq.core.models import Task, TaskStatus
from agentq.queueing.dispatch._context import Action

# Seconds: the clocks of two hosts may differ (NTP keeps EC2 hosts within milliseconds); a look
# earlier than this is a stray. Well under the shortest look interval (30 s by default), so a
# stray that comes right after a park is told apart too. A poll floor set at or under it
# (AGENTQ_BATCH_POLL_SECONDS, AGENTQ_A2A_POLL_SECONDS, as the tests do) lets a stray within the
# slack through; it then meets the compare-and-set on the due (``next_look``) or the fenced
# claim, so it still never starts a second chain.
EARLY_SLACK = 5.0


def stray(task: Task) -> Action | None:
    """The delete of a look that arrived while the task's next one is due later; None for the due look."""
    if task.status is TaskStatus.WAITING and task.look_due is not None and task.look_due - time.time() > EARLY_SLACK:
        return Action("delete", "a stray look: the task's next look is due later", task_id=task.task_id)
    return None
