"""Task notes (``NOTE#key``): a small key-value scratchpad the agent's note tools use; writes
are fenced by the lease like every other write a worker makes."""

from __future__ import annotations

from agentq.core.models import Lease
from agentq.storage import keys
from agentq.storage.leases import why_fenced
from agentq.storage.table import Check, Put, Table, TransactionCancelled, fence


class Notes:
    def __init__(self, table: Table) -> None:
        self.table = table

    def read(self, task_id: str, key: str) -> str | None:
        item = self.table.get(keys.item_key(task_id, f"{keys.NOTE}{key}"))
        return str(item["value"]) if item is not None else None

    def write(self, lease: Lease, key: str, value: str) -> None:
        item = {**keys.item_key(lease.task_id, f"{keys.NOTE}{key}"), "value": value, "epoch": lease.epoch}
        try:
            self.table.transact([Check("lease", keys.meta_key(lease.task_id), fence(lease)), Put("note", item)])
        except TransactionCancelled as exc:
            raise why_fenced(self.table, lease) from exc
