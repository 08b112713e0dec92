"""Turning a caller's request into a queued task, or into a precise error that wrote nothing."""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from pydantic_core import to_jsonable_python

from agentq import observe
from agentq.control.agents import resolve_agent
from agentq.control.defaults import Defaults
from agentq.control.memory import check_attachments
from agentq.control.operations import cancel

# Re-exported: the package root (agentq.parse_submission), the benches and tests import them from here.
from agentq.control.validation import check_submission as check_submission
from agentq.control.validation import parse_submission as parse_submission
from agentq.control.workspaces import check_workspace
from agentq.core.endusers import UserMayNot
from agentq.core.errors import IdempotencyConflict, TaskNotFound, ValidationError
from agentq.core.models import SET_BY_AGENTQ, Task, TaskStatus, TaskSubmission
from agentq.core.stops import check_open
from agentq.core.tools import ToolRegistry
from agentq.queueing.endings import task_ended
from agentq.queueing.fairness import FairShare
from agentq.queueing.queues import TaskQueues
from agentq.storage.container import Storage
from agentq.storage.keys import new_task_id
from agentq.storage.table import TransactionCancelled

log = logging.getLogger("agentq.submit")


def submit(store: Storage, tools: ToolRegistry, raw: Any, *, tenant: str, queues: TaskQueues | None = None) -> Task:
    """Validate fully, create the task (META with its budget, and the submission: one transaction), then enqueue it.

    If the enqueue fails the task is deleted again, so a caller who sees an error never
    leaves a queued task that no message will ever run; a dependent too, whose enqueue is its
    look at dependencies that already succeeded (``_undo_dependent``).
    """
    return submit_once(store, tools, raw, tenant=tenant, queues=queues).task


@dataclass(frozen=True)
class Submitted:
    task: Task
    created: bool  # False: an earlier request with the same idempotency key created it


def request_hash(submission: TaskSubmission) -> str:
    """What an idempotency key is bound to: the request as sent (before deployment defaults
    fill it in), so a retry matches even if the defaults changed in between. Canonical: a dict
    field's keys sorted (JSON objects are unordered) and each number by its value (``1`` and
    ``1.0`` are one JSON number), so a retry serialised by another encoder matches."""
    data = submission.model_dump(mode="python", exclude_none=True, exclude=None if submission.memory else {"memory"})
    body = json.dumps(_canonical(data), sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(body.encode()).hexdigest()


def legacy_request_hash(submission: TaskSubmission) -> str:
    """The hash keys were bound to before ``request_hash`` was canonical (the dump as parsed):
    a retry across the upgrade still matches a record written by the old code; records live
    24 hours (``storage.tasks.IDEMPOTENCY_TTL_SECONDS``), so this can go a day after."""
    # Without memory stores, the hash a request had before submissions could attach any.
    body = submission.model_dump_json(exclude_none=True, exclude=None if submission.memory else {"memory"})
    return hashlib.sha256(body.encode()).hexdigest()


def request_hashes(submission: TaskSubmission) -> tuple[str, ...]:
    """The hashes a key's record may hold for this request: the one written first."""
    return request_hash(submission), legacy_request_hash(submission)


def _canonical(value: Any) -> Any:
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, (int, float, Decimal)):
        number = Decimal(str(value)) if isinstance(value, float) else Decimal(value)
        if number.is_finite() and number == number.to_integral_value():
            return int(number)
        return float(number)
    if isinstance(value, dict):
        return {str(k): _canonical(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_canonical(v) for v in value]
    return _canonical(to_jsonable_python(value))


def prepare_submission(
    store: Storage,
    tools: ToolRegistry,
    submission: TaskSubmission,
    *,
    tenant: str,
    defaults: Defaults | None = None,
    task_id: str | None = None,
    only_user: str | None = None,
) -> TaskSubmission:
    """The submission as it will run, fully checked, nothing written: its agent version
    resolved (an alias's split keyed by ``task_id`` when the task has no user), the deployment's
    defaults filled in, tools, model, script, callback URL and dependencies checked
    (``submit_once``; a schedule's template is checked the same way). ``only_user``: the caller
    acts as that end user (a token's), so its dependencies must be that user's tasks, and a
    timeout it sets never approves (``check_user_approvals``)."""
    for name, why in SET_BY_AGENTQ.items():
        if getattr(submission, name) is not None:
            raise ValidationError(f"{name}: {why}; a submission cannot send it", field=name)
    if submission.agent is None and submission.mcp_tools:
        raise ValidationError(
            "mcp_tools: set from an agent version's mcp_servers; create an agent that names the server",
            field="mcp_tools",
        )
    if submission.agent is None and submission.remote_agents:
        raise ValidationError(
            "remote_agents: set from an agent version's remote_agents; create an agent that names them",
            field="remote_agents",
        )
    sent = submission.constraints.model_fields_set if "constraints" in submission.model_fields_set else set()
    if submission.agent is not None:
        submission = resolve_agent(store, submission, tenant=tenant, task_id=task_id)
    if only_user is not None:
        check_user_approvals(submission, sent)
    if defaults is not None:
        submission = defaults.apply(submission)
    check_submission(submission, tools)
    quota = defaults.workspace_quota() if defaults is not None else None
    check_workspace(store, submission.workspace, tenant=tenant, quota=quota)
    if submission.memory:
        check_attachments(store, submission.memory, tenant=tenant)
    if submission.depends_on:
        from agentq.queueing.dependencies import check_dependencies

        check_dependencies(store, submission, tenant=tenant, only_user=only_user)
    return submission


def check_user_approvals(submission: TaskSubmission, sent: set[str]) -> None:
    """A token's ``approval_timeout_seconds`` (``sent``: the constraints it set) under an
    ``approval_default`` of ``approve`` its agent (the tenant) chose: the timer would approve held
    calls only the tenant decides at the moment the user picked, a second after the pause if it
    likes, leaving the operator no time to look (``UserMayNot``, 403 naming the field). The
    tenant's own timeout with its own default stands; a token's timeout with ``reject`` too."""
    if "approval_timeout_seconds" in sent and submission.constraints.approval_default == "approve":
        raise UserMayNot(
            "constraints.approval_timeout_seconds: this task's agent makes a timed-out approval approve, and a "
            "user's token may not set when that happens: the timeout would decide held calls only the tenant decides "
            "(a policy rule's ask, an ask_tenant tool, a cap's soft threshold) at a time the user picked; leave it "
            "out (the agent's applies), or send approval_default: reject with it",
            field="constraints.approval_timeout_seconds",
        )


def submit_once(
    store: Storage,
    tools: ToolRegistry,
    raw: Any,
    *,
    tenant: str,
    queues: TaskQueues | None = None,
    idempotency_key: str | None = None,
    digest: str | tuple[str, ...] | None = None,
    defaults: Defaults | None = None,
    task_id: str | None = None,
    key_id: str | None = None,
    only_user: str | None = None,
    legacy_keys: tuple[str, ...] = (),
) -> Submitted:
    """``submit`` with an optional idempotency key: the same key and request return the task
    the first one created (``created=False``); the same key with another request raises
    IdempotencyConflict. Shared by the HTTP API, the CLI and the Python client's server side.

    A submission naming an agent is resolved to the agent's version first (``control.agents``),
    then ``defaults`` (the deployment's) fill what neither sets. An idempotency key is bound to
    the request as sent (``digest``: the first written to its record, any matching one found;
    else its hashes before either, ``request_hashes``), so a retry matches even
    after a new agent version or new defaults. ``task_id``: the id to create it under (a
    schedule's fire). ``key_id``: the API key the request came with (its tasks carry it, and its
    tree spends against that key's caps: ``core.caps``). ``only_user``: the user a caller bound
    to one (a token's) acts as; None for a tenant key (``prepare_submission``).

    ``legacy_keys``: what the key was scoped as by the previous release (``user_scoped_key``),
    looked up when the key has no record: a record found there whose request and user match is
    this request's (records live 24 hours, so these can go a day after the upgrade).

    A submission in a stopped scope (its tenant, user, agent or key: ``core.stops``) is refused
    with ``ScopeStopped`` before anything is written.
    """
    submission = raw if isinstance(raw, TaskSubmission) else parse_submission(raw)
    digests = (digest,) if isinstance(digest, str) else digest or request_hashes(submission)
    if idempotency_key is not None:
        # Looked up before the request is resolved and checked again: a retry of a request that
        # made its task returns it though its alias, agent or scope changed since.
        found = _found(store, queues, tenant=tenant, key=idempotency_key, digests=digests)
        for legacy in legacy_keys if found is None else ():
            found = _found_legacy(store, queues, tenant=tenant, key=legacy, digests=digests, user=submission.user)
            if found is not None:
                break
        if found is not None:
            return found
    task_id = task_id or new_task_id()  # chosen first: an alias's split may be keyed by it
    submission = prepare_submission(
        store, tools, submission, tenant=tenant, defaults=defaults, task_id=task_id, only_user=only_user
    )
    check_open(store.stops.list(tenant), user=submission.user, agent=submission.agent, key_id=key_id)
    blocked = bool(submission.depends_on)
    if idempotency_key is None:
        task = store.tasks.create(submission, tenant=tenant, blocked=blocked, task_id=task_id, key_id=key_id)
    else:
        task, created = store.tasks.create_idempotent(
            submission,
            tenant=tenant,
            key=idempotency_key,
            request_hash=digests[0],
            also_matches=digests[1:],
            blocked=blocked,
            task_id=task_id,
            key_id=key_id,
        )
        if not created:  # a request with the same key made it since our look
            replayed = _replay(store, queues, task, tenant=tenant)
            if replayed is None:
                raise RuntimeError(f"idempotency key {idempotency_key!r}: its task was undone meanwhile; retry")
            return replayed
    created = True
    observe.task_status_changed(task.task_id, tenant, task.status.value)
    if blocked:  # no message until its dependencies allow: they may have ended already
        from agentq.queueing.endings import resolve

        try:
            resolve(store, queues, task.task_id)
        except Exception:
            if _undo_dependent(store, task, tenant=tenant, idempotency_key=idempotency_key):
                raise
        return Submitted(store.tasks.get(task.task_id), created)
    if queues is None:
        return Submitted(task, created)
    # Admitted here, a task of a tenant at its running limit never enters the queue: it waits
    # on the tenant's list, and a burst of one tenant's submissions never stands in front of
    # another's tasks (its sub-agents' messages do, locally: ARCHITECTURE 12, "Waiting").
    fair = FairShare(
        store,
        queues,
        default_limit=defaults.tenant_max_running if defaults else None,
        fleet_capacity=defaults.fleet_capacity if defaults else None,
        cancel=cancel,
        tier_limits=defaults.tier_limits() if defaults else None,
    )
    try:  # a raise here (a throttled read of the slots) is undone as a failed send is
        gate = fair.admit(task, submission.priority)
    except Exception:
        if _undo_created(store, task, tenant=tenant, idempotency_key=idempotency_key):
            raise
        return Submitted(store.tasks.get(task.task_id), created)
    if gate.skipped:  # its key's skip ended it: reported as any end (no parent knows it yet), answered as it is now
        task = store.tasks.get(task.task_id)
        task_ended(store, queues, task, TaskStatus.CANCELLED)
    if gate.waits is not None:
        return Submitted(task, created)
    # Admitted, or neither admitted nor parked (``gate.keep``): then its message is sent
    # unadmitted, and the dispatcher admits it on delivery.
    try:  # a task with a workspace goes to the pool whose hosts run its sandbox (queueing.queues)
        queues.send(task.task_id, submission.priority, tenant=tenant, pool=queues.pool_for(submission))
    except Exception:
        if _undo_created(store, task, tenant=tenant, idempotency_key=idempotency_key):
            raise
        return Submitted(store.tasks.get(task.task_id), created)
    return Submitted(task, created)


def _found(
    store: Storage, queues: TaskQueues | None, *, tenant: str, key: str, digests: tuple[str, ...]
) -> Submitted | None:
    """The task an earlier request with ``key`` made (``_replay``d), or None when the key is new
    (or its task was undone): then the request goes on as a new one. The key with another
    request: IdempotencyConflict."""
    record = store.tasks.idempotency(tenant, key)
    if record is None:
        return None
    if record.request_hash not in digests:
        raise IdempotencyConflict(
            "this Idempotency-Key was already used with a different request body", field="Idempotency-Key"
        )
    try:
        task = store.tasks.get(record.task_id)
    except TaskNotFound:
        return None  # its create was undone (its enqueue failed), the record with it
    return _replay(store, queues, task, tenant=tenant)


def _found_legacy(
    store: Storage, queues: TaskQueues | None, *, tenant: str, key: str, digests: tuple[str, ...], user: str | None
) -> Submitted | None:
    """A record under the key's previous scope, only if it is this request's (its hash and its
    task's user match): never a conflict, since another caller's key may be scoped as that now."""
    record = store.tasks.idempotency(tenant, key)
    if record is None or record.request_hash not in digests:
        return None
    try:
        task = store.tasks.get(record.task_id)
    except TaskNotFound:
        return None
    return _replay(store, queues, task, tenant=tenant) if task.submission.user == user else None


def user_scoped_key(user: str, key: str) -> tuple[str, tuple[str, ...]]:
    """An end user's Idempotency-Key as its record is named, with what the previous release
    named it (for ``submit_once``'s ``legacy_keys``). A space joins them: the key's pattern
    (visible ASCII) excludes it, so no tenant key (unscoped) is ever a user's; the previous
    ``#`` let a tenant's "alice#k" be alice's "k"."""
    return f"{user} {key}", (f"{user}#{key}",)


def _replay(store: Storage, queues: TaskQueues | None, task: Task, *, tenant: str) -> Submitted | None:
    """A retry's answer for the task its key's first request made. That request may have died
    before its dependencies' look or its enqueue: the look is made again, and a queued task
    nobody claimed is sent again (a duplicate message is harmless), marked first
    (``mark_resent``) so the first request's undo of an enqueue that fails now leaves the task
    this retry answers standing. None when the task was undone before the mark."""
    moved: TaskStatus | None = None
    if task.submission.depends_on:
        from agentq.queueing.endings import resolve

        moved = resolve(store, queues, task.task_id)
        task = store.tasks.get(task.task_id)
    # (a dependent the look just queued was sent by the look)
    if (
        queues is not None
        and task.status is TaskStatus.QUEUED
        and task.lease_epoch == 0
        and moved is not TaskStatus.QUEUED
    ):
        if not store.tasks.mark_resent(task.task_id):
            return None
        queues.send(task.task_id, task.submission.priority, tenant=tenant, pool=queues.pool_for(task.submission))
    return Submitted(task, False)


def _undo_created(store: Storage, task: Task, *, tenant: str, idempotency_key: str | None) -> bool:
    """A created task's admission or enqueue raised: delete it with the slots it holds and its
    idempotency key's record, so the caller's error means nothing was made (TASKS.md). True when
    undone; False when it stands (then the caller answers it as made).

    The task and its slots go in one transaction, only while nobody claimed it and its slots
    are as read: a send that raised although SQS took the message may already be running it (it
    keeps its slots; its end gives them back), or a worker may have admitted or released it
    meanwhile. Whatever the gate said (or if it raised half way) the slots are read again here: a
    task it found needing no slot may have been admitted meanwhile by a worker holding the
    message (an override set since), and must not be deleted with the slots it took."""
    give_back = store.slots.give_back(task.task_id)
    try:
        store.tasks.delete_unstarted(
            task.task_id,
            idempotency=(tenant, idempotency_key) if idempotency_key else None,
            also=give_back.actions,
            only_if=give_back.condition,
        )
    except TransactionCancelled:
        log.warning("task %s: its admission or enqueue raised, but it moved on meanwhile: it stands", task.task_id)
        return False
    return True


def _undo_dependent(store: Storage, task: Task, *, tenant: str, idempotency_key: str | None) -> bool:
    """A dependent's look at its dependencies raised (its send, when they had all succeeded and
    it was queued; or a read): undo its submission as a plain task's whose enqueue failed is
    undone, with its edges and its idempotency key's record, so the caller's error means
    nothing was made and any retry (with the key or without) makes it once. True when undone;
    False when it stands, answered as it is: a worker took it (the send that raised reached SQS,
    or a dependency's ender queued and sent it meanwhile), or it ended (cancelled for a failed
    dependency, an ending whose callback may be out). Returning it then is right: it is made,
    and will run or has ended."""
    try:
        store.tasks.delete_unstarted(
            task.task_id,
            idempotency=(tenant, idempotency_key) if idempotency_key else None,
            depends_on=task.submission.depends_on,
        )
    except TransactionCancelled:
        log.warning("task %s: its dependencies' look raised, but it moved on meanwhile: it stands", task.task_id)
        return False
    return True
