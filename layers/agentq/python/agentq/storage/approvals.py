"""Human approvals (``APPROVAL#tool_use_id``): a pending record and the pause of the task are
one fenced transaction, and a decision and the task's requeue are another, refused unless the
approval is still pending, so a decision is taken exactly once.

A record keeps who may decide it (``approver``, fixed when it is asked): a decision by an end
user's token is conditioned on it too, so no path to ``decide`` lets a token decide an ask only
the tenant decides, whatever its caller checked.

A decision request that names no call (A2A's text reply ``approve``) is bound to the call held
when it first arrives (``bind``: ``DECISION#<key>``, a conditional put, so of two arrivals racing
one binds), and the decision it makes carries its key (``decided_key``): a retry of it finds the
call it is about, and whether it already decided it (``decided_with``), never the call held next."""

from __future__ import annotations

import time

from boto3.dynamodb.conditions import Attr, ConditionBase

from agentq.core.endusers import Approver, NotTheApprover
from agentq.core.errors import IllegalTransition
from agentq.core.models import Lease, TaskStatus
from agentq.core.records import ApprovalRecord
from agentq.storage import keys
from agentq.storage.event_writes import EVENT_TEXT_CHARS, NewEvent, logged_transact
from agentq.storage.leases import why_fenced
from agentq.storage.table import (
    ConditionFailed,
    Item,
    Patch,
    Put,
    Table,
    TransactionCancelled,
    Update,
    absent,
    plain,
)
from agentq.storage.tasks import Tasks


def _record(raw: Item) -> ApprovalRecord:
    d = plain(raw)
    return ApprovalRecord(
        use_id=d["sk"].split("#", 1)[1],
        state=d["state"],
        question=d.get("question", ""),
        asked_at=d.get("asked_at", 0.0),
        note=d.get("note"),
        decided_by=d.get("decided_by"),
        decided_at=d.get("decided_at"),
        credential=d.get("credential"),
        decided_by_user=d.get("decided_by_user"),
        approver=d.get("approver", "user"),
        step=int(d["step"]) if "step" in d else None,
        tool=d.get("tool"),
    )


class Approvals:
    def __init__(self, table: Table, tasks: Tasks) -> None:
        self.table = table
        self.tasks = tasks

    def request(
        self,
        lease: Lease,
        use_id: str,
        question: str,
        *,
        credential: dict[str, str] | None = None,
        approver: Approver = "user",
        step: int | None = None,
        tool: str | None = None,
    ) -> None:
        """Record a pending approval and pause the task, in one fenced transaction.
        ``credential`` (``{"name", "host"}``): the pause waits for the user to add that
        credential (``request_credential``), and its record and event name it. ``approver``:
        who may decide it (``tenant``: its API keys only), on the record and its event.
        ``step`` and ``tool``: the call it is asked for (``core.call_keys``), on the record."""
        record = {
            **keys.item_key(lease.task_id, f"{keys.APPROVAL}{use_id}"),
            "state": "pending",
            "question": question,
            "asked_at": time.time(),
            "approver": approver,
            **({"credential": credential} if credential else {}),
            **({"step": step} if step is not None else {}),
            **({"tool": tool} if tool is not None else {}),
        }
        paused = NewEvent("task.status", {"status": TaskStatus.PAUSED.value, "approval": use_id})
        asked = NewEvent("approval.requested", {"tool_use_id": use_id, "question": question[:EVENT_TEXT_CHARS],
                                               "status": TaskStatus.PAUSED.value, "approver": approver,
                                               **({"credential": credential} if credential else {})})  # fmt: skip
        try:
            logged_transact(
                self.table, lease.task_id, [Put("approval", record, absent()), self.tasks.pause(lease)], asked
            )
        except TransactionCancelled as exc:
            if "meta" in exc.failed:
                raise why_fenced(self.table, lease) from exc
            # asked before (a resumed worker): pause again
            try:
                logged_transact(self.table, lease.task_id, [self.tasks.pause(lease)], paused)
            except TransactionCancelled as again:
                raise why_fenced(self.table, lease) from again

    def get(self, task_id: str, use_id: str) -> ApprovalRecord | None:
        raw = self.table.get(keys.item_key(task_id, f"{keys.APPROVAL}{use_id}"))
        return _record(raw) if raw is not None else None

    def list(self, task_id: str) -> list[ApprovalRecord]:
        """Every approval of a task (pending and decided), in order of their ids."""
        return [_record(i) for i in self.table.query(keys.task_pk(task_id), prefix=keys.APPROVAL)]

    def pending(self, task_id: str) -> ApprovalRecord | None:
        return next((a for a in self.list(task_id) if a.state == "pending"), None)

    def bind(self, task_id: str, key: str, use_id: str) -> str:
        """The held call the decision request ``key`` (a digest naming the request, the same on
        each of its retries) decides: ``use_id`` the first time, and on every retry after the call
        its first arrival bound, whatever the task holds by then."""
        item = {**keys.item_key(task_id, f"{keys.DECISION}{key}"), "use_id": use_id}
        try:
            self.table.put(item, condition=absent())
        except ConditionFailed as exc:
            first = exc.old if exc.old is not None else self.table.get(keys.item_key(task_id, f"{keys.DECISION}{key}"))
            assert first is not None  # a binding is never deleted but with its task
            return str(first["use_id"])
        return use_id

    def bound(self, task_id: str, key: str) -> str | None:
        """The call the decision request ``key`` was bound to when it first arrived, if it did."""
        item = self.table.get(keys.item_key(task_id, f"{keys.DECISION}{key}"))
        return str(item["use_id"]) if item is not None else None

    def decided_with(self, task_id: str, use_id: str, key: str) -> bool:
        """Whether the request ``key`` made the decision of ``use_id`` (a retry of it, not another's)."""
        item = self.table.get(keys.item_key(task_id, f"{keys.APPROVAL}{use_id}"))
        return item is not None and item.get("decided_key") == key

    def decide(
        self,
        task_id: str,
        use_id: str,
        *,
        approved: bool,
        note: str,
        by: str,
        by_user: str | None = None,
        key: str | None = None,
    ) -> None:
        """Record the decision and requeue the paused task, atomically; refused unless pending
        (``IllegalTransition``) and, for a token's, unless its user may decide it
        (``NotTheApprover``). ``by``: the tenant (or agentq: ``timeout``, ``vault``);
        ``by_user``: the end user whose token decided, recorded on the approval and its event
        beside the tenant; ``key``: the decision request's (``bind``), recorded on the approval."""
        now = time.time()
        user = {"decided_by_user": by_user} if by_user is not None else {}
        request = {"decided_key": key} if key is not None else {}
        pending: ConditionBase = Attr("state").eq("pending")
        if by_user is not None:  # a record without an approver was asked when any user could decide
            pending = pending & (Attr("approver").not_exists() | Attr("approver").eq("user"))
        decision = Patch(
            "approval",
            keys.item_key(task_id, f"{keys.APPROVAL}{use_id}"),
            Update(
                set={
                    "state": "approved" if approved else "rejected",
                    "note": note,
                    "decided_by": by,
                    "decided_at": now,
                    **user,
                    **request,
                }
            ),
            pending,
        )
        requeue = Patch(
            "meta",
            keys.meta_key(task_id),
            Update(set={"status": TaskStatus.QUEUED.value, "updated_at": now}),
            Attr("status").eq(TaskStatus.PAUSED.value),
        )
        decided = NewEvent(
            "approval.decided",
            {"tool_use_id": use_id, "approved": approved, "note": note[:EVENT_TEXT_CHARS], "by": by,
             **({"by_user": by_user} if by_user is not None else {}), "status": TaskStatus.QUEUED.value},
        )  # fmt: skip
        try:
            logged_transact(self.table, task_id, [decision, requeue], decided)
        except TransactionCancelled as exc:
            record = self.get(task_id, use_id) if by_user is not None and "approval" in exc.failed else None
            if record is not None and record.state == "pending" and not record.may_decide(by_user):
                raise NotTheApprover(task_id, use_id, str(by_user)) from exc
            raise IllegalTransition(f"task {task_id} has no pending approval to decide", field="task_id") from exc
