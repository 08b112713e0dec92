"""A tenant's running limit and fleet weight, set by an operator: checked before anything is written.

The override and the weight live on the tenant's slot item (``storage.running_slots``,
``storage.fleet_slots``), beside the hourly windows under ``TENANT#t``. A tenant is known when
it has an API key (revoked ones count) or a task: an override for a name nobody uses is a typo,
refused naming the field. Lowering a limit below the tenant's running count kills nothing: its
new tasks wait until enough have ended. A weight counts only while the fleet is full: the
waiting tenant furthest below its weight's share of the running tasks is woken first.
"""

from __future__ import annotations

from agentq.core.errors import ValidationError
from agentq.queueing.queues import TaskQueues
from agentq.storage import fleet_slots, keys
from agentq.storage.container import Storage
from agentq.storage.running_slots import SlotUsage

WAKE_PAGE = 100  # waiters taken per page when a cleared override leaves the tenant unlimited


def known(store: Storage, tenant: str) -> bool:
    if store.api_keys.list(tenant):
        return True
    tasks, _ = store.tasks.list_for_tenant(tenant, limit=1, roots_only=False, max_reads=1)
    return bool(tasks)


def set_max_running(
    store: Storage,
    tenant: str,
    limit: int | None,
    queues: TaskQueues | None = None,
    *,
    weight: int | None = None,
    clear_weight: bool = False,
) -> SlotUsage:
    """Set (None: clear) ``tenant``'s override, and its ``weight`` when given (``clear_weight``:
    back to 1); returns its usage under the new values. Every value is checked before anything
    is written. A raised limit wakes as many waiting tasks as it made room for (their messages,
    on ``queues``); a cleared one, when no default applies, wakes them all, page by page; with a
    fleet (``store.slots`` built with its capacity), the fleet's free slots then wake its waiters."""
    if limit is not None and limit < 1:
        raise ValidationError(f"max_running must be at least 1 (got {limit})", field="max_running")
    if weight is not None:
        fleet_slots.check_weight(weight)
    if not known(store, tenant):
        raise ValidationError(f"unknown tenant {tenant!r}: it has no API key and no task", field="tenant")
    if weight is not None or clear_weight:
        store.slots.set_weight(tenant, weight)
    store.slots.set_limit(tenant, limit)
    usage = store.slots.usage(tenant)
    if queues is not None:
        _wake_room(store, tenant, usage, queues)
        usage = store.slots.usage(tenant)
    return usage


def set_weight(store: Storage, tenant: str, weight: int | None) -> SlotUsage:
    """Set (None: back to 1) ``tenant``'s weight, leaving its limit as it is."""
    if weight is not None:
        fleet_slots.check_weight(weight)
    if not known(store, tenant):
        raise ValidationError(f"unknown tenant {tenant!r}: it has no API key and no task", field="tenant")
    store.slots.set_weight(tenant, weight)
    return store.slots.usage(tenant)


def _wake_room(store: Storage, tenant: str, usage: SlotUsage, queues: TaskQueues) -> None:
    _wake_tenant_list(store, tenant, usage, queues)
    _wake_fleet_room(store, queues)


def _wake_tenant_list(store: Storage, tenant: str, usage: SlotUsage, queues: TaskQueues) -> None:
    pk = keys.tenant_pk(tenant)
    if usage.limit is not None:
        room = usage.limit - usage.running
        if room > 0:
            for task_id, tier, owner in store.slots.next_waiters(pk, most=room):
                queues.send(task_id, tier, tenant=owner or tenant)
        return
    while True:  # unlimited now: every waiter may go (``usage`` counts only up to 1,000)
        page = store.slots.next_waiters(pk, most=WAKE_PAGE)
        for task_id, tier, owner in page:
            queues.send(task_id, tier, tenant=owner or tenant)
        if not page:
            return


def _wake_fleet_room(store: Storage, queues: TaskQueues) -> None:
    """The fleet's free slots go to its waiters, by weight: a tenant at its hard limit was passed
    over by the wakes while its tasks waited on its fleet list, so a raised (or cleared) limit
    would otherwise leave them waiting with the fleet free, until the next release or sweep."""
    capacity = store.slots.fleet_capacity
    if capacity is None:
        return
    for task_id, tier, owner, _ in store.slots.next_fleet_waiters(capacity):
        queues.send(task_id, tier, tenant=owner or None)
