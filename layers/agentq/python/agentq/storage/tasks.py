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

``Tasks`` is the one repository callers take (``Storage().tasks``); its parts live by
responsibility: the items and reading a task back (``storage.task_items``), leases
(``storage.leases``), transitions, failures and retries (``storage.task_transitions``), and
listings (``storage.task_listing``). This module creates tasks: plain, idempotent, forked.
"""

from __future__ import annotations

import dataclasses
import time
import uuid
from collections.abc import Sequence
from typing import Any

from boto3.dynamodb.conditions import Attr, ConditionBase

from agentq.core.errors import IdempotencyConflict, TaskNotFound
from agentq.core.faults import crash_point
from agentq.core.models import StepRecord, Task, TaskStatus, TaskSubmission, ToolsStep, asks_for_calls
from agentq.core.pricing import NO_MONEY_CAP, micros
from agentq.core.records import IdempotencyRecord
from agentq.core.stops import agent_name
from agentq.core.workspace import Manifest, lookup_of
from agentq.storage import keys
from agentq.storage.budget_items import budget_attrs
from agentq.storage.leases import TaskLeases
from agentq.storage.table import (
    Action,
    ConditionFailed,
    Delete,
    Put,
    TransactionCancelled,
    Update,
    absent,
    chunks,
    plain,
    present,
    status_in,
    transact_through_conflicts,
)
from agentq.storage.task_items import DAY_SECONDS as DAY_SECONDS  # re-exported: callers import the retention from here
from agentq.storage.task_items import DEFAULT_TASK_RETENTION_DAYS as DEFAULT_TASK_RETENTION_DAYS
from agentq.storage.task_items import request_token, user_attrs
from agentq.storage.task_listing import TaskListing
from agentq.storage.task_transitions import TaskTransitions
from agentq.storage.workspaces import WorkspaceObjects

IDEMPOTENCY_TTL_SECONDS = 24 * 3600
# On META: a keyed retry sent the task's message again (``Tasks.mark_resent``).
RESENT = "resent_at"
# A fork's META while its steps and objects are copied (``Tasks.fork``): the token of the fork
# writing it, and the TTL that collects a fork cut short; the copy takes seconds to minutes.
FORK_PENDING = "fork_pending"
FORK_PENDING_SECONDS = 3600


class Tasks(TaskLeases, TaskTransitions, TaskListing):
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
        key_id: str | None = None,
        **extra: Any,
    ) -> tuple[list[Action], Task]:
        """The writes that create a task: META (never over an existing one) with, given
        ``budget``, the task's budget on it (``storage.budgets``), and its submission; and the
        Task they describe."""
        if budget is not None:
            money = submission.constraints.max_cost_usd
            extra = {**budget_attrs(budget, micros(money) if money is not None else NO_MONEY_CAP), **extra}
        if key_id is not None:  # the API key that submitted its root (``agentq stop --key``)
            extra = {"key_id": key_id, **extra}
        # Its agent's name ("": none), which the stop's listing reads (``resources.GSI_TENANT_LIVE``).
        extra = {"agent": agent_name(submission.agent) or "", **extra}
        if submission.user is not None:  # the user a task acts for, and its place in the user's listing
            extra = {**user_attrs(tenant, submission.user), **extra}
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
        key_id: str | None = None,
    ) -> Task:
        """Write META (with the budget, for a root task) and the submission in one transaction.
        ``blocked``: the task waits for its ``depends_on`` (see ``blocked_actions``). ``key_id``:
        the API key that submitted it (its tree is held to the key's caps, ``core.caps``)."""
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
            key_id=key_id,
        )
        if blocked:
            actions, task = self.blocked_actions(actions, task)
        # botocore retries a timed-out transaction; the token makes a retry of one that did
        # go through succeed instead of failing its own attribute_not_exists conditions. One
        # token per call, not per task: botocore's retries resend this call's request, while
        # another call under the same id (a schedule's fire retried after its enqueue failed and
        # the task was deleted again) writes another ``created_at``, which under the same token
        # DynamoDB refuses for ten minutes (IdempotentParameterMismatch), and the fire was lost.
        self.table.transact(actions, token=request_token("create", task_id, uuid.uuid4().hex))
        return task

    def blocked_actions(self, actions: list[Action], task: Task) -> tuple[list[Action], Task]:
        """``actions`` creating ``task`` in ``blocked``, with an edge ``DEPENDENT#<task>`` in each
        dependency's partition (written with the task, before anyone looks at the dependencies:
        a dependency that ends after this write finds the edge; one that ended before is seen by
        the submitter's own look, ``queueing.endings.resolve``)."""
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
        also_matches: Sequence[str] = (),
        ttl_seconds: int = IDEMPOTENCY_TTL_SECONDS,
        blocked: bool = False,
        task_id: str | None = None,
        key_id: str | None = None,
    ) -> tuple[Task, bool]:
        """Create the task unless ``key`` was used before by ``tenant``; returns (task, created).

        The ``IDEMP#tenant#key`` record (the task id and a hash of the request) is written in
        the same transaction as META and the submission, so a key never points at a task that does
        not exist, and two racing requests with one key create one task. A reused key with
        another request hash raises IdempotencyConflict (``also_matches``: other hashes of the same
        request, such as the one an older release bound keys to). A record past its ``expires_at``
        (DynamoDB TTL deletes lazily) counts as absent. ``task_id``: the id a new task takes (one
        its submission was resolved for), else a fresh one.
        """
        chosen = task_id
        for _ in range(3):
            task_id = chosen or keys.new_task_id()  # a cancelled attempt wrote nothing: its id is free
            now = time.time()
            actions, task = self.create_actions(
                task_id, submission, tenant=tenant, root_id=task_id, budget=submission.constraints.max_tokens,
                key_id=key_id,
            )  # fmt: skip
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
            if existing.request_hash not in (request_hash, *also_matches):
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

    def delete_unstarted(
        self,
        task_id: str,
        *,
        idempotency: tuple[str, str] | None = None,
        also: Sequence[Action] = (),
        only_if: ConditionBase | None = None,
        depends_on: Sequence[str] = (),
    ) -> None:
        """Undo a create whose enqueue failed: only while nobody has claimed the task.

        ``idempotency`` (tenant, key) also removes the task's ``IDEMP#`` record, so a retry
        with the same key creates the task anew instead of finding a deleted one. ``also``:
        writes that stand or fall with the deletion (the running slots it gives back), valid
        only while META also meets ``only_if`` (those slots still held as read). ``depends_on``:
        a dependent's (created blocked): its edges in each dependency's partition go with it,
        and only while it is still blocked or queued (one cancelled for a failed dependency has
        ended, and its callback may be out: it stands). A task a keyed retry sent again
        (``mark_resent``) stands too: the retry answered its id. Raises TransactionCancelled when a
        condition fails; a TransactionConflict (the slot items are hot) is tried again, not
        raised at once: raised, the submission would answer an error with the task left half undone.
        """
        condition: ConditionBase = Attr("lease_epoch").eq(0) & Attr(RESENT).not_exists()
        if depends_on:
            condition = condition & status_in([TaskStatus.BLOCKED, TaskStatus.QUEUED])
        actions: list[Action] = [
            Delete("meta", keys.meta_key(task_id), condition if only_if is None else condition & only_if),
            Delete("submission", keys.submission_key(task_id)),
        ]
        if idempotency is not None:
            actions.append(Delete("idempotency", {"pk": keys.idempotency_pk(*idempotency), "sk": keys.META}))
        actions += [
            Delete(f"edge{i}", {"pk": keys.task_pk(dep), "sk": f"{keys.DEPENDENT}{task_id}"})
            for i, dep in enumerate(depends_on)
        ]
        transact_through_conflicts(self.table, [*actions, *also])

    def mark_resent(self, task_id: str) -> bool:
        """A keyed retry that found the task is about to send its message again (the first
        request may have died before its enqueue) and answer its id: marked first, so the first
        request's undo of a failed enqueue (``delete_unstarted``) no longer deletes a task the
        retry's caller holds. False, nothing written, when the task is gone already (undone)."""
        try:
            self.table.update(keys.meta_key(task_id), Update(set={RESENT: int(time.time())}), condition=present())
        except ConditionFailed:
            return False
        return True

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
        """A new root task whose history is ``steps`` of ``source``, copied as they were stored.

        ``steps`` never end on the model's turn asking for tool calls: the fork would make them
        again, unknown to the source's effect records (``control.operations.fork`` names the
        steps to fork at instead; this is its backstop, ARCHITECTURE 3).

        META comes first, as a placeholder (``FORK_PENDING``: no status, no submission, no index
        key, so no read, listing or claim finds a task) carrying the TTL attribute
        (``expires_at``, ``FORK_PENDING_SECONDS`` on): a fork cut short anywhere (a killed
        process, a failed copy) leaves its copied steps and objects under a META that TTL
        deletes, and the reaper purges the rest as it does for any task
        (``control.retention``). The last write replaces the placeholder with the task, only
        while it is this fork's own, so the fork appears whole or not at all. A fork retried
        under the same ``task_id`` takes the placeholder over and copies again (every copy
        is an overwrite of the same key)."""
        if steps and asks_for_calls(steps[-1].body):
            raise ValueError(f"a fork cannot end on step {len(steps)}: its tool calls would be made again")
        task_id = task_id or keys.new_task_id()
        pending = uuid.uuid4().hex
        placeholder = {**keys.meta_key(task_id), "task_id": task_id, FORK_PENDING: pending,
                       "expires_at": int(time.time() + FORK_PENDING_SECONDS)}  # fmt: skip
        self.table.put(placeholder, condition=absent() | Attr(FORK_PENDING).exists())
        llm_steps = sum(1 for s in steps if s.body.kind == "llm")
        originals = {int(i["number"]): i for i in self.table.query(keys.task_pk(source.task_id), prefix=keys.STEP)}
        puts: list[Put] = []
        for record in steps:
            item = dict(originals[record.number])
            item["pk"] = keys.task_pk(task_id)
            # The status the source's commit ended it with is the source's event, not the fork's:
            # copied, the fork's log would show it ended before it ran. The engine ends a fork at a
            # copied answer itself (``core.engine._loop._end_on_copied_answer``).
            for ending in keys.STEP_ENDING:
                item.pop(ending, None)
            if "ref" in item:
                # The fork owns a copy: payloads live under their task's prefix, and the source's
                # go when its retention ends (agentq.control.retention), while the fork may live on.
                key = keys.step_payload_key(task_id, record.number, record.epoch)
                self.payloads.copy(item["ref"], key)
                item["ref"] = key
            puts.append(Put(f"step{record.number}", item))
        for chunk in chunks(puts):
            self.table.transact(chunk)
        crash_point("after_fork_steps")
        # The workspace of every copied step that changed it (core.workspace), copied under the
        # fork's own prefix like the payloads above: every manifest a step names and the content
        # of them all, so a fork of the fork at any of its steps, or after the source's
        # retention, still finds them. The last one is what the fork restores at its first claim.
        # A clone's starting files (``workspace_start``) are step 0's: copied, never cloned again.
        start = source.workspace_start
        refs = [start] if start else []
        refs += [s.body.workspace for s in steps if isinstance(s.body, ToolsStep) and s.body.workspace]
        workspace = refs[-1] if refs else None
        if refs:
            objects = WorkspaceObjects(self.payloads)
            lookup = lookup_of(source.submission.workspace, source.tenant)
            manifests = {r.manifest for r in refs}
            blobs: set[str] = set()
            for digest in manifests:
                blobs |= Manifest.from_bytes(objects.get_manifest(source.task_id, digest, lookup)).blobs()
            objects.copy_states(source.task_id, task_id, manifests, blobs, lookup)
        # The task last, over its placeholder: until then the fork is invisible and expiring.
        actions, task = self.create_actions(
            task_id,
            submission,
            tenant=tenant,
            root_id=task_id,
            budget=submission.constraints.max_tokens,
            forked_from={"task_id": source.task_id, "step": len(steps)},
            key_id=source.key_id,
        )
        meta = actions[0]
        assert isinstance(meta, Put)
        compacted_at = max((s.number for s in steps if s.body.kind == "compact"), default=0)
        counters: dict[str, Any] = {"step": len(steps), "llm_steps": llm_steps, "compacted_at": compacted_at}
        meta.item.update(counters)
        if workspace is not None:
            meta.item["workspace"] = workspace.model_dump()
            counters["workspace"] = workspace
        if start is not None:
            meta.item["workspace_start"] = start.model_dump()
            counters["workspace_start"] = start
        actions[0] = dataclasses.replace(meta, condition=Attr(FORK_PENDING).eq(pending))
        try:
            self.table.transact(actions)
        except TransactionCancelled as exc:
            if exc.failed != {"meta"}:
                raise
            raise RuntimeError(
                f"fork {task_id}: its placeholder expired or was taken over by another fork of that id before "
                "the copy finished; nothing of this one is visible, and what it copied goes with the placeholder"
            ) from exc
        return task.model_copy(update=counters)
