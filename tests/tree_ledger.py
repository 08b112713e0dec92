"""What a test of a tree's ending waits for: the tree's ledger closed (every task ended, nothing
left reserved on any budget, the root's ``used`` equal to every call the tree made), and what
the tree looks like when it is not."""

from __future__ import annotations

from agentq.control.subtrees import subtree
from agentq.core.errors import TaskNotFound
from agentq.storage.container import Storage

from tests.helpers import wait_for
from tests.test_fanout import _every_call


def ledger_closed(store: Storage, root_id: str, size: int) -> tuple[bool, str]:
    """Whether the tree under ``root_id`` has its ``size`` tasks, each ended with nothing left
    reserved, and the root's ``used`` equal to every call of the tree; and what it is now."""
    tree = subtree(store, store.tasks.get(root_id))
    budgets = {t.task_id: store.budgets.get(t.task_id) for t in tree}
    every_call, root = _every_call(store, tree), budgets[root_id]
    closed = (
        len(tree) == size
        and all(t.status.terminal and budgets[t.task_id].reserved == 0 for t in tree)
        and root.used == every_call
    )
    said = "; ".join(
        f"{t.submission.goal}: {t.status.value}, reserved {budgets[t.task_id].reserved}, used {budgets[t.task_id].used}"
        f", unknown {budgets[t.task_id].unknown}"
        for t in tree
    )
    return closed, f"{said}; every call of the tree {every_call}"


def wait_until_closed(store: Storage, root_id: str, size: int, timeout: float = 120) -> None:
    """Wait for ``ledger_closed``; fail saying what the tree looks like."""
    try:
        wait_for(lambda: ledger_closed(store, root_id, size)[0], timeout=timeout, what="the tree's ledger closed")
    except AssertionError as exc:
        raise AssertionError(f"{exc}: {ledger_closed(store, root_id, size)[1]}") from None


def status_of(store: Storage, task_id: str) -> str | None:
    """The task's status, None while it is listed on its parent's SPAWN record but not written."""
    try:
        return store.tasks.get(task_id).status.value
    except TaskNotFound:
        return None
