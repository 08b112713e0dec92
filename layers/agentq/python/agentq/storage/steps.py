"""Steps: the immutable ``STEP#n`` items a task's conversation is rebuilt from, and the step
commit that appends one.

A step commit is one transaction: put the step (never overwritten), advance META from step
n-1 to n under the lease fence, and settle the budget with the provider's reported usage, so
state, history and accounting never disagree. Checkpoint cost grows with the step, never with
the history: the step is a new item and META stays small.
"""

from __future__ import annotations

import time
from typing import Any

from boto3.dynamodb.conditions import Attr
from pydantic import TypeAdapter

from agentq.core.errors import BudgetExceeded
from agentq.core.models import Lease, LLMStep, Step, StepRecord, TaskStatus
from agentq.core.records import NO_USAGE, BudgetDelta, OrphanCall
from agentq.storage import keys
from agentq.storage.budgets import BUDGET, settle_and_reserve
from agentq.storage.serdes import Payloads
from agentq.storage.table import (
    Action,
    Item,
    Patch,
    Put,
    Table,
    TransactionCancelled,
    Update,
    absent,
    fence_holds,
    merge,
    plain,
)
from agentq.storage.tasks import Tasks, request_token, why_fenced

_STEP_ADAPTER: TypeAdapter[Any] = TypeAdapter(Step)


class Steps:
    def __init__(self, table: Table, payloads: Payloads, tasks: Tasks) -> None:
        self.table = table
        self.payloads = payloads
        self.tasks = tasks

    def load(self, task_id: str) -> list[StepRecord]:
        return [self._record(task_id, i) for i in self.table.query(keys.task_pk(task_id), prefix=keys.STEP)]

    def range(self, task_id: str, first: int, limit: int) -> list[StepRecord]:
        """Up to ``limit`` committed steps from number ``first`` on, in order."""
        items = self.table.query(
            keys.task_pk(task_id), between=(keys.step_sk(max(first, 0)), keys.LAST_STEP_SK), limit=limit
        )
        return [self._record(task_id, i) for i in items]

    def last(self, task_id: str) -> StepRecord | None:
        items = self.table.query(keys.task_pk(task_id), prefix=keys.STEP, descending=True, limit=1)
        return self._record(task_id, items[0]) if items else None

    def _record(self, task_id: str, raw: Item) -> StepRecord:
        item = plain(raw)
        body = _STEP_ADAPTER.validate_json(self.payloads.decode(item))
        return StepRecord(
            task_id=task_id, number=item["number"], epoch=item["epoch"], committed_at=item["committed_at"], body=body
        )

    def commit(
        self,
        lease: Lease,
        number: int,
        body: Any,
        *,
        root_id: str,
        settle: BudgetDelta | None = None,
        reserve_next: int = 0,
        finish: TaskStatus | None = None,
        result: str | None = None,
        error: dict[str, Any] | None = None,
        lease_until: float | None = None,
    ) -> StepRecord:
        """Append step ``number`` and advance META, fenced by the lease, in one transaction.

        ``settle`` settles this step's LLM reservation with the reported usage; ``reserve_next``
        reserves tokens for the next LLM call in the same write (saving a round trip per turn);
        ``finish`` moves the task to a terminal status with its result. ``lease_until`` (unless
        finishing, which drops the lease) also moves ``lease_expires`` there: progress is a
        heartbeat, so the heartbeat need not write this lease again soon. The condition is
        unchanged (the epoch, the status, the previous step), so it cannot take a lease over;
        and a run never commits after releasing its lease, so it cannot revive a released
        one either (``extend_lease``, on another thread, needs ``lease_expires > 0`` for that).
        """
        now = time.time()
        stored = self.payloads.encode(keys.step_payload_key(lease.task_id, number, lease.epoch), body.model_dump_json())
        step_item = {
            **keys.item_key(lease.task_id, keys.step_sk(number)),
            "number": number,
            "epoch": lease.epoch,
            "kind": body.kind,
            "committed_at": now,
            **stored,
        }
        sets: dict[str, Any] = {"step": number, "updated_at": now}
        adds: dict[str, Any] = {}
        removes: list[str] = []
        if lease_until is not None and finish is None:
            sets.update({"lease_expires": lease_until, "heartbeat_at": now})
        if body.kind == "llm":
            adds["llm_steps"] = 1
            removes.append("inflight")
        if settle is not None:
            adds.update({"tokens_in": settle.tokens_in, "tokens_out": settle.tokens_out, "cost_usd": settle.cost_usd})
        if finish is not None:
            sets.update(self.tasks.finish_update(lease.task_id, lease, finish, now, result, error))
        if reserve_next:
            sets["inflight"] = {"amount": reserve_next, "epoch": lease.epoch, "step": number + 1}
            removes = []
        meta = Patch(
            "meta",
            keys.meta_key(lease.task_id),
            Update(set=sets, add=adds, remove=removes),
            Attr("lease_epoch").eq(lease.epoch)
            & Attr("status").eq(TaskStatus.RUNNING.value)
            & Attr("step").eq(number - 1),
        )
        actions: list[Action] = [Put("step", step_item, absent()), meta]
        if settle is not None or reserve_next:
            budget = settle_and_reserve(root_id, settle or NO_USAGE, reserve_next)
            # The task's own budget is on its META: one write of that item, not two items.
            actions = [actions[0], merge("meta", meta, budget)] if root_id == lease.task_id else [*actions, budget]
        try:
            self.table.transact(
                actions, token=request_token("commit", lease.task_id, lease.epoch, number, reserve_next)
            )
        except TransactionCancelled as exc:
            if reserve_next and exc.failed == {BUDGET}:
                raise BudgetExceeded(f"the budget cannot cover {reserve_next} more tokens") from exc
            if reserve_next and root_id == lease.task_id and exc.failed == {"meta"}:
                current = self.table.get(keys.meta_key(lease.task_id))
                if fence_holds(current, lease) and current is not None and current.get("step") == number - 1:
                    raise BudgetExceeded(f"the budget cannot cover {reserve_next} more tokens") from exc
            raise why_fenced(self.table, lease) from exc
        return StepRecord(task_id=lease.task_id, number=number, epoch=lease.epoch, committed_at=now, body=body)

    # --------------------------------------------------------------- orphans

    def record_orphan(self, lease: Lease, number: int, body: LLMStep) -> None:
        """Keep an LLM call whose step could not be committed (its worker lost the lease) in
        the trace: it happened and it was paid for, so the trace and the ledger show it."""
        payload = self.payloads.encode(
            f"{keys.payload_prefix(lease.task_id)}orphans/{number:06d}-e{lease.epoch}.json", body.model_dump_json()
        )
        self.table.put(
            {
                **keys.item_key(lease.task_id, keys.orphan_sk(number, lease.epoch)),
                "epoch": lease.epoch,
                "number": number,
                **payload,
            }
        )

    def orphans(self, task_id: str) -> list[OrphanCall]:
        """Uncommitted LLM calls, with the step number they were meant for and their epoch."""
        out = []
        for raw in self.table.query(keys.task_pk(task_id), prefix=keys.ORPHAN):
            item = plain(raw)
            out.append(
                OrphanCall(
                    number=int(item["number"]),
                    epoch=int(item["epoch"]),
                    call=LLMStep.model_validate_json(self.payloads.decode(item)),
                )
            )
        return out

    def raw_items(self, task_id: str) -> list[dict[str, Any]]:
        """Every item of a task in DynamoDB's wire form (tests and benchmarks measure their sizes)."""
        from agentq.storage.dynamodb import to_wire

        return [to_wire(i) for i in self.table.query(keys.task_pk(task_id))]
