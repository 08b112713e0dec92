"""Moving a task to another version of its agent: the one write that changes what a task runs
after it was submitted (``control.aliases.move_task``), asked for explicitly by its owner.

The task's submission item is replaced, and an ``agent.moved`` event logged, in one transaction
conditional on the submission being the one the move was made from (``same_submission``: another
move in between is not undone; a raise moves the task out of these statuses) and on META's status
being one in which no worker holds the task (answered or idle):
a worker claims by reading META and the submission together, so it runs either the old version
or the new one, never a mix, and a run in flight is never changed under it.
"""

from __future__ import annotations

from collections.abc import Iterable

from agentq.core.models import TaskSubmission
from agentq.core.status import TaskStatus
from agentq.storage import keys
from agentq.storage.event_writes import NewEvent, logged_transact
from agentq.storage.table import Check, Item, Put, Table, TransactionCancelled, status_in
from agentq.storage.task_items import TaskItems, same_submission


class TaskBusy(Exception):
    """The task was not in one of the statuses the move needs when it was written."""


class SubmissionReplaced(Exception):
    """The submission the move was made from was replaced before it was written (another move)."""


def repin(
    table: Table,
    task_id: str,
    submission: TaskSubmission,
    *,
    before: str,
    statuses: Iterable[TaskStatus],
    read: Item,
) -> None:
    """Replace the submission of ``task_id`` (pinned to ``before``) with ``submission``, logging
    ``agent.moved``, only while its status is in ``statuses`` (else TaskBusy, nothing written)
    and its submission is still ``read``, the item it was made from (else SubmissionReplaced:
    another move written meanwhile is not undone, nor its ``agent.moved`` made false)."""
    guard = Check("meta", keys.meta_key(task_id), status_in(statuses))
    item = Put("submission", TaskItems.submission_item(task_id, submission), same_submission(read))
    event = NewEvent("agent.moved", {"from": before, "to": submission.agent})
    try:
        logged_transact(table, task_id, [guard, item], event)
    except TransactionCancelled as exc:
        if "meta" in exc.failed:
            raise TaskBusy(task_id) from None
        raise SubmissionReplaced(task_id) from None
