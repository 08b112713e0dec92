"""Sub-agent spawns (``SPAWN#tool_use_id``): the children of a ``spawn_subagents`` call,
created once, with their budget shares moved out of the parent's budget exactly once.

First one fenced transaction writes the spawn record (state ``creating``) and takes the
shares; then the children are written in chunks (a transaction holds at most 100 actions),
each with a check of the parent's fence; then the record becomes ``created``, fenced too. Until
then nothing can run a child (the execution starts later), so a resumed parent may rewrite the
chunks; a zombie parent (its lease taken over) can write none of it, so it never resets a child
its successor's fan-out ran (ARCHITECTURE 2).
"""

from __future__ import annotations

import json
import time
from typing import Any

from boto3.dynamodb.conditions import Attr, ConditionBase

from agentq.core.errors import BudgetExceeded
from agentq.core.fanout import ChildPlan
from agentq.core.faults import crash_point
from agentq.core.models import Lease, Task, TaskStatus, TaskSubmission, ToolOutcome
from agentq.core.records import SpawnRecord
from agentq.storage import keys
from agentq.storage.budget_patches import BUDGET
from agentq.storage.budgets import Budgets
from agentq.storage.event_writes import NewEvent, logged_transact
from agentq.storage.leases import why_fenced
from agentq.storage.serdes import Payloads
from agentq.storage.table import (
    MAX_TRANSACTION_ACTIONS,
    STOPPING,
    Action,
    Check,
    Item,
    Patch,
    Put,
    Table,
    TransactionCancelled,
    Update,
    absent,
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
        step: int | None = None,
    ) -> bool:
        """Create the spawn record and every child (META + funded budget). Returns False when
        the spawn already existed. ``step``: the LLM step of the spawning call (``core.call_keys``)."""
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
            **({"step": step} if step is not None else {}),
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
        self.write_children(lease, parent, spawn_id, children)
        return True

    def write_children(self, lease: Lease, parent: Task, spawn_id: str, children: list[ChildPlan]) -> None:
        """Write the children of a ``creating`` spawn, then mark it ``created``; fenced.

        Each chunk's transaction checks the parent's fence, so a zombie parent (paused after its
        SPAWN record while a successor carried the spawn on: the children written, run, ended,
        their budgets folded into the parent's) writes no child. And a child's META is put only
        over nothing or over this spawn's own child that nothing has claimed, marked or ended
        yet (``_fresh``): the retry of a write cut short (a resumed parent, botocore's retry of
        an applied transaction) writes the same children again, and nothing resets one that ran.
        """
        lease_check = Check("lease", keys.meta_key(lease.task_id), fence(lease))
        per_chunk = (MAX_TRANSACTION_ACTIONS - 1) // 2  # a child's 2 actions, never split, and the check
        for at in range(0, len(children), per_chunk):
            group = children[at : at + per_chunk]
            while group:
                actions: list[Action] = [lease_check]
                for child in group:
                    actions += self._child_actions(parent, spawn_id, child)
                try:
                    self.table.transact(actions)
                    break
                except TransactionCancelled as exc:
                    if "lease" in exc.failed:
                        raise why_fenced(self.table, lease) from exc
                    refused = [c for c in group if f"meta:{c.task_id}" in exc.failed]
                    if not refused:
                        raise
                    for child in refused:  # written before and gone on since: left as it is
                        item = self.table.get(keys.meta_key(child.task_id))
                        if item is None or item.get("spawn_id") != spawn_id or item.get("parent_id") != parent.task_id:
                            raise RuntimeError(f"child {child.task_id} of spawn {spawn_id} is another task") from exc
                    group = [c for c in group if c not in refused]
        self.mark(parent.task_id, spawn_id, lease=lease, state="created")

    def _child_actions(self, parent: Task, spawn_id: str, child: ChildPlan) -> list[Action]:
        """A child's META (with its funded budget, written only where ``_fresh`` holds) and its
        submission, named after it (action names are unique within a transaction)."""
        meta, submission = self.tasks.create_actions(
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
        )[0]
        assert isinstance(meta, Put) and isinstance(submission, Put)
        return [
            Put(f"meta:{child.task_id}", meta.item, _fresh(parent.task_id, spawn_id)),
            Put(f"submission:{child.task_id}", submission.item),
        ]

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
            step=int(d["step"]) if "step" in d else None,
        )

    def mark(self, parent_id: str, spawn_id: str, *, lease: Lease | None = None, **fields: Any) -> None:
        """Record facts about a spawn (execution ARN, woken, state) on its record. ``lease``: the
        parent's worker writes it, fenced (the fan-out's wake is not a worker's write)."""
        record = Patch("spawn", keys.item_key(parent_id, f"{keys.SPAWN}{spawn_id}"), Update(set=fields), present())
        if lease is None:
            self.table.update(record.key, record.update, condition=record.condition)
            return
        try:
            self.table.transact([Check("lease", keys.meta_key(lease.task_id), fence(lease)), record])
        except TransactionCancelled as exc:
            if "lease" in exc.failed:
                raise why_fenced(self.table, lease) from exc
            raise


def _fresh(parent_id: str, spawn_id: str) -> ConditionBase:
    """Where a spawn may put its child's META: nothing there, or this spawn's own child as it
    was written (queued, never claimed, no stop's mark on it): the same write again."""
    return absent() | (
        Attr("parent_id").eq(parent_id)
        & Attr("spawn_id").eq(spawn_id)
        & Attr("status").eq(TaskStatus.QUEUED.value)
        & Attr("claim_count").eq(0)
        & Attr(STOPPING).not_exists()
    )
