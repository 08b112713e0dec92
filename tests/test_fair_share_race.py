"""Running ≤ limit per tenant under contention: worker processes admitting one tenant's tasks at
once (real processes against moto server, as DynamoDB would see them) never admit more than its
limit, and every task left out waits on the tenant's list; worker processes admitting and
releasing three tenants' tasks at once never hold more fleet slots than its capacity."""

from __future__ import annotations

import uuid

from agentq.runtime import Settings
from agentq.storage.container import Storage
from agentq.storage.fleet_slots import SHARDS, shard_limits, shard_pk
from agentq.storage.table import plain

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


FLEET_CAPACITY = 7  # 3 tenants' 24 tasks race for 7 fleet slots (shards of 2, 2, 2 and 1)


def test_workers_admitting_and_releasing_three_tenants_tasks_at_once_never_exceed_the_fleets_capacity(
    settings: Settings, store: Storage
) -> None:
    tenants = [f"fleet-{uuid.uuid4().hex[:8]}" for _ in range(3)]
    fleet = f"FLEET-{uuid.uuid4().hex[:8]}"  # the test's own fleet: the moto table is the session's
    ids = [[store.tasks.create(scripted([{"text": "x"}]), tenant=tenants[(p + i) % 3]).task_id
            for i in range(TASKS_EACH)] for p in range(PROCESSES)]  # fmt: skip
    reports = racers.race(settings, "tests.fleet_racer", [[str(FLEET_CAPACITY), fleet, *mine] for mine in ids])

    holding = {t for r in reports for t in r["holding"]}
    woken = {t for r in reports for t in r["woken"]}
    slots = store.slots.with_default(None, FLEET_CAPACITY, fleet)
    shards = [plain(store.table.get({"pk": shard_pk(i, fleet), "sk": "RUNNING"}) or {}) for i in range(SHARDS)]
    in_shards = sum(int(s.get("running", 0)) for s in shards)
    holders = {t for row in ids for t in row if store.slots.holds_slots(t)}
    assert len(holders) == in_shards  # no slot lost to a race, none counted twice
    assert holding <= holders
    # A release hands its freed slot to a waiter (admits it, then sends its message): a waiter
    # whose own racer had already reported holds a slot its racer never saw. It was woken.
    assert holders - holding <= woken
    assert in_shards == FLEET_CAPACITY  # never more; and the releases' room was all taken again
    assert all(int(s.get("running", 0)) <= most for s, most in zip(shards, shard_limits(FLEET_CAPACITY), strict=True))
    assert sum(r["ended"] for r in reports) > 0  # releases raced the admissions
    assert sum(slots.usage(t).running for t in tenants) == in_shards  # each tenant counted too
