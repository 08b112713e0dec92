"""A tenant's running tasks of a tier ≤ the tier's fair limit under contention
(storage/tier_slots.py): worker processes admitting two tenants' tasks of one tier at once (real
processes against moto server, as DynamoDB would see them) admit exactly the tier's limit of each
tenant and park the rest, never more; and racing admissions, ends, releases and admissions again
leave each tenant's tier count equal to the tasks holding its slot, never above the limit."""

from __future__ import annotations

import uuid

from agentq.control.defaults import fair_limit
from agentq.runtime import Settings
from agentq.storage.container import Storage
from agentq.storage.table import plain
from agentq.storage.tier_slots import tier_pk

from tests import racers
from tests.helpers import scripted, tier_running

PROCESSES = 6
TASKS_EACH = 4
CAPACITY = 4  # the tier's runners
LIMIT = fair_limit(CAPACITY)  # 3 of each tenant's 12 tasks


def _tasks(store: Storage, tenants: list[str]) -> list[list[str]]:
    return [[store.tasks.create(scripted([{"text": "x"}]), tenant=tenants[(p + i) % 2]).task_id
             for i in range(TASKS_EACH)] for p in range(PROCESSES)]  # fmt: skip


def _holders(store: Storage, ids: list[list[str]], tenant: str) -> set[str]:
    """The tasks whose META names the tenant's tier slot."""
    metas = [plain(store.table.get({"pk": f"TASK#{t}", "sk": "META"}) or {}) for row in ids for t in row]
    return {str(m["task_id"]) for m in metas if tier_pk(tenant, "normal") in (m.get("slots") or [])}


def test_workers_admitting_two_tenants_tasks_of_one_tier_at_once_admit_exactly_its_limit_of_each(
    settings: Settings, store: Storage
) -> None:
    tenants = [f"tier-{uuid.uuid4().hex[:8]}" for _ in range(2)]
    ids = _tasks(store, tenants)
    reports = racers.race(settings, "tests.tier_racer", [[str(LIMIT), "admit", *mine] for mine in ids])

    assert sum(r["admitted"] for r in reports) == 2 * LIMIT  # never more, and no slot lost to a race
    for tenant in tenants:
        assert tier_running(store, tenant) == len(_holders(store, ids, tenant)) == LIMIT
    slots = store.slots.with_default(None, tier_limits={"normal": LIMIT})
    assert sum(slots.usage(t).waiting for t in tenants) == PROCESSES * TASKS_EACH - 2 * LIMIT
    assert sum(r["parked"] for r in reports) == PROCESSES * TASKS_EACH - 2 * LIMIT
    assert sum(r["kept"] for r in reports) == 0


def test_workers_admitting_ending_and_admitting_again_keep_each_tenants_tier_count_exact_and_within_its_limit(
    settings: Settings, store: Storage
) -> None:
    tenants = [f"tier-{uuid.uuid4().hex[:8]}" for _ in range(2)]
    ids = _tasks(store, tenants)
    reports = racers.race(settings, "tests.tier_racer", [[str(LIMIT), "churn", *mine] for mine in ids])

    assert sum(r["ended"] for r in reports) > 0  # releases raced the admissions
    holding = {t for r in reports for t in r["holding"]}
    for tenant in tenants:
        holders = _holders(store, ids, tenant)
        assert tier_running(store, tenant) == len(holders) <= LIMIT  # exact, and never above
        assert holders <= holding  # no wake admits here: the tier's slot is not handed off
