"""Purge: delete everything a finished task left behind (its partition, its budget with it on
META, its payloads). Idempotent, and refuses a task that is still live."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from agentq.core.errors import IllegalTransition
from agentq.core.models import TERMINAL_STATUSES
from agentq.storage import keys
from agentq.storage.serdes import Payloads
from agentq.storage.table import ConditionFailed, Table, present, status_in


@dataclass(frozen=True)
class Purged:
    items: int
    objects: int


class Purge:
    def __init__(self, table: Table, payloads: Payloads) -> None:
        self.table = table
        self.payloads = payloads

    def task(self, task_id: str, *, attempts: int = 8, sleep: Callable[[float], None] = time.sleep) -> Purged:
        """Safe to run again, and on a task whose META is already gone (the TTL path) or still
        there but terminal (then META goes first, so a purge cut short never leaves a visible
        task without its history). ``attempts`` bounds the retries of unprocessed deletes."""
        try:
            old = self.table.delete(keys.meta_key(task_id), condition=~present() | status_in(TERMINAL_STATUSES))
        except ConditionFailed as exc:
            status = (exc.old or {}).get("status", "live")
            raise IllegalTransition(
                f"task {task_id} is {status}; only a finished task is purged", field="task_id"
            ) from exc
        rest = self.table.query(keys.task_pk(task_id), keys_only=True)
        self.table.batch_delete(rest, attempts=attempts, sleep=sleep)
        objects = self.payloads.delete_prefix(keys.payload_prefix(task_id))
        return Purged(items=len(rest) + (1 if old else 0), objects=objects)
