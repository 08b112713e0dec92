"""Finding tasks: a tenant's, newest first (the ``gsi1`` index), one of its users' (the sparse
``user`` index), the unfinished ones (the sparse ``live`` index, which the sweeper walks), and
one tenant's unfinished ones (the sparse ``tenant_live`` index, which a stop reads)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from boto3.dynamodb.conditions import Attr, ConditionBase

from agentq.core.errors import LeaseLost
from agentq.core.models import Lease, Task, TaskStatus
from agentq.core.status import SWEPT_AT
from agentq.resources import GSI1, GSI_LIVE, GSI_TENANT_LIVE, GSI_USER, LIVE_ATTRIBUTES, LIVE_SHARDS
from agentq.storage import keys
from agentq.storage.leases import refused
from agentq.storage.table import ConditionFailed, Item, Update, fence_holds, plain, present, status_in
from agentq.storage.task_items import TaskItems

# The Limit of a Query of ``tenant_live``: above what DynamoDB's 1 MB page holds of the
# smallest entries (103 bytes: a one-letter tenant, no user, key, parent or agent), so a page
# ends at 1 MB, never at the Limit: ~3,000 entries of the largest (64-character tenant and
# agent names, every scope and a parent: 341 bytes), ~4,500 of typical ones. So a stop lists
# one Query a 3,000 tasks and more; on the local stack (no 1 MB cut) one Query up to 20,000.
TENANT_LIVE_PAGE = 20_000


class TaskListing(TaskItems):
    def list_for_tenant(
        self,
        tenant: str,
        *,
        limit: int,
        after: str | None = None,
        status: TaskStatus | None = None,
        roots_only: bool = True,
        max_reads: int = 5,
        user: str | None = None,
    ) -> tuple[list[Task], str | None]:
        """A page of ``tenant``'s tasks, newest first, from the ``gsi1`` index (with ``user``: of
        the tasks acting for that user, from the sparse ``user`` index, under the same sort key).

        ``after`` is the ``gsi1sk`` of the last task of the previous page. Filters are applied
        on the index (status and parent_id are projected), then the page's tasks are read in
        one BatchGetItem. Returns the tasks and the ``gsi1sk`` to continue after, or None at
        the end. With a filter, a page may hold fewer than ``limit`` tasks although more follow:
        at most ``max_reads`` index queries are made per call.
        """
        index, pk_name = (GSI1, "gsi1pk") if user is None else (GSI_USER, "user_pk")
        pk = keys.tenant_pk(tenant) if user is None else keys.user_tasks_pk(tenant, user)
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
                index,
                (pk_name, pk),
                descending=True,
                limit=max(wanted, 100) if filter_ is not None else wanted,  # a filter reads wider
                filter=filter_,
                start=(
                    {**keys.meta_key(start.split("#", 1)[1]), pk_name: pk, "gsi1sk": start}
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
        return self.get_many([task_id for task_id, _ in found], skip_unreadable=True), cursor

    def live_task_ids(self, page_size: int = 500, shards: Iterable[int] = range(LIVE_SHARDS)) -> Iterator[str]:
        """Every task in the sparse ``live`` index: the unfinished ones (and a few just finished,
        as the index is eventually consistent). ``shards``: only those (a caller reading them at once)."""
        for shard in shards:
            start: Item | None = None
            while True:
                page = self.table.query_index(
                    GSI_LIVE, ("live_pk", f"LIVE#{shard}"), descending=False, limit=page_size, start=start
                )
                yield from (str(i["live_sk"]) for i in page.items)
                if page.last_key is None:
                    break
                start = page.last_key

    def unfinished_of_tenant(self, tenant: str, page_size: int = TENANT_LIVE_PAGE) -> list[dict[str, Any]]:
        """Every unfinished task of ``tenant`` (and a few just finished: the index is eventually
        consistent), from the sparse ``tenant_live`` index, as its entry there: ``task_id`` and
        what names its scopes, those it has: ``parent_id``, ``user_pk``, ``key_id``, ``agent``
        (its agent's name, "" for none; absent on a task created before META carried it). One
        Query a 1 MB page (``TENANT_LIVE_PAGE``): the index holds the tenant's unfinished tasks only."""
        entries: list[dict[str, Any]] = []
        start: Item | None = None
        while True:
            page = self.table.query_index(
                GSI_TENANT_LIVE, ("gsi1pk", keys.tenant_pk(tenant)), descending=False, limit=page_size, start=start
            )
            for item in page.items:
                entry = {k: item[k] for k in ("parent_id", "user_pk", "key_id", "agent") if item.get(k) is not None}
                entries.append({"task_id": str(item["live_sk"]), **entry})
            if page.last_key is None:
                return entries
            start = page.last_key

    def metas(self, task_ids: list[str]) -> list[dict[str, Any]]:
        """The META attributes of many tasks (BatchGetItem, no submissions), as plain values."""
        return [plain(i) for i in self.table.batch_get([keys.meta_key(t) for t in task_ids])]

    def fenced_out(self, leases: Sequence[Lease]) -> dict[str, LeaseLost]:
        """Those of ``leases`` whose task no longer runs under them (``table.fence_holds``: a
        stop's mark, a status but ``running``, another epoch, gone), each with the ``LeaseLost``
        a fenced write would have raised (``leases.refused``): what a worker's heartbeat looks
        for while a task's shell may reach the network (``queueing.heartbeat``), without a write.
        Their METAs in one strongly consistent BatchGetItem a 100 tasks."""
        found = {str(i["task_id"]): i for i in self.table.batch_get([keys.meta_key(le.task_id) for le in leases])}
        return {
            le.task_id: refused(le, found.get(le.task_id))
            for le in leases
            if not fence_holds(found.get(le.task_id), le)
        }

    def unlist(self, task_id: str) -> None:
        """Take an ended task out of the ``live`` index (one whose end did not, e.g. written
        before the index existed); only while it is terminal."""
        ended = [s for s in TaskStatus if s.terminal]
        with contextlib.suppress(ConditionFailed):
            self.table.update(keys.meta_key(task_id), Update(remove=LIVE_ATTRIBUTES), condition=status_in(ended))

    def mark_swept(self, task_id: str, at: float, *, after: float | None) -> bool:
        """Note that the sweeper re-enqueues the stranded ``task_id`` now (``SWEPT_AT``: ``at``),
        before its ``swept`` message is sent: a compare-and-set from ``after``, the value the
        sweep listed (None: it had none), so of two sweeps that listed the task only one sends,
        and the next sweep counts its silence from ``at``. False, and nothing written, when the
        task is no longer queued or running, or another sweep marked it since the listing."""
        read = Attr(SWEPT_AT).not_exists() if after is None else Attr(SWEPT_AT).eq(after)
        strandable = status_in([TaskStatus.QUEUED, TaskStatus.RUNNING])
        try:
            self.table.update(
                keys.meta_key(task_id), Update(set={SWEPT_AT: at}), condition=present() & strandable & read
            )
        except ConditionFailed:
            return False
        return True
