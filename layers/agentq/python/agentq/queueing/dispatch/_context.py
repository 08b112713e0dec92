"""What every handler of a message shares: the dispatcher's ``Context``, one message's
``Delivery``, and the ``Action`` a handler answers with.

A handler reads and writes through the context (the engine, the store, the queues, the fair-share
gate, the failure allowance, what ``control`` hands in) and never reaches back into the
dispatcher that called it: the walk of a message goes down, from ``_dispatcher`` to its kind's
handler to the shared steps below it.
"""

from __future__ import annotations

import math
import random
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from agentq.core.engine import Engine, KeeperFactory, RunResult
from agentq.core.models import Task, TaskStatus
from agentq.core.records import ClaimOwner
from agentq.queueing.endings import task_ended
from agentq.queueing.fairness import FairShare
from agentq.queueing.ports import FireSchedule
from agentq.queueing.queues import MessageKind, TaskQueues
from agentq.storage.container import Storage

ActionKind = Literal["delete", "retry", "dead_letter", "abandon"]
MAX_VISIBILITY = 12 * 3600
MAX_DELAY = 900  # SQS DelaySeconds limit
# Statuses a task leaves only by a message of its own (a wake, an approval's, a batch's, a
# conversation's): any other message for it is deleted.
PARKED = (TaskStatus.WAITING, TaskStatus.PAUSED, TaskStatus.IDLE)


@dataclass
class Action:
    """What the adapter does with the message on SQS."""

    kind: ActionKind
    reason: str = ""
    delay_seconds: int = 0
    task_id: str | None = None
    run: RunResult | None = None
    attempts: int = 0  # a retry: the task's own failures so far (not the message's receives)
    dead_letter_id: str | None = None  # a dead letter whose task this failed: which failure (META's ``dead_letter``)


@dataclass(frozen=True)
class RetryBackoff:
    """Exponential backoff with full jitter for retryable failures, in whole seconds (SQS)."""

    base_seconds: float = 2.0
    cap_seconds: float = 900.0

    def delay(self, receive_count: int, rng: random.Random | None = None) -> int:
        ceiling = min(self.cap_seconds, self.base_seconds * 2 ** max(0, receive_count - 1))
        return max(1, int((rng or random).uniform(ceiling / 2, ceiling)))


DEFAULT_BACKOFF = RetryBackoff()


@dataclass(frozen=True)
class Delivery:
    """One receive of a message, as the adapter hands it over: the tier it came from, how often
    SQS delivered it, its attributes (a dead letter's), and how the run is kept and stopped."""

    tier: str
    receive_count: int
    attributes: dict[str, Any] | None = None
    deadline: float | None = None
    keeper: KeeperFactory | None = None
    on_beat: Callable[[], None] | None = None
    stop: threading.Event | None = None
    owner: ClaimOwner | None = None


@dataclass
class Context:
    """The dispatcher's parts, named: what every handler may use.

    ``store`` is the whole store, not ``engine.store`` (the engine's ports): the dispatcher also
    records task tokens and wakes spawns, which the engine never does. ``fire_schedule`` is
    ``control``'s (``queueing.ports``), handed in by ``agentq.runtime.build_dispatcher``."""

    engine: Engine
    store: Storage
    queues: TaskQueues
    max_receive_count: int
    backoff: RetryBackoff
    fair: FairShare
    fire_schedule: FireSchedule

    def end(self, task: Task, status: TaskStatus, *, give_back: Callable[[], object] | None = None) -> None:
        """The task ended: ``queueing.endings.task_ended``, its parent told through the engine's fan-out."""
        task_ended(self.store, self.queues, task, status, fanout=self.engine.fanout, give_back=give_back)

    def send_later(self, task_id: str, tier: str, kind: MessageKind, wait: float, *, tenant: str) -> None:
        """A follow-up message for the task in ``wait`` seconds (at least 1, at most SQS's 15 minutes)."""
        self.queues.send(task_id, tier, kind=kind, delay_seconds=delay_seconds(wait), tenant=tenant)


def delay_seconds(wait: float) -> int:
    """A wait as a message's delay: whole seconds, at least 1, at most SQS's 15 minutes (a
    longer wait is a message that, when it comes, sends the next one)."""
    return min(MAX_DELAY, max(1, math.ceil(wait)))


def parked(task: Task) -> Action | None:
    """A delete when the task waits for a message of its own (see ``PARKED``)."""
    if task.status in PARKED:
        return Action("delete", f"task is {task.status.value}; it is woken by its own message", task_id=task.task_id)
    return None
