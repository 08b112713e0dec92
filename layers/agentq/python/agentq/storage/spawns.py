"""Sub-agent spawns (``SPAWN#tool_use_id``): the children of a ``spawn_subagents`` call,
created once, with their budget shares moved out of the parent's budget exactly once.

First one fenced transaction writes the spawn record (state ``creating``) and takes the
shares; then the children are written in chunks (a transaction holds at most 100 actions);
then the record becomes ``created``. Until then nothing can run a child (the execution starts
later), so a resumed parent may rewrite the chunks safely.
"""

from __future__ import annotations

import json
import time
from typing import Any

from agentq.core.errors import BudgetExceeded
from agentq.core.fanout import ChildPlan
from agentq.core.faults import crash_point
from agentq.core.models import Lease, Task, TaskSubmission, ToolOutcome
from agentq.core.records import SpawnRecord
from agentq.storage import keys
from agentq.storage.budget_patches import BUDGET
from agentq.storage.budgets import Budgets
from agentq.storage.events import NewEvent, logged_transact
from agentq.storage.leases import why_fenced
from agentq.storage.serdes import Payloads
from agentq.storage.table import (
    Action,
    Check,
    Item,
    Put,
    Table,
    TransactionCancelled,
    Update,
    absent,
    chunks,
    fence,
    fence_holds,
    merge,
    plain,
    present,
)
from agentq.storage.tasks import Tasks


class Spawns:
    def __init__(self, table: Table, payloads: Payloads, tasks: Tasks, budgets: Budgets) -> None:
        self.table = table
        self.payloads = payloads
        self.tasks = tasks
        self.budgets = budgets

    def create(
        self,
        lease: Lease,
        parent: Task,
        spawn_id: str,
        children: list[ChildPlan],
        pending: list[ToolOutcome],
        max_concurrency: int,
    ) -> bool:
        """Create the spawn record and every child (META + funded budget). Returns False when
        the spawn already existed."""
        total = sum(c.share for c in children)
        payload = json.dumps(
            {
                "pending": [p.model_dump(mode="json") for p in pending],
                "plans": [
                    {
                        "task_id": c.task_id,
                        "share": c.share,
                        "deadline_seconds": c.deadline_seconds,
                        "submission": c.submission.model_dump(mode="json", exclude_none=True),
                    }
                    for c in children
                ],
            }
        )
        record = {
            **keys.item_key(parent.task_id, f"{keys.SPAWN}{spawn_id}"),
            "children": [c.task_id for c in children],
            "max_concurrency": max_concurrency,
            "state": "creating",
            "created_at": time.time(),
            "epoch": lease.epoch,
            **self.payloads.encode(
                f"{keys.payload_prefix(parent.task_id)}spawns/{spawn_id}-e{lease.epoch}.json", payload
            ),
        }
        lease_check = Check("lease", keys.meta_key(lease.task_id), fence(lease))
        funding = self.budgets.fund_children(parent.budget_id, total, sum(c.share_micros for c in children))
        # The parent's budget is on its META: the fence and the funding are one write of it.
        writes: list[Action] = (
            [merge("lease", lease_check, funding)] if funding.key == lease_check.key else [lease_check, funding]
        )
        try:
            spawned = NewEvent(
                "task.spawned",
                {"spawn_id": spawn_id, "children": [c.task_id for c in children], "max_concurrency": max_concurrency},
            )
            logged_transact(self.table, lease.task_id, [*writes, Put("spawn", record, absent())], spawned, meta="lease")
        except TransactionCancelled as exc:
            if "lease" in exc.failed and not fence_holds(self.table.get(keys.meta_key(lease.task_id)), lease):
                raise why_fenced(self.table, lease) from exc
            if "spawn" in exc.failed:
                return False
            if exc.failed & {"lease", BUDGET}:
                raise BudgetExceeded(f"the budget cannot fund {total} tokens of sub-agent shares") from exc
            raise
        crash_point("after_spawn_record")
        self.write_children(parent, spawn_id, children)
        return True

    def write_children(self, parent: Task, spawn_id: str, children: list[ChildPlan]) -> None:
        """Write the children of a ``creating`` spawn (idempotent), then mark it ``created``."""
        actions: list[Action] = []
        for child in children:
            child_actions, _ = self.tasks.create_actions(
                child.task_id,
                child.submission,
                tenant=parent.tenant,
                root_id=parent.root_id,
                parent_id=parent.task_id,
                depth=parent.depth + 1,
                budget=child.share,
                overwrite=True,
                spawn_id=spawn_id,
                key_id=parent.key_id,
            )
            actions += [_renamed(a, child.task_id) for a in child_actions]
        for chunk in chunks(actions, 100):  # 2 actions a child (META with its budget, submission): never split
            self.table.transact(chunk)
        self.mark(parent.task_id, spawn_id, state="created")

    def get(self, parent_id: str, spawn_id: str) -> SpawnRecord | None:
        raw = self.table.get(keys.item_key(parent_id, f"{keys.SPAWN}{spawn_id}"))
        return self._record(raw, with_payload=True) if raw is not None else None

    def list(self, task_id: str) -> list[SpawnRecord]:
        return [self._record(i, with_payload=False) for i in self.table.query(keys.task_pk(task_id), prefix=keys.SPAWN)]

    def _record(self, raw: Item, *, with_payload: bool) -> SpawnRecord:
        d = plain(raw)
        pending: list[ToolOutcome] = []
        plans: list[ChildPlan] = []
        if with_payload:
            payload = json.loads(self.payloads.decode(d))
            pending = [ToolOutcome.model_validate(p) for p in payload["pending"]]
            plans = [
                ChildPlan(
                    p["task_id"], TaskSubmission.model_validate(p["submission"]), p["share"], p["deadline_seconds"]
                )
                for p in payload["plans"]
            ]
        return SpawnRecord(
            spawn_id=d["sk"].split("#", 1)[1],
            children=list(d.get("children", [])),
            max_concurrency=int(d["max_concurrency"]),
            state=d["state"],
            created_at=d["created_at"],
            epoch=d["epoch"],
            execution_arn=d.get("execution_arn"),
            woken=bool(d.get("woken", False)),
            pending=pending,
            plans=plans,
        )

    def mark(self, parent_id: str, spawn_id: str, **fields: Any) -> None:
        """Record facts about a spawn (execution ARN, woken, state) on its record."""
        self.table.update(keys.item_key(parent_id, f"{keys.SPAWN}{spawn_id}"), Update(set=fields), condition=present())


def _renamed(action: Action, task_id: str) -> Action:
    """Action names must be unique within a transaction: qualify them with the child's id."""
    assert isinstance(action, Put)
    return Put(f"{action.name}:{task_id}", action.item, action.condition)
