"""Running ≤ limit per tenant under contention: worker processes admitting one tenant's tasks at
once (real processes against moto server, as DynamoDB would see them) never admit more than its
limit, and every task left out waits on the tenant's list."""

from __future__ import annotations

import uuid

from agentq.runtime import Settings
from agentq.storage.container import Storage

from tests import racers
from tests.helpers import scripted

PROCESSES = 6
TASKS_EACH = 4
LIMIT = 5  # 24 tasks race for 5 slots


def test_workers_admitting_one_tenants_tasks_at_once_never_exceed_its_running_limit(
    settings: Settings, store: Storage
) -> None:
    tenant = f"burst-{uuid.uuid4().hex[:8]}"
    ids = [[store.tasks.create(scripted([{"text": "x"}]), tenant=tenant).task_id for _ in range(TASKS_EACH)]
           for _ in range(PROCESSES)]  # fmt: skip
    reports = racers.race(settings, "tests.fair_racer", [[str(LIMIT), *mine] for mine in ids])

    admitted = [t for r in reports for t in r["admitted"]]
    usage = store.slots.with_default(LIMIT).usage(tenant)
    assert len(admitted) == LIMIT == usage.running  # never more, and no slot lost to a race either
    assert sum(store.slots.holds_slots(t) for row in ids for t in row) == LIMIT
    assert usage.waiting == PROCESSES * TASKS_EACH - LIMIT == sum(r["parked"] for r in reports)
    assert sum(r["kept"] for r in reports) == 0  # no releases: nobody's re-check found room
