"""The DynamoDB single-table store: task META, immutable STEP items, EFFECT and NOTE items,
and the root BUDGET item.

Every write a worker makes carries the condition ``lease_epoch = <my epoch>``: a worker whose
lease was taken over (a zombie woken from SIGSTOP) can write nothing. A step commit is one
TransactWriteItems: put the step (never overwritten), advance META from step n-1 to n, and
reconcile the budget with the provider's reported usage, so state, history and accounting
never disagree.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, Iterator

from botocore.exceptions import ClientError

from agentq.core.errors import BudgetExceeded, IdempotencyConflict, IllegalTransition, LeaseLost, TaskNotFound
from agentq.core.faults import crash_point
from pydantic import TypeAdapter

from agentq.core.models import (
    ALLOWED_TRANSITIONS,
    Lease,
    LLMStep,
    Step,
    StepRecord,
    Task,
    TaskStatus,
    TaskSubmission,
    ToolOutcome,
    sources_of,
)
from agentq.resources import PAYLOAD_PREFIX, TTL_ATTRIBUTE
from agentq.storage.serdes import PayloadStore, from_item, to_item, to_values

_STEP_ADAPTER: TypeAdapter[Any] = TypeAdapter(Step)
META = "META"
DEFAULT_TASK_RETENTION_DAYS = 30
DAY_SECONDS = 86_400


def task_pk(task_id: str) -> str:
    return f"TASK#{task_id}"


def budget_pk(root_id: str) -> str:
    return f"BUDGET#{root_id}"


def step_sk(number: int) -> str:
    return f"STEP#{number:06d}"


def payload_prefix(task_id: str) -> str:
    """Every S3 payload of a task is under this prefix (so its purge can list them)."""
    return f"{PAYLOAD_PREFIX}{task_id}/"


def step_payload_key(task_id: str, number: int, epoch: int) -> str:
    return f"{payload_prefix(task_id)}steps/{number:06d}-e{epoch}.json"


def new_task_id() -> str:
    return uuid.uuid4().hex


def tenant_index_pk(tenant: str) -> str:
    """``gsi1`` partition of a tenant's tasks."""
    return f"TENANT#{tenant}"


def tenant_index_sk(created_at: float, task_id: str) -> str:
    """``gsi1`` sort key: creation time in epoch milliseconds (15 digits, so it sorts as text),
    then the task id to break ties; a descending query lists newest first."""
    return f"{int(created_at * 1000):015d}#{task_id}"


def idempotency_pk(tenant: str, key: str) -> str:
    return f"IDEMP#{tenant}#{key}"


@dataclass(frozen=True)
class Reservation:
    """Tokens held on the root budget for one LLM call, recorded on META as ``inflight``."""

    amount: int
    epoch: int
    step: int


@dataclass(frozen=True)
class BudgetState:
    cap: int
    reserved: int
    used: int
    available: int
    cost_usd: Decimal


@dataclass(frozen=True)
class EffectRecord:
    tool_use_id: str
    state: str  # "started" | "done"
    content: str | None
    is_error: bool
    epoch: int


@dataclass(frozen=True)
class BudgetDelta:
    """How a committed LLM call settles its reservation against the root budget."""

    reserved: int
    used: int
    cost_usd: Decimal
    tokens_in: int
    tokens_out: int


NO_USAGE = BudgetDelta(reserved=0, used=0, cost_usd=Decimal(0), tokens_in=0, tokens_out=0)


class Store:
    def __init__(
        self, ddb: Any, table: str, payloads: PayloadStore, *, retention_seconds: int = DEFAULT_TASK_RETENTION_DAYS * DAY_SECONDS
    ) -> None:
        """``retention_seconds``: how long a finished task stays readable. Entering a terminal
        status stamps META's ``expires_at`` (the table's TTL attribute) in the same write; DynamoDB
        TTL then deletes META and the reaper (``agentq.control.retention``) the rest of the task."""
        if retention_seconds < DAY_SECONDS:
            # Idempotency records live 24 h and a fan-out waits at most 24 h for a child: a
            # shorter retention could delete a task something still points at.
            raise ValueError(f"task retention must be at least one day, got {retention_seconds} s")
        self.ddb = ddb
        self.table = table
        self.payloads = payloads
        self.retention_seconds = retention_seconds

    def expiry(self, now: float) -> int:
        """The ``expires_at`` of a task that finishes at ``now`` (epoch seconds, as TTL wants)."""
        return int(now + self.retention_seconds)

    # ------------------------------------------------------------------ tasks

    def create_task(
        self,
        submission: TaskSubmission,
        *,
        tenant: str,
        task_id: str | None = None,
        parent_id: str | None = None,
        root_id: str | None = None,
        depth: int = 0,
    ) -> Task:
        """Write META (and the root budget for a root task) in one transaction: all or nothing."""
        task_id = task_id or new_task_id()
        root_id = root_id or task_id
        meta = self._meta_item(task_id, submission, tenant=tenant, root_id=root_id, parent_id=parent_id, depth=depth)
        items: list[dict[str, Any]] = [
            {"Put": {"TableName": self.table, "Item": to_item(meta), "ConditionExpression": "attribute_not_exists(pk)"}}
        ]
        if root_id == task_id:
            items.append(self._budget_put(task_id, submission.constraints.max_tokens))
        # botocore retries a timed-out transaction; the token makes a retry of one that did
        # go through succeed instead of failing its own attribute_not_exists conditions.
        self.ddb.transact_write_items(TransactItems=items, ClientRequestToken=request_token("create", task_id))
        return Task.model_validate({**meta, "submission": submission})

    @staticmethod
    def _meta_item(
        task_id: str,
        submission: TaskSubmission,
        *,
        tenant: str,
        root_id: str,
        parent_id: str | None,
        depth: int,
        **extra: Any,
    ) -> dict[str, Any]:
        now = time.time()
        return {
            "pk": task_pk(task_id),
            "sk": META,
            "gsi1pk": tenant_index_pk(tenant),
            "gsi1sk": tenant_index_sk(now, task_id),
            "task_id": task_id,
            "tenant": tenant,
            "status": TaskStatus.QUEUED.value,
            "submission": submission.model_dump_json(exclude_none=True),
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
            "claims": [],
            **extra,
        }

    def _budget_put(self, budget_id: str, cap: int, **extra: Any) -> dict[str, Any]:
        budget = {
            "pk": budget_pk(budget_id),
            "sk": META,
            "cap": cap,
            "reserved": 0,
            "used": 0,
            "available": cap,
            "cost_usd": Decimal(0),
            "tokens_in": 0,
            "tokens_out": 0,
            **extra,
        }
        return {"Put": {"TableName": self.table, "Item": to_item(budget), "ConditionExpression": "attribute_not_exists(pk)"}}

    def delete_unstarted(self, task_id: str, *, idempotency: tuple[str, str] | None = None) -> None:
        """Undo a create whose enqueue failed: only while nobody has claimed the task.

        ``idempotency`` (tenant, key) also removes the task's ``IDEMP#`` record, so a retry
        with the same key creates the task anew instead of finding a deleted one.
        """
        items: list[dict[str, Any]] = [
            {
                "Delete": {
                    "TableName": self.table,
                    "Key": to_item({"pk": task_pk(task_id), "sk": META}),
                    "ConditionExpression": "lease_epoch = :zero",
                    "ExpressionAttributeValues": to_values({":zero": 0}),
                }
            },
            {"Delete": {"TableName": self.table, "Key": to_item({"pk": budget_pk(task_id), "sk": META})}},
        ]
        if idempotency is not None:
            items.append({"Delete": {"TableName": self.table, "Key": to_item({"pk": idempotency_pk(*idempotency), "sk": META})}})
        self.ddb.transact_write_items(TransactItems=items)

    def create_task_idempotent(
        self,
        submission: TaskSubmission,
        *,
        tenant: str,
        key: str,
        request_hash: str,
        ttl_seconds: int = 24 * 3600,
    ) -> tuple[Task, bool]:
        """Create the task unless ``key`` was used before by ``tenant``; returns (task, created).

        The ``IDEMP#tenant#key`` record (the task id and a hash of the request) is written in
        the same transaction as META and the budget, so a key never points at a task that does
        not exist, and two racing requests with one key create one task. A reused key with
        another request hash raises IdempotencyConflict. A record past its ``expires_at``
        (DynamoDB TTL deletes lazily) counts as absent.
        """
        for _ in range(3):
            task_id = new_task_id()
            now = time.time()
            meta = self._meta_item(task_id, submission, tenant=tenant, root_id=task_id, parent_id=None, depth=0)
            record = {
                "pk": idempotency_pk(tenant, key),
                "sk": META,
                "task_id": task_id,
                "request_hash": request_hash,
                "created_at": now,
                "expires_at": int(now + ttl_seconds),
            }
            items = [
                {"Put": {"TableName": self.table, "Item": to_item(meta), "ConditionExpression": "attribute_not_exists(pk)"}},
                self._budget_put(task_id, submission.constraints.max_tokens),
                {
                    "Put": {
                        "TableName": self.table,
                        "Item": to_item(record),
                        "ConditionExpression": "attribute_not_exists(pk) OR expires_at < :now",
                        "ExpressionAttributeValues": to_values({":now": int(now)}),
                    }
                },
            ]
            try:
                self.ddb.transact_write_items(TransactItems=items)
                return Task.model_validate({**meta, "submission": submission}), True
            except ClientError as exc:
                if _cancellation_codes(exc)[2:3] != ["ConditionalCheckFailed"]:
                    raise
            existing = self.get_idempotency(tenant, key)
            if existing is None:
                continue  # expired or deleted meanwhile: try again
            if existing["request_hash"] != request_hash:
                raise IdempotencyConflict(
                    "this Idempotency-Key was already used with a different request body", field="Idempotency-Key"
                )
            try:
                return self.get_task(existing["task_id"]), False
            except TaskNotFound:
                continue  # its create was undone (enqueue failed) and the record with it
        raise RuntimeError(f"could not settle idempotency key {key!r}: it keeps changing")

    def get_idempotency(self, tenant: str, key: str) -> dict[str, Any] | None:
        resp = self.ddb.get_item(
            TableName=self.table, Key=to_item({"pk": idempotency_pk(tenant, key), "sk": META}), ConsistentRead=True
        )
        if "Item" not in resp:
            return None
        record = from_item(resp["Item"])
        return record if record.get("expires_at", 0) >= time.time() else None

    def get_task(self, task_id: str) -> Task:
        resp = self.ddb.get_item(
            TableName=self.table, Key=to_item({"pk": task_pk(task_id), "sk": META}), ConsistentRead=True
        )
        if "Item" not in resp:
            raise TaskNotFound(f"no task {task_id!r}", field="task_id")
        return self._task(resp["Item"])

    def _task(self, item: dict[str, Any]) -> Task:
        data = from_item(item, keep_decimal=frozenset({"cost_usd"}))
        data["submission"] = TaskSubmission.model_validate_json(data["submission"])
        if "result_ref" in data:
            data["result"] = self.payloads.decode({"ref": data["result_ref"]})
        return Task.model_validate(data)

    # ------------------------------------------------------------------ leases

    def claim(self, task_id: str, worker: str, lease_seconds: float) -> tuple[Lease, Task] | None:
        """Take the task if it is claimable and no live lease exists; bumps the epoch.

        Returns None when another worker holds a live lease or the task is not runnable
        (finished, paused, waiting). One conditional UpdateItem that also returns the task.
        """
        now = time.time()
        try:
            resp = self.ddb.update_item(
                TableName=self.table,
                Key=to_item({"pk": task_pk(task_id), "sk": META}),
                UpdateExpression=(
                    "SET lease_owner = :w, lease_epoch = lease_epoch + :one, lease_expires = :exp, "
                    "#s = :running, updated_at = :now, started_at = if_not_exists(started_at, :now), "
                    "claims = list_append(claims, :claim), prev_heartbeat_at = if_not_exists(heartbeat_at, :now), "
                    "heartbeat_at = :now"
                ),
                ConditionExpression="attribute_exists(pk) AND #s IN (:queued, :running) AND lease_expires < :now",
                ExpressionAttributeNames={"#s": "status"},
                ExpressionAttributeValues=to_values(
                    {
                        ":w": worker,
                        ":one": 1,
                        ":exp": now + lease_seconds,
                        ":running": TaskStatus.RUNNING.value,
                        ":queued": TaskStatus.QUEUED.value,
                        ":now": now,
                        ":claim": [{"worker": worker, "at": now}],
                    }
                ),
                ReturnValues="ALL_NEW",
            )
        except ClientError as exc:
            if _is_condition_failure(exc):
                return None
            raise
        task = self._task(resp["Attributes"])
        lease = Lease(task_id=task_id, owner=worker, epoch=task.lease_epoch, expires_at=task.lease_expires)
        return lease, task

    def extend_lease(self, lease: Lease, lease_seconds: float) -> Lease:
        now = time.time()
        expires = now + lease_seconds
        self._fenced_update(
            lease, "SET lease_expires = :exp, heartbeat_at = :now", {":exp": expires, ":now": now, ":zero": 0},
            extra_condition=" AND lease_expires > :zero",
        )
        return lease.model_copy(update={"expires_at": expires})

    def release(self, lease: Lease) -> None:
        """Give the task back (continuation, graceful shutdown): the next claim may run at once."""
        self._fenced_update(lease, "SET lease_expires = :zero", {":zero": 0})

    def _fenced_update(self, lease: Lease, expression: str, values: dict[str, Any], extra_condition: str = "") -> None:
        try:
            self.ddb.update_item(
                TableName=self.table,
                Key=to_item({"pk": task_pk(lease.task_id), "sk": META}),
                UpdateExpression=expression,
                ConditionExpression="lease_epoch = :epoch" + extra_condition,
                ExpressionAttributeValues=to_values({**values, ":epoch": lease.epoch}),
            )
        except ClientError as exc:
            if _is_condition_failure(exc):
                raise LeaseLost(f"lease epoch {lease.epoch} of task {lease.task_id} is no longer current") from exc
            raise

    # ------------------------------------------------------------- transitions

    def transition(
        self,
        task_id: str,
        to: TaskStatus,
        *,
        lease: Lease | None = None,
        result: str | None = None,
        error: dict[str, Any] | None = None,
    ) -> None:
        """Move a task to ``to``; DynamoDB refuses it unless the current status may lead there.

        With a lease the write is also fenced by its epoch.
        """
        allowed = sources_of(to)
        if not allowed:
            raise IllegalTransition(f"no status may move to {to.value!r}", field="status")
        names = {"#s": "status"}
        values: dict[str, Any] = {":to": to.value, ":now": time.time()}
        placeholders = []
        for i, src in enumerate(allowed):
            values[f":from{i}"] = src.value
            placeholders.append(f":from{i}")
        sets = ["#s = :to", "updated_at = :now"]
        if to is not TaskStatus.RUNNING:  # only a running task holds a lease
            sets.append("lease_expires = :zero")
            values[":zero"] = 0
        removes = ["#e", "finished_at"] if to is TaskStatus.QUEUED else []  # a requeue starts clean
        if removes:
            names["#e"] = "error"
        if to.terminal:
            sets += ["finished_at = :now", f"{TTL_ATTRIBUTE} = :expires"]
            values[":expires"] = self.expiry(values[":now"])
        else:
            removes.append(TTL_ATTRIBUTE)  # a live task never expires (a no-op unless leaving a terminal status)
        if result is not None:
            sets.append(self._result_set(task_id, result, values, names, lease))
        if error is not None:
            sets.append("#e = :error")
            names["#e"] = "error"
            values[":error"] = error
        condition = f"attribute_exists(pk) AND #s IN ({', '.join(placeholders)})"
        leaves_terminal = any(src.terminal for src in allowed)
        if leaves_terminal:
            # Not once the retention has run out: from then on DynamoDB TTL may delete META (and
            # the reaper the rest of the task) at any moment. Only terminal tasks carry expires_at.
            condition += f" AND (attribute_not_exists({TTL_ATTRIBUTE}) OR {TTL_ATTRIBUTE} > :now)"
        if lease is not None:
            condition += " AND lease_epoch = :epoch"
            values[":epoch"] = lease.epoch
        expression = "SET " + ", ".join(sets) + (" REMOVE " + ", ".join(removes) if removes else "")
        try:
            self.ddb.update_item(
                TableName=self.table,
                Key=to_item({"pk": task_pk(task_id), "sk": META}),
                UpdateExpression=expression,
                ConditionExpression=condition,
                ExpressionAttributeNames=names,
                ExpressionAttributeValues=to_values(values),
            )
        except ClientError as exc:
            if not _is_condition_failure(exc):
                raise
            current = self.get_task(task_id)  # raises TaskNotFound if absent
            if lease is not None and current.lease_epoch != lease.epoch:
                raise LeaseLost(f"lease epoch {lease.epoch} of task {task_id} is no longer current") from exc
            if leaves_terminal and current.status.terminal and (current.expires_at or float("inf")) <= values[":now"]:
                raise IllegalTransition(
                    f"task {task_id} is {current.status.value} and its retention ran out; it is being deleted", field="task_id"
                ) from exc
            raise IllegalTransition(
                f"task {task_id} cannot move from {current.status.value!r} to {to.value!r}", field="status"
            ) from exc

    def _result_set(
        self, task_id: str, result: str, values: dict[str, Any], names: dict[str, str], lease: Lease | None
    ) -> str:
        """The SET clause storing ``result`` inline or as an S3 pointer (``result_ref``)."""
        epoch = lease.epoch if lease else 0
        attrs = self.payloads.encode(f"{payload_prefix(task_id)}result-e{epoch}.txt", result)
        if "body" in attrs:
            values[":result"] = attrs["body"]
            names["#r"] = "result"
            return "#r = :result"
        values[":result_ref"] = attrs["ref"]
        return "result_ref = :result_ref"

    # ------------------------------------------------------------------ steps

    def load_steps(self, task_id: str) -> list[StepRecord]:
        return list(self._iter_steps(task_id))

    def _iter_steps(self, task_id: str) -> Iterator[StepRecord]:
        paginator = self.ddb.get_paginator("query")
        for page in paginator.paginate(
            TableName=self.table,
            KeyConditionExpression="pk = :pk AND begins_with(sk, :prefix)",
            ExpressionAttributeValues=to_values({":pk": task_pk(task_id), ":prefix": "STEP#"}),
            ConsistentRead=True,
        ):
            for raw in page["Items"]:
                item = from_item(raw)
                body = _STEP_ADAPTER.validate_json(self.payloads.decode(item))
                yield StepRecord(
                    task_id=task_id,
                    number=item["number"],
                    epoch=item["epoch"],
                    committed_at=item["committed_at"],
                    body=body,
                )

    def commit_step(
        self,
        lease: Lease,
        number: int,
        body: LLMStep | Any,
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
        payload = body.model_dump_json()
        stored = self.payloads.encode(step_payload_key(lease.task_id, number, lease.epoch), payload)
        step_item = {
            "pk": task_pk(lease.task_id),
            "sk": step_sk(number),
            "number": number,
            "epoch": lease.epoch,
            "kind": body.kind,
            "committed_at": now,
            **stored,
        }
        names: dict[str, str] = {"#s": "status"}
        values: dict[str, Any] = {
            ":n": number,
            ":prev": number - 1,
            ":epoch": lease.epoch,
            ":running": TaskStatus.RUNNING.value,
            ":now": now,
        }
        sets = ["step = :n", "updated_at = :now"]
        if lease_until is not None and finish is None:
            sets += ["lease_expires = :until", "heartbeat_at = :now"]
            values[":until"] = lease_until
        removes = ["inflight"] if body.kind == "llm" else []
        if body.kind == "llm":
            sets.append("llm_steps = llm_steps + :one")
            values[":one"] = 1
        if settle is not None:
            sets += ["tokens_in = tokens_in + :tin", "tokens_out = tokens_out + :tout", "cost_usd = cost_usd + :cost"]
            values.update({":tin": settle.tokens_in, ":tout": settle.tokens_out, ":cost": settle.cost_usd})
        if finish is not None:
            assert finish in ALLOWED_TRANSITIONS[TaskStatus.RUNNING] and finish.terminal
            sets += ["#s = :final", "finished_at = :now", "lease_expires = :zero", f"{TTL_ATTRIBUTE} = :expires"]
            values.update({":final": finish.value, ":zero": 0, ":expires": self.expiry(now)})
            if result is not None:
                sets.append(self._result_set(lease.task_id, result, values, names, lease))
            if error is not None:
                sets.append("#e = :error")
                names["#e"] = "error"
                values[":error"] = error
        items: list[dict[str, Any]] = [
            {
                "Put": {
                    "TableName": self.table,
                    "Item": to_item(step_item),
                    "ConditionExpression": "attribute_not_exists(pk)",
                }
            }
        ]
        if reserve_next:
            sets.append("inflight = :inflight")
            removes = []
            values[":inflight"] = {"amount": reserve_next, "epoch": lease.epoch, "step": number + 1}
        meta_update: dict[str, Any] = {
            "Update": {
                "TableName": self.table,
                "Key": to_item({"pk": task_pk(lease.task_id), "sk": META}),
                "UpdateExpression": "SET " + ", ".join(sets) + (" REMOVE " + ", ".join(removes) if removes else ""),
                "ConditionExpression": "lease_epoch = :epoch AND #s = :running AND step = :prev",
                "ExpressionAttributeNames": names,
                "ExpressionAttributeValues": to_values(values),
            }
        }
        items.append(meta_update)
        if settle is not None or reserve_next:
            items.append(self._budget_update(root_id, settle or NO_USAGE, reserve_next))
        try:
            self.ddb.transact_write_items(
                TransactItems=items, ClientRequestToken=request_token("commit", lease.task_id, lease.epoch, number, reserve_next)
            )
        except ClientError as exc:
            reasons = _cancellation_codes(exc)
            if reserve_next and reasons[2:3] == ["ConditionalCheckFailed"] and "ConditionalCheckFailed" not in reasons[:2]:
                raise BudgetExceeded(f"root budget cannot cover {reserve_next} more tokens") from exc
            if "ConditionalCheckFailed" in reasons or _is_condition_failure(exc):
                raise self._why_fenced(lease) from exc
            raise
        return StepRecord(task_id=lease.task_id, number=number, epoch=lease.epoch, committed_at=now, body=body)

    def _why_fenced(self, lease: Lease) -> LeaseLost:
        current = self.get_task(lease.task_id)
        if current.lease_epoch != lease.epoch:
            return LeaseLost(f"lease epoch {lease.epoch} of task {lease.task_id} superseded by {current.lease_epoch}")
        if current.status is not TaskStatus.RUNNING:
            err = LeaseLost(f"task {lease.task_id} is {current.status.value}; the worker must stop")
            err.details["status"] = current.status
            return err
        return LeaseLost(f"task {lease.task_id} step moved to {current.step} under epoch {lease.epoch}")

    # ------------------------------------------------------------------ budget

    def _budget_update(self, root_id: str, delta: BudgetDelta, reserve_next: int) -> dict[str, Any]:
        """Settle a reservation (``reserved - est``, ``used + actual``) and optionally reserve anew.

        ``available`` is kept as its own attribute because DynamoDB conditions cannot do
        arithmetic: a reservation succeeds only if ``available >= amount``.
        """
        reserved_change = reserve_next - delta.reserved
        available_change = delta.reserved - delta.used - reserve_next
        values = {
            ":rc": reserved_change,
            ":used": delta.used,
            ":ac": available_change,
            ":cost": delta.cost_usd,
            ":tin": delta.tokens_in,
            ":tout": delta.tokens_out,
        }
        update: dict[str, Any] = {
            "TableName": self.table,
            "Key": to_item({"pk": budget_pk(root_id), "sk": META}),
            "UpdateExpression": (
                "SET reserved = reserved + :rc, used = used + :used, available = available + :ac, "
                "cost_usd = cost_usd + :cost, tokens_in = tokens_in + :tin, tokens_out = tokens_out + :tout"
            ),
        }
        if reserve_next:
            update["ConditionExpression"] = "available >= :need"
            values[":need"] = reserve_next - (delta.reserved - delta.used)
        update["ExpressionAttributeValues"] = to_values(values)
        return {"Update": update}

    def reserve(self, lease: Lease, root_id: str, amount: int, step: int) -> Reservation:
        """Hold ``amount`` tokens on the root budget and record it on META, atomically and fenced.

        Raises BudgetExceeded when the root has less than ``amount`` available.
        """
        items = [
            self._budget_update(root_id, NO_USAGE, amount),
            {
                "Update": {
                    "TableName": self.table,
                    "Key": to_item({"pk": task_pk(lease.task_id), "sk": META}),
                    "UpdateExpression": "SET inflight = :inflight",
                    "ConditionExpression": "lease_epoch = :epoch AND #s = :running",
                    "ExpressionAttributeNames": {"#s": "status"},
                    "ExpressionAttributeValues": to_values(
                        {
                            ":inflight": {"amount": amount, "epoch": lease.epoch, "step": step},
                            ":epoch": lease.epoch,
                            ":running": TaskStatus.RUNNING.value,
                        }
                    ),
                }
            },
        ]
        try:
            self.ddb.transact_write_items(TransactItems=items)
        except ClientError as exc:
            reasons = _cancellation_codes(exc)
            if reasons and reasons[0] == "ConditionalCheckFailed":
                raise BudgetExceeded(f"root budget {root_id} cannot cover {amount} tokens") from exc
            if "ConditionalCheckFailed" in reasons:
                raise self._why_fenced(lease) from exc
            raise
        return Reservation(amount=amount, epoch=lease.epoch, step=step)

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
            self.ddb.transact_write_items(TransactItems=[self._budget_update(budget_id, delta, 0)])
            return True
        release_marker = {
            "Update": {
                "TableName": self.table,
                "Key": to_item({"pk": task_pk(task_id), "sk": META}),
                "UpdateExpression": "REMOVE inflight",
                "ConditionExpression": "inflight.epoch = :e",
                "ExpressionAttributeValues": to_values({":e": inflight_epoch}),
            }
        }
        try:
            self.ddb.transact_write_items(TransactItems=[release_marker, self._budget_update(budget_id, delta, 0)])
            return True
        except ClientError as exc:
            if "ConditionalCheckFailed" not in _cancellation_codes(exc):
                raise
        if delta.used or delta.cost_usd:
            usage_only = BudgetDelta(reserved=0, used=delta.used, cost_usd=delta.cost_usd, tokens_in=delta.tokens_in, tokens_out=delta.tokens_out)
            self.ddb.transact_write_items(TransactItems=[self._budget_update(budget_id, usage_only, 0)])
        return False

    def record_orphan_call(self, lease: Lease, number: int, body: LLMStep) -> None:
        """Keep an LLM call whose step could not be committed (its worker lost the lease) in
        the trace: it happened and it was paid for, so the trace and the ledger show it."""
        payload = self.payloads.encode(f"{payload_prefix(lease.task_id)}orphans/{number:06d}-e{lease.epoch}.json", body.model_dump_json())
        self.ddb.put_item(
            TableName=self.table,
            Item=to_item({"pk": task_pk(lease.task_id), "sk": f"ORPHAN#{number:06d}#e{lease.epoch:04d}", "epoch": lease.epoch, "number": number, **payload}),
        )

    def orphan_calls(self, task_id: str) -> list[LLMStep]:
        return [LLMStep.model_validate_json(self.payloads.decode(from_item(i))) for i in self._query_prefix(task_id, "ORPHAN#")]

    def inflight(self, task_id: str) -> Reservation | None:
        resp = self.ddb.get_item(
            TableName=self.table,
            Key=to_item({"pk": task_pk(task_id), "sk": META}),
            ProjectionExpression="inflight",
            ConsistentRead=True,
        )
        raw = from_item(resp.get("Item", {})).get("inflight")
        return Reservation(**raw) if raw else None

    def get_budget(self, root_id: str) -> BudgetState:
        resp = self.ddb.get_item(
            TableName=self.table, Key=to_item({"pk": budget_pk(root_id), "sk": META}), ConsistentRead=True
        )
        if "Item" not in resp:
            raise TaskNotFound(f"no budget for root task {root_id!r}", field="root_id")
        return _budget_state(resp["Item"])

    # ----------------------------------------------------------------- effects

    def begin_effect(self, lease: Lease, tool_use_id: str, name: str) -> EffectRecord | None:
        """Record that a side-effecting tool is about to run; None means "go ahead, run it".

        An existing record means an earlier worker got here first: its result if it finished,
        or a "started" record whose outcome nobody knows.
        """
        item = {
            "pk": task_pk(lease.task_id),
            "sk": f"EFFECT#{tool_use_id}",
            "tool": name,
            "state": "started",
            "epoch": lease.epoch,
            "started_at": time.time(),
        }
        try:
            self.ddb.transact_write_items(
                TransactItems=[
                    self._lease_check(lease),
                    {
                        "Put": {
                            "TableName": self.table,
                            "Item": to_item(item),
                            "ConditionExpression": "attribute_not_exists(pk)",
                        }
                    },
                ]
            )
            return None
        except ClientError as exc:
            reasons = _cancellation_codes(exc)
            if reasons and reasons[0] == "ConditionalCheckFailed":
                raise self._why_fenced(lease) from exc
            if len(reasons) > 1 and reasons[1] == "ConditionalCheckFailed":
                return self.get_effect(lease.task_id, tool_use_id)
            raise

    def finish_effect(self, lease: Lease, tool_use_id: str, outcome: ToolOutcome) -> None:
        attrs = self.payloads.encode(
            f"{payload_prefix(lease.task_id)}effects/{tool_use_id}-e{lease.epoch}.txt", outcome.content
        )
        values = {":done": "done", ":err": outcome.is_error, ":at": time.time(), ":epoch": lease.epoch}
        if "body" in attrs:
            expr = "SET #st = :done, is_error = :err, finished_at = :at, body = :body"
            values[":body"] = attrs["body"]
        else:
            expr = "SET #st = :done, is_error = :err, finished_at = :at, #ref = :ref"
            values[":ref"] = attrs["ref"]
        names = {"#st": "state"} | ({"#ref": "ref"} if "ref" in attrs else {})
        try:
            self.ddb.transact_write_items(
                TransactItems=[
                    self._lease_check(lease),
                    {
                        "Update": {
                            "TableName": self.table,
                            "Key": to_item({"pk": task_pk(lease.task_id), "sk": f"EFFECT#{tool_use_id}"}),
                            "UpdateExpression": expr,
                            "ExpressionAttributeNames": names,
                            "ExpressionAttributeValues": to_values(values),
                        }
                    },
                ]
            )
        except ClientError as exc:
            if _cancellation_codes(exc)[:1] == ["ConditionalCheckFailed"]:
                raise self._why_fenced(lease) from exc
            raise

    def get_effect(self, task_id: str, tool_use_id: str) -> EffectRecord | None:
        resp = self.ddb.get_item(
            TableName=self.table,
            Key=to_item({"pk": task_pk(task_id), "sk": f"EFFECT#{tool_use_id}"}),
            ConsistentRead=True,
        )
        if "Item" not in resp:
            return None
        data = from_item(resp["Item"])
        content = self.payloads.decode(data) if ("body" in data or "ref" in data) else None
        return EffectRecord(
            tool_use_id=tool_use_id,
            state=data["state"],
            content=content,
            is_error=bool(data.get("is_error", False)),
            epoch=data["epoch"],
        )

    # ------------------------------------------------------------------ spawns

    def spawn(
        self,
        lease: Lease,
        parent: Task,
        spawn_id: str,
        children: list[Any],
        pending: list[ToolOutcome],
        max_concurrency: int,
    ) -> bool:
        """Create the SPAWN record and every child (META + funded budget), moving the children's
        shares out of the parent's budget exactly once.

        First one fenced transaction writes the SPAWN record (state ``creating``) and takes
        the shares; then the children are written in chunks (a transaction holds at most 100
        items); then the record becomes ``created``. Until then nothing can run a child (the
        execution starts later), so a resumed parent may rewrite the chunks safely.
        Returns False when the spawn already existed.
        """
        total = sum(c.share for c in children)
        record = {
            "pk": task_pk(parent.task_id),
            "sk": f"SPAWN#{spawn_id}",
            "children": [c.task_id for c in children],
            "max_concurrency": max_concurrency,
            "state": "creating",
            "created_at": time.time(),
            "epoch": lease.epoch,
            **self.payloads.encode(
                f"{payload_prefix(parent.task_id)}spawns/{spawn_id}-e{lease.epoch}.json",
                json.dumps(
                    {
                        "pending": [p.model_dump(mode="json") for p in pending],
                        "plans": [
                            {"task_id": c.task_id, "share": c.share, "deadline_seconds": c.deadline_seconds,
                             "submission": c.submission.model_dump(mode="json", exclude_none=True)}
                            for c in children
                        ],
                    }
                ),
            ),
        }
        items: list[dict[str, Any]] = [
            self._lease_check(lease),
            {"Put": {"TableName": self.table, "Item": to_item(record), "ConditionExpression": "attribute_not_exists(pk)"}},
            {
                "Update": {
                    "TableName": self.table,
                    "Key": to_item({"pk": budget_pk(parent.budget_id), "sk": META}),
                    "UpdateExpression": "SET available = available - :total, reserved = reserved + :total",
                    "ConditionExpression": "available >= :total",
                    "ExpressionAttributeValues": to_values({":total": total}),
                }
            },
        ]
        try:
            self.ddb.transact_write_items(TransactItems=items)
        except ClientError as exc:
            reasons = _cancellation_codes(exc)
            if reasons[:1] == ["ConditionalCheckFailed"]:
                raise self._why_fenced(lease) from exc
            if reasons[1:2] == ["ConditionalCheckFailed"]:
                return False
            if reasons[2:3] == ["ConditionalCheckFailed"]:
                raise BudgetExceeded(f"the budget cannot fund {total} tokens of sub-agent shares") from exc
            raise
        crash_point("after_spawn_record")
        self.write_children(parent, spawn_id, children)
        return True

    def write_children(self, parent: Task, spawn_id: str, children: list[Any]) -> None:
        """Write the children of a ``creating`` spawn (idempotent), then mark it ``created``."""
        puts: list[dict[str, Any]] = []
        for child in children:
            meta = self._meta_item(
                child.task_id,
                child.submission,
                tenant=parent.tenant,
                root_id=parent.root_id,
                parent_id=parent.task_id,
                depth=parent.depth + 1,
                spawn_id=spawn_id,
            )
            puts.append({"Put": {"TableName": self.table, "Item": to_item(meta)}})
            budget = self._budget_put(child.task_id, child.share, parent_budget=parent.budget_id)
            budget["Put"].pop("ConditionExpression")
            puts.append(budget)
        for i in range(0, len(puts), 100):
            self.ddb.transact_write_items(TransactItems=puts[i : i + 100])
        self.mark_spawn(parent.task_id, spawn_id, state="created")

    def get_spawn(self, parent_id: str, spawn_id: str) -> dict[str, Any] | None:
        resp = self.ddb.get_item(
            TableName=self.table, Key=to_item({"pk": task_pk(parent_id), "sk": f"SPAWN#{spawn_id}"}), ConsistentRead=True
        )
        if "Item" not in resp:
            return None
        data = from_item(resp["Item"])
        payload = json.loads(self.payloads.decode(data))
        data["pending"] = [ToolOutcome.model_validate(p) for p in payload["pending"]]
        data["plans"] = payload["plans"]
        return data

    def mark_spawn(self, parent_id: str, spawn_id: str, **fields: Any) -> None:
        """Record facts about a spawn (execution ARN, woken) on its SPAWN item."""
        names = {f"#{k}": k for k in fields}
        self.ddb.update_item(
            TableName=self.table,
            Key=to_item({"pk": task_pk(parent_id), "sk": f"SPAWN#{spawn_id}"}),
            UpdateExpression="SET " + ", ".join(f"#{k} = :{k}" for k in fields),
            ConditionExpression="attribute_exists(pk)",
            ExpressionAttributeNames=names,
            ExpressionAttributeValues=to_values({f":{k}": v for k, v in fields.items()}),
        )

    def get_tasks(self, task_ids: list[str]) -> list[Task]:
        """Many META items (BatchGetItem, 100 a call), in the order asked."""
        found: dict[str, Task] = {}
        for i in range(0, len(task_ids), 100):
            keys = [to_item({"pk": task_pk(t), "sk": META}) for t in task_ids[i : i + 100]]
            request: dict[str, Any] = {self.table: {"Keys": keys, "ConsistentRead": True}}
            while request:
                resp = self.ddb.batch_get_item(RequestItems=request)
                for item in resp["Responses"].get(self.table, []):
                    task = self._task(item)
                    found[task.task_id] = task
                request = resp.get("UnprocessedKeys") or {}
        return [found[t] for t in task_ids if t in found]

    def set_task_token(self, task_id: str, token: str) -> None:
        self.ddb.update_item(
            TableName=self.table,
            Key=to_item({"pk": task_pk(task_id), "sk": META}),
            UpdateExpression="SET task_token = :t",
            ConditionExpression="attribute_exists(pk)",
            ExpressionAttributeValues=to_values({":t": token}),
        )

    def settle_child(self, parent_budget_id: str, child_id: str) -> None:
        """Close a child's budget and fold what its subtree spent into the parent's, once.

        The share was moved to the parent's ``reserved`` at spawn; now ``reserved`` gives it
        back, ``used`` takes the child's real usage and the rest is available again. The
        ``settled`` flag makes a repeat (a resumed parent) a no-op.
        """
        for _ in range(5):
            raw = self.ddb.get_item(TableName=self.table, Key=to_item({"pk": budget_pk(child_id), "sk": META}), ConsistentRead=True)
            if "settled" in raw.get("Item", {}):
                return
            child = _budget_state(raw["Item"])
            tokens = from_item(raw["Item"])
            try:
                self.ddb.transact_write_items(
                    TransactItems=[
                        {
                            "Update": {
                                "TableName": self.table,
                                "Key": to_item({"pk": budget_pk(child_id), "sk": META}),
                                "UpdateExpression": "SET settled = :true, available = :zero",
                                "ConditionExpression": "attribute_not_exists(settled) AND used = :used AND reserved = :reserved",
                                "ExpressionAttributeValues": to_values(
                                    {":true": True, ":zero": 0, ":used": child.used, ":reserved": child.reserved}
                                ),
                            }
                        },
                        {
                            "Update": {
                                "TableName": self.table,
                                "Key": to_item({"pk": budget_pk(parent_budget_id), "sk": META}),
                                "UpdateExpression": (
                                    "SET reserved = reserved - :cap, used = used + :used, available = available + :back, "
                                    "cost_usd = cost_usd + :cost, tokens_in = tokens_in + :tin, tokens_out = tokens_out + :tout"
                                ),
                                "ExpressionAttributeValues": to_values(
                                    {
                                        ":cap": child.cap,
                                        ":used": child.used + child.reserved,
                                        ":back": child.cap - child.used - child.reserved,
                                        ":cost": child.cost_usd,
                                        ":tin": tokens["tokens_in"],
                                        ":tout": tokens["tokens_out"],
                                    }
                                ),
                            }
                        },
                    ]
                )
                return
            except ClientError as exc:
                if "ConditionalCheckFailed" not in _cancellation_codes(exc):
                    raise
        raise RuntimeError(f"could not settle the budget of child {child_id}: it keeps changing")

    def list_spawns(self, task_id: str) -> list[dict[str, Any]]:
        return [from_item(i) for i in self._query_prefix(task_id, "SPAWN#")]

    def _query_prefix(self, task_id: str, prefix: str) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = []
        for page in self.ddb.get_paginator("query").paginate(
            TableName=self.table,
            KeyConditionExpression="pk = :pk AND begins_with(sk, :prefix)",
            ExpressionAttributeValues=to_values({":pk": task_pk(task_id), ":prefix": prefix}),
            ConsistentRead=True,
        ):
            items.extend(page["Items"])
        return items

    # --------------------------------------------------------------- approvals

    def request_approval(self, lease: Lease, use_id: str, question: str) -> None:
        """Record a pending approval and pause the task, in one fenced transaction."""
        record = {"pk": task_pk(lease.task_id), "sk": f"APPROVAL#{use_id}", "state": "pending", "question": question, "asked_at": time.time()}
        try:
            self.ddb.transact_write_items(
                TransactItems=[
                    {"Put": {"TableName": self.table, "Item": to_item(record), "ConditionExpression": "attribute_not_exists(pk)"}},
                    self._pause_update(lease),
                ]
            )
        except ClientError as exc:
            reasons = _cancellation_codes(exc)
            if reasons[:1] == ["ConditionalCheckFailed"]:  # asked before (a resumed worker): pause again
                self.ddb.transact_write_items(TransactItems=[self._pause_update(lease)])
                return
            if "ConditionalCheckFailed" in reasons:
                raise self._why_fenced(lease) from exc
            raise

    def _pause_update(self, lease: Lease) -> dict[str, Any]:
        return {
            "Update": {
                "TableName": self.table,
                "Key": to_item({"pk": task_pk(lease.task_id), "sk": META}),
                "UpdateExpression": "SET #s = :paused, lease_expires = :zero, updated_at = :now",
                "ConditionExpression": "lease_epoch = :epoch AND #s = :running",
                "ExpressionAttributeNames": {"#s": "status"},
                "ExpressionAttributeValues": to_values(
                    {":paused": TaskStatus.PAUSED.value, ":zero": 0, ":now": time.time(), ":epoch": lease.epoch, ":running": TaskStatus.RUNNING.value}
                ),
            }
        }

    def get_approval(self, task_id: str, use_id: str) -> dict[str, Any] | None:
        resp = self.ddb.get_item(TableName=self.table, Key=to_item({"pk": task_pk(task_id), "sk": f"APPROVAL#{use_id}"}), ConsistentRead=True)
        return from_item(resp["Item"]) if "Item" in resp else None

    def pending_approval(self, task_id: str) -> dict[str, Any] | None:
        for raw in self._query_prefix(task_id, "APPROVAL#"):
            item = from_item(raw)
            if item["state"] == "pending":
                return item
        return None

    def decide_approval(self, task_id: str, use_id: str, *, approved: bool, note: str, by: str) -> None:
        """Record the decision and requeue the paused task, atomically; refused unless pending."""
        now = time.time()
        try:
            self.ddb.transact_write_items(
                TransactItems=[
                    {
                        "Update": {
                            "TableName": self.table,
                            "Key": to_item({"pk": task_pk(task_id), "sk": f"APPROVAL#{use_id}"}),
                            "UpdateExpression": "SET #st = :state, note = :note, decided_by = :by, decided_at = :now",
                            "ConditionExpression": "#st = :pending",
                            "ExpressionAttributeNames": {"#st": "state"},
                            "ExpressionAttributeValues": to_values(
                                {":state": "approved" if approved else "rejected", ":note": note, ":by": by, ":now": now, ":pending": "pending"}
                            ),
                        }
                    },
                    {
                        "Update": {
                            "TableName": self.table,
                            "Key": to_item({"pk": task_pk(task_id), "sk": META}),
                            "UpdateExpression": "SET #s = :queued, updated_at = :now",
                            "ConditionExpression": "#s = :paused",
                            "ExpressionAttributeNames": {"#s": "status"},
                            "ExpressionAttributeValues": to_values({":queued": TaskStatus.QUEUED.value, ":paused": TaskStatus.PAUSED.value, ":now": now}),
                        }
                    },
                ]
            )
        except ClientError as exc:
            if "ConditionalCheckFailed" in _cancellation_codes(exc):
                raise IllegalTransition(f"task {task_id} has no pending approval to decide", field="task_id") from exc
            raise

    # ------------------------------------------------------------ fork, raise

    def fork_task(self, source: Task, submission: TaskSubmission, steps: list[StepRecord], *, tenant: str, task_id: str | None = None) -> Task:
        """A new root task whose history is ``steps`` of ``source``, copied as they were stored."""
        task_id = task_id or new_task_id()
        llm_steps = sum(1 for s in steps if s.body.kind == "llm")
        meta = self._meta_item(
            task_id, submission, tenant=tenant, root_id=task_id, parent_id=None, depth=0,
            forked_from={"task_id": source.task_id, "step": len(steps)},
        )  # fmt: skip
        meta.update({"step": len(steps), "llm_steps": llm_steps})
        puts: list[dict[str, Any]] = []
        originals = {from_item(i)["number"]: i for i in self._query_prefix(source.task_id, "STEP#")}
        for record in steps:
            item = dict(originals[record.number])
            item["pk"] = {"S": task_pk(task_id)}
            if "ref" in item:
                # The fork owns a copy: payloads live under their task's prefix, and the source's
                # go when its retention ends (agentq.control.retention), while the fork may live on.
                key = step_payload_key(task_id, record.number, record.epoch)
                self.payloads.copy(item["ref"]["S"], key)
                item["ref"] = {"S": key}
            puts.append({"Put": {"TableName": self.table, "Item": item}})
        for i in range(0, len(puts), 100):
            self.ddb.transact_write_items(TransactItems=puts[i : i + 100])
        # META last: until it exists the fork is invisible, so a failed copy leaves nothing usable.
        self.ddb.transact_write_items(
            TransactItems=[
                {"Put": {"TableName": self.table, "Item": to_item(meta), "ConditionExpression": "attribute_not_exists(pk)"}},
                self._budget_put(task_id, submission.constraints.max_tokens),
            ]
        )
        return Task.model_validate({**meta, "submission": submission})

    def raise_budget(self, task_id: str, add_tokens: int) -> BudgetState:
        self.ddb.update_item(
            TableName=self.table,
            Key=to_item({"pk": budget_pk(task_id), "sk": META}),
            UpdateExpression="SET cap = cap + :n, available = available + :n",
            ConditionExpression="attribute_exists(pk) AND attribute_not_exists(settled)",
            ExpressionAttributeValues=to_values({":n": add_tokens}),
        )
        return self.get_budget(task_id)

    def replace_submission(self, task_id: str, submission: TaskSubmission, *, when_status: TaskStatus) -> None:
        try:
            self.ddb.update_item(
                TableName=self.table,
                Key=to_item({"pk": task_pk(task_id), "sk": META}),
                UpdateExpression="SET submission = :sub",
                ConditionExpression="#s = :status",
                ExpressionAttributeNames={"#s": "status"},
                ExpressionAttributeValues=to_values({":sub": submission.model_dump_json(exclude_none=True), ":status": when_status.value}),
            )
        except ClientError as exc:
            if _is_condition_failure(exc):
                raise IllegalTransition(f"task {task_id} is no longer {when_status.value}", field="task_id") from exc
            raise

    # ------------------------------------------------------------------- notes

    def read_note(self, task_id: str, key: str) -> str | None:
        resp = self.ddb.get_item(
            TableName=self.table, Key=to_item({"pk": task_pk(task_id), "sk": f"NOTE#{key}"}), ConsistentRead=True
        )
        return from_item(resp["Item"])["value"] if "Item" in resp else None

    def write_note(self, lease: Lease, key: str, value: str) -> None:
        item = {"pk": task_pk(lease.task_id), "sk": f"NOTE#{key}", "value": value, "epoch": lease.epoch}
        try:
            self.ddb.transact_write_items(
                TransactItems=[self._lease_check(lease), {"Put": {"TableName": self.table, "Item": to_item(item)}}]
            )
        except ClientError as exc:
            if "ConditionalCheckFailed" in _cancellation_codes(exc):
                raise self._why_fenced(lease) from exc
            raise

    def _lease_check(self, lease: Lease) -> dict[str, Any]:
        return {
            "ConditionCheck": {
                "TableName": self.table,
                "Key": to_item({"pk": task_pk(lease.task_id), "sk": META}),
                "ConditionExpression": "lease_epoch = :epoch AND #s = :running",
                "ExpressionAttributeNames": {"#s": "status"},
                "ExpressionAttributeValues": to_values({":epoch": lease.epoch, ":running": TaskStatus.RUNNING.value}),
            }
        }

    # ----------------------------------------------------------- API queries

    def list_tenant_tasks(
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
        on the index (status and parent_id are projected), then the page's META items are read
        in one BatchGetItem. Returns the tasks and the ``gsi1sk`` to continue after, or None at
        the end. With a filter, a page may hold fewer than ``limit`` tasks although more follow:
        at most ``max_reads`` index queries are made per call.
        """
        from agentq.resources import GSI1

        pk = tenant_index_pk(tenant)
        names: dict[str, str] = {}
        values: dict[str, Any] = {":pk": pk}
        filters = []
        if status is not None:
            filters.append("#s = :status")
            names["#s"] = "status"
            values[":status"] = status.value
        if roots_only:
            filters.append("attribute_not_exists(parent_id)")
        keys: list[tuple[str, str]] = []  # (task_id, gsi1sk)
        start = after
        last: dict[str, Any] | None = None
        for _ in range(max_reads):
            request: dict[str, Any] = {
                "TableName": self.table,
                "IndexName": GSI1,
                "KeyConditionExpression": "gsi1pk = :pk",
                "ExpressionAttributeValues": to_values(values),
                "ScanIndexForward": False,
                # one more than needed tells whether another page exists; a filter reads wider
                "Limit": max(limit + 1 - len(keys), 100) if filters else limit + 1 - len(keys),
            }
            if names:
                request["ExpressionAttributeNames"] = names
            if filters:
                request["FilterExpression"] = " AND ".join(filters)
            if start is not None:
                request["ExclusiveStartKey"] = to_item(
                    {"pk": task_pk(start.split("#", 1)[1]), "sk": META, "gsi1pk": pk, "gsi1sk": start}
                )
            resp = self.ddb.query(**request)
            for raw in resp["Items"]:
                item = from_item(raw)
                keys.append((item["pk"].split("#", 1)[1], item["gsi1sk"]))
            last = resp.get("LastEvaluatedKey")
            if len(keys) > limit or last is None:
                break
            start = from_item(last)["gsi1sk"]
        cursor: str | None
        if len(keys) > limit:
            keys = keys[:limit]
            cursor = keys[-1][1]
        elif last is None:
            cursor = None
        else:  # read budget spent: go on from the last index entry evaluated
            cursor = from_item(last)["gsi1sk"]
        tasks = self.get_tasks([task_id for task_id, _ in keys])
        return tasks, cursor

    def load_steps_range(self, task_id: str, first: int, limit: int) -> list[StepRecord]:
        """Up to ``limit`` committed steps from number ``first`` on, in order."""
        resp = self.ddb.query(
            TableName=self.table,
            KeyConditionExpression="pk = :pk AND sk BETWEEN :lo AND :hi",
            ExpressionAttributeValues=to_values({":pk": task_pk(task_id), ":lo": step_sk(max(first, 0)), ":hi": "STEP#999999"}),
            ConsistentRead=True,
            Limit=limit,
        )
        return [self._step_record(task_id, raw) for raw in resp["Items"]]

    def last_step(self, task_id: str) -> StepRecord | None:
        resp = self.ddb.query(
            TableName=self.table,
            KeyConditionExpression="pk = :pk AND begins_with(sk, :prefix)",
            ExpressionAttributeValues=to_values({":pk": task_pk(task_id), ":prefix": "STEP#"}),
            ConsistentRead=True,
            ScanIndexForward=False,
            Limit=1,
        )
        return self._step_record(task_id, resp["Items"][0]) if resp["Items"] else None

    def _step_record(self, task_id: str, raw: dict[str, Any]) -> StepRecord:
        item = from_item(raw)
        body = _STEP_ADAPTER.validate_json(self.payloads.decode(item))
        return StepRecord(task_id=task_id, number=item["number"], epoch=item["epoch"], committed_at=item["committed_at"], body=body)

    def list_approvals(self, task_id: str) -> list[dict[str, Any]]:
        """Every APPROVAL# record of a task (pending and decided)."""
        return [from_item(i) for i in self._query_prefix(task_id, "APPROVAL#")]

    def orphan_records(self, task_id: str) -> list[tuple[int, int, LLMStep]]:
        """Uncommitted LLM calls as (step number they were meant for, epoch, call)."""
        out = []
        for raw in self._query_prefix(task_id, "ORPHAN#"):
            item = from_item(raw)
            out.append((int(item["number"]), int(item["epoch"]), LLMStep.model_validate_json(self.payloads.decode(item))))
        return out

    # ------------------------------------------------------------------- debug

    def raw_items(self, task_id: str) -> list[dict[str, Any]]:
        """Every item of a task as stored (tests and benchmarks measure their sizes)."""
        paginator = self.ddb.get_paginator("query")
        out: list[dict[str, Any]] = []
        for page in paginator.paginate(
            TableName=self.table,
            KeyConditionExpression="pk = :pk",
            ExpressionAttributeValues=to_values({":pk": task_pk(task_id)}),
            ConsistentRead=True,
        ):
            out.extend(page["Items"])
        return out


def request_token(*parts: object) -> str:
    """A TransactWriteItems idempotency token (at most 36 characters) for one logical write."""
    import hashlib

    return hashlib.sha256(":".join(map(str, parts)).encode()).hexdigest()[:36]


def _budget_state(item: dict[str, Any]) -> BudgetState:
    data = from_item(item, keep_decimal=frozenset({"cost_usd"}))
    return BudgetState(
        cap=data["cap"], reserved=data["reserved"], used=data["used"], available=data["available"], cost_usd=data["cost_usd"]
    )


def _is_condition_failure(exc: ClientError) -> bool:
    code = exc.response.get("Error", {}).get("Code", "")
    if code == "ConditionalCheckFailedException":
        return True
    return code == "TransactionCanceledException" and "ConditionalCheckFailed" in _cancellation_codes(exc)


def _cancellation_codes(exc: ClientError) -> list[str]:
    reasons = exc.response.get("CancellationReasons") or []
    if not reasons:
        # Some endpoints only put the reasons in the message: "[None, ConditionalCheckFailed]".
        msg = exc.response.get("Error", {}).get("Message", "")
        if "[" in msg and "]" in msg:
            inner = msg[msg.index("[") + 1 : msg.rindex("]")]
            return [part.strip() for part in inner.split(",")]
        return []
    return [str(r.get("Code", "None")) for r in reasons]


def dumps(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), sort_keys=True, default=str)
