"""The approvals a task served over MCP waits on (``api.mcp_tasks``' ``inputRequests``, the
blocking tools' ``next``): its own pending one, or, while it waits for its sub-agents, each
pending one below it. A parent ``waiting`` on a sub-agent paused for a person's approval cannot
go on until that is decided, and SEP-2663 has ``inputRequests`` hold every outstanding request
the task needs: shown as the parent's ``working``, the approval waited unseen for as long as
nobody looked at the console.

Found by walking the task's tree down its SPAWN records, breadth-first in spawn order, through
``waiting`` tasks only: a parent waits on its children only while ``waiting``, so a paused task
below a running, queued or ended one holds nothing of this task's up. A task the caller may not
see (another tenant's, another end user's for a token's caller) is passed over, with what is
below it: the walk fails closed.

Bounded, since a tree can be big (a fan-out of thousands) and a client polls ``tasks/get``
every second: one look reads at most ``MAX_READS`` items (a task's spawn listing, or a task,
each one) and stops at ``MAX_ASKED`` pending approvals (what one ``tasks/update`` may answer).
What it did not read is said (``Asks.cut``): its approvals show once those found are decided,
and the console lists them all.
"""

from __future__ import annotations

from dataclasses import dataclass

from agentq.core.endusers import Caller
from agentq.core.models import Task, TaskStatus
from agentq.core.records import ApprovalRecord
from agentq.storage.container import Storage

MAX_READS = 256
MAX_ASKED = 16


@dataclass(frozen=True)
class Asked:
    """A pending approval: of the task itself (``key`` ``approval-<tool use id>``) or of a
    sub-agent below it (``approval-<sub-agent's task id>.<tool use id>``). A task id holds no
    ``.``, and each part names one call once in a task's life: a key is never reused."""

    key: str
    task: Task  # the task that holds the call: the one asked about, or a sub-agent of it
    pending: ApprovalRecord
    below: bool = False  # a sub-agent's


@dataclass(frozen=True)
class Asks:
    asked: tuple[Asked, ...] = ()
    cut: bool = False  # the walk stopped at a bound: more of the tree may wait, unread

    def decidable(self, user: str | None) -> list[Asked]:
        """What ``user``'s token (None: an API key) may decide: an approval only the tenant
        decides is no input a token can give."""
        return [a for a in self.asked if a.pending.may_decide(user)]


def approvals(store: Storage, task: Task, caller: Caller) -> Asks:
    """The approvals ``task`` waits on now, as ``caller`` may see them."""
    if task.status is TaskStatus.PAUSED:
        pending = store.approvals.pending(task.task_id)
        return Asks((Asked(f"approval-{pending.use_id}", task, pending),)) if pending is not None else Asks()
    if task.status is not TaskStatus.WAITING:
        return Asks()
    paused, cut = _paused_below(store, task, caller)
    asked = []
    for child in paused:
        pending = store.approvals.pending(child.task_id)
        if pending is not None:  # else decided since the read, or its request not written yet
            asked.append(Asked(f"approval-{child.task_id}.{pending.use_id}", child, pending, below=True))
    return Asks(tuple(asked), cut)


def _paused_below(store: Storage, task: Task, caller: Caller) -> tuple[list[Task], bool]:
    """The paused tasks below ``task`` through waiting ones (see the module), and whether the
    walk stopped at a bound."""
    paused: list[Task] = []
    waiting, reads = [task], 0
    while waiting:
        node = waiting.pop(0)
        if reads >= MAX_READS:
            return paused, True
        ids = [child for spawn in store.spawns.list(node.task_id) for child in spawn.children]
        reads += 1
        room = MAX_READS - reads
        reads += min(len(ids), room)
        for child in store.tasks.get_many(ids[:room]):
            if child.tenant != task.tenant or not caller.sees(child.tenant, child.user):
                continue
            if child.status is TaskStatus.PAUSED:
                paused.append(child)
                if len(paused) >= MAX_ASKED:
                    return paused, True
            elif child.status is TaskStatus.WAITING:
                waiting.append(child)
        if len(ids) > room:
            return paused, True
    return paused, False
