"""Steps: the immutable ``STEP#n`` items a task's conversation is rebuilt from, and the step
commit that appends one.

A step commit is two writes: first the step item (a *prepared* step), then the commit point,
one conditional UpdateItem of META that advances ``step`` from n-1 to n under the lease fence
and, on the same item, settles the budget with the provider's reported usage and reserves the
next call (``storage.budgets``). So state and accounting never disagree (one item, one
atomic write), and the step is durable before META points at it.

Why not one transaction of both: a transactional write costs two write units per started KB
of every item in it, a plain write one. The step item is the large one (a tool result of
3 KB makes a 4 KB item: 8 units in a transaction, 4 outside), and it carries nothing the
fence needs: a step is *committed* exactly when ``number <= META.step``, and every reader
(``load``, ``range``, ``last``) reads only up to there. What the split costs, and why each
invariant still holds:

- A prepared step whose META write never happens (a crash between the two, a refused
  commit: the lease lost, the task cancelled, the budget short) is a leftover at
  ``META.step + 1``, never read. The next commit of that number overwrites it: the put's
  condition admits an absent item or one of an *older* epoch.
- A committed step is never overwritten: a worker that writes ``STEP#n`` claimed after the
  commit of step n-1 and before any commit of n (a claim bumps the epoch, and a commit needs
  the epoch it claimed), so a committed ``STEP#n`` has an epoch no older than the writer's.
  A zombie's put therefore finds a newer epoch and is refused, and its META write is refused
  by the fence as before.
- A retry in the same epoch (the engine commits again without a reservation when the budget
  refused one) finds its own prepared step: it is replaced only while META still says n-1.

Checkpoint cost grows with the step, never with the history: the step is a new item and META
stays small.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from typing import Any

from boto3.dynamodb.conditions import Attr
from pydantic import TypeAdapter

from agentq.core.errors import BudgetExceeded, ConversationMoved, LeaseLost
from agentq.core.faults import crash_point
from agentq.core.models import (
    CommittedStep,
    CompactStep,
    Lease,
    LLMStep,
    MessageStep,
    Step,
    StepRecord,
    TaskStatus,
    ToolsStep,
)
from agentq.core.records import NO_USAGE, BudgetDelta, Inbox, OrphanCall, OrphanReason
from agentq.resources import LIVE_ATTRIBUTES
from agentq.storage import keys
from agentq.storage.budget_items import ticket_value
from agentq.storage.budget_patches import BUDGET, settle_and_reserve
from agentq.storage.leases import PREVIOUS_CLAIM, why_fenced
from agentq.storage.messages import inbox_of, nothing_waits
from agentq.storage.serdes import Payloads
from agentq.storage.table import (
    ConditionFailed,
    Item,
    Patch,
    Table,
    TransactionCancelled,
    Update,
    absent,
    fence,
    fence_holds,
    merge,
    plain,
)
from agentq.storage.task_items import request_token
from agentq.storage.tasks import Tasks

_STEP_ADAPTER: TypeAdapter[Any] = TypeAdapter(Step)
CALL_STEP: TypeAdapter[LLMStep | CompactStep] = TypeAdapter(LLMStep | CompactStep)


@dataclass(frozen=True)
class _Heeds:
    """What a commit's condition listens for besides the fence: messages beyond ``delivered``
    (a commit that ends the task), an interrupt (an LLM step: its answer is then discarded)."""

    delivered: int | None
    interrupt: bool


def _heeds_messages(body: Any, finish: TaskStatus | None) -> bool:
    """Whether a commit that ends the task is refused while a message waits: one that ends it
    ``succeeded`` (an answer, its grade), and one of the model's turn that ends it however (a
    refusal, a cut-off, a malformed turn, a budget that ran out during it: ``_llm_answer.turn_end``).
    The engine goes on from either with the message: the turn an ordinary turn, none of a turn's
    tool calls that was no answer carried out. A tools step or a grade that ends the task
    otherwise (a fault, a stop, a grade below the bar for good) is not: its ending stands."""
    return finish is TaskStatus.SUCCEEDED or (finish is not None and body.kind == "llm")


class Steps:
    def __init__(self, table: Table, payloads: Payloads, tasks: Tasks) -> None:
        self.table = table
        self.payloads = payloads
        self.tasks = tasks

    def committed(self, task_id: str) -> int:
        """How many steps are committed (META's ``step``; 0 for a task that is gone)."""
        meta = self.table.get(keys.meta_key(task_id))
        return int(meta["step"]) if meta is not None else 0

    def load(self, task_id: str, upto: int | None = None, since: int = 1) -> list[StepRecord]:
        """Every committed step from number ``since`` on (a resume starts at the latest
        compaction), in order. ``upto``: the committed count when the caller has just read
        META (a claim); otherwise it is read here."""
        upto = self.committed(task_id) if upto is None else upto
        since = max(since, 1)
        if upto < since:
            return []
        items = self.table.query(keys.task_pk(task_id), between=(keys.step_sk(since), keys.step_sk(upto)))
        return [self._record(task_id, i) for i in items]

    def range(self, task_id: str, first: int, limit: int, upto: int | None = None) -> list[StepRecord]:
        """Up to ``limit`` committed steps from number ``first`` on, in order."""
        upto = self.committed(task_id) if upto is None else upto
        if upto < max(first, 1):
            return []
        items = self.table.query(
            keys.task_pk(task_id), between=(keys.step_sk(max(first, 1)), keys.step_sk(upto)), limit=limit
        )
        return [self._record(task_id, i) for i in items]

    def last(self, task_id: str, upto: int | None = None) -> StepRecord | None:
        """The last committed step."""
        upto = self.committed(task_id) if upto is None else upto
        if upto < 1:
            return None
        items = self.table.query(
            keys.task_pk(task_id), between=(keys.step_sk(1), keys.step_sk(upto)), descending=True, limit=1
        )
        return self._record(task_id, items[0]) if items else None

    def record(self, task_id: str, raw: Item) -> StepRecord:
        """A step item as read (its body fetched from S3 when it was offloaded)."""
        return self._record(task_id, raw)

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
        reserve_next_micros: int = 0,
        finish: TaskStatus | None = None,
        result: str | None = None,
        error: dict[str, Any] | None = None,
        lease_until: float | None = None,
        hold_until: float | None = None,
        delivered: int | None = None,
        grade: dict[str, Any] | None = None,
        counted: BudgetDelta | None = None,
    ) -> CommittedStep:
        """Append step ``number`` and advance META, fenced by the lease (see the module).

        ``delivered``: how many of the task's messages the conversation holds after this step
        (``storage.messages``). A ``MessageStep`` moves META's count there; a commit that ends
        the task with an answer, or with the model's turn however it ended (``_heeds_messages``),
        is refused while more were accepted, and an LLM step while an interrupt is asked for
        (``ConversationMoved``): the engine hears them first. The commit returns META's
        counters as its write left them.

        ``settle`` settles this step's LLM reservation with the reported usage; ``reserve_next``
        reserves tokens for the next LLM call in the same write (saving a round trip per turn),
        with ``hold_until`` as that hold's deadline (``storage/budgets.py``) and
        ``reserve_next_micros`` as its money (millionths of a dollar); ``finish`` moves the
        task to a terminal status with its result. ``counted``: usage the budget has already
        (settled as an orphan's): only the task's own tokens and dollars take it. ``grade``: the task's latest grade, on META
        (a grade step's commit: ``core.engine._grade``). ``lease_until`` (unless finishing, which
        drops the lease) also moves ``lease_expires`` there: progress is a
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
        if finish is not None:  # the step's second event in the task's log (storage/events.py)
            step_item["finish"] = finish.value
            if error and error.get("code"):
                step_item["finish_error"] = str(error["code"])
        self._prepare(lease, number, step_item)
        crash_point("after_step_put")
        sets: dict[str, Any] = {"step": number, "updated_at": now}
        adds: dict[str, Any] = {}
        # A claim that superseded another wrote that one's record before its first step: META's copy goes.
        removes: list[str] = [*PREVIOUS_CLAIM] if lease.epoch > 1 else []
        if lease_until is not None and finish is None:
            sets.update({"lease_expires": lease_until, "heartbeat_at": now})
        if body.kind == "llm":
            adds["llm_steps"] = 1
        if body.kind in ("llm", "compact"):
            # The call's text and usage are in the step now; its batch, and who settled its hold, done with.
            removes += ["inflight", "live_text", "seen", "batch", "batch_settled"]
        if body.kind == "grade" and settle is not None and settle.reserved:
            removes += ["inflight", "live_text", "seen"]  # the grading call's hold, settled here
        if body.kind == "compact":
            sets["compacted_at"] = number  # a resume reads the steps from here on
        if isinstance(body, ToolsStep) and body.workspace is not None:
            sets["workspace"] = body.workspace.model_dump()  # what a takeover restores (core.workspace)
        if isinstance(body, LLMStep | CompactStep) and body.fallback_from is not None and body.provider:
            # A fallback took over: META says which model answers now (the task view shows it)
            sets["answered_by"] = {"provider": body.provider, "model": body.model}
        if grade is not None:
            sets["grade"] = grade
        for usage in (settle, counted):
            if usage is not None:
                adds.update({"tokens_in": usage.tokens_in, "tokens_out": usage.tokens_out, "cost_usd": usage.cost_usd})
        if finish is not None:
            sets.update(self.tasks.finish_update(lease.task_id, lease, finish, now, result, error))
        if reserve_next:
            sets["inflight"] = ticket_value(reserve_next, lease.epoch, number + 1, hold_until, reserve_next_micros)
            removes = [r for r in removes if r != "inflight"]
        if finish is not None:
            removes = [*removes, *LIVE_ATTRIBUTES]  # out of the sweeper's index
        condition = fence(lease) & Attr("step").eq(number - 1)
        if isinstance(body, MessageStep):
            sets["messages_delivered"] = body.messages[-1].seq
            removes.append("interrupt_at")  # the person spoke: the agent goes on with what they said
        heeds = _Heeds(
            delivered=delivered if _heeds_messages(body, finish) else None,
            interrupt=delivered is not None and body.kind == "llm",
        )
        if heeds.delivered is not None:
            condition = condition & nothing_waits(heeds.delivered)
        if heeds.interrupt:
            condition = condition & Attr("interrupt_at").not_exists()
        meta = Patch("meta", keys.meta_key(lease.task_id), Update(set=sets, add=adds, remove=removes), condition)
        budget = (
            settle_and_reserve(root_id, settle or NO_USAGE, reserve_next, reserve_next_micros)
            if settle or reserve_next
            else None
        )
        try:
            if budget is not None and root_id != lease.task_id:
                self._commit_across(lease, number, meta, budget, reserve_next)
                after = None  # a sub-agent's commit: sub-agents take no messages
            else:
                after = self._commit_meta(
                    lease, number, merge("meta", meta, budget) if budget else meta, reserve_next, heeds
                )
        except LeaseLost as lost:
            if lost.details.get("gone"):
                self._take_back(lease, step_item)
            raise
        return CommittedStep(
            task_id=lease.task_id, number=number, epoch=lease.epoch, committed_at=now, body=body,
            messages_received=after.received if after else None, interrupt_at=after.interrupt_at if after else None,
        )  # fmt: skip

    def _prepare(self, lease: Lease, number: int, step_item: Item) -> None:
        """Put the step item: over nothing, or over a leftover of an older epoch."""
        try:
            self.table.put(step_item, condition=absent() | Attr("epoch").lt(lease.epoch))
            return
        except ConditionFailed as exc:
            if exc.old is None or plain(exc.old).get("epoch") != lease.epoch:
                raise why_fenced(self.table, lease) from exc  # a newer epoch wrote it: this worker is a zombie
        # This epoch's own step: a commit of it that was refused (the budget) or that went
        # through. Replace it only while it is still uncommitted.
        current = self.table.get(keys.meta_key(lease.task_id))
        if not fence_holds(current, lease) or current is None or current.get("step") != number - 1:
            raise why_fenced(self.table, lease)
        try:
            self.table.put(step_item, condition=Attr("epoch").eq(lease.epoch))
        except ConditionFailed as exc:
            raise why_fenced(self.table, lease) from exc

    def _take_back(self, lease: Lease, item: Item) -> None:
        """The task was purged while this step was being committed (cancelled, its worker still in
        the call): its prepared item (and payload) landed after the purge's delete, or will be
        deleted by it. Either way it goes, so nothing is written back into a purged task. The
        purge deleted META first, so the commit point's refusal came after it: a put the purge's
        listing missed is deleted here, and a worker killed in between leaves it (only then).
        Every payload of the task goes with it, not the step's alone: a commit that ends the task
        put its result first (``result-e{epoch}.txt``), and META being gone means the purge
        deleted them all, or will."""
        with contextlib.suppress(ConditionFailed):
            self.table.delete(keys.item_key(lease.task_id, str(item["sk"])), condition=Attr("epoch").eq(lease.epoch))
        self.payloads.delete_prefix(keys.payload_prefix(lease.task_id))

    def _commit_meta(self, lease: Lease, number: int, write: Patch, reserve_next: int, heeds: _Heeds) -> Inbox:
        """The commit point: one conditional write of META (and the task's own budget on it)."""
        try:
            return inbox_of(self.table.update(write.key, write.update, condition=write.condition, returns="ALL_NEW"))
        except ConditionFailed as exc:
            old = exc.old or {}
            if old.get("lease_epoch") == lease.epoch and old.get("step") == number:
                return inbox_of(old)  # a retried request whose first attempt went through: only this epoch commits n
            unmoved = fence_holds(old, lease) and old.get("step") == number - 1  # refused by the rest of the condition
            if unmoved:
                moved = inbox_of(old)
                if heeds.interrupt and moved.interrupt_at is not None:
                    raise ConversationMoved(
                        f"task {lease.task_id}: an interrupt was asked for", received=moved.received,
                        interrupt_at=moved.interrupt_at,
                    ) from exc  # fmt: skip
                if heeds.delivered is not None and moved.received != heeds.delivered:
                    raise ConversationMoved(
                        f"task {lease.task_id}: a message came in", received=moved.received, interrupt_at=None
                    ) from exc
            if reserve_next and unmoved:
                raise BudgetExceeded(f"the budget cannot cover {reserve_next} more tokens") from exc
            raise why_fenced(self.table, lease) from exc

    def _commit_across(self, lease: Lease, number: int, meta: Patch, budget: Patch, reserve_next: int) -> None:
        """The commit point when the budget is another task's: META and that budget together."""
        try:
            self.table.transact(
                [meta, budget], token=request_token("commit", lease.task_id, lease.epoch, number, reserve_next)
            )
        except TransactionCancelled as exc:
            if reserve_next and exc.failed == {BUDGET}:
                raise BudgetExceeded(f"the budget cannot cover {reserve_next} more tokens") from exc
            raise why_fenced(self.table, lease) from exc

    # --------------------------------------------------------------- orphans

    def record_orphan(
        self, lease: Lease, number: int, body: LLMStep | CompactStep, *, reason: OrphanReason = "lease_lost"
    ) -> None:
        """Keep an LLM call whose step could not be committed in the trace, with why
        (``reason``: its worker lost the lease, or a person interrupted the task): it happened
        and it was paid for, so the trace and the ledger show it, and say which it was."""
        payload = self.payloads.encode(
            f"{keys.payload_prefix(lease.task_id)}orphans/{number:06d}-e{lease.epoch}.json", body.model_dump_json()
        )
        item = {
            **keys.item_key(lease.task_id, keys.orphan_sk(number, lease.epoch)),
            "epoch": lease.epoch,
            "number": number,
            "reason": reason,
            **payload,
        }
        self.table.put(item)
        if self.table.get(keys.meta_key(lease.task_id)) is None:  # purged meanwhile (see ``_take_back``)
            self._take_back(lease, item)

    def orphans(self, task_id: str) -> list[OrphanCall]:
        """Uncommitted LLM calls, with the step number they were meant for and their epoch."""
        out = []
        for raw in self.table.query(keys.task_pk(task_id), prefix=keys.ORPHAN):
            item = plain(raw)
            out.append(
                OrphanCall(
                    number=int(item["number"]),
                    epoch=int(item["epoch"]),
                    reason=_orphan_reason(item.get("reason")),
                    call=CALL_STEP.validate_json(self.payloads.decode(item)),
                )
            )
        return out

    def raw_items(self, task_id: str) -> list[dict[str, Any]]:
        """Every item of a task in DynamoDB's wire form (tests and benchmarks measure their sizes)."""
        from agentq.storage.dynamodb import to_wire

        return [to_wire(i) for i in self.table.query(keys.task_pk(task_id))]


_REASONS: dict[str, OrphanReason] = {
    "interrupted": "interrupted",
    "timed_out": "timed_out",
    "commit_failed": "commit_failed",
}


def _orphan_reason(stored: Any) -> OrphanReason:
    """An orphan item's ``reason`` (one written before reasons were kept: ``lease_lost``)."""
    return _REASONS.get(str(stored), "lease_lost")
