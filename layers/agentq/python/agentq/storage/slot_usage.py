"""What the running slots count, read for people: a tenant's usage (``usage``: running, waiting,
its limit and weight, what ``GET /usage`` answers) and every tenant's (``all_usage``).

``RunningSlots`` holds these methods (``SlotListing`` is one of its bases, like ``FleetWaiting``);
they read its items and waiting lists, never write them. They use the running slots' own
table, default limit and fleet, named by ``_Listed``.

Listing (``all_usage``, what an operator's ``GET /usage/tenants`` reads): a tenant's slot item
carries ``gsi1pk = TENANTS`` / ``gsi1sk = <tenant>``, set if absent by every write of it
(``admit``, ``release``, ``set_limit``: no write of its own), so the tenants are a Query of
``gsi1``, never a table Scan; the items are then read by ``batch_get`` (the index projects few
attributes) and each tenant's waiters counted by one Query. A tenant that never held a slot
nor had a limit set (an unlimited one) has no item: it holds no slot and nothing waits on it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from agentq.core.models import TaskStatus
from agentq.storage import fleet_slots as fleet
from agentq.storage import keys
from agentq.storage.fleet_waiting import WAIT, weight_of
from agentq.storage.table import Table, plain
from agentq.storage.tier_slots import tier_pk


@dataclass(frozen=True)
class SlotUsage:
    tenant: str
    running: int
    waiting: int
    limit: int | None
    weight: int = fleet.DEFAULT_WEIGHT


class _Listed(Protocol):
    """What of ``RunningSlots`` these methods use."""

    table: Table
    default_limit: int | None
    fleet_name: str
    tier_limits: dict[str, int]

    @staticmethod
    def _key(pk: str) -> dict[str, str]: ...

    def _usage_of(self, tenant: str, raw: dict[str, Any] | None, waiting_up_to: int) -> SlotUsage: ...

    def _waiting(self, tenant: str, up_to: int) -> int: ...


class SlotListing:
    """The usage reads, as methods of ``RunningSlots`` (see the module)."""

    def usage(self: _Listed, tenant: str, *, waiting_up_to: int = 1000) -> SlotUsage:
        return self._usage_of(tenant, self.table.get(self._key(keys.tenant_pk(tenant))), waiting_up_to)

    def all_usage(self: _Listed, *, waiting_up_to: int = 1000, page: int = 100) -> list[SlotUsage]:
        """Every tenant with a slot item (see the module), by name: a Query of ``gsi1`` per
        ``page`` tenants, their items by ``batch_get``, and one Query each for its waiters."""
        from agentq.resources import GSI1

        tenants: list[str] = []
        start: dict[str, Any] | None = None
        while True:
            found = self.table.query_index(
                GSI1, ("gsi1pk", keys.TENANT_SLOTS_INDEX_PK), descending=False, limit=page, start=start
            )
            tenants += [str(item["gsi1sk"]) for item in found.items]
            if found.last_key is None:
                break
            start = found.last_key
        items: dict[str, dict[str, Any]] = {}
        for i in range(0, len(tenants), page):
            batch = [self._key(keys.tenant_pk(t)) for t in tenants[i : i + page]]
            items |= {str(item["pk"]): item for item in self.table.batch_get(batch)}
        return [self._usage_of(t, items.get(keys.tenant_pk(t)), waiting_up_to) for t in tenants]

    def _usage_of(self: _Listed, tenant: str, raw: dict[str, Any] | None, waiting_up_to: int) -> SlotUsage:
        item = plain(raw or {})
        limit = item.get("limit")
        return SlotUsage(
            tenant=tenant,
            running=int(item.get("running", 0)),
            waiting=self._waiting(tenant, waiting_up_to),
            limit=int(limit) if limit is not None else self.default_limit,
            weight=weight_of(item),
        )

    def _waiting(self: _Listed, tenant: str, up_to: int) -> int:
        """The tenant's tasks still waiting for its slot, a slot of a tier with a limit, or the
        fleet (up to ``up_to``): a waiter cancelled, or admitted by another route, keeps its item
        until a wake drops it, and is not counted."""
        waiters: list[dict[str, Any]] = []
        lists = [keys.tenant_pk(tenant), *(tier_pk(tenant, t) for t in self.tier_limits)]
        for pk in (*lists, fleet.queue_pk(tenant, self.fleet_name)):
            waiters += self.table.query(pk, prefix=WAIT, limit=up_to - len(waiters), keys_only=True)
            if len(waiters) >= up_to:
                break
        if not waiters:
            return 0
        metas = self.table.batch_get([keys.meta_key(_waiter_id(w)) for w in waiters])
        return sum(1 for m in metas if _still_waiting(m))


def _waiter_id(waiter: dict[str, Any]) -> str:
    return str(waiter["sk"]).split("#", 3)[3]


def _still_waiting(meta: dict[str, Any]) -> bool:
    return meta.get("status") == TaskStatus.QUEUED.value and not meta.get("slots")
