"""What queueing needs from the layer above it (``control``), as narrow interfaces.

A schedule's fire (``control.schedules.fire``) and a cancel (``control.operations.cancel``, for
a concurrency key's ``cancel_running``) are operations people perform, written in ``control``,
which itself enqueues through ``queueing.queues``. Queueing reaching up for them made the two
layers lean on each other; instead ``agentq.runtime.build_dispatcher`` (and ``control.submit``
for the gate it runs at submission) hands them in, and the import contract forbids
``queueing -> control`` (pyproject's ``agentq-layers``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from agentq.core.tools import ToolRegistry
    from agentq.queueing.queues import TaskQueues
    from agentq.storage.container import Storage
    from agentq.storage.running_slots import RunningSlots


class FireSchedule(Protocol):
    """One fire of a schedule: the task it created (or had created), None when skipped or gone."""

    def __call__(
        self,
        store: Storage,
        tools: ToolRegistry,
        queues: TaskQueues | None,
        *,
        tenant: str,
        name: str,
        fire_time: float,
    ) -> str | None: ...


class CancelTask(Protocol):
    """Cancel a task and its subtree; the ids cancelled. Raises ``IllegalTransition`` when it
    ended meanwhile, ``TaskNotFound`` when it is gone."""

    def __call__(
        self,
        store: Storage,
        task_id: str,
        *,
        tenant: str | None = None,
        reason: str = ...,
        queues: TaskQueues | None = None,
        slots: RunningSlots | None = None,
    ) -> list[str]: ...
