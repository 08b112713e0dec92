"""The fleet's waiting tenants and its wake by weight: the I/O of ``storage.fleet_slots``.

``RunningSlots`` holds these methods (``FleetWaiting`` is one of its bases): the waiting marks
(``FLEET#WAITING`` / ``TENANT#<tenant>``), the fleet's room as its shards show it, and the choice
of the waiting tenant furthest below its weight's share. They use the running slots' own reads
(``_take`` a waiter off a list, ``_limit_of`` a tenant's item), named by ``_Slots``.
"""

from __future__ import annotations

from typing import Any, Protocol

from agentq.storage import fleet_slots as fs
from agentq.storage import keys
from agentq.storage.table import Table, plain

WAIT = "WAIT#"  # a waiting list's items (a tenant's, a key's, the fleet's per tenant): ``WAIT#<rank>#<created>#<id>``


class _Slots(Protocol):
    """What of ``RunningSlots`` these methods use."""

    table: Table
    fleet_capacity: int | None
    fleet_name: str

    @staticmethod
    def _key(pk: str) -> dict[str, str]: ...

    def _take(self, pk: str, room: int) -> list[tuple[str, str, str]]: ...

    def _limit_of(self, item: dict[str, Any] | None) -> int | None: ...

    def next_fleet_waiters(self, most: int) -> list[tuple[str, str, str, int]]: ...

    def mark_waiting(self, tenant: str) -> None: ...

    def _drop_mark(self, tenant: str) -> None: ...

    def _fleet_room(self, most: int) -> int: ...


class FleetWaiting:
    """The fleet's waiting and waking, as methods of ``RunningSlots`` (see the module)."""

    def mark_waiting(self: _Slots, tenant: str) -> None:
        """Mark ``tenant`` waiting for the fleet (idempotent): the fleet's wake finds waiting
        tenants only by their marks. Written by ``park`` after the item, and put back by the
        sweeper for every tenant with a fleet list, since a mark can be lost (a crash between
        ``park``'s two writes, or in ``_drop_mark`` between its delete and its put back) and
        then nothing would ever wake that tenant's waiters."""
        self.table.put({"pk": fs.waiting_pk(self.fleet_name), "sk": fs.WAITING_TENANT + tenant, "tenant": tenant})

    def _fleet_room(self: _Slots, most: int) -> int:
        """How many fleet slots are free now, up to ``most`` (one BatchGetItem of the shards);
        without a capacity, ``most``: nothing limits the fleet any more, its waiters may all go."""
        if self.fleet_capacity is None:
            return most
        read = [self._key(fs.shard_pk(i, self.fleet_name)) for i in range(fs.SHARDS)]
        items = {str(i["pk"]): plain(i) for i in self.table.batch_get(read)}
        running = [int(items.get(fs.shard_pk(i, self.fleet_name), {}).get("running", 0)) for i in range(fs.SHARDS)]
        return min(most, fs.room(self.fleet_capacity, running))

    def _next_fleet_waiters(self: _Slots, most: int) -> list[tuple[str, str, str]]:
        return [(task_id, tier, tenant) for task_id, tier, tenant, _ in self.next_fleet_waiters(most)]

    def next_fleet_waiters(self: _Slots, most: int) -> list[tuple[str, str, str, int]]:
        """Take up to ``most`` of the fleet's waiters it has room for, each of the waiting
        tenant whose ``running / weight`` is lowest and below its hard limit (a tenant's count
        goes up by each one taken here, so a wake of several shares them by weight too). Reads:
        the shards, the waiting tenants (one Query of ``FLEET#WAITING``), their slot items (one
        BatchGetItem); then per waiter taken its list's Query, its META and one conditional Delete.
        Each with its tenant's running count as read (the fourth member), for a hand-off
        conditional on it (``FairShare``)."""
        room = self._fleet_room(most)
        if room <= 0:
            return []
        marks = self.table.query(fs.waiting_pk(self.fleet_name), prefix=fs.WAITING_TENANT)
        if not marks:
            return []
        tenants = [str(m["sk"]).removeprefix(fs.WAITING_TENANT) for m in marks]
        items = {str(i["pk"]): plain(i) for i in self.table.batch_get([self._key(keys.tenant_pk(t)) for t in tenants])}
        shares = {}
        for t in tenants:
            item = items.get(keys.tenant_pk(t), {})
            shares[t] = fs.Share(t, int(item.get("running", 0)), weight_of(item), self._limit_of(item or None))
        taken: list[tuple[str, str, str, int]] = []
        while room > 0 and shares:
            ranked = fs.by_share(list(shares.values()))
            if not ranked:
                break  # every waiting tenant is at its hard limit: its own releases wake it
            share = ranked[0]
            got = self._take(fs.queue_pk(share.tenant, self.fleet_name), 1)
            if not got:
                self._drop_mark(share.tenant)
                del shares[share.tenant]
                continue
            taken += [(*got[0], share.running)]
            room -= 1
            shares[share.tenant] = fs.Share(share.tenant, share.running + 1, share.weight, share.limit)
        return taken

    def _drop_mark(self: _Slots, tenant: str) -> None:
        """``tenant`` no longer waits for the fleet: take its mark away, then look at its list
        again, and mark it back if a task parked meanwhile (its park wrote the item first)."""
        self.table.delete({"pk": fs.waiting_pk(self.fleet_name), "sk": fs.WAITING_TENANT + tenant})
        if self.table.query(fs.queue_pk(tenant, self.fleet_name), prefix=WAIT, limit=1, keys_only=True):
            self.mark_waiting(tenant)


def weight_of(item: dict[str, Any]) -> int:
    return int(item.get("weight", fs.DEFAULT_WEIGHT))
