"""A tenant's stops (``core.stops``), in the tenant's own partition ``TENANT#<tenant>``:
``STOP#<kind>#<value>`` holds who stopped the scope, when and why. Every stop of a tenant is
read in one strongly consistent Query of the ``STOP#`` prefix (what a submission and a claim
check), so a stop written before the read is always seen by it.

A second stop of a scope already stopped keeps the first one's time and author (a conditional
put), so a stop is idempotent; a resume deletes the item and says whether there was one.
"""

from __future__ import annotations

import time

from agentq.core.stops import StopRecord, StopScope
from agentq.storage import keys
from agentq.storage.table import ConditionFailed, Item, Table, absent, plain


class Stops:
    """Stops over any ``Table`` (DynamoDB, or memory in tests)."""

    def __init__(self, table: Table) -> None:
        self.table = table

    def put(self, tenant: str, scope: StopScope, *, by: str | None = None, reason: str = "") -> tuple[StopRecord, bool]:
        """Mark ``scope`` stopped; (the stop, created). A scope already stopped keeps its stop."""
        record = StopRecord(tenant, scope, time.time(), by, reason)
        item = {**self._key(tenant, scope), "kind": scope.kind, "value": scope.value, "stopped_at": record.stopped_at,
                "reason": reason, **({"by": by} if by else {})}  # fmt: skip
        try:
            self.table.put(item, condition=absent())
        except ConditionFailed:
            current = self.table.get(self._key(tenant, scope))
            if current is not None:
                return _record(tenant, current), False
            return self.put(tenant, scope, by=by, reason=reason)  # resumed meanwhile: stop it again
        return record, True

    def delete(self, tenant: str, scope: StopScope) -> StopRecord | None:
        """Resume ``scope``: the stop that was removed, or None if it was not stopped."""
        old = self.table.delete(self._key(tenant, scope))
        return _record(tenant, old) if old else None

    def list(self, tenant: str) -> list[StopRecord]:
        """Every stop of ``tenant``: one strongly consistent Query."""
        return [_record(tenant, i) for i in self.table.query(keys.tenant_pk(tenant), prefix=keys.STOP_PREFIX)]

    @staticmethod
    def _key(tenant: str, scope: StopScope) -> dict[str, str]:
        return {"pk": keys.tenant_pk(tenant), "sk": keys.stop_sk(scope.kind, scope.value)}


def _record(tenant: str, item: Item) -> StopRecord:
    data = plain(item)
    return StopRecord(
        tenant=tenant,
        scope=StopScope(str(data["kind"]), str(data["value"])),
        stopped_at=float(data["stopped_at"]),
        by=data.get("by"),
        reason=str(data.get("reason") or ""),
    )
