"""Tasks, their leases and their status transitions: the task's ``META`` item.

META is rewritten by every step commit, so it is kept small (what a worker and a listing need:
status, lease, counters, timestamps, and the task's token budget, ``storage.budgets``; ≤ 1 KB,
one write unit): the submission is its own immutable item
(``META#SUBMISSION``, read together with META by one Query) and the claim history is one
``CLAIM#epoch`` item per claim.

Every write a worker makes carries the lease fence (``table.fence``): a worker whose lease was
taken over (a zombie woken from SIGSTOP) can write nothing. Status changes are conditional on
the current status being one that may lead to the new one (``sources_of``), so an illegal
transition is refused by DynamoDB, not by a read-then-write race.
"""

from __future__ import annotations

import contextlib
import hashlib
import time
from collections.abc import Iterator
from decimal import Decimal
from typing import Any

from boto3.dynamodb.conditions import Attr, ConditionBase

from agentq import observe
from agentq.core.errors import IdempotencyConflict, IllegalTransition, LeaseLost, TaskNotFound
from agentq.core.models import (
    ALLOWED_TRANSITIONS,
    Lease,
    RetryState,
    StepRecord,
    Task,
    TaskStatus,
    TaskSubmission,
    sources_of,
)
from agentq.core.pricing import NO_MONEY_CAP, micros
from agentq.core.records import ClaimRecord, IdempotencyRecord
from agentq.resources import GSI1, GSI_LIVE, LIVE_ATTRIBUTES, LIVE_SHARDS, TTL_ATTRIBUTE
from agentq.storage import keys
from agentq.storage.budget_items import budget_attrs, lapsed_holds
from agentq.storage.serdes import Payloads
from agentq.storage.table import (
    Action,
    Check,
    ConditionFailed,
    Delete,
    Item,
    Patch,
    Put,
    Table,
    TransactionCancelled,
    Update,
    absent,
    chunks,
    fence,
    plain,
    present,
    status_in,
)

DEFAULT_TASK_RETENTION_DAYS = 30
DAY_SECONDS = 86_400
IDEMPOTENCY_TTL_SECONDS = 24 * 3600


def live_keys(task_id: str) -> dict[str, str]:
    """The sparse ``live`` index keys an unfinished task's META carries (``resources.GSI_LIVE``)."""
    shard = int(hashlib.sha256(task_id.encode()).hexdigest()[:8], 16) % LIVE_SHARDS
    return {"live_pk": f"LIVE#{shard}", "live_sk": task_id}


def request_token(*parts: object) -> str:
    """A TransactWriteItems idempotency token (at most 36 characters) for one logical write."""
    return hashlib.sha256(":".join(map(str, parts)).encode()).hexdigest()[:36]


def why_fenced(table: Table, lease: Lease) -> LeaseLost:
    """Explain a write the fence refused: the epoch moved on, the task stopped, or the step moved."""
    current = _read_meta(table, lease.task_id)
    if current is None:
        return LeaseLost(f"task {lease.task_id} no longer exists")
    epoch, status, step = int(current["lease_epoch"]), TaskStatus(current["status"]), int(current["step"])
    if epoch != lease.epoch:
        return LeaseLost(f"lease epoch {lease.epoch} of task {lease.task_id} superseded by {epoch}")
    if status is not TaskStatus.RUNNING:
        err = LeaseLost(f"task {lease.task_id} is {status.value}; the worker must stop")
        err.details["status"] = status
        return err
    return LeaseLost(f"task {lease.task_id} step moved to {step} under epoch {lease.epoch}")


def _read_meta(table: Table, task_id: str) -> Item | None:
    return table.get(keys.meta_key(task_id))


LIVE_TEXT_CHARS = 1000  # of a call in flight: enough to watch, small enough for one write unit


class Tasks:
    def __init__(
        self, table: Table, payloads: Payloads, *, retention_seconds: int = DEFAULT_TASK_RETENTION_DAYS * DAY_SECONDS
    ) -> None:
        """``retention_seconds``: how long a finished task stays readable. Entering a terminal
        status stamps META's ``expires_at`` (the table's TTL attribute) in the same write; DynamoDB
        TTL then deletes META and the reaper (``agentq.control.retention``) the rest of the task."""
        if retention_seconds < DAY_SECONDS:
            # Idempotency records live 24 h and a fan-out waits at most 24 h for a child: a
            # shorter retention could delete a task something still points at.
            raise ValueError(f"task retention must be at least one day, got {retention_seconds} s")
        self.table = table
        self.payloads = payloads
        self.retention_seconds = retention_seconds

    def expiry(self, now: float) -> int:
        """The ``expires_at`` of a task that finishes at ``now`` (epoch seconds, as TTL wants)."""
        return int(now + self.retention_seconds)

    # ---------------------------------------------------------------- create

    @staticmethod
    def meta_item(
        task_id: str,
        *,
        tenant: str,
        root_id: str,
        parent_id: str | None,
        depth: int,
        now: float,
        **extra: Any,
    ) -> Item:
        return {
            **keys.meta_key(task_id),
            "gsi1pk": keys.tenant_pk(tenant),
            "gsi1sk": keys.tenant_index_sk(now, task_id),
            "task_id": task_id,
            "tenant": tenant,
            "status": TaskStatus.QUEUED.value,
            "root_id": root_id,
            "parent_id": parent_id,
            "depth": depth,
            "step": 0,
            "llm_steps": 0,
            "lease_epoch": 0,
            "lease_expires": 0,
            "tokens_in": 0,
            "tokens_out": 0,
            "cost_usd": Decimal(0),
            "created_at": now,
            "updated_at": now,
            "claim_count": 0,
            **live_keys(task_id),
            **extra,
        }

    @staticmethod
    def submission_item(task_id: str, submission: TaskSubmission) -> Item:
        return {**keys.submission_key(task_id), "submission": submission.model_dump_json(exclude_none=True)}

    def create_actions(
        self,
        task_id: str,
        submission: TaskSubmission,
        *,
        tenant: str,
        root_id: str,
        parent_id: str | None = None,
        depth: int = 0,
        budget: int | None = None,
        overwrite: bool = False,
        **extra: Any,
    ) -> tuple[list[Action], Task]:
        """The writes that create a task: META (never over an existing one) with, given
        ``budget``, the task's budget on it (``storage.budgets``), and its submission; and the
        Task they describe."""
        if budget is not None:
            money = submission.constraints.max_cost_usd
            extra = {**budget_attrs(budget, micros(money) if money is not None else NO_MONEY_CAP), **extra}
        meta = self.meta_item(
            task_id, tenant=tenant, root_id=root_id, parent_id=parent_id, depth=depth, now=time.time(), **extra
        )
        actions: list[Action] = [
            Put("meta", meta, None if overwrite else absent()),
            Put("submission", self.submission_item(task_id, submission)),
        ]
        return actions, self._task(plain(meta), submission)

    def create(
        self,
        submission: TaskSubmission,
        *,
        tenant: str,
        task_id: str | None = None,
        parent_id: str | None = None,
        root_id: str | None = None,
        depth: int = 0,
        blocked: bool = False,
    ) -> Task:
        """Write META (with the budget, for a root task) and the submission in one transaction.
        ``blocked``: the task waits for its ``depends_on`` (see ``blocked_actions``)."""
        task_id = task_id or keys.new_task_id()
        root_id = root_id or task_id
        actions, task = self.create_actions(
            task_id,
            submission,
            tenant=tenant,
            root_id=root_id,
            parent_id=parent_id,
            depth=depth,
            budget=submission.constraints.max_tokens if root_id == task_id else None,
        )
        if blocked:
            actions, task = self.blocked_actions(actions, task)
        # botocore retries a timed-out transaction; the token makes a retry of one that did
        # go through succeed instead of failing its own attribute_not_exists conditions.
        self.table.transact(actions, token=request_token("create", task_id))
        return task

    def blocked_actions(self, actions: list[Action], task: Task) -> tuple[list[Action], Task]:
        """``actions`` creating ``task`` in ``blocked``, with an edge ``DEPENDENT#<task>`` in each
        dependency's partition (written with the task, before anyone looks at the dependencies:
        a dependency that ends after this write finds the edge; one that ended before is seen by
        the submitter's own look, ``queueing.dependencies.resolve``)."""
        meta = actions[0]
        assert isinstance(meta, Put)
        meta.item["status"] = TaskStatus.BLOCKED.value
        edges: list[Action] = [
            Put(
                f"edge{i}",
                {"pk": keys.task_pk(dep), "sk": f"{keys.DEPENDENT}{task.task_id}", "dependent": task.task_id},
            )
            for i, dep in enumerate(task.submission.depends_on)
        ]
        return [*actions, *edges], task.model_copy(update={"status": TaskStatus.BLOCKED})

    def dependents(self, task_id: str) -> list[str]:
        """The blocked tasks that named ``task_id`` in their ``depends_on``."""
        return [str(i["dependent"]) for i in self.table.query(keys.task_pk(task_id), prefix=keys.DEPENDENT)]

    def create_idempotent(
        self,
        submission: TaskSubmission,
        *,
        tenant: str,
        key: str,
        request_hash: str,
        ttl_seconds: int = IDEMPOTENCY_TTL_SECONDS,
        blocked: bool = False,
    ) -> tuple[Task, bool]:
        """Create the task unless ``key`` was used before by ``tenant``; returns (task, created).

        The ``IDEMP#tenant#key`` record (the task id and a hash of the request) is written in
        the same transaction as META and the submission, so a key never points at a task that does
        not exist, and two racing requests with one key create one task. A reused key with
        another request hash raises IdempotencyConflict. A record past its ``expires_at``
        (DynamoDB TTL deletes lazily) counts as absent.
        """
        for _ in range(3):
            task_id = keys.new_task_id()
            now = time.time()
            actions, task = self.create_actions(
                task_id, submission, tenant=tenant, root_id=task_id, budget=submission.constraints.max_tokens
            )
            if blocked:
                actions, task = self.blocked_actions(actions, task)
            record = {
                "pk": keys.idempotency_pk(tenant, key),
                "sk": keys.META,
                "task_id": task_id,
                "request_hash": request_hash,
                "created_at": now,
                "expires_at": int(now + ttl_seconds),
            }
            actions.append(Put("idempotency", record, absent() | Attr("expires_at").lt(int(now))))
            try:
                self.table.transact(actions)
                return task, True
            except TransactionCancelled as exc:
                if exc.failed != {"idempotency"}:
                    raise
            existing = self.idempotency(tenant, key)
            if existing is None:
                continue  # expired or deleted meanwhile: try again
            if existing.request_hash != request_hash:
                raise IdempotencyConflict(
                    "this Idempotency-Key was already used with a different request body", field="Idempotency-Key"
                )
            try:
                return self.get(existing.task_id), False
            except TaskNotFound:
                continue  # its create was undone (enqueue failed) and the record with it
        raise RuntimeError(f"could not settle idempotency key {key!r}: it keeps changing")

    def idempotency(self, tenant: str, key: str) -> IdempotencyRecord | None:
        item = self.table.get({"pk": keys.idempotency_pk(tenant, key), "sk": keys.META})
        if item is None:
            return None
        data = plain(item)
        if data.get("expires_at", 0) < time.time():
            return None
        return IdempotencyRecord(
            tenant=tenant,
            key=key,
            task_id=data["task_id"],
            request_hash=data["request_hash"],
            created_at=data["created_at"],
            expires_at=data["expires_at"],
        )

    def delete_unstarted(self, task_id: str, *, idempotency: tuple[str, str] | None = None) -> None:
        """Undo a create whose enqueue failed: only while nobody has claimed the task.

        ``idempotency`` (tenant, key) also removes the task's ``IDEMP#`` record, so a retry
        with the same key creates the task anew instead of finding a deleted one.
        """
        actions: list[Action] = [
            Delete("meta", keys.meta_key(task_id), Attr("lease_epoch").eq(0)),
            Delete("submission", keys.submission_key(task_id)),
        ]
        if idempotency is not None:
            actions.append(Delete("idempotency", {"pk": keys.idempotency_pk(*idempotency), "sk": keys.META}))
        self.table.transact(actions)

    # ------------------------------------------------------------------ read

    def get(self, task_id: str) -> Task:
        """META, the submission and the latest retry (``META#RETRY``): one Query."""
        items = {i["sk"]: i for i in self.table.query(keys.task_pk(task_id), prefix=keys.META)}
        meta, sub = items.get(keys.META), items.get(keys.SUBMISSION)
        if meta is None or sub is None:
            raise TaskNotFound(f"no task {task_id!r}", field="task_id")
        task = self._decode(meta, sub)
        retry = items.get(keys.RETRY)
        if retry is not None:
            fields = {k: v for k, v in plain(retry).items() if k not in ("pk", "sk")}
            task = task.model_copy(update={"retry": RetryState.model_validate(fields)})
        return task

    def get_many(self, task_ids: list[str]) -> list[Task]:
        """Many tasks (BatchGetItem), in the order asked; missing ones are left out."""
        wanted = [k for t in task_ids for k in (keys.meta_key(t), keys.submission_key(t))]
        by_key = {(i["pk"], i["sk"]): i for i in self.table.batch_get(wanted)}
        out = []
        for t in task_ids:
            meta, sub = by_key.get((keys.task_pk(t), keys.META)), by_key.get((keys.task_pk(t), keys.SUBMISSION))
            if meta is not None and sub is not None:
                out.append(self._decode(meta, sub))
        return out

    def _decode(self, meta: Item, sub: Item) -> Task:
        return self._task(
            plain(meta, keep_decimal=frozenset({"cost_usd"})), TaskSubmission.model_validate_json(sub["submission"])
        )

    def _task(self, data: dict[str, Any], submission: TaskSubmission) -> Task:
        data["lapsed_holds"] = lapsed_holds(data)
        if "result_ref" in data:
            data["result"] = self.payloads.decode({"ref": data["result_ref"]})
        return Task.model_validate({**data, "submission": submission})

    def claims(self, task_id: str) -> list[ClaimRecord]:
        """Every claim of the task's lease, oldest first."""
        return [
            ClaimRecord(epoch=d["epoch"], worker=d["worker"], at=d["at"], prev_heartbeat_at=d.get("prev_heartbeat_at"))
            for d in (plain(i) for i in self.table.query(keys.task_pk(task_id), prefix=keys.CLAIM))
        ]

    def list_for_tenant(
        self,
        tenant: str,
        *,
        limit: int,
        after: str | None = None,
        status: TaskStatus | None = None,
        roots_only: bool = True,
        max_reads: int = 5,
    ) -> tuple[list[Task], str | None]:
        """A page of ``tenant``'s tasks, newest first, from the ``gsi1`` index.

        ``after`` is the ``gsi1sk`` of the last task of the previous page. Filters are applied
        on the index (status and parent_id are projected), then the page's tasks are read in
        one BatchGetItem. Returns the tasks and the ``gsi1sk`` to continue after, or None at
        the end. With a filter, a page may hold fewer than ``limit`` tasks although more follow:
        at most ``max_reads`` index queries are made per call.
        """
        pk = keys.tenant_pk(tenant)
        conditions: list[ConditionBase] = []
        if status is not None:
            conditions.append(Attr("status").eq(status.value))
        if roots_only:
            conditions.append(Attr("parent_id").not_exists())
        filter_ = None
        for c in conditions:
            filter_ = c if filter_ is None else filter_ & c
        found: list[tuple[str, str]] = []  # (task_id, gsi1sk)
        start = after
        last: Item | None = None
        for _ in range(max_reads):
            wanted = limit + 1 - len(found)  # one more than needed tells whether another page exists
            page = self.table.query_index(
                GSI1,
                ("gsi1pk", pk),
                descending=True,
                limit=max(wanted, 100) if filter_ is not None else wanted,  # a filter reads wider
                filter=filter_,
                start=(
                    {**keys.meta_key(start.split("#", 1)[1]), "gsi1pk": pk, "gsi1sk": start}
                    if start is not None
                    else None
                ),
            )
            found += [(keys.task_id_of(i["pk"]), i["gsi1sk"]) for i in page.items]
            last = page.last_key
            if len(found) > limit or last is None:
                break
            start = last["gsi1sk"]
        cursor: str | None
        if len(found) > limit:
            found = found[:limit]
            cursor = found[-1][1]
        elif last is None:
            cursor = None
        else:  # read budget spent: go on from the last index entry evaluated
            cursor = last["gsi1sk"]
        return self.get_many([task_id for task_id, _ in found]), cursor

    # ---------------------------------------------------------------- leases

    def claim(self, task_id: str, worker: str, lease_seconds: float) -> tuple[Lease, Task] | None:
        """Take the task if it is claimable and no live lease exists; bumps the epoch.

        Returns None when another worker holds a live lease or the task is not runnable
        (finished, paused, waiting). A conditional UpdateItem of META, then the claim's own
        ``CLAIM#epoch`` record and a read of the submission. The record is history only: a
        crash between the two loses one line of it, never the lease.
        """
        now = time.time()
        try:
            meta = self.table.update(
                keys.meta_key(task_id),
                Update(
                    set={
                        "lease_owner": worker,
                        "lease_expires": now + lease_seconds,
                        "status": TaskStatus.RUNNING.value,
                        "updated_at": now,
                        "heartbeat_at": now,
                        "last_claimed_at": now,
                    },
                    add={"lease_epoch": 1, "claim_count": 1},
                    set_if_absent={"started_at": now, "first_claimed_at": now},
                    copy_from={"prev_heartbeat_at": ("heartbeat_at", now)},
                ),
                condition=present()
                & status_in([TaskStatus.QUEUED, TaskStatus.RUNNING])
                & Attr("lease_expires").lt(Decimal(repr(now))),
                returns="ALL_NEW",
            )
        except ConditionFailed:
            return None
        assert meta is not None
        epoch = int(meta["lease_epoch"])
        claim = {
            **keys.item_key(task_id, keys.claim_sk(epoch)),
            "epoch": epoch,
            "worker": worker,
            "at": now,
            "prev_heartbeat_at": meta["prev_heartbeat_at"],
        }
        self.table.put(claim)
        sub = self.table.get(keys.submission_key(task_id))
        if sub is None:
            raise TaskNotFound(f"task {task_id!r} has no submission", field="task_id")
        task = self._decode(meta, sub)
        observe.task_status_changed(task_id, task.tenant, TaskStatus.RUNNING.value, epoch=epoch, worker=worker)
        return Lease(task_id=task_id, owner=worker, epoch=epoch, expires_at=task.lease_expires), task

    def extend_lease(self, lease: Lease, lease_seconds: float, *, live_text: str | None = None) -> Lease:
        """Extend the lease; ``live_text`` (the tail of a streamed call's text, best effort) rides
        on the same write, so showing it costs no write of its own."""
        now = time.time()
        expires = now + lease_seconds
        sets: dict[str, Any] = {"lease_expires": expires, "heartbeat_at": now}
        if live_text:
            sets["live_text"] = live_text[-LIVE_TEXT_CHARS:]
        self._fenced(lease, Update(set=sets), Attr("lease_expires").gt(0))
        return lease.model_copy(update={"expires_at": expires})

    def release(self, lease: Lease, *, forget_batch: bool = False) -> None:
        """Give the task back (continuation, graceful shutdown): the next claim may run at once.
        ``forget_batch``: the batch its next turn was sent in failed; the next claim sends anew."""
        self._fenced(lease, Update(set={"lease_expires": 0}, remove=["batch"] if forget_batch else []))

    def record_retry(self, task_id: str, state: RetryState, *, lease: Lease | None = None) -> bool:
        """Replace the task's ``META#RETRY`` with ``state``, so status and the trace show the
        retry while it waits. With a lease the write is fenced (the worker retrying a call);
        without one (the queue's redelivery) it is made only while the task is queued or
        running. Returns False when the task had ended."""
        item = {**keys.retry_key(task_id), **state.model_dump()}
        guard = fence(lease) if lease is not None else present() & status_in([TaskStatus.QUEUED, TaskStatus.RUNNING])
        try:
            self.table.transact([Check("task", keys.meta_key(task_id), guard), Put("retry", item)])
        except TransactionCancelled as exc:
            if lease is not None:
                raise why_fenced(self.table, lease) from exc
            return False
        return True

    def _fenced(self, lease: Lease, update: Update, extra: ConditionBase | None = None) -> None:
        condition = Attr("lease_epoch").eq(lease.epoch)
        try:
            self.table.update(keys.meta_key(lease.task_id), update, condition=condition & extra if extra else condition)
        except ConditionFailed as exc:
            raise LeaseLost(f"lease epoch {lease.epoch} of task {lease.task_id} is no longer current") from exc

    # ----------------------------------------------------------- transitions

    def transition(
        self,
        task_id: str,
        to: TaskStatus,
        *,
        lease: Lease | None = None,
        result: str | None = None,
        error: dict[str, Any] | None = None,
        extra: dict[str, Any] | None = None,
    ) -> None:
        """Move a task to ``to``; DynamoDB refuses it unless the current status may lead there.

        With a lease the write is also fenced by its epoch. ``extra``: attributes set in the
        same write (a waiting task's ``batch``).
        """
        allowed = sources_of(to)
        if not allowed:
            raise IllegalTransition(f"no status may move to {to.value!r}", field="status")
        now = time.time()
        sets: dict[str, Any] = {"status": to.value, "updated_at": now}
        removes: list[str] = []
        if to is not TaskStatus.RUNNING:  # only a running task holds a lease
            sets["lease_expires"] = 0
        if to is TaskStatus.QUEUED:  # a requeue starts clean
            removes += ["error", "finished_at"]
        if to.terminal:
            sets.update({"finished_at": now, TTL_ATTRIBUTE: self.expiry(now)})
            removes += LIVE_ATTRIBUTES  # out of the sweeper's index
        else:
            sets.update(live_keys(task_id))  # back in it (a requeue from the DLQ)
            removes.append(TTL_ATTRIBUTE)  # a live task never expires (a no-op unless leaving a terminal status)
        if result is not None:
            sets.update(self._result_attrs(task_id, result, lease))
        if error is not None:
            sets["error"] = error
            removes = [r for r in removes if r != "error"]
        sets.update(extra or {})
        condition = present() & status_in(allowed)
        leaves_terminal = any(src.terminal for src in allowed)
        if leaves_terminal:
            # Not once the retention has run out: from then on DynamoDB TTL may delete META (and
            # the reaper the rest of the task) at any moment. Only terminal tasks carry expires_at.
            condition = condition & (Attr(TTL_ATTRIBUTE).not_exists() | Attr(TTL_ATTRIBUTE).gt(Decimal(repr(now))))
        if lease is not None:
            condition = condition & Attr("lease_epoch").eq(lease.epoch)
        try:
            new = self.table.update(
                keys.meta_key(task_id), Update(set=sets, remove=removes), condition=condition, returns="ALL_NEW"
            )
        except ConditionFailed as exc:
            current = self.get(task_id)  # raises TaskNotFound if absent
            if lease is not None and current.lease_epoch != lease.epoch:
                raise LeaseLost(f"lease epoch {lease.epoch} of task {task_id} is no longer current") from exc
            if leaves_terminal and current.status.terminal and (current.expires_at or float("inf")) <= now:
                raise IllegalTransition(
                    f"task {task_id} is {current.status.value} and its retention ran out; it is being deleted",
                    field="task_id",
                ) from exc
            raise IllegalTransition(
                f"task {task_id} cannot move from {current.status.value!r} to {to.value!r}", field="status"
            ) from exc
        observe.task_status_changed(
            task_id, str((new or {}).get("tenant", "")), to.value, **({"error": error.get("code")} if error else {})
        )

    def _result_attrs(self, task_id: str, result: str, lease: Lease | None) -> dict[str, Any]:
        """``result`` inline, or an S3 pointer (``result_ref``) when it is large."""
        epoch = lease.epoch if lease else 0
        attrs = self.payloads.encode(f"{keys.payload_prefix(task_id)}result-e{epoch}.txt", result)
        return {"result": attrs["body"]} if "body" in attrs else {"result_ref": attrs["ref"]}

    def finish_update(
        self,
        task_id: str,
        lease: Lease,
        finish: TaskStatus,
        now: float,
        result: str | None,
        error: dict[str, Any] | None,
    ) -> dict[str, Any]:
        """The META attributes a step commit sets when it ends the task."""
        assert finish in ALLOWED_TRANSITIONS[TaskStatus.RUNNING] and finish.terminal
        sets: dict[str, Any] = {
            "status": finish.value,
            "finished_at": now,
            "lease_expires": 0,
            TTL_ATTRIBUTE: self.expiry(now),
        }
        if result is not None:
            sets.update(self._result_attrs(task_id, result, lease))
        if error is not None:
            sets["error"] = error
        return sets

    # ------------------------------------------------------- failures, sweeps

    def record_failure(self, task_id: str, step: int) -> int:
        """Count one retryable failure of the task at ``step``; returns the failures in a row there.

        The count is the task's own (on META), so it grows only when the task itself fails, not
        when a message is received again because a worker was killed or stopped; a step
        committed since the last failure starts the count again.
        """
        key = keys.meta_key(task_id)
        try:
            item = self.table.update(
                key,
                Update(add={"failures": 1}, set={"updated_at": time.time()}),
                condition=present() & Attr("failure_step").eq(step),
                returns="ALL_NEW",
            )
            assert item is not None
            return int(item["failures"])
        except ConditionFailed:
            try:
                self.table.update(
                    key,
                    Update(set={"failures": 1, "failure_step": step, "updated_at": time.time()}),
                    condition=present(),
                )
            except ConditionFailed as exc:
                raise TaskNotFound(f"no task {task_id!r}", field="task_id") from exc
            return 1

    def live_task_ids(self, page_size: int = 500) -> Iterator[str]:
        """Every task in the sparse ``live`` index: the unfinished ones (and a few just finished,
        as the index is eventually consistent)."""
        for shard in range(LIVE_SHARDS):
            start: Item | None = None
            while True:
                page = self.table.query_index(
                    GSI_LIVE, ("live_pk", f"LIVE#{shard}"), descending=False, limit=page_size, start=start
                )
                yield from (str(i["live_sk"]) for i in page.items)
                if page.last_key is None:
                    break
                start = page.last_key

    def metas(self, task_ids: list[str]) -> list[dict[str, Any]]:
        """The META attributes of many tasks (BatchGetItem, no submissions), as plain values."""
        return [plain(i) for i in self.table.batch_get([keys.meta_key(t) for t in task_ids])]

    def unlist(self, task_id: str) -> None:
        """Take an ended task out of the ``live`` index (one whose end did not, e.g. written
        before the index existed); only while it is terminal."""
        ended = [s for s in TaskStatus if s.terminal]
        with contextlib.suppress(ConditionFailed):
            self.table.update(keys.meta_key(task_id), Update(remove=LIVE_ATTRIBUTES), condition=status_in(ended))

    def pause(self, lease: Lease) -> Patch:
        """The fenced write that pauses a running task (it gives up its lease)."""
        return Patch(
            "meta",
            keys.meta_key(lease.task_id),
            Update(set={"status": TaskStatus.PAUSED.value, "lease_expires": 0, "updated_at": time.time()}),
            fence(lease),
        )

    def replace_submission(self, task_id: str, submission: TaskSubmission, *, when_status: TaskStatus) -> None:
        try:
            self.table.transact(
                [
                    Patch(
                        "meta",
                        keys.meta_key(task_id),
                        Update(set={"updated_at": time.time()}),
                        Attr("status").eq(when_status.value),
                    ),
                    Put("submission", self.submission_item(task_id, submission)),
                ]
            )
        except TransactionCancelled as exc:
            raise IllegalTransition(f"task {task_id} is no longer {when_status.value}", field="task_id") from exc

    def set_task_token(self, task_id: str, token: str) -> None:
        self.table.update(keys.meta_key(task_id), Update(set={"task_token": token}), condition=present())

    # ------------------------------------------------------------------ fork

    def fork(
        self,
        source: Task,
        submission: TaskSubmission,
        steps: list[StepRecord],
        *,
        tenant: str,
        task_id: str | None = None,
    ) -> Task:
        """A new root task whose history is ``steps`` of ``source``, copied as they were stored."""
        task_id = task_id or keys.new_task_id()
        llm_steps = sum(1 for s in steps if s.body.kind == "llm")
        originals = {int(i["number"]): i for i in self.table.query(keys.task_pk(source.task_id), prefix=keys.STEP)}
        puts: list[Put] = []
        for record in steps:
            item = dict(originals[record.number])
            item["pk"] = keys.task_pk(task_id)
            if "ref" in item:
                # The fork owns a copy: payloads live under their task's prefix, and the source's
                # go when its retention ends (agentq.control.retention), while the fork may live on.
                key = keys.step_payload_key(task_id, record.number, record.epoch)
                self.payloads.copy(item["ref"], key)
                item["ref"] = key
            puts.append(Put(f"step{record.number}", item))
        for chunk in chunks(puts):
            self.table.transact(chunk)
        # META last: until it exists the fork is invisible, so a failed copy leaves nothing usable.
        actions, task = self.create_actions(
            task_id,
            submission,
            tenant=tenant,
            root_id=task_id,
            budget=submission.constraints.max_tokens,
            forked_from={"task_id": source.task_id, "step": len(steps)},
        )
        meta = actions[0]
        assert isinstance(meta, Put)
        compacted_at = max((s.number for s in steps if s.body.kind == "compact"), default=0)
        counters = {"step": len(steps), "llm_steps": llm_steps, "compacted_at": compacted_at}
        meta.item.update(counters)
        self.table.transact(actions)
        return task.model_copy(update=counters)
