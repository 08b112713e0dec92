"""What a tenant's agents spent over a recent window, known and unknown apart (ARCHITECTURE 4):
the sum of its root tasks' tree ledgers, for a bill that shows the provider-reported usage and,
apart, what is counted at holds because no worker learned a call's outcome.

Read on demand, never written: a counter per tenant updated with every call would cost a write
per step (the step commit touches the task's META only, and that is its cost's point). So the
window is read from the tenant's task listing (newest first, roots only) and their METAs in
batches: two batch reads per hundred trees, at most ``MAX_TREES`` trees (``complete`` says
whether the window held more). A tree is counted by when its root was created; a late report of
a call moves it from unknown to known in the tree's ledger, and the next read shows it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from decimal import Decimal

from agentq.core.errors import ValidationError
from agentq.core.pricing import dollars
from agentq.storage.container import Storage

MAX_TREES = 1_000
PAGE = 100
MAX_HOURS = 24 * 31


@dataclass(frozen=True)
class TenantSpend:
    since: float
    trees: int
    known_tokens: int
    unknown_tokens: int
    known_usd: Decimal
    unknown_usd: Decimal
    complete: bool  # False: the window held more than MAX_TREES trees; these are the newest


def tenant_spend(
    store: Storage, tenant: str, hours: float, *, user: str | None = None, now: float | None = None
) -> TenantSpend:
    """The ledgers of ``tenant``'s task trees whose roots were created in the last ``hours``
    (with ``user``: of the trees acting for that end user, from the user index)."""
    if not 0 < hours <= MAX_HOURS:
        raise ValidationError(f"hours must be more than 0 and at most {MAX_HOURS}", field="hours")
    since = (time.time() if now is None else now) - hours * 3600
    known = unknown = known_micros = unknown_micros = trees = 0
    cursor: str | None = None
    while trees < MAX_TREES:
        page, cursor = store.tasks.list_for_tenant(tenant, limit=min(PAGE, MAX_TREES - trees), after=cursor, user=user)
        roots = [t.task_id for t in page if t.created_at >= since]
        for budget in store.budgets.many(roots).values():
            known, unknown = known + budget.known, unknown + budget.unknown
            known_micros, unknown_micros = known_micros + budget.known_micros, unknown_micros + budget.unknown_micros
        trees += len(roots)
        if cursor is None or len(roots) < len(page):  # the end, or past the window (newest first)
            return TenantSpend(since, trees, known, unknown, dollars(known_micros), dollars(unknown_micros), True)
    return TenantSpend(since, trees, known, unknown, dollars(known_micros), dollars(unknown_micros), False)


@dataclass(frozen=True)
class UserSpend:
    """One end user's row of a tenant's usage: its trees of the window and what they spent."""

    user: str
    trees: int
    running: int
    known_tokens: int
    unknown_tokens: int
    known_usd: Decimal
    unknown_usd: Decimal


def spend_by_user(
    store: Storage, tenant: str, hours: float = 24, *, user: str | None = None, now: float | None = None
) -> tuple[list[UserSpend], bool]:
    """``tenant``'s usage over the last ``hours`` broken down by the end user each tree acts
    for (trees acting for no user are the tenant's own and make no row), biggest spender first;
    with ``user``, that user's row only (read from the user index: a token's caller never reads
    another user's trees). Returns the rows and whether the window was read whole (the same
    ``MAX_TREES`` bound as ``tenant_spend``)."""
    if not 0 < hours <= MAX_HOURS:
        raise ValidationError(f"hours must be more than 0 and at most {MAX_HOURS}", field="hours")
    since = (time.time() if now is None else now) - hours * 3600
    rows: dict[str, list[int]] = {}  # user -> [trees, running, known, unknown, known_micros, unknown_micros]
    trees, cursor, complete = 0, None, False
    while trees < MAX_TREES:
        page, cursor = store.tasks.list_for_tenant(tenant, limit=min(PAGE, MAX_TREES - trees), after=cursor, user=user)
        roots = [t for t in page if t.created_at >= since and t.user is not None]
        budgets = store.budgets.many([t.task_id for t in roots])
        for root in roots:
            row = rows.setdefault(str(root.user), [0, 0, 0, 0, 0, 0])
            row[0] += 1
            row[1] += int(root.status.value == "running")
            budget = budgets.get(root.task_id)
            if budget is not None:
                row[2] += budget.known
                row[3] += budget.unknown
                row[4] += budget.known_micros
                row[5] += budget.unknown_micros
        trees += len(page)
        if cursor is None or any(t.created_at < since for t in page):  # the end, or past the window
            complete = True
            break
    listed = [
        UserSpend(u, r[0], r[1], r[2], r[3], dollars(r[4]), dollars(r[5]))
        for u, r in sorted(rows.items(), key=lambda kv: (-kv[1][4], -kv[1][2], kv[0]))
    ]
    return listed, complete
