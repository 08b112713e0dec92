"""A process that races for tokens (and money) on a shared root budget, and ``race``, which
starts many of them at once (test_budget_race, test_money_budget; tests/racers.py)."""

from __future__ import annotations

import json
import sys
from decimal import Decimal
from typing import Any

from agentq.core.errors import BudgetExceeded
from agentq.core.records import BudgetDelta
from agentq.runtime import Settings, build_store


def main(root_id: str, task_id: str, amount: int, attempts: int, hold_micros: int = 0) -> None:
    """``hold_micros``: each hold also takes that much money (the race is then for the money cap)."""
    store = build_store(Settings.from_env())
    claimed = store.tasks.claim(task_id, f"racer-{task_id}", 60)
    assert claimed is not None
    lease, _ = claimed
    print("ready", flush=True)  # then wait for the starting gun: a line on stdin, sent to all at once
    sys.stdin.readline()
    granted = 0
    for step in range(attempts):
        try:
            store.budgets.reserve(lease, root_id, amount, step + 1, micros=hold_micros)
            granted += 1
        except BudgetExceeded:
            pass
    # Settle every grant with a provider-reported usage below the hold, as a real call would.
    used = used_micros = 0
    for _ in range(granted):
        spent = amount - 7
        cost = Decimal(max(hold_micros - 7, 0)) / 1_000_000
        store.budgets.settle_orphan(
            lease.task_id,
            root_id,
            BudgetDelta(
                reserved=amount, used=spent, cost_usd=cost, tokens_in=spent, tokens_out=0, reserved_micros=hold_micros
            ),
            inflight_epoch=None,
        )
        used += spent
        used_micros += max(hold_micros - 7, 0)
    print(json.dumps({"granted": granted, "used": used, "used_micros": used_micros}))


def race(
    settings: Settings, root_id: str, task_ids: list[str], amount: int, attempts: int, hold_micros: int = 0
) -> list[dict[str, Any]]:
    """One racer per task of ``task_ids``, each holding its task's lease before the gun; returns
    each one's report (granted, used, used_micros)."""
    from tests import racers

    args = [str(amount), str(attempts), *([str(hold_micros)] if hold_micros else [])]
    return racers.race(settings, "tests.budget_racer", [[root_id, task_id, *args] for task_id in task_ids])


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), *(int(a) for a in sys.argv[5:6]))
