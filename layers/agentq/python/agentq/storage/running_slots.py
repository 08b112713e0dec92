"""Running slots: at most ``limit`` running tasks per tenant and per concurrency key.

Invariant: running ≤ limit for every tenant that has a limit, and for every concurrency key;
with a fleet capacity, the tasks holding a fleet slot never number more than the capacity
(``storage.fleet_slots``).

A slot item per tenant (``TENANT#t`` / ``RUNNING``) and per concurrency key (``CKEY#t#key`` /
``RUNNING``) counts in ``running`` the tasks holding one of its slots; a tenant's item also
carries its override ``limit`` when it has one (else the deployment's default applies, else the
tenant is unlimited and pays nothing). A task holds a slot from its admission until it leaves
``running`` and ``queued`` (it ends, goes idle, waits for its children, pauses for an approval):
META's ``slots`` names the slot partitions it holds.

- **Admit** (``admit``) is one transaction: META gets ``slots``, conditional on holding none
  and on being ``queued`` or ``running``; each slot item gets ``running + 1``, conditional on
  ``running < limit``. **Release** (``release``) is its mirror: META loses ``slots``,
  conditional on holding them and on having left ``queued``/``running``; each slot ``- 1``.
  Both are idempotent, so a redelivered message never takes a second slot nor gives one back
  twice, and ``running`` always equals the number of tasks whose META names the slot. A
  release that meets a TransactionConflict (the slot item is hot) is tried again, and raised
  if it keeps meeting one: never dropped, or the slot would be lost for good. The
  dispatcher admits before every claim (the claim is the only way into ``running``), hence the
  invariant. A dead worker's task stays ``running`` and keeps its slot; the worker that takes
  it over finds it already admitted: a slot comes back only with the task's own exit.
- **Wait** (``park``): a task refused puts a ``WAIT#<tier rank>#<created>#<task id>`` item
  under the slot's partition, and its message is deleted: it waits ``queued`` without
  spending receives or polling. It then reads the slot again: a release between its refusal
  and its item woke nobody, so it admits itself if the slot is free by now. A task whose
  key's ``cancel_running`` stops the key's holders for it parks ``first``: its rank
  (``FIRST_RANK``) sorts before every tier's, so the slots the cancellation frees go to it,
  not to the tasks that were already waiting on the key.
- **Wake** (``next_waiters``): for each slot a release freed, while the slot is below its
  limit, the releaser takes its oldest waiter (a conditional delete: one waker wins) and sends
  that task's message (a key's waiter admitted first: ``FairShare`` hands the slot off): one per slot freed, never ``limit - running`` (see ``next_waiters``). A
  woken task that does not take the slot (cancelled first, refused by another of its slots)
  passes the wake on (``FairShare.pass_on``). The sweeper's ``swept`` messages are the
  backstop for a wake lost in a crash (late: ``stale_after``); the sweeper also wakes the
  room no release made (a raised default: ``room``).

With tier limits a task also takes its tenant's slot of its tier (``storage.tier_slots``).

Listing (``all_usage``, what an operator's ``GET /usage/tenants`` reads) is ``storage.slot_usage``:
the reads of these items and waiting lists a person sees (``SlotListing``, a base of ``RunningSlots``).

Lowering a limit below ``running`` kills nothing: admissions are refused until enough tasks
have left. Cost without a fleet, for a limited tenant: one read of the slot item per admission,
a two-item transaction (three with a key) when admitted, the same transaction and a read and a
Query at release; for a refused task one Put, one read, later one Delete and one SQS send. An
unlimited tenant without a key pays one read of the slot item per admission. With a fleet
every tenant is counted, and a release also reads the fleet's shards and waiting tenants
(``storage.fleet_slots``; every figure counted by ``bench/slot_calls.py``).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from boto3.dynamodb.conditions import Attr, ConditionBase

from agentq.core.errors import ValidationError
from agentq.core.models import Task, TaskStatus
from agentq.storage import fleet_slots as fleet
from agentq.storage import keys
from agentq.storage import tier_slots as tiers
from agentq.storage.fleet_waiting import WAIT as WAIT  # re-exported: the waiting lists are this module's
from agentq.storage.fleet_waiting import FleetWaiting
from agentq.storage.slot_usage import SlotListing
from agentq.storage.slot_usage import SlotUsage as SlotUsage  # re-exported: the usage the slots count
from agentq.storage.table import (
    Action,
    ConditionFailed,
    Delete,
    Patch,
    Put,
    Table,
    TransactionCancelled,
    TransactionConflict,
    Update,
    plain,
    present,
    status_in,
    transact_through_conflicts,
)

RUNNING = "RUNNING"
HOLD = "HOLD#"  # under a key's partition: a task holding one of its slots (cancel_running lists them)
TIER_RANK = {"high": 0, "normal": 1, "low": 2}
FIRST_RANK = "!"  # sorts before every tier's rank: a cancel_running task is woken before the key's other waiters
ADMISSIBLE = (TaskStatus.QUEUED, TaskStatus.RUNNING)


Waits = Literal["key", "tenant", "tier", "fleet"]  # the waiting lists a parked task may be on


def key_pk(tenant: str, key: str) -> str:
    return f"CKEY#{tenant}#{key}"


@dataclass(frozen=True)
class Slot:
    """One limit a task must fit under: its partition, its limit, and whether that limit is
    the tenant's override stored on the item (conditioned as stored, so a concurrent change of
    the override is seen) or a value the caller knows (the default, a key's limit, a fleet
    shard's part of the capacity). None: no limit, only counted (a tenant's running count is
    what the fleet's weighted wake compares, so with a fleet every tenant's is kept)."""

    pk: str
    limit: int | None
    stored_limit: bool = False
    key: bool = False
    tier: bool = False  # a tenant's slot of one tier (storage.tier_slots): its limit is the deployment's
    seen_full: bool = False  # the read that found it saw running >= limit: refuse without a transaction
    queue: str | None = None  # the waiting list of a task it refuses, when not ``pk`` (the fleet's, per tenant)

    @property
    def fleet(self) -> bool:
        return fleet.is_shard(self.pk)

    @property
    def wait_pk(self) -> str:
        return self.queue or self.pk


@dataclass(frozen=True)
class GiveBack:
    """The slots a deleted task gives back: ``actions`` for the deletion's transaction, valid
    only under ``condition`` on its META (its ``slots`` as they were read)."""

    condition: ConditionBase
    actions: list[Action]


@dataclass(frozen=True)
class Admission:
    outcome: Literal["admitted", "refused", "not_admissible", "conflict"]
    slot: Slot | None = None  # refused: the slot that was full


def _listed(pk: str) -> dict[str, str]:
    """The ``gsi1`` keys that list a tenant's slot item (none for a concurrency key's)."""
    if not pk.startswith(keys.tenant_pk("")):
        return {}
    return {"gsi1pk": keys.TENANT_SLOTS_INDEX_PK, "gsi1sk": pk.removeprefix(keys.tenant_pk(""))}


class RunningSlots(SlotListing, FleetWaiting):
    def __init__(
        self,
        table: Table,
        default_limit: int | None = None,
        fleet_capacity: int | None = None,
        fleet_name: str = fleet.FLEET,
        tier_limits: Mapping[str, int] | None = None,
    ) -> None:
        """``default_limit``: the deployment's most running tasks per tenant without an
        override (``AGENTQ_DEFAULT_TENANT_MAX_RUNNING``); None leaves them unlimited.
        ``fleet_capacity``: the most running tasks of all tenants together, shared by weight
        (``AGENTQ_FLEET_CAPACITY``, ``storage.fleet_slots``); None: no fleet slot.
        ``fleet_name``: its partitions' prefix (a test names a fleet of its own). ``tier_limits``:
        the most running tasks of a tenant in each tier whose capacity is known
        (``Defaults.tier_limits``, ``storage.tier_slots``); a tier left out has no tier slot."""
        self.table = table
        self.default_limit = default_limit
        self.fleet_capacity = fleet_capacity
        self.fleet_name = fleet_name
        self.tier_limits: dict[str, int] = dict(tier_limits or {})

    def with_default(
        self,
        default_limit: int | None,
        fleet_capacity: int | None = None,
        fleet_name: str = fleet.FLEET,
        *,
        tier_limits: Mapping[str, int] | None = None,
    ) -> RunningSlots:
        return RunningSlots(self.table, default_limit, fleet_capacity, fleet_name, tier_limits)

    @staticmethod
    def _key(pk: str) -> dict[str, str]:
        return {"pk": pk, "sk": RUNNING}

    # --- limits -------------------------------------------------------------------------

    def set_limit(self, tenant: str, limit: int | None) -> None:
        """The tenant's override (None removes it: the default applies again). Changing it
        never touches a running task."""
        if limit is not None and limit < 1:
            raise ValidationError(f"max_running must be at least 1 (got {limit})", field="max_running")
        listed = _listed(keys.tenant_pk(tenant))
        if limit is not None:
            update = Update(set={"limit": limit}, set_if_absent=listed)
        else:
            update = Update(remove=["limit"], set_if_absent=listed)
        self.table.update(self._key(keys.tenant_pk(tenant)), update)

    def set_weight(self, tenant: str, weight: int | None) -> None:
        """The tenant's weight in the fleet's share (None: back to 1). Changing it never touches
        a running task: the next wakes compare running counts by the new weight."""
        if weight is not None:
            fleet.check_weight(weight)
        listed = _listed(keys.tenant_pk(tenant))
        if weight is not None:
            update = Update(set={"weight": weight}, set_if_absent=listed)
        else:
            update = Update(remove=["weight"], set_if_absent=listed)
        self.table.update(self._key(keys.tenant_pk(tenant)), update)

    def limit(self, tenant: str) -> int | None:
        return self._limit_of(self.table.get(self._key(keys.tenant_pk(tenant))))

    def _limit_of(self, item: dict[str, Any] | None) -> int | None:
        stored = plain(item or {}).get("limit")
        return int(stored) if stored is not None else self.default_limit

    # --- admission ----------------------------------------------------------------------

    def slots_for(self, task: Task, *, tiered: bool = True) -> list[Slot]:
        """The slots ``task`` needs (one read: the tenant's slot item for its override; with a
        fleet or a tier limit, one BatchGetItem of it, the tenant's tier item and the fleet's
        shards). ``tiered``: it runs on its tier's runners (not on a workspace pool's hosts), so
        its tier's limit applies when the deployment knows one."""
        slots: list[Slot] = []
        tenant_pk = keys.tenant_pk(task.tenant)
        tier = task.submission.priority
        tier_limit = self.tier_limits.get(tier) if tiered else None
        if self.fleet_capacity is None and tier_limit is None:
            item = plain(self.table.get(self._key(tenant_pk)) or {})
            items: dict[str, dict[str, Any]] = {}
        else:
            read = [self._key(tenant_pk)]
            if tier_limit is not None:
                read.append(self._key(tiers.tier_pk(task.tenant, tier)))
            if self.fleet_capacity is not None:
                read += [self._key(fleet.shard_pk(i, self.fleet_name)) for i in range(fleet.SHARDS)]
            items = {str(i["pk"]): plain(i) for i in self.table.batch_get(read)}
            item = items.get(tenant_pk, {})
        stored, running = item.get("limit"), int(item.get("running", 0))
        if stored is not None:
            slots.append(Slot(tenant_pk, int(stored), stored_limit=True, seen_full=running >= stored))
        elif self.default_limit is not None:
            slots.append(Slot(tenant_pk, self.default_limit, seen_full=running >= self.default_limit))
        elif self.fleet_capacity is not None:
            slots.append(Slot(tenant_pk, None))  # unlimited, but counted for the fleet's shares
        concurrency = task.submission.concurrency
        if concurrency is not None:
            slots.append(Slot(key_pk(task.tenant, concurrency.key), concurrency.limit, key=True))
        if tier_limit is not None:  # after the key (its on_conflict decides first), before the fleet
            pk = tiers.tier_pk(task.tenant, tier)
            running = int(items.get(pk, {}).get("running", 0))
            slots.append(Slot(pk, tier_limit, tier=True, seen_full=running >= tier_limit))
        if self.fleet_capacity is not None:  # last: a task its key refuses waits on its key's list, not the fleet's
            shards = [
                int(items.get(fleet.shard_pk(i, self.fleet_name), {}).get("running", 0)) for i in range(fleet.SHARDS)
            ]
            pick = fleet.pick_shard(self.fleet_capacity, shards)
            # Full: a shard at or over its part, so a task the transaction still tries (a keyed
            # one) is refused by it, not let in by a shard below its part of a lowered capacity.
            index = fleet.full_shard(self.fleet_capacity, shards) if pick is None else pick
            limit = fleet.shard_limits(self.fleet_capacity)[index]
            slots.append(
                Slot(
                    fleet.shard_pk(index, self.fleet_name),
                    limit,
                    seen_full=pick is None,
                    queue=fleet.queue_pk(task.tenant, self.fleet_name),
                )
            )
        return slots

    def admit(
        self, task: Task, slots: list[Slot], *, tenant_running: int | None = None, touch: bool = False
    ) -> Admission:
        """Take one slot of each of ``slots`` for ``task`` (see the module), or say which was full.
        ``tenant_running``: only if its tenant's count is still this (the fleet's waker chose the
        tenant by it; refused on the tenant's slot when it moved). ``touch``: also set META's
        ``updated_at`` (the fleet's hand-off: the sweeper counts the woken task's silence from its
        admission, so a message waiting in a backlog is not re-sent by every sweep)."""
        condition = present() & status_in(list(ADMISSIBLE)) & Attr("slots").not_exists()
        admitted: dict[str, Any] = {"slots": [s.pk for s in slots]}
        if touch:
            admitted["updated_at"] = time.time()
        actions: list[Any] = [
            Patch(
                "meta",
                keys.meta_key(task.task_id),
                Update(set=admitted),
                condition=condition,
            )
        ]
        for i, slot in enumerate(slots):
            take = Update(add={"running": 1}, set_if_absent=_listed(slot.pk))
            room = _room(slot)
            if tenant_running is not None and slot.pk == keys.tenant_pk(task.tenant):
                same = Attr("running").eq(tenant_running)
                room = room & (same | Attr("running").not_exists() if tenant_running == 0 else same)
            actions.append(Patch(f"slot{i}", self._key(slot.pk), take, condition=room))
            if slot.key:
                actions.append(Put(f"hold{i}", {"pk": slot.pk, "sk": HOLD + task.task_id, "task_id": task.task_id}))
        try:
            self.table.transact(actions)
        except TransactionCancelled as exc:
            full = [s for i, s in enumerate(slots) if f"slot{i}" in exc.failed]
            if "meta" in exc.failed or not full:
                return Admission("not_admissible")
            return Admission("refused", full[0])
        except TransactionConflict:  # raced another admission or release: nothing decided
            return Admission("conflict")
        return Admission("admitted")

    def holds_slots(self, task_id: str) -> bool:
        return "slots" in plain(self.table.get(keys.meta_key(task_id)) or {})

    def release(self, task_id: str, *, if_epoch: int | None = None) -> list[str]:
        """Give back the slots of a task that left ``queued``/``running``; the slot partitions
        freed ([] when it held none, or still runs). ``if_epoch``: only if no worker claimed the
        task since its ``lease_epoch`` was this (a cancel of a ``queued`` task: one a worker
        claimed meanwhile gives its slots back at the end of the step it is running)."""
        meta = plain(self.table.get(keys.meta_key(task_id)) or {})
        held = [str(pk) for pk in meta.get("slots") or []]
        if not held or meta.get("status") in {s.value for s in ADMISSIBLE}:
            return []
        condition = Attr("slots").exists() & ~status_in(list(ADMISSIBLE))
        if if_epoch is not None:
            condition = condition & Attr("lease_epoch").eq(if_epoch)
        actions: list[Any] = [Patch("meta", keys.meta_key(task_id), Update(remove=["slots"]), condition=condition)]
        for i, pk in enumerate(held):
            # set_if_absent: lists a slot item written before the listing existed
            actions.append(Patch(f"slot{i}", self._key(pk), Update(add={"running": -1}, set_if_absent=_listed(pk))))
            if pk.startswith("CKEY#"):
                actions.append(Delete(f"hold{i}", {"pk": pk, "sk": HOLD + task_id}))
        try:
            transact_through_conflicts(self.table, actions)
        except TransactionCancelled:
            return []  # released by another copy of the message meanwhile (or it runs again)
        return held

    def give_back(self, task_id: str) -> GiveBack:
        """What undoes the admission of a task deleted before it ever ran (its enqueue failed),
        for the deletion's own transaction (``Tasks.delete_unstarted``): given back if and only
        if the task is deleted, so a task a worker claimed meanwhile (SQS took the message
        although the send raised) keeps the slots it runs on. The slots are read here, outside
        the transaction, so the deletion is conditional on META still naming exactly them: a
        worker may meanwhile release them (the task was cancelled before it ran: given back
        twice, a count below zero) or admit the task (it held none here: its slots lost with it)."""
        held = [str(pk) for pk in plain(self.table.get(keys.meta_key(task_id)) or {}).get("slots") or []]
        actions: list[Action] = []
        for i, pk in enumerate(held):
            actions.append(Patch(f"slot{i}", self._key(pk), Update(add={"running": -1})))
            if pk.startswith("CKEY#"):
                actions.append(Delete(f"hold{i}", {"pk": pk, "sk": HOLD + task_id}))
        return GiveBack(Attr("slots").eq(held) if held else Attr("slots").not_exists(), actions)

    def holders(self, tenant: str, key: str) -> list[str]:
        """The tasks holding a slot of a concurrency key."""
        return [str(i["task_id"]) for i in self.table.query(key_pk(tenant, key), prefix=HOLD)]

    # --- waiting ------------------------------------------------------------------------

    def park(self, task: Task, slot: Slot, tier: str, *, first: bool = False) -> None:
        """``task`` waits for ``slot``: its item in the slot's waiting list (idempotent). For
        the fleet, its tenant is then marked waiting (after the item: a wake that finds the
        mark finds the item; ``_drop_mark`` re-reads the list after taking a mark away).
        ``first``: ahead of every waiter parked without it (see the module)."""
        self.table.put(
            {
                "pk": slot.wait_pk,
                "sk": _wait_sk(task, tier, first=first),
                "task_id": task.task_id,
                "tier": tier,
                "tenant": task.tenant,
                "parked_at": time.time(),
            }
        )
        if slot.fleet:
            self.mark_waiting(task.tenant)

    def unpark(self, task: Task, slot: Slot, tier: str, *, first: bool = False) -> bool:
        """Take ``task`` off ``slot``'s list (parked ``first`` or not, as it was parked); False
        when a waker took it first (its message is sent)."""
        try:
            self.table.delete({"pk": slot.wait_pk, "sk": _wait_sk(task, tier, first=first)}, condition=present())
        except ConditionFailed:
            return False
        return True

    def waits_on(self, task: Task) -> Waits | None:
        """Which waiting list holds ``task`` (parked by the gate; see ``park``): its concurrency
        key's, its tenant's, its tenant's tier's or the fleet's, or none. One BatchGetItem of the
        keys its ``WAIT`` item would have under each (parked with its own priority as the tier);
        what a person watching a queued task is told it waits for."""
        sk = _wait_sk(task, task.submission.priority)
        lists: dict[str, Waits] = {
            keys.tenant_pk(task.tenant): "tenant",
            tiers.tier_pk(task.tenant, task.submission.priority): "tier",
            fleet.queue_pk(task.tenant, self.fleet_name): "fleet",
        }
        if task.submission.concurrency is not None:
            lists[key_pk(task.tenant, task.submission.concurrency.key)] = "key"
        found = {str(item["pk"]) for item in self.table.batch_get([{"pk": pk, "sk": sk} for pk in lists])}
        kinds: tuple[Waits, ...] = ("key", "tenant", "tier", "fleet")
        for kind in kinds:  # a key first: it is what the submitter chose
            if any(lists[pk] == kind for pk in found):
                return kind
        return None

    def has_room(self, slot: Slot) -> bool:
        """Is ``slot`` below its limit now (a tenant's override as stored now; for a fleet
        shard: has any shard room)?"""
        if slot.fleet:
            return self._fleet_room(1) > 0
        item = plain(self.table.get(self._key(slot.pk)) or {})
        limit = int(item["limit"]) if "limit" in item and not (slot.key or slot.tier) else slot.limit
        return limit is None or int(item.get("running", 0)) < limit

    def parked(self, pk: str) -> set[str]:
        """The tasks with a WAIT item under ``pk`` (all pages, keys only): the sweeper leaves
        them alone, their release will wake them."""
        return {str(i["sk"]).split("#", 3)[3] for i in self.table.query(pk, prefix=WAIT, keys_only=True)}

    def room(self, tenant: str) -> int | None:
        """How many more tasks ``tenant`` may run now (None: unlimited)."""
        item = self.table.get(self._key(keys.tenant_pk(tenant)))
        limit = self._limit_of(item)
        return None if limit is None else max(0, limit - int(plain(item or {}).get("running", 0)))

    def next_waiters(self, pk: str, most: int = 1, *, if_limited: bool = False) -> list[tuple[str, str, str]]:
        """Take (delete) up to ``most`` waiters the slot has room for, oldest first: (task id,
        tier, tenant) each, for the caller to send. A release wakes one per slot it freed, never
        ``limit - running``: concurrent releases would each read the same room and wake the
        whole list at once (measured: a thundering herd of refused admissions). A waiter that is
        no longer ``queued`` (cancelled while it waited), or was admitted meanwhile by another
        route, is dropped and does not count. A
        conditional delete, so two wakers never take the same one. For a fleet shard: the
        fleet's waiters, by weight (``_next_fleet_waiters``). ``if_limited``: none for a tenant
        with no limit, without reading its list (a release's wake: an unlimited tenant's slot,
        counted for the fleet, frees no place anyone waits for; the waiters a cleared override
        left are all woken by the clear, ``control.tenants``)."""
        if fleet.is_shard(pk):
            return self._next_fleet_waiters(most)
        item = plain(self.table.get(self._key(pk)) or {})
        tier_limit = self.tier_limits.get(tiers.tier_of(pk)) if tiers.is_tier_pk(pk) else None  # a tier's: ours
        limit = item.get("limit", self.default_limit) if pk.startswith("TENANT#") else tier_limit
        if limit is None and if_limited and pk.startswith("TENANT#"):
            return []
        room = most if limit is None else min(most, max(0, int(limit) - int(item.get("running", 0))))
        return self._take(pk, room)

    def _take(self, pk: str, room: int) -> list[tuple[str, str, str]]:
        """Take (delete) up to ``room`` waiters of the list ``pk`` still waiting, oldest first."""
        taken: list[tuple[str, str, str]] = []
        while room > 0:
            waiters = self.table.query(pk, prefix=WAIT, limit=room + 4)
            if not waiters:
                break
            metas = self.table.batch_get([keys.meta_key(str(w["task_id"])) for w in waiters])
            # Queued and not admitted yet: a waiter admitted by another route meanwhile (a
            # re-POST, a swept message) has a message of its own; its item is stale.
            queued = {str(m["pk"]) for m in metas if m.get("status") == TaskStatus.QUEUED.value and not m.get("slots")}
            for waiter in waiters:
                if room <= 0:
                    break
                try:
                    self.table.delete({"pk": pk, "sk": waiter["sk"]}, condition=present())
                except ConditionFailed:
                    continue
                if keys.task_pk(str(waiter["task_id"])) in queued:
                    taken.append((str(waiter["task_id"]), str(waiter["tier"]), str(waiter.get("tenant", ""))))
                    room -= 1
        return taken


def _room(slot: Slot) -> ConditionBase:
    """``running < limit`` on the slot item, as the admission must see it."""
    if slot.limit is None:  # an unlimited tenant counted for the fleet: unless an override appeared
        return Attr("limit").not_exists()
    free = Attr("running").not_exists() | Attr("running").lt(slot.limit)
    if slot.stored_limit:
        return Attr("limit").eq(slot.limit) & free
    if slot.key or slot.fleet or slot.tier:
        return free
    return Attr("limit").not_exists() & free


def _wait_sk(task: Task, tier: str, *, first: bool = False) -> str:
    rank = FIRST_RANK if first else TIER_RANK.get(tier, 1)
    return f"{WAIT}{rank}#{task.created_at:017.6f}#{task.task_id}"


def is_key_pk(pk: str) -> bool:
    """Is ``pk`` a concurrency key's slot partition (``CKEY#<tenant>#<key>``)?"""
    return pk.startswith("CKEY#")
