"""A2A push notifications: when a task an A2A client can reach (one it sent, or any task of an
agent: ``reachable``) waits for someone (``input-required``, ``auth-required``) or ends, each
push config its client set (``storage/a2a_push.py``; a tenant's API key's: an end user's token
sets none, ``api/a2a_push.refuse_push``, as every push is signed as the tenant) gets the
change as A2A's ``StreamResponse`` (a ``statusUpdate``; at ``completed`` the ``task`` with its
artifacts, ``queueing/a2a_artifacts.py``), queued on the webhooks queue and
delivered as every callback is (``queueing/webhooks.py``): signed with the tenant's secret, the
address checked when it is sent, retried until the receiver answers 2xx, then dead-lettered.
The config's own ``authentication`` (``Authorization: <scheme> <credentials>``) and ``token``
(``X-A2A-Notification-Token``) go with it, as the protocol asks.

At least once: the ``agentq-delivery`` id is the same for every attempt and every queueing of one
change of one config (task, config, state, step), so a receiver dedupes by it."""

from __future__ import annotations

import hashlib
import time
from datetime import UTC, datetime

from agentq.core.a2a_states import COMPLETED, state_name
from agentq.core.models import Task, TaskStatus
from agentq.core.webhooks import Delivery
from agentq.queueing.a2a_artifacts import artifacts
from agentq.queueing.queues import TaskQueues
from agentq.storage.container import Storage

VIA, CONTEXT_KEY = "a2a", "a2a_context_id"  # as the A2A server marks its tasks (api/a2a_views.py)
TOKEN_HEADER = "X-A2A-Notification-Token"


def payload(store: Storage, task: Task, status: TaskStatus, state: str) -> dict[str, object]:
    """A ``statusUpdate``; at ``completed``, the whole ``task`` instead, with the artifacts
    ``GetTask`` shows (``queueing/a2a_artifacts.py``), so the receiver has the result and the
    files' URLs in the one notification that says it is done."""
    stamp = datetime.fromtimestamp(task.updated_at or time.time(), UTC).isoformat().replace("+00:00", "Z")
    context = str(task.submission.metadata.get(CONTEXT_KEY) or task.task_id)
    meta = {"agentq": {"status": status.value, "agent": task.submission.agent}}
    if state == COMPLETED and task.status is status:
        return {"task": {"id": task.task_id, "contextId": context, "status": {"state": state, "timestamp": stamp},
                         "artifacts": artifacts(store, task), "metadata": meta}}  # fmt: skip
    return {"statusUpdate": {"taskId": task.task_id, "contextId": context,
                             "status": {"state": state, "timestamp": stamp}, "metadata": meta}}  # fmt: skip


def reachable(task: Task) -> bool:
    """Whether an A2A client can have set a push config on ``task``: one the A2A server submitted,
    or any task of an agent, however it was started (``POST /tasks``, MCP, a schedule): the A2A
    server lists, shows and takes configs on every task of the agent at ``/a2a/{agent}``. A task
    without an agent is reachable by no A2A path and is not read for."""
    return task.submission.metadata.get("via") == VIA or bool(task.submission.agent)


def enqueue_push(store: Storage, queues: TaskQueues | None, task: Task, status: TaskStatus) -> int:
    """Queue the change of ``task`` to ``status`` for each of its push configs; how many. The
    configs are read at the change itself (one Query of their partition, empty for most tasks),
    not from a flag on the caller's copy of the task: that copy was read before the run, and a
    config set while the task ran would be missed."""
    if queues is None or not reachable(task):
        return 0
    configs = store.a2a_push.listed(task.task_id)
    if not configs:
        return 0
    task = store.tasks.get(task.task_id)  # as it is now: its step and time name this change
    credential = False
    if status is TaskStatus.PAUSED:
        pending = store.approvals.pending(task.task_id)
        credential = pending is not None and bool(pending.credential)
    state = state_name(status, credential=credential)
    body = payload(store, task, status, state)
    for config in configs:
        headers: dict[str, str] = {}
        auth = config.get("authentication") or {}
        if isinstance(auth, dict) and auth.get("scheme"):
            headers["Authorization"] = f"{auth['scheme']} {auth.get('credentials', '')}".strip()
        if config.get("token"):
            headers[TOKEN_HEADER] = str(config["token"])
        key = "\0".join((task.task_id, str(config.get("id")), state, str(task.step), str(task.invocation)))
        delivery_id = hashlib.sha256(key.encode()).hexdigest()[:32]
        queues.send_webhook(Delivery(delivery_id, task.tenant, str(config["url"]), body, headers).to_json())
    return len(configs)
