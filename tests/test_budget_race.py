"""Invariant 4 under contention: 20 processes reserving against one root budget at once."""

from __future__ import annotations

from agentq.runtime import Settings
from agentq.storage.container import Storage

from tests.budget_racer import race
from tests.helpers import scripted

PROCESSES = 20
AMOUNT = 700
ATTEMPTS = 4
CAP = 20_000  # demand is 20 * 4 * 700 = 56,000 tokens, almost three times the cap


def test_twenty_processes_reserving_at_once_never_push_the_root_past_its_cap(
    settings: Settings, store: Storage
) -> None:
    root = store.tasks.create(scripted([{"text": "root"}], max_tokens=CAP), tenant="t")
    children = [
        store.tasks.create(
            scripted([{"text": "child"}]), tenant="t", root_id=root.task_id, parent_id=root.task_id, depth=1
        )
        for _ in range(PROCESSES)
    ]
    reports = race(settings, root.task_id, [c.task_id for c in children], AMOUNT, ATTEMPTS)

    granted = sum(r["granted"] for r in reports)
    budget = store.budgets.get(root.task_id)
    # Never past the cap, and no lost update either: exactly as many grants as fit.
    assert granted * AMOUNT <= CAP
    assert granted == CAP // AMOUNT
    assert budget.used == sum(r["used"] for r in reports) <= CAP
    assert budget.reserved == 0
    assert budget.available == CAP - budget.used
    assert sum(1 for r in reports if r["granted"] < ATTEMPTS) > 0  # there really was contention
