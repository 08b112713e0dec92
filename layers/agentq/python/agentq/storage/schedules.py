"""Schedules in one partition (``SCHEDULES``, sort key ``<tenant>#<name>``): a tenant lists its
own by prefix, and the local scheduler reads every schedule with one Query. ``next_fire_at`` is
moved by a conditional write on its old value, so two loops firing the same schedule agree on
who fires it; the same write notes the fire time it moves past as ``pending_fire``, taken off
once that fire is done, so a fire cut short (an outage, the scheduler killed before it fired)
is fired on a later tick, not lost (``control.schedules.fire_due``).

A fire of an overlap ``skip`` schedule claims the schedule before it submits: ``last_task_id``
set to its task's id, ``claimed_at`` to when, on condition both are still as that fire read
them, so of two fires at once one claims and the other, reading again, finds the claimed task
in flight and skips. A fire is counted once per fire time (``last_fired_slot``), so a
redelivery that finds its task made counts it only if the fire that made it did not; a skip
likewise (``last_skipped_slot``), and a repeated delivery of a skipped fire skips again."""

from __future__ import annotations

import builtins
import contextlib
import json
import time
from dataclasses import dataclass
from decimal import Decimal

from boto3.dynamodb.conditions import Attr, ConditionBase

from agentq.core.errors import TaskNotFound
from agentq.core.schedules import STORED, ScheduleSpec
from agentq.storage.table import ConditionFailed, Table, Update, plain

PARTITION = "SCHEDULES"


@dataclass(frozen=True)
class Schedule:
    tenant: str
    spec: ScheduleSpec
    created_at: float
    next_fire_at: float
    last_task_id: str | None = None
    fired: int = 0
    skipped: int = 0
    failed: int = 0  # fires whose stored submission was refused (``control.schedules.fire``)
    last_error: str | None = None  # why the latest of them was refused; cleared by a fire that submits
    pending_fire: float | None = None  # a fire time the local scheduler moved past and has not yet fired
    claimed_at: float | None = None  # when a fire claimed ``last_task_id`` (``claim``), its task made or about to be
    last_skipped_slot: float | None = None  # the fire time of the latest skipped fire (``record_skip``)


class ScheduleNotFound(TaskNotFound):
    """A 404 like an unknown task (another tenant's schedule is not found either)."""

    code = "schedule_not_found"


class Schedules:
    def __init__(self, table: Table) -> None:
        self.table = table

    @staticmethod
    def _key(tenant: str, name: str) -> dict[str, str]:
        return {"pk": PARTITION, "sk": f"{tenant}#{name}"}

    def put(self, tenant: str, spec: ScheduleSpec, next_fire_at: float) -> Schedule:
        """Create the schedule, or replace its spec and next fire: what its fires left (its
        latest task, claimed or made, which overlap ``skip`` holds the next fire off for; its
        counts; the last refusal; a pending fire) stays, as does when it was created."""
        item = self.table.update(
            self._key(tenant, spec.name),
            Update(set={"tenant": tenant, "spec": spec.model_dump_json(), "next_fire_at": Decimal(repr(next_fire_at))},
                   set_if_absent={"created_at": Decimal(repr(time.time())), "fired": 0, "skipped": 0}),
            returns="ALL_NEW",
        )  # fmt: skip
        assert item is not None
        return _schedule(plain(item))

    def get(self, tenant: str, name: str) -> Schedule:
        item = self.table.get(self._key(tenant, name))
        if item is None:
            raise ScheduleNotFound(f"no schedule {name!r}", field="name")
        return _schedule(plain(item))

    def list(self, tenant: str | None = None) -> list[Schedule]:
        items = self.table.query(PARTITION, prefix=f"{tenant}#" if tenant is not None else None)
        return [_schedule(plain(i)) for i in items]

    def page(self, tenant: str, *, limit: int, after: str | None = None) -> tuple[builtins.list[Schedule], bool]:
        """Up to ``limit`` of a tenant's schedules by name, after the name ``after``; and whether
        there are more (a listing's page: each schedule holds a whole submission)."""
        start = f"{tenant}#{after}" if after is not None else None
        items = self.table.query(PARTITION, prefix=f"{tenant}#", limit=limit + 1, after=start)
        return [_schedule(plain(i)) for i in items[:limit]], len(items) > limit

    def delete(self, tenant: str, name: str) -> None:
        if self.table.delete(self._key(tenant, name)) is None:
            raise ScheduleNotFound(f"no schedule {name!r}", field="name")

    def advance(self, schedule: Schedule, to: float, *, firing: float) -> bool:
        """Move ``next_fire_at`` on, if no one else did, noting ``firing`` (the fire time this
        caller is about to fire) as pending: True when this caller fires it. Not while another
        fire is pending: that one is fired first (``fired`` takes it off)."""
        try:
            self.table.update(
                self._key(schedule.tenant, schedule.spec.name),
                Update(set={"next_fire_at": Decimal(repr(to)), "pending_fire": Decimal(repr(firing))}),
                condition=Attr("next_fire_at").eq(Decimal(repr(schedule.next_fire_at)))
                & Attr("pending_fire").not_exists(),
            )
        except ConditionFailed:
            return False
        return True

    def move_on(self, tenant: str, name: str, to: float) -> None:
        """A fire happened: ``next_fire_at`` moves on to ``to`` unless it is there or past
        already (the local ticker moved it; a later fire did). In AWS no ticker moves it, so
        each fire does, and ``GET /schedules`` shows the next fire, not the first."""
        with contextlib.suppress(ConditionFailed):
            self.table.update(self._key(tenant, name), Update(set={"next_fire_at": Decimal(repr(to))}),
                              condition=Attr("next_fire_at").lt(Decimal(repr(to))))  # fmt: skip

    def fired(self, tenant: str, name: str, fire_time: float) -> None:
        """The pending fire at ``fire_time`` is done (a task made or found, a skip, a refusal):
        take it off, if it is still the pending one (and the schedule still exists)."""
        with contextlib.suppress(ConditionFailed):
            self.table.update(self._key(tenant, name), Update(remove=("pending_fire",)),
                              condition=Attr("pending_fire").eq(Decimal(repr(fire_time))))  # fmt: skip

    def claim(self, schedule: Schedule, task_id: str, *, at: float) -> bool:
        """Make ``task_id`` the schedule's latest task before it is submitted, if no other fire
        claimed since ``schedule`` was read (``last_task_id`` and ``claimed_at`` as read): True
        when this fire may submit it. A fire that claimed the same task before (a redelivery)
        claims it again, so a fire taking over a claim too old to be in flight and the
        redelivery of that claim's own fire cannot both win."""
        try:
            self.table.update(
                self._key(schedule.tenant, schedule.spec.name),
                Update(set={"last_task_id": task_id, "claimed_at": Decimal(repr(at))}),
                condition=_as_read("last_task_id", schedule.last_task_id)
                & _as_read("claimed_at", _number(schedule.claimed_at)),
            )
        except ConditionFailed:
            return False
        return True

    def release(self, schedule: Schedule, task_id: str) -> None:
        """Put back the claim ``schedule`` was read with, if ``task_id``'s is still the one
        standing: its fire made no task (refused, stopped, cut short), and must not hold off
        the next fire as if its task were in flight. Read with that claim already (a repeated
        delivery of its fire), what it replaced is not known: then the claim goes."""
        previous = {"last_task_id": schedule.last_task_id, "claimed_at": _number(schedule.claimed_at)}
        if schedule.last_task_id == task_id:
            previous = dict.fromkeys(previous)
        update = Update(
            set={k: v for k, v in previous.items() if v is not None},
            remove=tuple(k for k, v in previous.items() if v is None),
        )
        with contextlib.suppress(ConditionFailed):
            self.table.update(self._key(schedule.tenant, schedule.spec.name), update,
                              condition=Attr("last_task_id").eq(task_id))  # fmt: skip

    def record_fire(self, tenant: str, name: str, fire_time: float, *, task_id: str | None = None) -> bool:
        """Count a fire that made its task (clearing the last refusal: the cause is gone), once
        for its fire time: False when it was counted already (the fire that made it finished;
        this is a repeated delivery). ``task_id``: made ``last_task_id`` too, for a schedule
        whose fires claim nothing (overlap ``allow``); a claim set it for the others."""
        update = Update(set={"last_fired_slot": _number(fire_time), **({"last_task_id": task_id} if task_id else {})},
                        add={"fired": 1}, remove=("last_error",))  # fmt: skip
        return self._count(tenant, name, update, Attr("last_fired_slot").ne(_number(fire_time)))

    def record_skip(self, tenant: str, name: str, fire_time: float) -> bool:
        """Count a fire the overlap policy or a stopped scope skipped, once for its fire time
        (``last_skipped_slot``): False when it was counted already (a repeated delivery)."""
        update = Update(set={"last_skipped_slot": _number(fire_time)}, add={"skipped": 1})
        return self._count(tenant, name, update, Attr("last_skipped_slot").ne(_number(fire_time)))

    def record_failure(self, tenant: str, name: str, error: str) -> None:
        """Count a fire whose submission was refused, and keep why (cut to 500 characters), so
        the schedule's listing shows what its owner must fix."""
        self._count(tenant, name, Update(set={"last_error": error[:500]}, add={"failed": 1}))

    def _count(self, tenant: str, name: str, update: Update, once: ConditionBase | None = None) -> bool:
        """Apply a count, unless the schedule was deleted meanwhile or ``once`` is false
        (counted already): True when it was applied."""
        condition = Attr("pk").exists() if once is None else Attr("pk").exists() & once
        try:
            self.table.update(self._key(tenant, name), update, condition=condition)
        except ConditionFailed:
            return False
        return True


def _number(value: float | None) -> Decimal | None:
    return Decimal(repr(value)) if value is not None else None


def _float(value: object) -> float | None:
    return float(value) if value is not None else None  # type: ignore[arg-type]


def _as_read(name: str, value: object) -> ConditionBase:
    """``name`` still holds ``value`` (still absent, for None)."""
    return Attr(name).not_exists() if value is None else Attr(name).eq(value)


def _schedule(item: dict[str, object]) -> Schedule:
    return Schedule(
        tenant=str(item["tenant"]),
        spec=ScheduleSpec.model_validate(json.loads(str(item["spec"])), context={STORED: True}),
        created_at=float(item["created_at"]),  # type: ignore[arg-type]
        next_fire_at=float(item["next_fire_at"]),  # type: ignore[arg-type]
        last_task_id=str(item["last_task_id"]) if item.get("last_task_id") else None,
        fired=int(item.get("fired", 0)),  # type: ignore[call-overload]
        skipped=int(item.get("skipped", 0)),  # type: ignore[call-overload]
        failed=int(item.get("failed", 0)),  # type: ignore[call-overload]
        last_error=str(item["last_error"]) if item.get("last_error") else None,
        pending_fire=float(item["pending_fire"]) if item.get("pending_fire") is not None else None,  # type: ignore[arg-type]
        claimed_at=_float(item.get("claimed_at")),
        last_skipped_slot=_float(item.get("last_skipped_slot")),
    )
