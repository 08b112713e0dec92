"""The ledger keeps what the provider reported apart from what no one knows (ARCHITECTURE 4).

``used`` counts both, so ``used <= cap`` stays absolute; ``unknown`` is the part of it that is
holds counted as spent with their calls' outcomes unknown (and a folded child's), so ``known =
used - unknown`` is exactly the sum of the usage reported for the tree's calls. Every path that
moves the ledger is walked here, on both backends, in tokens and in dollars.
"""

from __future__ import annotations

import time
from decimal import Decimal

import pytest

from agentq.core.fanout import ChildPlan
from agentq.core.models import Task
from agentq.core.pricing import micros
from agentq.core.records import BudgetDelta, BudgetState, Reservation
from agentq.core.reservation import Seen
from agentq.storage.container import Storage

from tests.helpers import scripted
from tests.storage_conformance._builders import claimed, llm_step

HOLD, HOLD_MICROS = 400, 30_000


def _usage(used: int, hold: int = HOLD, hold_micros: int = HOLD_MICROS, cost: str = "0.002") -> BudgetDelta:
    return BudgetDelta(reserved=hold, used=used, cost_usd=Decimal(cost), tokens_in=used - 10, tokens_out=10,
                       reserved_micros=hold_micros)  # fmt: skip


def _reported(budget: BudgetState) -> int:
    return budget.tokens_in + budget.tokens_out


def _assert_ledger(budget: BudgetState, *, unknown: int, unknown_micros: int) -> None:
    assert (budget.unknown, budget.unknown_micros) == (unknown, unknown_micros)
    assert budget.known == _reported(budget)  # known is exactly what the provider reported
    assert budget.known_micros == micros(budget.cost_usd)  # in dollars too
    assert budget.used + budget.reserved <= budget.cap


def _held(backend: Storage, cap: int = 1000) -> tuple[str, Reservation]:
    """Epoch 1 holds a call's tokens and dollars, then loses its lease (its outcome unknown)."""
    lease = claimed(backend, max_tokens=cap)
    held = backend.budgets.reserve(lease, lease.task_id, HOLD, 1, until=time.time() + 60, micros=HOLD_MICROS)
    backend.tasks.release(lease)
    return lease.task_id, held


def test_a_call_settled_by_its_commit_is_known_in_full(backend: Storage) -> None:
    lease = claimed(backend, max_tokens=1000)
    backend.budgets.reserve(lease, lease.task_id, HOLD, 1, micros=HOLD_MICROS)
    backend.steps.commit(lease, 1, llm_step(), root_id=lease.task_id, settle=_usage(110))
    _assert_ledger(backend.budgets.get(lease.task_id), unknown=0, unknown_micros=0)


def test_a_hold_spent_at_its_deadline_is_unknown_and_its_late_report_makes_it_known(backend: Storage) -> None:
    task_id, held = _held(backend)
    backend.budgets.spend_lapsed(task_id, task_id, held)
    spent = backend.budgets.get(task_id)
    assert spent.used == HOLD
    _assert_ledger(spent, unknown=HOLD, unknown_micros=HOLD_MICROS)
    assert backend.budgets.settle_orphan(task_id, task_id, _usage(110), inflight_epoch=1) is True
    reported = backend.budgets.get(task_id)
    assert (reported.used, reported.used_micros) == (110, 2000)
    _assert_ledger(reported, unknown=0, unknown_micros=0)
    # Reported twice (a retried write): the ticket is gone; the unknown is not taken twice.
    backend.budgets.settle_orphan(task_id, task_id, _usage(0, cost="0"), inflight_epoch=1)
    _assert_ledger(backend.budgets.get(task_id), unknown=0, unknown_micros=0)


def test_a_failed_attempts_spent_hold_leaves_no_ticket_for_a_later_settlement_of_its_epoch(backend: Storage) -> None:
    """A retry after an attempt that may have been billed counts that attempt's hold as spent,
    and no answer can come for it (``ticket=False``). A later settlement of the same epoch, a
    grade's replayed once more, finds no ticket to correct: it used to find that stale
    ``spent_<epoch>`` and take the attempt's unknown back as if its call had been reported."""
    lease = claimed(backend, max_tokens=10_000)
    first = backend.budgets.reserve(lease, lease.task_id, HOLD, 1, until=time.time() + 60, micros=HOLD_MICROS)
    assert backend.budgets.spend_lapsed(lease.task_id, lease.task_id, first, ticket=False)
    backend.budgets.reserve(lease, lease.task_id, HOLD, 1, micros=HOLD_MICROS)  # the retry's own hold
    backend.steps.commit(lease, 1, llm_step(), root_id=lease.task_id, settle=_usage(110))
    assert not backend.budgets.settle_orphan(lease.task_id, lease.task_id, _usage(50), inflight_epoch=lease.epoch,
                                             ticketed=True)  # fmt: skip
    after = backend.budgets.get(lease.task_id)
    assert (after.used, after.reserved) == (HOLD + 110, 0)
    _assert_ledger(after, unknown=HOLD, unknown_micros=HOLD_MICROS)


def test_a_set_aside_hold_settled_by_its_zombie_before_its_deadline_never_becomes_unknown(backend: Storage) -> None:
    task_id, held = _held(backend)
    successor = backend.tasks.claim(task_id, "w2", 30)
    assert successor is not None
    backend.budgets.set_aside(successor[0], held)
    backend.budgets.settle_orphan(task_id, task_id, _usage(110), inflight_epoch=1)
    backend.budgets.spend_lapsed(task_id, task_id, held)  # too late: settled already
    _assert_ledger(backend.budgets.get(task_id), unknown=0, unknown_micros=0)


def test_spent_holds_add_up_as_unknown_and_each_report_takes_back_only_its_own(backend: Storage) -> None:
    lease = claimed(backend, max_tokens=10_000)
    task_id, holds = lease.task_id, []
    for epoch in (1, 2, 3):
        got = backend.tasks.claim(task_id, f"w{epoch}", 30) if epoch > 1 else (lease, None)
        assert got is not None
        holds.append(backend.budgets.reserve(got[0], task_id, HOLD + epoch, epoch, until=time.time() + 60,
                                             micros=HOLD_MICROS + epoch))  # fmt: skip
        backend.tasks.release(got[0])
        backend.budgets.spend_lapsed(task_id, task_id, holds[-1])
    _assert_ledger(backend.budgets.get(task_id), unknown=3 * HOLD + 6, unknown_micros=3 * HOLD_MICROS + 6)
    backend.budgets.settle_orphan(task_id, task_id, _usage(50, HOLD + 2, HOLD_MICROS + 2), inflight_epoch=2)
    _assert_ledger(backend.budgets.get(task_id), unknown=2 * HOLD + 4, unknown_micros=2 * HOLD_MICROS + 4)


def _child_holding(backend: Storage) -> tuple[Task, str, Reservation]:
    """A parent that spawned a child whose worker held for a call, then lost its lease (the
    call's outcome unknown): the parent, the child's id and the hold."""
    lease = claimed(backend, max_tokens=5000)
    parent = backend.tasks.get(lease.task_id)
    child_id = f"child-{time.time_ns()}"
    backend.spawns.create(lease, parent, "sp1", [ChildPlan(child_id, scripted([{"text": "c"}]), 1000, 60)], [], 1)
    first = backend.tasks.claim(child_id, "w2", 30)
    assert first is not None
    held = backend.budgets.reserve(first[0], child_id, HOLD, 1, until=time.time() + 60, micros=HOLD_MICROS)
    backend.tasks.release(first[0])
    return parent, child_id, held


def _child_folded(backend: Storage, *, spent_before_fold: bool) -> tuple[str, str, Reservation]:
    """A child whose call's hold outlived its worker, folded into its parent with the hold still
    out (set aside) or already counted as spent."""
    parent, child_id, held = _child_holding(backend)
    if spent_before_fold:
        backend.budgets.spend_lapsed(child_id, child_id, held, parent_id=parent.task_id)
    backend.budgets.settle_child(parent.task_id, child_id)
    return parent.task_id, child_id, held


@pytest.mark.parametrize("spent_before_fold", [False, True], ids=["hold_out_at_fold", "spent_before_fold"])
def test_a_folded_childs_unknown_is_the_parents_until_its_call_is_reported(
    backend: Storage, spent_before_fold: bool
) -> None:
    parent_id, child_id, held = _child_folded(backend, spent_before_fold=spent_before_fold)
    _assert_ledger(backend.budgets.get(parent_id), unknown=HOLD, unknown_micros=HOLD_MICROS)
    backend.budgets.spend_lapsed(child_id, child_id, held, parent_id=parent_id)  # no-op when spent already
    _assert_ledger(backend.budgets.get(parent_id), unknown=HOLD, unknown_micros=HOLD_MICROS)
    _assert_ledger(backend.budgets.get(child_id), unknown=HOLD, unknown_micros=HOLD_MICROS)
    backend.budgets.settle_orphan(child_id, child_id, _usage(110), inflight_epoch=1, parent_id=parent_id)
    parent = backend.budgets.get(parent_id)
    assert parent.used == 110
    _assert_ledger(parent, unknown=0, unknown_micros=0)
    _assert_ledger(backend.budgets.get(child_id), unknown=0, unknown_micros=0)


def _seen(held: Reservation) -> Seen:
    """What the stream of ``held``'s call said it had billed before it was lost."""
    return Seen(epoch=held.epoch, step=held.step, until=held.until, tokens_in=120, tokens_out=30, micros=900)


def test_what_a_spent_holds_call_was_seen_to_bill_is_known_and_only_the_rest_unknown(backend: Storage) -> None:
    task_id, held = _held(backend)
    backend.budgets.spend_lapsed(task_id, task_id, held.with_seen(_seen(held)))
    spent = backend.budgets.get(task_id)
    assert (spent.used, spent.known, spent.tokens_in, spent.tokens_out) == (HOLD, 150, 120, 30)
    _assert_ledger(spent, unknown=HOLD - 150, unknown_micros=HOLD_MICROS - 900)
    backend.budgets.settle_orphan(task_id, task_id, _usage(210), inflight_epoch=1)  # reported whole after all
    reported = backend.budgets.get(task_id)
    assert (reported.used, reported.tokens_in, reported.tokens_out) == (210, 200, 10)
    _assert_ledger(reported, unknown=0, unknown_micros=0)


def test_a_seen_note_of_another_step_or_epoch_is_not_the_holds() -> None:
    held = Reservation(amount=HOLD, epoch=1, step=1, until=1000.0, micros=HOLD_MICROS)
    # Another epoch's, another step's, or another hold's of this step (a retry's: another deadline).
    for other in (Seen(2, 1, 1000.0, 120), Seen(1, 2, 1000.0, 120), Seen(1, 1, 1030.0, 120), Seen(1, 1, None, 120)):
        assert held.with_seen(other).seen == 0
    assert held.with_seen(Seen(1, 1, 1000.0005, 120)).seen == 120  # a deadline stored to the millisecond
    assert held.with_seen(Seen(1, 1, 1000.0, HOLD + 50, 10)).seen == HOLD  # never more than the hold


@pytest.mark.parametrize("spent_before_fold", [False, True], ids=["hold_out_at_fold", "spent_before_fold"])
def test_a_folded_childs_seen_usage_is_known_in_the_parent_too(backend: Storage, spent_before_fold: bool) -> None:
    parent, child_id, held = _child_holding(backend)
    seen = held.with_seen(_seen(held))
    if spent_before_fold:
        backend.budgets.spend_lapsed(child_id, child_id, seen, parent_id=parent.task_id)
    backend.budgets.settle_child(parent.task_id, child_id)
    backend.budgets.spend_lapsed(child_id, child_id, seen, parent_id=parent.task_id)  # no-op if spent already
    for budget_id in (parent.task_id, child_id):
        budget = backend.budgets.get(budget_id)
        assert budget.known == 150, budget_id
        _assert_ledger(budget, unknown=HOLD - 150, unknown_micros=HOLD_MICROS - 900)
    backend.budgets.settle_orphan(child_id, child_id, _usage(210), inflight_epoch=1, parent_id=parent.task_id)
    for budget_id in (parent.task_id, child_id):
        budget = backend.budgets.get(budget_id)
        assert budget.known == 210, budget_id
        _assert_ledger(budget, unknown=0, unknown_micros=0)


def test_a_late_report_of_exactly_the_holds_size_racing_a_fold_is_folded_as_known(
    backend: Storage, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The child's spent hold is reported, for exactly its size, between the fold's read of the
    child and its write: ``used`` and ``reserved`` do not move, but the unknown becomes known.
    The fold must carry what the child holds at its write, so it tries again: it used to check
    only ``used`` and ``reserved`` and fold the stale unknown, leaving the parent's ledger
    counting a reported call as unknown for good."""
    parent, child_id, held = _child_holding(backend)
    backend.budgets.spend_lapsed(child_id, child_id, held, parent_id=parent.task_id)
    read, reported = backend.budgets.get, list[bool]()

    def read_then_report(budget_id: str) -> BudgetState:
        state = read(budget_id)
        if budget_id == child_id and not reported:  # the report lands between the fold's read and write
            reported.append(backend.budgets.settle_orphan(child_id, child_id, _usage(HOLD), inflight_epoch=1,
                                                          parent_id=parent.task_id))  # fmt: skip
        return state

    monkeypatch.setattr(backend.budgets, "get", read_then_report)
    backend.budgets.settle_child(parent.task_id, child_id)
    monkeypatch.undo()
    assert reported == [True]
    for budget_id in (parent.task_id, child_id):
        budget = backend.budgets.get(budget_id)
        assert (budget.used, budget.known) == (HOLD, HOLD), budget_id
        _assert_ledger(budget, unknown=0, unknown_micros=0)


def _grandchild_holding(backend: Storage) -> tuple[list[str], Reservation]:
    """A root, its child and the child's child, whose worker held for a call and then lost its
    lease (the call's outcome unknown): the budgets' ids, root first, and the hold."""
    lease = claimed(backend, max_tokens=5000)
    ids = [lease.task_id, f"child-{time.time_ns()}", f"grandchild-{time.time_ns()}"]
    for i, share in ((1, 1000), (2, 600)):
        parent = backend.tasks.get(ids[i - 1])
        backend.spawns.create(lease, parent, f"sp{i}", [ChildPlan(ids[i], scripted([{"text": "c"}]), share, 60)], [], 1)
        got = backend.tasks.claim(ids[i], "w2", 30)
        assert got is not None
        lease = got[0]
    held = backend.budgets.reserve(lease, ids[2], HOLD, 1, until=time.time() + 60, micros=HOLD_MICROS)
    backend.tasks.release(lease)
    return ids, held


def _grandchild_folded(
    backend: Storage, *, spent_before_fold: bool, seen: bool = False
) -> tuple[list[str], Reservation]:
    """The grandchild's call still out when the tree ended around it (a cancel, or the root's
    fan-out giving up on the child): the grandchild folded into the child, the child into the
    root, leaves first. The budgets' ids, root first, and the hold (with what its call was seen
    to bill, ``seen``)."""
    ids, held = _grandchild_holding(backend)
    held = held.with_seen(_seen(held)) if seen else held
    if spent_before_fold:
        backend.budgets.spend_lapsed(ids[2], ids[2], held, parent_id=ids[1])
    backend.budgets.settle_child(ids[1], ids[2])
    backend.budgets.settle_child(ids[0], ids[1])
    return ids, held


@pytest.mark.parametrize("spent_before_fold", [False, True], ids=["hold_out_at_fold", "spent_before_fold"])
def test_a_grandchilds_call_reported_after_the_tree_was_folded_corrects_every_budget_above_it(
    backend: Storage, spent_before_fold: bool
) -> None:
    """The folds carried the grandchild's hold, whole, into the child and the root. Its report
    must correct every one of them: it corrected the child only, and the root kept the whole
    hold as used and unknown for good (a cancel of a tree whose grandchildren were mid call)."""
    ids, _ = _grandchild_folded(backend, spent_before_fold=spent_before_fold)
    for budget_id in ids[:2]:  # the folds counted it as spent, unknown; the grandchild holds it
        _assert_ledger(backend.budgets.get(budget_id), unknown=HOLD, unknown_micros=HOLD_MICROS)
    assert backend.budgets.settle_orphan(ids[2], ids[2], _usage(110), inflight_epoch=1, parent_id=ids[1]) is True
    for budget_id in ids:
        budget = backend.budgets.get(budget_id)
        assert (budget.used, budget.reserved) == (110, 0), budget_id
        _assert_ledger(budget, unknown=0, unknown_micros=0)


def test_what_a_folded_grandchilds_spent_hold_was_seen_to_bill_is_known_all_the_way_up(backend: Storage) -> None:
    ids, held = _grandchild_folded(backend, spent_before_fold=False, seen=True)
    backend.budgets.spend_lapsed(ids[2], ids[2], held, parent_id=ids[1])
    for budget_id in ids:
        budget = backend.budgets.get(budget_id)
        assert (budget.used, budget.known) == (HOLD, 150), budget_id
        _assert_ledger(budget, unknown=HOLD - 150, unknown_micros=HOLD_MICROS - 900)


def test_a_fold_of_the_child_landing_after_the_report_read_the_line_is_corrected_one_level_higher(
    backend: Storage, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The report reads the grandchild's ancestors while the child is not yet folded; the
    child's fold lands before the report's write. The write, conditioned on the child still not
    folded, fails, and the report reads the line again: the root gets the correction too."""
    from agentq.storage import budget_folds, budgets

    ids, _ = _grandchild_holding(backend)
    backend.budgets.settle_child(ids[1], ids[2])
    read, folded = budget_folds.folded_line, list[bool]()

    def read_then_fold(table: object, parent_id: str) -> list[tuple[str, bool]]:
        line = read(table, parent_id)  # type: ignore[arg-type]
        if not folded:  # the child's fold lands between the read and the write
            backend.budgets.settle_child(ids[0], ids[1])
            folded.append(True)
        return line

    monkeypatch.setattr(budgets, "folded_line", read_then_fold)
    assert backend.budgets.settle_orphan(ids[2], ids[2], _usage(110), inflight_epoch=1, parent_id=ids[1]) is True
    monkeypatch.undo()
    assert folded == [True]
    for budget_id in ids:
        budget = backend.budgets.get(budget_id)
        assert (budget.used, budget.reserved) == (110, 0), budget_id
        _assert_ledger(budget, unknown=0, unknown_micros=0)
