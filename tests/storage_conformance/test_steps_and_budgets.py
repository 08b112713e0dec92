"""Step commits, reservations and settlements: fenced, all or nothing, never past the cap."""

from __future__ import annotations

import time
from typing import Any

import pytest

from agentq.core.errors import BudgetExceeded, ConversationMoved, LeaseLost
from agentq.core.models import TaskStatus
from agentq.core.records import NO_USAGE, Reservation
from agentq.storage import keys
from agentq.storage.container import Storage
from agentq.storage.item_size import item_size
from agentq.storage.steps import Steps
from agentq.storage.table import plain

from tests.storage_conformance._builders import claimed, llm_step, tools_step, usage


def test_a_commit_appends_the_step_advances_meta_and_settles_the_budget_together(backend: Storage) -> None:
    lease = claimed(backend, max_tokens=1000)
    backend.budgets.reserve(lease, lease.task_id, 300, 1)
    backend.steps.commit(lease, 1, llm_step(), root_id=lease.task_id, settle=usage(reserved=300, used=110))
    task, budget = backend.tasks.get(lease.task_id), backend.budgets.get(lease.task_id)
    assert task.step == 1 and task.llm_steps == 1 and task.inflight is None and task.tokens_in == 100
    assert (budget.used, budget.reserved, budget.available) == (110, 0, 890)
    assert [s.number for s in backend.steps.load(lease.task_id)] == [1]


def test_a_commit_with_the_next_reservation_is_refused_whole_when_the_budget_cannot_cover_it(backend: Storage) -> None:
    lease = claimed(backend, max_tokens=500)
    backend.steps.commit(lease, 1, llm_step(), root_id=lease.task_id, settle=usage(reserved=0, used=110))
    with pytest.raises(BudgetExceeded):
        backend.steps.commit(lease, 2, tools_step(), root_id=lease.task_id, reserve_next=1000)
    assert backend.tasks.get(lease.task_id).step == 1 and backend.steps.last(lease.task_id).number == 1  # type: ignore[union-attr]
    assert backend.budgets.get(lease.task_id).reserved == 0
    backend.steps.commit(lease, 2, tools_step(), root_id=lease.task_id, reserve_next=300)
    assert backend.tasks.get(lease.task_id).inflight == Reservation(amount=300, epoch=1, step=3)
    assert backend.budgets.get(lease.task_id).reserved == 300


def test_a_zombie_commits_nothing_and_a_step_number_is_never_written_twice(backend: Storage) -> None:
    lease = claimed(backend)
    backend.steps.commit(lease, 1, llm_step(), root_id=lease.task_id)
    with pytest.raises(LeaseLost, match="step moved"):
        backend.steps.commit(lease, 1, tools_step(), root_id=lease.task_id, reserve_next=5)
    backend.tasks.release(lease)
    successor = backend.tasks.claim(lease.task_id, "w2", 30)
    assert successor is not None
    with pytest.raises(LeaseLost, match="superseded"):
        backend.steps.commit(lease, 2, tools_step(), root_id=lease.task_id)
    backend.steps.commit(successor[0], 2, tools_step(), root_id=lease.task_id)
    assert [(s.number, s.epoch) for s in backend.steps.load(lease.task_id)] == [(1, 1), (2, 2)]


def test_a_finishing_commit_ends_the_task_with_its_result(backend: Storage) -> None:
    lease = claimed(backend)
    backend.steps.commit(lease, 1, llm_step(), root_id=lease.task_id, finish=TaskStatus.SUCCEEDED, result="done")
    task = backend.tasks.get(lease.task_id)
    assert task.status is TaskStatus.SUCCEEDED and task.result == "done" and task.lease_expires == 0 and task.expires_at
    with pytest.raises(LeaseLost, match="succeeded"):
        backend.steps.commit(lease, 2, tools_step(), root_id=lease.task_id)


@pytest.mark.parametrize(
    ("stop_reason", "finish"),
    [("end_turn", TaskStatus.SUCCEEDED), ("refusal", TaskStatus.FAILED), ("max_tokens", TaskStatus.COST_EXCEEDED)],
)
def test_a_commit_of_the_models_turn_that_would_end_the_task_is_refused_while_a_message_waits_however_it_ends(
    backend: Storage, stop_reason: str, finish: TaskStatus
) -> None:
    """ARCHITECTURE 11: the engine hears the message first (``ConversationMoved``) and goes on with
    it. A tools step's failing end does not heed it: that ending stands."""
    lease = claimed(backend)
    backend.messages.accept(lease.task_id, "one more thing")
    turn = llm_step().model_copy(update={"stop_reason": stop_reason})
    with pytest.raises(ConversationMoved) as moved:
        backend.steps.commit(lease, 1, turn, root_id=lease.task_id, finish=finish, error={"code": "x"}, delivered=0)
    assert moved.value.received == 1 and backend.tasks.get(lease.task_id).status is TaskStatus.RUNNING
    backend.steps.commit(lease, 1, turn, root_id=lease.task_id, delivered=0)  # the turn, ending nothing
    backend.steps.commit(lease, 2, tools_step(), root_id=lease.task_id, finish=TaskStatus.FAILED, delivered=0)
    assert backend.tasks.get(lease.task_id).status is TaskStatus.FAILED


def test_steps_read_back_by_range_and_last_with_large_bodies_offloaded(backend: Storage) -> None:
    lease = claimed(backend)
    for n in range(1, 6):
        backend.steps.commit(lease, n, llm_step() if n % 2 else tools_step("x" * 70_000), root_id=lease.task_id)
    assert [s.number for s in backend.steps.range(lease.task_id, 2, 2)] == [2, 3]
    last = backend.steps.last(lease.task_id)
    assert last is not None and last.number == 5
    assert backend.steps.load(lease.task_id)[1].body.results[0].content == "x" * 70_000  # type: ignore[union-attr]


def test_reservations_never_pass_the_cap(backend: Storage) -> None:
    lease = claimed(backend, max_tokens=1000)
    backend.budgets.reserve(lease, lease.task_id, 600, 1)
    with pytest.raises(BudgetExceeded):
        backend.budgets.reserve(lease, lease.task_id, 600, 1)
    budget = backend.budgets.get(lease.task_id)
    assert budget.reserved == 600 and budget.used + budget.reserved <= budget.cap


def test_a_hold_is_returned_exactly_once_by_whoever_holds_its_ticket(backend: Storage) -> None:
    lease = claimed(backend, max_tokens=1000)
    backend.budgets.reserve(lease, lease.task_id, 400, 1)
    ticket = backend.budgets.inflight(lease.task_id)
    assert ticket is not None and ticket.epoch == 1
    back = usage(reserved=400, used=50)
    assert backend.budgets.settle_orphan(lease.task_id, lease.task_id, back, inflight_epoch=1) is True
    assert backend.budgets.settle_orphan(lease.task_id, lease.task_id, back, inflight_epoch=1) is False  # usage only
    budget = backend.budgets.get(lease.task_id)
    assert (budget.reserved, budget.used) == (0, 100)  # the hold back once, the usage of both calls recorded


def test_a_reservation_by_a_zombie_is_refused(backend: Storage) -> None:
    lease = claimed(backend, max_tokens=1000)
    backend.tasks.release(lease)
    assert backend.tasks.claim(lease.task_id, "w2", 30) is not None
    with pytest.raises(LeaseLost):
        backend.budgets.reserve(lease, lease.task_id, 100, 1)
    assert backend.budgets.get(lease.task_id).reserved == 0


def test_raising_the_cap_adds_to_available(backend: Storage) -> None:
    lease = claimed(backend, max_tokens=1000)
    backend.steps.commit(lease, 1, llm_step(), root_id=lease.task_id, settle=usage(reserved=0, used=1000))
    raised = backend.budgets.raise_cap(lease.task_id, 500)
    assert (raised.cap, raised.available, raised.used) == (1500, 500, 1000)


def test_an_unsettled_commit_leaves_the_budget_alone(backend: Storage) -> None:
    lease = claimed(backend, max_tokens=1000)
    backend.steps.commit(lease, 1, tools_step(), root_id=lease.task_id, settle=NO_USAGE)
    assert backend.budgets.get(lease.task_id).available == 1000


def test_the_budget_rides_on_meta_which_stays_within_one_write_unit(backend: Storage) -> None:
    lease = claimed(backend, max_tokens=900_000_000)
    backend.budgets.reserve(lease, lease.task_id, 123_456, 1)
    backend.steps.commit(lease, 1, llm_step(), root_id=lease.task_id, settle=usage(reserved=123_456, used=100_110))
    backend.steps.commit(lease, 2, tools_step(), root_id=lease.task_id, reserve_next=234_567)
    meta = backend.table.get(keys.meta_key(lease.task_id))
    assert meta is not None and plain(meta)["available"] == 900_000_000 - 100_110 - 234_567
    assert item_size(meta) <= 1024  # every step commit rewrites META: one write unit, not two


def test_a_task_reserving_on_another_tasks_budget_is_capped_and_fenced(backend: Storage) -> None:
    root = claimed(backend, max_tokens=1000)
    other = claimed(backend, max_tokens=10)
    backend.budgets.reserve(other, root.task_id, 600, 1)
    with pytest.raises(BudgetExceeded):
        backend.budgets.reserve(other, root.task_id, 600, 2)
    assert backend.budgets.inflight(other.task_id) is not None and backend.budgets.inflight(root.task_id) is None
    assert (backend.budgets.get(root.task_id).reserved, backend.budgets.get(other.task_id).reserved) == (600, 0)
    back = usage(reserved=600, used=500)
    assert backend.budgets.settle_orphan(other.task_id, root.task_id, back, inflight_epoch=1) is True
    assert (backend.budgets.get(root.task_id).used, backend.budgets.get(root.task_id).reserved) == (500, 0)
    backend.tasks.release(other)
    assert backend.tasks.claim(other.task_id, "w2", 30) is not None
    with pytest.raises(LeaseLost):
        backend.budgets.reserve(other, root.task_id, 100, 2)
    assert backend.budgets.get(root.task_id).reserved == 0


def test_a_refused_commit_leaves_a_step_no_reader_sees_and_the_next_commit_overwrites(backend: Storage) -> None:
    lease = claimed(backend)
    backend.steps.commit(lease, 1, llm_step(text="one"), root_id=lease.task_id)
    backend.tasks.release(lease)
    successor = backend.tasks.claim(lease.task_id, "w2", 30)
    assert successor is not None
    with pytest.raises(LeaseLost, match="superseded"):  # the zombie's step item is written, its META write refused
        backend.steps.commit(lease, 2, llm_step(text="zombie"), root_id=lease.task_id)
    assert [i["sk"]["S"] for i in backend.steps.raw_items(lease.task_id)].count(keys.step_sk(2)) == 1
    assert [s.number for s in backend.steps.load(lease.task_id)] == [1]
    assert [s.number for s in backend.steps.range(lease.task_id, 1, 10)] == [1]
    assert backend.steps.last(lease.task_id).number == 1  # type: ignore[union-attr]
    backend.steps.commit(successor[0], 2, llm_step(text="two"), root_id=lease.task_id)
    (_, two) = backend.steps.load(lease.task_id)
    assert (two.epoch, two.body.content) == (2, [{"type": "text", "text": "two"}])  # type: ignore[union-attr]
    with pytest.raises(LeaseLost, match="superseded"):  # a committed step is never overwritten by a zombie
        backend.steps.commit(lease, 2, llm_step(text="zombie"), root_id=lease.task_id)
    assert backend.steps.load(lease.task_id)[1].body.content == two.body.content  # type: ignore[union-attr]


class _LostResponses:
    """A table whose every write is sent twice, as a client retries a request whose response
    was lost after the write went through (the second send meets the first one's effect)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def put(self, item: Any, *, condition: Any = None) -> None:
        self.inner.put(item, condition=condition)
        self.inner.put(item, condition=condition)

    def update(self, key: Any, update: Any, *, condition: Any = None, returns: Any = "NONE") -> Any:
        self.inner.update(key, update, condition=condition, returns=returns)
        return self.inner.update(key, update, condition=condition, returns=returns)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def test_a_step_commit_sent_twice_is_applied_once(backend: Storage) -> None:
    lease = claimed(backend, max_tokens=1000)
    backend.budgets.reserve(lease, lease.task_id, 300, 1)
    twice = Steps(_LostResponses(backend.table), backend.payloads, backend.tasks)
    twice.commit(lease, 1, llm_step(), root_id=lease.task_id, settle=usage(reserved=300, used=110))
    twice.commit(lease, 2, tools_step(), root_id=lease.task_id, reserve_next=200)
    budget, task = backend.budgets.get(lease.task_id), backend.tasks.get(lease.task_id)
    assert (budget.used, budget.reserved, budget.available) == (110, 200, 690)
    assert (task.step, task.llm_steps, task.tokens_in) == (2, 1, 100)
    assert [s.number for s in backend.steps.load(lease.task_id)] == [1, 2]


def test_a_hold_keeps_its_deadline_on_the_ticket_and_a_new_claim_leaves_it_counted(backend: Storage) -> None:
    lease = claimed(backend, max_tokens=1000)
    until = time.time() + 60.0004
    backend.budgets.reserve(lease, lease.task_id, 400, 1, until=until)
    backend.tasks.release(lease)
    assert backend.tasks.claim(lease.task_id, "w2", 30) is not None  # the successor's claim
    ticket = backend.budgets.inflight(lease.task_id)
    assert ticket is not None and ticket.epoch == 1 and ticket.amount == 400
    assert ticket.until is not None and until <= ticket.until < until + 0.001  # rounded up, never earlier
    budget = backend.budgets.get(lease.task_id)
    assert (budget.reserved, budget.available) == (400, 600)  # still counted under the new epoch


def test_a_commit_reserving_the_next_call_records_the_holds_deadline(backend: Storage) -> None:
    lease = claimed(backend, max_tokens=1000)
    backend.steps.commit(lease, 1, llm_step(), root_id=lease.task_id, settle=usage(reserved=0, used=110))
    backend.steps.commit(lease, 2, tools_step(), root_id=lease.task_id, reserve_next=300, hold_until=1234.5)
    assert backend.tasks.get(lease.task_id).inflight == Reservation(amount=300, epoch=1, step=3, until=1234.5)


def test_extending_a_holds_deadline_is_fenced_so_a_zombie_learns_it_before_its_call(backend: Storage) -> None:
    lease = claimed(backend, max_tokens=1000)
    held = backend.budgets.reserve(lease, lease.task_id, 400, 1, until=100.0)
    backend.budgets.extend_hold(lease, held, 200.25)
    assert backend.budgets.inflight(lease.task_id).until == 200.25  # type: ignore[union-attr]
    backend.tasks.release(lease)
    assert backend.tasks.claim(lease.task_id, "w2", 30) is not None
    with pytest.raises(LeaseLost):
        backend.budgets.extend_hold(lease, held, 300.0)
    ticket = backend.budgets.inflight(lease.task_id)
    assert ticket is not None and ticket.until == 200.25 and ticket.epoch == 1


def test_the_zombie_returns_its_own_hold_with_its_usage_while_its_ticket_is_still_there(backend: Storage) -> None:
    """What the successor's deferral buys: the zombie's late call is settled against its own hold."""
    lease = claimed(backend, max_tokens=1000)
    backend.budgets.reserve(lease, lease.task_id, 400, 1, until=time.time() + 60)
    backend.tasks.release(lease)
    assert backend.tasks.claim(lease.task_id, "w2", 30) is not None
    back = usage(reserved=400, used=380)
    assert backend.budgets.settle_orphan(lease.task_id, lease.task_id, back, inflight_epoch=1) is True
    budget = backend.budgets.get(lease.task_id)
    assert (budget.reserved, budget.used, budget.available) == (0, 380, 620)
    assert backend.budgets.inflight(lease.task_id) is None


def _taken_over_with_a_live_hold(backend: Storage, *, cap: int, hold: int) -> tuple[Any, Any, Any]:
    """Epoch 1 holds ``hold`` and loses its lease; epoch 2 claims and sets the hold aside."""
    lease = claimed(backend, max_tokens=cap)
    held = backend.budgets.reserve(lease, lease.task_id, hold, 1, until=time.time() + 60)
    backend.tasks.release(lease)
    claim = backend.tasks.claim(lease.task_id, "w2", 30)
    assert claim is not None
    successor = claim[0]
    backend.budgets.set_aside(successor, held)
    return lease, held, successor


def test_a_successor_sets_a_live_hold_aside_and_reserves_on_top_while_the_budget_covers_both(
    backend: Storage,
) -> None:
    lease, _, successor = _taken_over_with_a_live_hold(backend, cap=1000, hold=400)
    task = backend.tasks.get(lease.task_id)
    assert task.inflight is None and set(task.lapsed_holds) == {1} and task.lapsed_holds[1].amount == 400
    backend.budgets.reserve(successor, lease.task_id, 500, 2)
    budget = backend.budgets.get(lease.task_id)
    assert (budget.reserved, budget.available) == (900, 100)  # both holds counted: used <= cap whoever lands
    with pytest.raises(BudgetExceeded):
        backend.budgets.reserve(successor, lease.task_id, 200, 2)
    assert backend.budgets.get(lease.task_id).reserved == 900


def test_a_zombie_settles_its_set_aside_hold_with_its_usage_exactly_once(backend: Storage) -> None:
    lease, _, _ = _taken_over_with_a_live_hold(backend, cap=1000, hold=400)
    late = usage(reserved=400, used=380)
    assert backend.budgets.settle_orphan(lease.task_id, lease.task_id, late, inflight_epoch=1) is True
    budget = backend.budgets.get(lease.task_id)
    assert (budget.reserved, budget.used, budget.available) == (0, 380, 620)
    assert backend.tasks.get(lease.task_id).lapsed_holds == {}
    # Sent again (a retried write): the hold is gone, so only usage could be recorded; none here.
    assert (
        backend.budgets.settle_orphan(lease.task_id, lease.task_id, usage(reserved=400, used=0), inflight_epoch=1)
        is False
    )
    assert backend.budgets.get(lease.task_id).reserved == 0


def test_a_set_aside_hold_is_counted_spent_once_after_its_deadline(backend: Storage) -> None:
    lease, held, _ = _taken_over_with_a_live_hold(backend, cap=1000, hold=400)
    assert backend.budgets.spend_lapsed(lease.task_id, lease.task_id, held) is True
    assert backend.budgets.spend_lapsed(lease.task_id, lease.task_id, held) is False
    budget = backend.budgets.get(lease.task_id)
    assert (budget.reserved, budget.used, budget.available) == (0, 400, 600)  # never returned unspent
    assert backend.tasks.get(lease.task_id).lapsed_holds == {}


def test_an_older_epochs_current_hold_past_its_deadline_is_counted_spent_with_its_dollars(
    backend: Storage,
) -> None:
    lease = claimed(backend, max_tokens=1000)
    held = backend.budgets.reserve(lease, lease.task_id, 400, 1, until=time.time() + 60, micros=30_000)
    backend.tasks.release(lease)
    assert backend.budgets.spend_lapsed(lease.task_id, lease.task_id, held) is True
    budget = backend.budgets.get(lease.task_id)
    assert (budget.reserved, budget.used, budget.available) == (0, 400, 600)
    assert (budget.reserved_micros, budget.used_micros) == (0, 30_000)
    assert backend.budgets.inflight(lease.task_id) is None


def test_a_call_reported_after_its_hold_was_counted_spent_is_corrected_to_its_usage_once(
    backend: Storage,
) -> None:
    """A paused worker wakes after its hold's deadline and reports the provider's answer: the
    ledger ends at the real usage, and ``used <= cap`` held all along."""
    lease, held, successor = _taken_over_with_a_live_hold(backend, cap=1000, hold=400)
    backend.budgets.spend_lapsed(lease.task_id, lease.task_id, held)
    backend.budgets.reserve(successor, lease.task_id, 600, 2)  # the successor takes what is left
    with pytest.raises(BudgetExceeded):
        backend.budgets.reserve(successor, lease.task_id, 1, 2)
    late = usage(reserved=400, used=380)
    assert backend.budgets.settle_orphan(lease.task_id, lease.task_id, late, inflight_epoch=1) is True
    budget = backend.budgets.get(lease.task_id)
    assert (budget.reserved, budget.used, budget.available) == (600, 380, 20)
    assert budget.used + budget.reserved <= budget.cap
    assert (
        backend.budgets.settle_orphan(lease.task_id, lease.task_id, usage(reserved=400, used=0), inflight_epoch=1)
        is False
    )
    assert backend.budgets.get(lease.task_id).used == 380


def test_setting_aside_is_fenced_and_a_hold_already_settled_is_left_alone(backend: Storage) -> None:
    lease = claimed(backend, max_tokens=1000)
    held = backend.budgets.reserve(lease, lease.task_id, 400, 1, until=time.time() + 60)
    backend.tasks.release(lease)
    claim = backend.tasks.claim(lease.task_id, "w2", 30)
    assert claim is not None
    with pytest.raises(LeaseLost):
        backend.budgets.set_aside(lease, held)  # the old epoch cannot move tickets
    assert backend.budgets.settle_orphan(lease.task_id, lease.task_id, usage(reserved=400, used=0), inflight_epoch=1)
    backend.budgets.set_aside(claim[0], held)  # settled meanwhile by its own worker: nothing to set aside
    task = backend.tasks.get(lease.task_id)
    assert task.lapsed_holds == {} and backend.budgets.get(lease.task_id).reserved == 0
