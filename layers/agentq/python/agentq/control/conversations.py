"""Talking to a task: send it a message, interrupt it, close its conversation.

The unit of a conversation is the task, not a session resource beside it: a task already is a
conversation (its committed steps), with the budget, the compaction, the prompt cache and the
trace that a follow-up must keep, and a fork at a later exchange is the fork a task already has.
A follow-up to an answered task continues it in place (``succeeded -> queued``); its result is the
latest answer, and the trace shows each exchange. See ``storage.messages`` for the delivery rules.
"""

from __future__ import annotations

import logging
from decimal import Decimal

from agentq import observe
from agentq.control.operations import owned_task, planned_raise
from agentq.core.errors import ValidationError
from agentq.core.models import MAX_MESSAGE_CHARS, Task, TaskStatus, UserMessage
from agentq.core.stops import ScopeStopped, stop_covering
from agentq.queueing.queues import TaskQueues
from agentq.queueing.webhooks import enqueue_event
from agentq.storage.budget_items import BudgetRaise
from agentq.storage.container import Storage
from agentq.storage.messages import MAX_MESSAGES_PER_TASK, Accepted

log = logging.getLogger("agentq.control")


def send_message(
    store: Storage,
    queues: TaskQueues,
    task_id: str,
    text: str,
    *,
    tenant: str | None = None,
    idempotency_key: str | None = None,
    add_tokens: int = 0,
    add_steps: int = 0,
    add_usd: Decimal = Decimal(0),
    reopen_ended: bool = True,
) -> Accepted:
    """Give ``text`` to the task (see the module); ``add_tokens``, ``add_steps`` and ``add_usd``
    raise its caps with it, which is how a task that ran out of budget takes a follow-up (and how
    a long conversation gets more turns). The raise is written by the very write that accepts the
    message (``storage.messages``), after its checks and its idempotency key's: a refused message
    raises nothing, and a retry of one that was taken raises nothing again. ``reopen_ended``
    False: a task that has ended, an answered one too, is refused by that write
    (``IllegalTransition`` with its ``status``), never reopened (A2A's messages)."""
    if not text.strip():
        raise ValidationError("text must not be empty", field="text")
    if len(text) > MAX_MESSAGE_CHARS:
        raise ValidationError(f"text is {len(text):,} characters; a message holds at most {MAX_MESSAGE_CHARS:,}",
                              field="text")  # fmt: skip
    task = owned_task(store, task_id, tenant)
    stop = stop_covering(store.stops.list(task.tenant), task)
    if stop is not None:  # a follow-up would start work in a stopped scope
        raise ScopeStopped(stop)
    raised: BudgetRaise | None = None
    if add_tokens or add_steps or add_usd:
        raised = planned_raise(task, add_tokens=add_tokens, add_steps=add_steps, add_usd=add_usd)
    accepted: Accepted = store.messages.accept(
        task_id,
        text,
        tenant=tenant,
        idempotency_key=idempotency_key,
        double_texting=task.submission.double_texting,
        raised=raised,
        reopen_ended=reopen_ended,
    )
    if accepted.reopened:
        queues.send(task_id, task.submission.priority, tenant=task.tenant)
        log.info("task %s: follow-up message %d reopened it", task_id, accepted.message.seq)
    elif accepted.replayed and accepted.status is TaskStatus.QUEUED and not accepted.delivered:
        # The request that took it may have died before its queue message went (a 500, the
        # client retrying): send it again, as a retried submission does (control.submit). A
        # duplicate is harmless: the dispatcher drops a copy for a task another worker holds or
        # that has ended (queueing.dispatch._outcome). Else the run waits for the sweeper.
        queues.send(task_id, task.submission.priority, tenant=task.tenant)
    if not accepted.replayed:
        observe.message_received(task_id, task.tenant, accepted.message.seq, reopened=accepted.reopened)
        try:
            enqueue_event(queues, task.model_copy(update={"status": accepted.status}), "message_received",
                          seq=accepted.message.seq, message_id=accepted.message.message_id)  # fmt: skip
        except Exception:  # the message is taken; its callback is a notification, never a reason to fail
            log.warning("could not queue the message_received callback of task %s", task_id, exc_info=True)
    return accepted


def interrupt(store: Storage, task_id: str, *, tenant: str | None = None) -> TaskStatus:
    """Ask the agent to stop at its earliest safe point and wait for the next message."""
    return store.messages.interrupt(task_id, tenant=tenant)


def close(store: Storage, task_id: str, *, tenant: str | None = None) -> None:
    """The conversation takes no more messages; the task itself is left as it is."""
    store.messages.close(task_id, tenant=tenant)


def messages(
    store: Storage, task_id: str, *, tenant: str | None = None, after: int = 0, limit: int = MAX_MESSAGES_PER_TASK
) -> tuple[Task, list[UserMessage]]:
    """The task as read, and at most ``limit`` of the messages it had accepted then, after the
    ``after``-th, in order (its ``messages_delivered`` says which the agent has read; its
    ``messages_received``, whether more follow)."""
    task = owned_task(store, task_id, tenant)
    return task, store.messages.listed(task_id, after=after, upto=min(after + limit, task.messages_received))
