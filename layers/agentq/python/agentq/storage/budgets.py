"""Budgets: the ``BUDGET#root`` item every task of a tree reserves on, and its settlements.

``used <= cap`` holds always because a reservation is a conditional write: ``available``
is kept as its own attribute (DynamoDB conditions cannot do arithmetic) and a hold succeeds
only if ``available >= amount``. A reservation also records an ``inflight`` ticket on the
task's META, and a hold is returned only together with removing the ticket of its epoch, so a
resumed worker and a zombie cannot both return it.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from boto3.dynamodb.conditions import Attr

from agentq.core.errors import BudgetExceeded, TaskNotFound
from agentq.core.models import Lease
from agentq.core.records import NO_USAGE, BudgetDelta, BudgetState, Reservation
from agentq.storage import keys
from agentq.storage.table import (
    Item,
    Patch,
    Put,
    Table,
    TransactionCancelled,
    Update,
    absent,
    fence,
    plain,
)

BUDGET = "budget"  # the action name of a budget write in a transaction


def budget_item(budget_id: str, cap: int, **extra: Any) -> Item:
    return {
        **keys.budget_key(budget_id),
        "cap": cap,
        "reserved": 0,
        "used": 0,
        "available": cap,
        "cost_usd": Decimal(0),
        "tokens_in": 0,
        "tokens_out": 0,
        **extra,
    }


def create_budget(budget_id: str, cap: int, **extra: Any) -> Put:
    return Put(BUDGET, budget_item(budget_id, cap, **extra), condition=absent())


def settle_and_reserve(root_id: str, delta: BudgetDelta, reserve_next: int) -> Patch:
    """Settle a reservation (``reserved - est``, ``used + actual``) and optionally reserve anew,
    refused unless the budget can cover what the new hold adds beyond what the old one frees."""
    update = Update(
        add={
            "reserved": reserve_next - delta.reserved,
            "used": delta.used,
            "available": delta.reserved - delta.used - reserve_next,
            "cost_usd": delta.cost_usd,
            "tokens_in": delta.tokens_in,
            "tokens_out": delta.tokens_out,
        }
    )
    condition = Attr("available").gte(reserve_next - (delta.reserved - delta.used)) if reserve_next else None
    return Patch(BUDGET, keys.budget_key(root_id), update, condition)


def budget_state(item: Item) -> BudgetState:
    data = plain(item, keep_decimal=frozenset({"cost_usd"}))
    return BudgetState(
        cap=data["cap"],
        reserved=data["reserved"],
        used=data["used"],
        available=data["available"],
        cost_usd=data["cost_usd"],
        tokens_in=data.get("tokens_in", 0),
        tokens_out=data.get("tokens_out", 0),
        settled=bool(data.get("settled", False)),
    )


class Budgets:
    def __init__(self, table: Table) -> None:
        self.table = table

    def get(self, root_id: str) -> BudgetState:
        item = self.table.get(keys.budget_key(root_id))
        if item is None:
            raise TaskNotFound(f"no budget for root task {root_id!r}", field="root_id")
        return budget_state(item)

    def reserve(self, lease: Lease, root_id: str, amount: int, step: int) -> Reservation:
        """Hold ``amount`` tokens on the root budget and record it on META, atomically and fenced.

        Raises BudgetExceeded when the root has less than ``amount`` available.
        """
        ticket = Patch(
            "meta",
            keys.meta_key(lease.task_id),
            Update(set={"inflight": {"amount": amount, "epoch": lease.epoch, "step": step}}),
            fence(lease),
        )
        try:
            self.table.transact([settle_and_reserve(root_id, NO_USAGE, amount), ticket])
        except TransactionCancelled as exc:
            if BUDGET in exc.failed:
                raise BudgetExceeded(f"root budget {root_id} cannot cover {amount} tokens") from exc
            from agentq.storage.tasks import why_fenced

            raise why_fenced(self.table, lease) from exc
        return Reservation(amount=amount, epoch=lease.epoch, step=step)

    def inflight(self, task_id: str) -> Reservation | None:
        item = self.table.get(keys.meta_key(task_id))
        raw = plain(item or {}).get("inflight")
        return Reservation(**raw) if raw else None

    def settle_orphan(self, task_id: str, budget_id: str, delta: BudgetDelta, *, inflight_epoch: int | None) -> bool:
        """Account for a reservation whose step will not be committed (lease lost, provider
        error, a crashed worker's leftover), exactly once.

        The task's ``inflight`` marker is the claim ticket: the hold is returned only together
        with removing the marker of ``inflight_epoch``, in one transaction, so a resumed worker
        and a zombie cannot both return it. If the ticket is gone, only the usage is recorded
        (tokens a zombie spent are spent whoever holds the task). Not fenced by the lease for
        that reason. With ``inflight_epoch=None`` the caller owns the hold outright (no
        marker) and it is settled unconditionally. Returns whether the hold was returned.
        """
        if inflight_epoch is None:
            self.table.transact([settle_and_reserve(budget_id, delta, 0)])
            return True
        release_ticket = Patch(
            "ticket", keys.meta_key(task_id), Update(remove=["inflight"]), Attr("inflight.epoch").eq(inflight_epoch)
        )
        try:
            self.table.transact([release_ticket, settle_and_reserve(budget_id, delta, 0)])
            return True
        except TransactionCancelled as exc:
            if "ticket" not in exc.failed:
                raise
        if delta.used or delta.cost_usd:
            usage_only = BudgetDelta(
                reserved=0,
                used=delta.used,
                cost_usd=delta.cost_usd,
                tokens_in=delta.tokens_in,
                tokens_out=delta.tokens_out,
            )
            self.table.transact([settle_and_reserve(budget_id, usage_only, 0)])
        return False

    def fund_children(self, parent_budget_id: str, total: int) -> Patch:
        """The budget side of a spawn: move ``total`` from available to reserved, if it is there."""
        return Patch(
            BUDGET,
            keys.budget_key(parent_budget_id),
            Update(add={"available": -total, "reserved": total}),
            Attr("available").gte(total),
        )

    def settle_child(self, parent_budget_id: str, child_id: str) -> None:
        """Close a child's budget and fold what its subtree spent into the parent's, once.

        The share was moved to the parent's ``reserved`` at spawn; now ``reserved`` gives it
        back, ``used`` takes the child's real usage and the rest is available again. The
        ``settled`` flag makes a repeat (a resumed parent) a no-op.
        """
        for _ in range(5):
            child = self.get(child_id)
            if child.settled:
                return
            close = Patch(
                "child",
                keys.budget_key(child_id),
                Update(set={"settled": True, "available": 0}),
                Attr("settled").not_exists() & Attr("used").eq(child.used) & Attr("reserved").eq(child.reserved),
            )
            fold = Patch(
                "parent",
                keys.budget_key(parent_budget_id),
                Update(
                    add={
                        "reserved": -child.cap,
                        "used": child.used + child.reserved,
                        "available": child.cap - child.used - child.reserved,
                        "cost_usd": child.cost_usd,
                        "tokens_in": child.tokens_in,
                        "tokens_out": child.tokens_out,
                    }
                ),
            )
            try:
                self.table.transact([close, fold])
                return
            except TransactionCancelled as exc:
                if "child" not in exc.failed:
                    raise
        raise RuntimeError(f"could not settle the budget of child {child_id}: it keeps changing")

    def raise_cap(self, task_id: str, add_tokens: int) -> BudgetState:
        from agentq.storage.table import present

        self.table.update(
            keys.budget_key(task_id),
            Update(add={"cap": add_tokens, "available": add_tokens}),
            condition=present() & Attr("settled").not_exists(),
        )
        return self.get(task_id)
