"""``Dispatcher``: parse the message, hand it to its kind's handler, answer with its ``Action``."""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from typing import Any

import pydantic

from agentq import observe
from agentq.core.engine import Engine, KeeperFactory
from agentq.core.records import ClaimOwner
from agentq.queueing.dispatch import _approval_due, _batch_poll, _poison, _remote_poll, _run, _schedule, _wake
from agentq.queueing.dispatch._context import DEFAULT_BACKOFF, Action, Context, Delivery, RetryBackoff
from agentq.queueing.fairness import FairShare
from agentq.queueing.ports import CancelTask, FireSchedule
from agentq.queueing.queues import MessageKind, TaskMessage, TaskQueues
from agentq.storage.container import Storage

Handler = Callable[[Context, TaskMessage, Delivery], Action]
# The handler of each kind of task message (a schedule's fire names no task: ``_schedule``).
HANDLERS: dict[MessageKind, Handler] = {
    "run": _run.handle,
    "continue": _run.handle,
    "safety_net": _run.handle,
    "release_holds": _run.handle,
    "renewed": _run.handle,
    "swept": _run.handle,
    "recovered": _run.handle,
    "redrive": _run.handle,
    "wake": _wake.handle,
    "approval_due": _approval_due.handle,
    "batch_poll": _batch_poll.handle,
    "remote_poll": _remote_poll.handle,
}


class Dispatcher(Context):
    """The context every handler shares, and ``handle``: one message in, one ``Action`` out."""

    def __init__(
        self,
        engine: Engine,
        store: Storage,
        queues: TaskQueues,
        *,
        max_receive_count: int,
        fire_schedule: FireSchedule,
        cancel: CancelTask,
        backoff: RetryBackoff = DEFAULT_BACKOFF,
        default_max_running: int | None = None,
        fleet_capacity: int | None = None,
        tier_limits: Mapping[str, int] | None = None,
    ) -> None:
        """``default_max_running``: the most running tasks per tenant without an override of
        its own (the deployment's ``AGENTQ_DEFAULT_TENANT_MAX_RUNNING``; None: unlimited).
        ``fleet_capacity``: the most running tasks of all tenants, shared by weight when full
        (``AGENTQ_FLEET_CAPACITY``; None: no fleet slot). ``tier_limits``: a tenant's most running
        tasks of each tier whose capacity is known (``Defaults.tier_limits``, from
        ``AGENTQ_TIER_CAPACITY``; none: no tier slot). ``fire_schedule`` and ``cancel``:
        ``control``'s, handed in; required, so a dispatcher cannot be built that fails only when
        a schedule's fire or a ``cancel_running`` key arrives (``agentq.runtime.build_dispatcher``,
        the one constructor outside the tests, hands them in)."""
        fair = FairShare(store, queues, default_limit=default_max_running, fleet_capacity=fleet_capacity,
                         cancel=cancel, tier_limits=tier_limits)  # fmt: skip
        super().__init__(engine, store, queues, max_receive_count, backoff, fair, fire_schedule)

    def handle(
        self,
        body: str,
        *,
        tier: str,
        receive_count: int,
        attributes: dict[str, Any] | None = None,
        deadline: float | None = None,
        keeper: KeeperFactory | None = None,
        on_beat: Callable[[], None] | None = None,
        stop: threading.Event | None = None,
        owner: ClaimOwner | None = None,
    ) -> Action:
        try:
            message = TaskMessage.model_validate_json(body)
        except pydantic.ValidationError as exc:
            return _poison.not_a_message(exc)
        if message.kind == "schedule":
            return _schedule.handle(self, message)
        delivery = Delivery(tier, receive_count, attributes, deadline, keeper, on_beat, stop, owner)
        with observe.task_context(task_id=message.task_id):
            return HANDLERS[message.kind](self, message, delivery)
