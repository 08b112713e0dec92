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
