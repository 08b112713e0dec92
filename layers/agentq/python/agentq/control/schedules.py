"""Schedules: create, list, delete, and fire (``core.schedules`` has the expressions).

In AWS (``AGENTQ_SCHEDULER_GROUP`` set) creating a schedule also creates an EventBridge
Scheduler schedule in the stack's group, whose target is the normal tier queue with a
``schedule`` message (the fire time filled in by the Scheduler), sent with the stack's
scheduler role: the executor that receives it fires. With ``AGENTQ_SCHEDULE_DLQ_ARN`` set, a
fire the Scheduler could not send past its retries goes to that queue (its dead-letter config). In ``agentq dev`` a thread calls
``fire_due`` every second instead (a fire it moved past but did not finish is fired on a later
tick: ``pending_fire``). Either way a fire is ``fire``: a fire time held up past the next is
fired as the latest due (a backlog makes one task), then the overlap policy, then one task per
fire time (its id derived from it), enqueued.

A fire whose stored submission is refused (its agent, alias, workspace or memory store deleted
since, a tool no longer registered, a field that no longer validates) is counted on the schedule
as ``failed`` with ``last_error`` (``GET /schedules``, ``agentq schedules``), and raised: the
executor dead-letters its message with the reason, the local ticker goes on with the other
schedules. The schedule stays: its next fire is tried again, and submits once its owner fixes the
cause (re-creating what it names) or replaces or deletes it; a fire that submits clears the error.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time
from typing import Any

from agentq.control.submit import prepare_submission, submit_once
from agentq.control.validation import parse_submission, validate_body
from agentq.core.errors import DETERMINISTIC_FAULTS, AgentqError, ValidationError, fault_error
from agentq.core.models import Task, TaskStatus
from agentq.core.schedules import ScheduleSpec, fire_task_id, last_fire, next_fire
from agentq.core.stops import ScopeStopped
from agentq.core.tools import ToolRegistry
from agentq.queueing.queues import TaskQueues
from agentq.storage.container import Storage
from agentq.storage.schedules import Schedule

log = logging.getLogger("agentq.schedules")
# What a fire's submission raises when the stored submission is refused: our own refusals (as
# POST /tasks answers them, 4xx) and the faults another delivery would meet again. A network or
# throttling fault is neither: it propagates and the fire's message comes back.
REFUSED: tuple[type[Exception], ...] = (AgentqError, *DETERMINISTIC_FAULTS)
# A claim whose task is not made yet is in flight this long: a fire killed after claiming holds
# the schedule's next fires off no longer than this (the longest a Lambda runs), and its own
# redelivery, claiming again, still makes it.
CLAIM_SECONDS = 900.0
CLAIM_TRIES = 5  # claims lost to other fires before this fire gives up (its message comes back)


def create_schedule(store: Storage, tools: ToolRegistry, raw: Any, *, tenant: str) -> Schedule:
    """Validate fully (the expression; the submission as POST /tasks would), in AWS create (or
    update) its Scheduler schedule, then store it. A bad field is a ValidationError naming it;
    nothing is written.

    The Scheduler goes first: an expression it refuses that ``core.schedules`` took (its
    ValidationException) is a ValidationError naming ``expression``, and any refusal or
    outage there leaves nothing stored, where a schedule stored first stayed listed with a
    next fire that never came. A store that fails after a new Scheduler schedule was made
    takes that back (best effort: one left fires a schedule that is gone, which makes nothing)."""
    spec = validate_body(ScheduleSpec, raw, what="a schedule")
    try:
        prepare_submission(store, tools, parse_submission(spec.submission), tenant=tenant)
    except AgentqError as exc:
        field = f"submission.{exc.field}" if exc.field and exc.field != "body" else "submission"
        raise ValidationError(f"submission: {exc.message}", field=field) from None
    group = os.environ.get("AGENTQ_SCHEDULER_GROUP")
    made = _aws_schedule(group, tenant, spec) if group else False
    try:
        return store.schedules.put(tenant, spec, next_fire(spec.expression, time.time()))
    except Exception:
        if group and made:
            with contextlib.suppress(Exception):  # the store's error is the one to answer with
                _aws_delete(group, tenant, spec.name)
        raise


def delete_schedule(store: Storage, *, tenant: str, name: str) -> None:
    """Delete the Scheduler schedule first, then the stored one: a failure between the two
    leaves the schedule listed (a DELETE again finishes it), never a Scheduler schedule firing
    for one that no DELETE can reach."""
    group = os.environ.get("AGENTQ_SCHEDULER_GROUP")
    if group:
        _aws_delete(group, tenant, name)
    store.schedules.delete(tenant, name)


def _aws_delete(group: str, tenant: str, name: str) -> None:
    import boto3

    client = boto3.client("scheduler")
    with contextlib.suppress(client.exceptions.ResourceNotFoundException):  # never made, or gone
        client.delete_schedule(Name=_aws_name(tenant, name), GroupName=group)


def _aws_name(tenant: str, name: str) -> str:
    """The Scheduler schedule's name: unique per tenant and name, within the Scheduler's 64
    characters. A name of up to 51 characters keeps the form schedules were first made under
    (``<name>-<12 hex of the tenant>``), so those are still found to replace and delete. A
    longer one (up to 64, ``core.schedules.NAME_PATTERN``) keeps its first 39 characters and
    adds 24 hex of tenant and name: a tenant chooses the name, so the digest must be too long
    to search for one that lands on another tenant's schedule. The two forms never meet: the
    first's 64-character names have '-' where the second has a hex digit."""
    import hashlib

    if len(name) <= 51:
        return f"{name}-{hashlib.sha256(tenant.encode()).hexdigest()[:12]}"
    return f"{name[:39]}-{hashlib.sha256(f'{tenant}#{name}'.encode()).hexdigest()[:24]}"


def _aws_schedule(group: str, tenant: str, spec: ScheduleSpec) -> bool:
    """Create the Scheduler schedule, or update the one there: True when it was created."""
    import boto3

    message = {"task_id": f"schedule:{tenant}#{spec.name}"[:128], "kind": "schedule", "schedule": f"{tenant}#{spec.name}",
               "scheduled_time": "<aws.scheduler.scheduled-time>"}  # fmt: skip
    target: dict[str, Any] = {"Arn": os.environ["AGENTQ_SCHEDULE_TARGET_ARN"],
                              "RoleArn": os.environ["AGENTQ_SCHEDULER_ROLE_ARN"], "Input": json.dumps(message)}  # fmt: skip
    # A fire the Scheduler could not send (the queue unreachable past its retries, the role
    # refused) lands there with the reason, instead of being dropped unseen.
    if dlq := os.environ.get("AGENTQ_SCHEDULE_DLQ_ARN"):
        target["DeadLetterConfig"] = {"Arn": dlq}
    client = boto3.client("scheduler")
    kwargs = {"Name": _aws_name(tenant, spec.name), "GroupName": group, "ScheduleExpression": spec.expression,
              "FlexibleTimeWindow": {"Mode": "OFF"}, "Target": target}  # fmt: skip
    try:
        try:
            client.create_schedule(**kwargs)
        except client.exceptions.ConflictException:
            client.update_schedule(**kwargs)
            return False
    except client.exceptions.ValidationException as exc:
        refusal = str(exc.response.get("Error", {}).get("Message", ""))
        if "expression" not in refusal.lower():
            raise  # nothing the caller sent: the deployment's (its target, its role)
        raise ValidationError(
            f"expression: EventBridge Scheduler refuses it: {refusal[:300]}", field="expression"
        ) from None
    return True


def fire(
    store: Storage,
    tools: ToolRegistry,
    queues: TaskQueues | None,
    *,
    tenant: str,
    name: str,
    fire_time: float,
    now: float | None = None,
) -> str | None:
    """One fire of a schedule: the task it created (or had created: a repeated delivery), or
    None when the overlap policy skipped it (or the schedule is gone). A refused submission
    (``REFUSED``) is counted as a failed fire on the schedule, then raised.

    A fire time that a later one has followed by ``now`` (the fire held up: executors down, a
    backlog in the queue) fires as the latest fire time due (``core.schedules.last_fire``):
    however many of a backlog's fires arrive, they make one task, as the local ticker makes
    one for the fire times it missed (``fire_due``), and a queue that lags behind steadily
    still fires once a period.

    With overlap ``skip`` the fire claims the schedule before it submits (``Schedules.claim``:
    ``last_task_id`` set to its task's id, on condition no other fire claimed since it read
    it), so two fires at once (a backlog, two executors) make one task, and a fire killed
    after submitting has its task counted as the previous one all the same. A claim whose task
    is not made is in flight for ``CLAIM_SECONDS``; a fire that made no task puts the claim
    back (``Schedules.release``)."""
    schedule = _get(store, tenant, name)
    if schedule is None:
        return None
    try:
        fire_time = _coalesced(schedule, fire_time, time.time() if now is None else now)
        following = next_fire(schedule.spec.expression, fire_time)
    except ValueError as exc:
        _unreadable(store, schedule, exc)
        return None
    if following > schedule.next_fire_at:
        store.schedules.move_on(tenant, name, following)  # in AWS no ticker moves it
    task_id = fire_task_id(tenant, name, fire_time)
    for _ in range(CLAIM_TRIES):
        if schedule is None or schedule.last_skipped_slot == fire_time:
            return None  # gone, or this fire was skipped already (a repeated delivery): skipped again
        made = store.tasks.get_many([task_id])
        if made:  # this fire already made its task: a repeated delivery
            return _made(store, queues, schedule, made[0], fire_time)
        if schedule.spec.overlap == "allow":
            break
        if schedule.last_task_id != task_id and _in_flight(store, schedule):
            store.schedules.record_skip(tenant, name, fire_time)
            log.info("schedule %s/%s skipped a fire: task %s is still live", tenant, name, schedule.last_task_id)
            return None
        if store.schedules.claim(schedule, task_id, at=time.time()):
            break
        schedule = _get(store, tenant, name)  # another fire claimed it meanwhile: look again
    else:
        raise RuntimeError(f"schedule {tenant}/{name}: its claim kept changing under {CLAIM_TRIES} fires")
    try:
        submitted = submit_once(store, tools, schedule.spec.submission, tenant=tenant, queues=queues, task_id=task_id)
    except ScopeStopped as stopped:  # counted as a skipped fire: the schedule fires again once resumed
        _release(store, schedule, task_id)
        store.schedules.record_skip(tenant, name, fire_time)
        log.info("schedule %s/%s skipped a fire: %s", tenant, name, stopped.message)
        return None
    except REFUSED as exc:
        _release(store, schedule, task_id)
        error = fault_error(exc)["message"]
        store.schedules.record_failure(tenant, name, error)
        log.warning("schedule %s/%s: its submission was refused, no task: %s", tenant, name, error)
        raise
    except Exception:  # an outage: the fire is tried again (its message comes back, the next tick)
        with contextlib.suppress(Exception):  # the original error is the one to see; the claim lapses anyway
            _release(store, schedule, task_id)
        raise
    store.schedules.record_fire(tenant, name, fire_time, task_id=task_id if schedule.spec.overlap == "allow" else None)
    log.info("schedule %s/%s fired: task %s", tenant, name, submitted.task.task_id)
    return submitted.task.task_id


UNREADABLE_RETRY_SECONDS = 86_400.0  # the local ticker counts such a schedule failed once a day


def _unreadable(store: Storage, schedule: Schedule, exc: ValueError) -> None:
    """A fire of a schedule stored before its expression's check grew stricter (the check now
    refuses it: ``core.schedules.STORED``): counted failed, naming what is wrong, so its
    listing tells its owner to replace it; no task, and the other schedules still fire."""
    error = f"expression: {exc}; replace the schedule with an expression EventBridge takes"
    store.schedules.record_failure(schedule.tenant, schedule.spec.name, error)
    log.warning("schedule %s/%s cannot fire: %s", schedule.tenant, schedule.spec.name, error)


def _coalesced(schedule: Schedule, fire_time: float, now: float) -> float:
    latest = last_fire(schedule.spec.expression, now) if fire_time <= now else fire_time
    if latest <= fire_time:
        return fire_time
    log.info("schedule %s/%s: the fire at %s is past, fired as the latest due, at %s",
             schedule.tenant, schedule.spec.name, fire_time, latest)  # fmt: skip
    return latest


def _get(store: Storage, tenant: str, name: str) -> Schedule | None:
    try:
        return store.schedules.get(tenant, name)
    except AgentqError:  # deleted
        return None


def _in_flight(store: Storage, schedule: Schedule) -> bool:
    """The schedule's latest task is live, or claimed by a fire that may still make it."""
    if schedule.last_task_id is None:
        return False
    found = store.tasks.get_many([schedule.last_task_id])
    if found:
        return not found[0].status.terminal
    return schedule.claimed_at is not None and time.time() - schedule.claimed_at < CLAIM_SECONDS


def _release(store: Storage, schedule: Schedule, task_id: str) -> None:
    """Put back the claim of a fire that made no task (a task made after all keeps it)."""
    if not store.tasks.get_many([task_id]):
        store.schedules.release(schedule, task_id)


def _made(store: Storage, queues: TaskQueues | None, schedule: Schedule, task: Task, fire_time: float) -> str:
    """A fire whose task is made already (a repeated delivery, two loops): count it, if the fire
    that made it did not (killed before it could), and then, as ``submit_once`` does for a
    repeated request, send its message again while it is queued and never claimed: that fire
    may have died before sending it, and a duplicate message is harmless. With overlap
    ``skip`` the task becomes the schedule's latest unless another still is in flight."""
    tenant, name = schedule.tenant, schedule.spec.name
    if (
        schedule.spec.overlap == "skip"
        and schedule.last_task_id != task.task_id
        and not task.status.terminal
        and not _in_flight(store, schedule)
    ):
        store.schedules.claim(schedule, task.task_id, at=time.time())  # lost to another fire: that one stands
    allow = schedule.spec.overlap == "allow"
    counted = store.schedules.record_fire(tenant, name, fire_time, task_id=task.task_id if allow else None)
    if counted and queues is not None and task.status is TaskStatus.QUEUED and task.lease_epoch == 0:
        queues.send(task.task_id, task.submission.priority, tenant=tenant, pool=queues.pool_for(task.submission))
    return task.task_id


def fire_due(store: Storage, tools: ToolRegistry, queues: TaskQueues | None, *, now: float | None = None) -> list[str]:
    """The local scheduler's tick: fire every schedule whose time has come, once (a schedule
    that missed several fires while nothing ran fires once, for the latest, as ``fire``
    coalesces a backlog of the Scheduler's messages in AWS). A schedule whose submission is
    refused is counted failed (``fire``) and the others still fire.

    Moving ``next_fire_at`` on and firing are two steps, so the move notes the fire time as
    pending (``Schedules.advance``) and the fire takes it off once done: a fire an outage cuts
    short (anything but ``REFUSED`` propagates, and the dev stack's loop tries the next tick) or
    a scheduler killed between the two leaves it pending, and a later tick fires that slot
    before the schedule moves on. At most once a slot still: the task's id is derived from the
    fire time, and a fire that finds its task made returns it (``fire``)."""
    now = time.time() if now is None else now
    fired: list[str] = []
    for schedule in store.schedules.list():
        if schedule.pending_fire is not None:  # a fire cut short: its slot first
            _fire_pending(store, tools, queues, schedule, schedule.pending_fire, fired, now)
        if schedule.next_fire_at > now:
            continue
        try:
            due = max(schedule.next_fire_at, last_fire(schedule.spec.expression, now))
            following = next_fire(schedule.spec.expression, due)
        except ValueError as exc:
            _unreadable(store, schedule, exc)
            store.schedules.move_on(schedule.tenant, schedule.spec.name, now + UNREADABLE_RETRY_SECONDS)
            continue
        if not store.schedules.advance(schedule, following, firing=due):
            continue  # another loop fired it (or fires the one still pending)
        _fire_pending(store, tools, queues, schedule, due, fired, now)
    return fired


def _fire_pending(
    store: Storage,
    tools: ToolRegistry,
    queues: TaskQueues | None,
    schedule: Schedule,
    due: float,
    fired: list[str],
    now: float,
) -> None:
    """Fire the slot ``due`` of ``schedule``, then take it off as pending; an outage raises with
    it left pending, for the next tick."""
    tenant, name = schedule.tenant, schedule.spec.name
    try:
        task_id = fire(store, tools, queues, tenant=tenant, name=name, fire_time=due, now=now)
    except REFUSED:
        task_id = None  # counted and logged by ``fire``
    store.schedules.fired(tenant, name, due)
    if task_id is not None and task_id not in fired:
        fired.append(task_id)
