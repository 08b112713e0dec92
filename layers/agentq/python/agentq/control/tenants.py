"""A tenant's running limit, set by an operator: checked before anything is written.

The override lives on the tenant's slot item (``storage.running_slots``), beside the hourly
windows under ``TENANT#t``. A tenant is known when it has an API key (revoked ones count) or a
task: an override for a name nobody uses is a typo, refused naming the field. Lowering a limit
below the tenant's running count kills nothing: its new tasks wait until enough have ended.
"""

from __future__ import annotations

from agentq.core.errors import ValidationError
from agentq.queueing.queues import TaskQueues
from agentq.storage import keys
from agentq.storage.container import Storage
from agentq.storage.running_slots import SlotUsage


def known(store: Storage, tenant: str) -> bool:
    if store.api_keys.list(tenant):
        return True
    tasks, _ = store.tasks.list_for_tenant(tenant, limit=1, roots_only=False, max_reads=1)
    return bool(tasks)


def set_max_running(store: Storage, tenant: str, limit: int | None, queues: TaskQueues | None = None) -> SlotUsage:
    """Set (None: clear) ``tenant``'s override; returns its usage under the new limit. A
    raised limit wakes as many waiting tasks as it made room for (their messages, on
    ``queues``)."""
    if limit is not None and limit < 1:
        raise ValidationError(f"max_running must be at least 1 (got {limit})", field="max_running")
    if not known(store, tenant):
        raise ValidationError(f"unknown tenant {tenant!r}: it has no API key and no task", field="tenant")
    store.slots.set_limit(tenant, limit)
    usage = store.slots.usage(tenant)
    room = usage.limit - usage.running if usage.limit is not None else usage.waiting
    if queues is not None and room > 0:
        for task_id, tier, owner in store.slots.next_waiters(keys.tenant_pk(tenant), most=room):
            queues.send(task_id, tier, tenant=owner or tenant)
        usage = store.slots.usage(tenant)
    return usage
