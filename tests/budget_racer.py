"""A process that races for tokens on a shared root budget (run by test_budget_race)."""

from __future__ import annotations

import json
import sys
from decimal import Decimal

from agentq.core.errors import BudgetExceeded
from agentq.core.records import BudgetDelta
from agentq.runtime import Settings, build_store


def main(root_id: str, task_id: str, amount: int, attempts: int) -> None:
    store = build_store(Settings.from_env())
    claimed = store.tasks.claim(task_id, f"racer-{task_id}", 60)
    assert claimed is not None
    lease, _ = claimed
    print("ready", flush=True)  # then wait for the starting gun: a line on stdin, sent to all at once
    sys.stdin.readline()
    granted = 0
    for step in range(attempts):
        try:
            store.budgets.reserve(lease, root_id, amount, step + 1)
            granted += 1
        except BudgetExceeded:
            pass
    # Settle every grant with a provider-reported usage below the hold, as a real call would.
    used = 0
    for _ in range(granted):
        spent = amount - 7
        store.budgets.settle_orphan(
            lease.task_id,
            root_id,
            BudgetDelta(reserved=amount, used=spent, cost_usd=Decimal(0), tokens_in=spent, tokens_out=0),
            inflight_epoch=None,
        )
        used += spent
    print(json.dumps({"granted": granted, "used": used}))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
