"""A task's items, ``META`` and ``META#SUBMISSION``, and the ``Task`` read back from them: the
base that every part of the ``Tasks`` repository (``storage.tasks``) builds on.

The retention is here too: whichever part ends a task (a transition, a step commit) stamps META's
``expires_at`` with ``expiry``.
"""

from __future__ import annotations

import hashlib
import logging
from decimal import Decimal
from typing import Any

from boto3.dynamodb.conditions import Attr, ConditionBase

from agentq.core.errors import TaskNotFound
from agentq.core.models import RetryState, Task, TaskStatus, TaskSubmission
from agentq.resources import LIVE_SHARDS
from agentq.storage import keys
from agentq.storage.budget_items import lapsed_holds
from agentq.storage.serdes import Payloads
from agentq.storage.table import Item, Put, Table, Update, plain

log = logging.getLogger("agentq.storage")

DEFAULT_TASK_RETENTION_DAYS = 30
DAY_SECONDS = 86_400


def live_keys(task_id: str) -> dict[str, str]:
    """The sparse ``live`` index keys an unfinished task's META carries (``resources.GSI_LIVE``)."""
    shard = int(hashlib.sha256(task_id.encode()).hexdigest()[:8], 16) % LIVE_SHARDS
    return {"live_pk": f"LIVE#{shard}", "live_sk": task_id}


DIGEST = "digest"  # of the submission item: what a write made from a read of it checks


def _digest(stored: str) -> str:
    return hashlib.sha256(stored.encode()).hexdigest()[:16]


def same_submission(read: Item) -> ConditionBase:
    """The condition of a write of the submission made from ``read`` (its item as read: a raise
    of its caps, a move to another version): no other write has replaced it since, so none is
    undone (the writer reads it again and makes its write again). Every write of the item
    records its digest; one stored before digests were has none, and then none may have been
    recorded since."""
    digest = read.get(DIGEST)
    return Attr(DIGEST).eq(digest) if digest is not None else Attr(DIGEST).not_exists()


def read_submission(table: Table, task_id: str) -> tuple[TaskSubmission, Item]:
    """The task's submission and its item as read (for ``same_submission``)."""
    item = table.get(keys.submission_key(task_id))
    if item is None:
        raise TaskNotFound(f"no task {task_id!r}", field="task_id")
    return TaskSubmission.model_validate_json(str(item["submission"])), item


def user_attrs(tenant: str, user: str) -> dict[str, str]:
    """What the META of a task acting for ``user`` carries: its place in the sparse ``user``
    index (``resources.GSI_USER``; its sort key is the tenant listing's ``gsi1sk``). The user
    itself is the submission's (``Task.user``), read with META by every read of a task."""
    return {"user_pk": keys.user_tasks_pk(tenant, user)}


def reopening(now: float) -> Update:
    """What the write that reopens an ended task adds to its META: the next invocation, when it
    started and the token totals it starts from (``Task.invocation``; the count is an ``ADD``, so
    no read of it can be stale). Merged into that write's own update (``Update`` refuses an
    attribute written twice)."""
    return Update(
        set={"invoked_at": Decimal(repr(now))},
        add={"invocation": 1},
        copy_from={"invocation_tokens_in": ("tokens_in", 0), "invocation_tokens_out": ("tokens_out", 0)},
    )


def first_end_writes(task_id: str, meta: Item) -> tuple[Update, list[Put]]:
    """What the write that reopens an ended task (a follow-up, a redrive, a raised budget) adds,
    from META as it read it, when it is the first to: the end it leaves (status, result or its
    S3 pointer, error, when) put as ``FIRSTEND``, and META's ``first_ended_at`` saying it is
    kept, merged into the write's own update. Nothing for a task that is not at an end (an
    interrupted one going on) or left one before. A task served as an MCP task handle answers
    with that end from then on (``first_end``): the extension's terminal states have no way out.
    A large result's pointer stays good: a later end is written by a later claim's epoch, under
    a key of its own (``task_transitions._result_attrs``)."""
    status = TaskStatus(str(meta.get("status")))
    if not status.terminal or meta.get("first_ended_at") is not None:
        return Update(), []
    kept = {k: meta[k] for k in ("result", "result_ref", "error", "finished_at") if meta.get(k) is not None}
    at = meta.get("finished_at") or meta.get("updated_at")
    item = {**keys.item_key(task_id, keys.FIRST_END), "status": status.value, **kept}
    return Update(set_if_absent={"first_ended_at": at}), [Put("first_end", item)]


def merged(update: Update, extra: Update) -> Update:
    return Update(
        set={**update.set, **extra.set},
        add={**update.add, **extra.add},
        remove=[*update.remove, *extra.remove],
        set_if_absent={**update.set_if_absent, **extra.set_if_absent},
        copy_from={**update.copy_from, **extra.copy_from},
    )


def request_token(*parts: object) -> str:
    """A TransactWriteItems idempotency token (at most 36 characters) for one logical write."""
    return hashlib.sha256(":".join(map(str, parts)).encode()).hexdigest()[:36]


class TaskItems:
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
        """The submission as stored, with its digest (``same_submission``)."""
        stored = submission.model_dump_json(exclude_none=True)
        return {**keys.submission_key(task_id), "submission": stored, DIGEST: _digest(stored)}

    def submission_read(self, task_id: str) -> tuple[TaskSubmission, Item]:
        """The task's submission, and its item as read: what a write made from it is conditional
        on (``same_submission``)."""
        return read_submission(self.table, task_id)

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

    def first_end(self, task: Task) -> Task | None:
        """``task`` as it first ended, before a write reopened it (``first_end_writes``); None
        if it never left an end (or left it before the end was kept)."""
        if task.first_ended_at is None:
            return None
        item = self.table.get(keys.item_key(task.task_id, keys.FIRST_END))
        if item is None:
            return None
        data = plain(item)
        result = self.payloads.decode({"ref": data["result_ref"]}) if "result_ref" in data else data.get("result")
        at = data.get("finished_at")
        ended = {"status": TaskStatus(data["status"]), "result": result, "error": data.get("error"), "finished_at": at}
        return task.model_copy(update={**ended, "updated_at": at or task.updated_at})

    def get_many(self, task_ids: list[str], *, skip_unreadable: bool = False) -> list[Task]:
        """Many tasks (BatchGetItem), in the order asked; missing ones are left out, and with
        ``skip_unreadable`` one stored as no code of ours can read (written by hand, by a
        release that wrote what this one refuses) too, named in a warning: a tenant's listing
        must not fail for every task because of one."""
        return [task for task, _ in self.read_many(task_ids, skip_unreadable=skip_unreadable)]

    def read_many(self, task_ids: list[str], *, skip_unreadable: bool = False) -> list[tuple[Task, Item]]:
        """``get_many`` with each task's META item as read, which a write of the task may be
        made from (``transition(read=)``: a stop fences the tasks it read without reading META
        again)."""
        wanted = [k for t in task_ids for k in (keys.meta_key(t), keys.submission_key(t))]
        by_key = {(i["pk"], i["sk"]): i for i in self.table.batch_get(wanted)}
        out = []
        for t in task_ids:
            meta, sub = by_key.get((keys.task_pk(t), keys.META)), by_key.get((keys.task_pk(t), keys.SUBMISSION))
            if meta is None or sub is None:
                continue
            try:
                out.append((self._decode(meta, sub), meta))
            except ValueError:  # pydantic's ValidationError, a JSON error: what the task holds, not the read
                if not skip_unreadable:
                    raise
                log.warning("task %s is stored as no code of this release can read: left out", t)
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
