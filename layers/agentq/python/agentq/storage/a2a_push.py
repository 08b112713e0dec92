"""A2A push notification configs (``A2APUSH#<task_id>`` / ``<config_id>``): where a client asked
to be told of a task's changes (a task of an agent, however it was started) (``api/a2a_push.py`` writes them, the worker's
``queueing/a2a_push.py`` reads them when the task pauses or ends). A partition of their own,
not the task's: nothing that reads a task's partition meets them. Each expires with the
deployment's retention (the table's TTL), as a task's items do; a task's end does not delete
them (a client may still read them), but nothing is sent for a task after its end."""

from __future__ import annotations

import time
from typing import Any

from agentq.resources import TTL_ATTRIBUTE
from agentq.storage.keys import a2a_push_pk
from agentq.storage.table import Table, plain

MAX_CONFIGS = 10  # per task: a client's handful, not a fan-out list


class PushConfigs:
    def __init__(self, table: Table, *, retention_seconds: int) -> None:
        self.table = table
        self.retention_seconds = retention_seconds

    def put(self, task_id: str, tenant: str, config_id: str, config: dict[str, Any]) -> None:
        """Store (or replace: the same id is the same config) one config, as the protocol's JSON."""
        self.table.put({"pk": a2a_push_pk(task_id), "sk": config_id, "tenant": tenant, "config": config,
                        TTL_ATTRIBUTE: int(time.time() + self.retention_seconds)})  # fmt: skip

    def get(self, task_id: str, config_id: str) -> dict[str, Any] | None:
        item = self.table.get({"pk": a2a_push_pk(task_id), "sk": config_id})
        return dict(plain(item)["config"]) if item is not None else None

    def listed(self, task_id: str) -> list[dict[str, Any]]:
        return [dict(plain(item)["config"]) for item in self.table.query(a2a_push_pk(task_id))]

    def delete(self, task_id: str, config_id: str) -> None:
        self.table.delete({"pk": a2a_push_pk(task_id), "sk": config_id})
