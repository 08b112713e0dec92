"""Holds counted as spent: a call whose outcome no run will learn (its worker died, its lease
was lost, it was cut) keeps its hold counted, moved from held to ``unknown``, once.

The engine's way (``_holds.BudgetHolds``: at a claim, a reservation, the dispatcher's
``release_holds``) and a cancel's (``control.operations``), which no engine runs, share these
functions, so a hold is counted one way whoever counts it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from agentq import observe
from agentq.core.models import Task
from agentq.core.ports import BudgetLedger
from agentq.core.reservation import Reservation


@dataclass(frozen=True)
class LapsedHolds:
    """What settling a task's lapsed holds left: the holds still live (by epoch), the seconds
    left until each of them can no longer be charged, and how many were counted as spent now
    (moved from held to ``unknown``: ``reserve`` weighs them again)."""

    kept: dict[int, Reservation]
    live: list[float]
    spent: int = 0


def spend_lapsed(budgets: BudgetLedger, task: Task) -> LapsedHolds:
    """Count as spent the holds older epochs left on ``task`` (``lapsed_<epoch>``) whose calls
    can no longer complete, each once (``count_as_spent``); the rest are kept, with the seconds
    left until each can no longer be charged. The engine's way (a claim, a reservation, the
    dispatcher's ``release_holds`` for a task no run will claim for them) and a cancel's, which
    no engine runs."""
    now = time.time()
    live, kept, spent = [], {}, 0
    for epoch, held in task.lapsed_holds.items():
        if held.lapsed_by(now):
            count_as_spent(budgets, task, held.with_seen(task.seen))
            spent += 1
        else:
            kept[epoch] = held
            live.append(held.until - now if held.until is not None else 0.0)
    return LapsedHolds(kept, live, spent)


def count_as_spent(
    budgets: BudgetLedger, task: Task, held: Reservation, *, ticket: bool = True, forget_batch: bool = False
) -> bool:
    """Count ``task``'s hold ``held`` as spent, its outcome unknown but for what its call was
    seen to bill; the unknown part is told to the metrics and the tenant's bill once (only the
    write that moved the ticket tells it; True then). The engine's way (``BudgetHolds``) and a
    cancel's (``control.operations``), which no engine runs."""
    counted = budgets.spend_lapsed(
        task.task_id, task.budget_id, held, parent_id=task.parent_id, ticket=ticket, **forgetting(forget_batch)
    )
    if counted:
        observe.record_unknown_usage(task.tenant, task.task_id, held.amount - held.seen, held.micros - held.seen_micros)
    return counted


def forgetting(forget_batch: bool) -> dict[str, bool]:
    """``forget_batch`` for a ledger write, named only when asked for (the engine's
    characterisation goldens record each write's arguments, unchanged for every other call)."""
    return {"forget_batch": True} if forget_batch else {}
