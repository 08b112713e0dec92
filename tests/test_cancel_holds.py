"""A task cancelled with a call's hold on it keeps the hold counted (ARCHITECTURE 4): the call
may be in flight, answered and not yet committed, or billed by a worker that died. No one claims
a cancelled task, so the hold was left in ``reserved`` for good and the call's possible spend
never counted. Now the cancel sets it aside as a successor would (``lapsed_<epoch>``): a worker
still alive settles it to its call's usage, or gives it back (its call never sent); else it is
counted as spent (unknown) at its deadline, by the ``release_holds`` message the cancel sends
for then, or at once when the deadline has passed. On moto server: the ticket's conditions are
DynamoDB's."""

from __future__ import annotations

import time
from decimal import Decimal
from types import SimpleNamespace
from typing import Any

import pytest

from agentq.control.operations import cancel
from agentq.core.models import TaskStatus
from agentq.core.records import BudgetDelta
from agentq.storage.container import Storage

from tests.helpers import scripted

HOLD = 4_000


class _Queues:
    """Stands in for TaskQueues: the messages a cancel sends."""

    def __init__(self) -> None:
        self.sent: list[dict[str, Any]] = []

    def send(self, task_id: str, tier: str, kind: str = "run", delay_seconds: int = 0, **_: Any) -> str:
        self.sent.append({"task_id": task_id, "kind": kind, "delay_seconds": delay_seconds})
        return "m"


def _held(store: Storage, until: float) -> tuple[str, Any]:
    """A running task whose worker holds ``HOLD`` tokens for its call, up to ``until``."""
    task = store.tasks.create(scripted([{"text": "x"}], max_tokens=10_000), tenant="t")
    claimed = store.tasks.claim(task.task_id, "w1", 30)
    assert claimed is not None
    lease = claimed[0]
    store.budgets.reserve(lease, task.task_id, HOLD, 1, until=until, micros=1_000)
    return task.task_id, lease


def test_a_dead_workers_hold_past_its_deadline_is_counted_as_spent_by_the_cancel(store: Storage) -> None:
    task_id, _ = _held(store, until=time.time() - 1)
    queues = _Queues()
    assert cancel(store, task_id, queues=queues) == [task_id]  # type: ignore[arg-type]
    budget = store.budgets.get(task_id)
    assert (budget.reserved, budget.used, budget.unknown) == (0, HOLD, HOLD)
    assert (budget.reserved_micros, budget.unknown_micros) == (0, 1_000)
    assert store.tasks.get(task_id).inflight is None and queues.sent == []


@pytest.mark.parametrize("answered", [True, False], ids=["its_call_answered", "its_call_never_sent"])
def test_a_live_workers_hold_is_set_aside_and_settled_by_that_worker(store: Storage, answered: bool) -> None:
    task_id, lease = _held(store, until=time.time() + 120)
    queues = _Queues()
    cancel(store, task_id, queues=queues)  # type: ignore[arg-type]
    task = store.tasks.get(task_id)
    assert task.inflight is None and set(task.lapsed_holds) == {lease.epoch}
    assert store.budgets.get(task_id).reserved == HOLD  # still counted while its call may complete
    [sent] = queues.sent
    assert sent["kind"] == "release_holds" and 100 <= sent["delay_seconds"] <= 121  # its deadline

    used = 1_234 if answered else 0  # the worker learns its call's outcome and settles its hold
    delta = BudgetDelta(reserved=HOLD, used=used, cost_usd=Decimal("0.0005") if answered else Decimal(0),
                        tokens_in=used, tokens_out=0, reserved_micros=1_000)  # fmt: skip
    assert store.budgets.settle_orphan(task_id, task_id, delta, inflight_epoch=lease.epoch)  # its ticket
    budget = store.budgets.get(task_id)
    assert (budget.reserved, budget.used, budget.unknown) == (0, used, 0)
    assert store.tasks.get(task_id).lapsed_holds == {}


def test_a_cancelled_task_without_a_hold_is_left_as_it_was(store: Storage) -> None:
    task = store.tasks.create(scripted([{"text": "x"}], max_tokens=10_000), tenant="t")
    queues = _Queues()
    cancel(store, task.task_id, queues=queues)  # type: ignore[arg-type]
    budget = store.budgets.get(task.task_id)
    assert (budget.reserved, budget.used, budget.unknown) == (0, 0, 0) and queues.sent == []


def test_a_dead_workers_hold_set_aside_at_the_cancel_is_counted_as_spent_when_its_release_comes(
    store: Storage, registry: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What the ``release_holds`` message does for an ended task (``dispatch._ended``): once
    the hold's deadline has passed, it is counted as spent; before, it is left counted. The
    engine's clock is moved past the deadline, not waited for: a deadline a moment away was
    passed already on a loaded machine before the first look."""
    from agentq.core.engine import Engine, EngineConfig, _spent

    task_id, _ = _held(store, until=time.time() + 60)
    cancel(store, task_id, queues=_Queues())  # type: ignore[arg-type]
    engine = Engine(store, worker_id="dispatcher", tools=registry, config=EngineConfig(lease_seconds=30))
    early = engine.spend_lapsed_holds(store.tasks.get(task_id))
    assert early > 0 and store.budgets.get(task_id).reserved == HOLD  # its call may still complete
    [hold] = store.tasks.get(task_id).lapsed_holds.values()
    later = time.time() + early + 1
    assert hold.lapsed_by(later)
    monkeypatch.setattr(_spent, "time", SimpleNamespace(time=lambda: later))
    assert engine.spend_lapsed_holds(store.tasks.get(task_id)) == 0
    budget = store.budgets.get(task_id)
    assert (budget.reserved, budget.used, budget.unknown) == (0, HOLD, HOLD)


def test_a_hold_taken_between_the_cancels_read_and_its_move_is_kept_counted(
    store: Storage, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The cancel read the task holding nothing; its worker then held for a call, just before
    the move to ``cancelled`` (after which it can hold nothing: ``fence``). That hold is set
    aside as any other the cancel finds, and its deadline's message sent. The cancel used to
    decide from the tree's read alone, so the hold stayed in ``reserved`` for good if the worker
    died."""
    task = store.tasks.create(scripted([{"text": "x"}], max_tokens=10_000), tenant="t")
    claimed = store.tasks.claim(task.task_id, "w1", 30)
    assert claimed is not None
    lease, moved = claimed[0], store.tasks.transition

    def held_then_moved(task_id: str, to: Any, **kwargs: Any) -> str:
        if task_id == task.task_id and not store.tasks.get(task_id).inflight:
            store.budgets.reserve(lease, task_id, HOLD, 1, until=time.time() + 120, micros=1_000)
        return moved(task_id, to, **kwargs)

    monkeypatch.setattr(store.tasks, "transition", held_then_moved)
    queues = _Queues()
    assert cancel(store, task.task_id, queues=queues) == [task.task_id]  # type: ignore[arg-type]
    after = store.tasks.get(task.task_id)
    assert after.inflight is None and set(after.lapsed_holds) == {lease.epoch}
    assert store.budgets.get(task.task_id).reserved == HOLD  # counted while its call may complete
    [sent] = queues.sent
    assert sent["kind"] == "release_holds" and 100 <= sent["delay_seconds"] <= 121


def _idle_with_a_dead_workers_hold(store: Storage, until: float) -> tuple[str, int]:
    """An idle conversation whose dead worker's hold (``HOLD``, up to ``until``) the claim that
    took over set aside (``lapsed_<epoch>``) before an interrupt left it ``idle``."""
    task = store.tasks.create(scripted([{"text": "x"}], max_tokens=10_000), tenant="t")
    dead = store.tasks.claim(task.task_id, "w1", -1)  # its lease lapsed at once: the worker died
    assert dead is not None
    store.budgets.reserve(dead[0], task.task_id, HOLD, 1, until=until, micros=1_000)
    successor = store.tasks.claim(task.task_id, "w2", 30)
    assert successor is not None
    lease, claimed = successor
    assert claimed.inflight is not None and claimed.inflight.epoch == dead[0].epoch
    store.budgets.set_aside(lease, claimed.inflight)
    assert store.messages.go_idle(lease, delivered=0) is None
    idle = store.tasks.get(task.task_id)
    assert idle.status is TaskStatus.IDLE and set(idle.lapsed_holds) == {dead[0].epoch}
    return task.task_id, dead[0].epoch


def test_an_idle_conversations_dead_hold_past_its_deadline_is_counted_as_spent_by_the_cancel(store: Storage) -> None:
    """No claim follows an idle task, nor its cancel: the hold a successor set aside stayed in
    ``reserved`` for good, the cancel reading only the current one."""
    task_id, _ = _idle_with_a_dead_workers_hold(store, until=time.time() - 1)
    queues = _Queues()
    assert cancel(store, task_id, queues=queues) == [task_id]  # type: ignore[arg-type]
    budget = store.budgets.get(task_id)
    assert (budget.reserved, budget.used, budget.unknown) == (0, HOLD, HOLD)
    assert store.tasks.get(task_id).lapsed_holds == {} and queues.sent == []


def test_an_idle_conversations_live_dead_hold_is_released_at_its_deadline_after_the_cancel(store: Storage) -> None:
    task_id, epoch = _idle_with_a_dead_workers_hold(store, until=time.time() + 120)
    queues = _Queues()
    cancel(store, task_id, queues=queues)  # type: ignore[arg-type]
    assert set(store.tasks.get(task_id).lapsed_holds) == {epoch}
    assert store.budgets.get(task_id).reserved == HOLD  # still counted while its call may complete
    [sent] = queues.sent
    assert sent["kind"] == "release_holds" and 100 <= sent["delay_seconds"] <= 121  # its deadline
