"""A cancel of a tree on the local stack (real Step Functions on moto, worker processes): it
reaches every task of the tree, also one a running child spawns while the cancel runs, and the
tree's ledger closes: every budget's ``reserved`` back to 0 and the root's ``used`` equal to every
call the tree made."""

from __future__ import annotations

from typing import Any

import pytest

from agentq.control import operations, subtrees
from agentq.control.submit import submit
from agentq.core.models import Task
from agentq.runtime import build_fanout, build_registry
from agentq.storage.container import Storage
from agentq_dev.stack import LocalStack

from tests.helpers import call, scripted, wait_for
from tests.tree_ledger import ledger_closed, status_of, wait_until_closed

SUBTREE = subtrees.subtree  # as it is, whatever a test patches


@pytest.fixture(scope="module")
def stack() -> Any:
    with LocalStack(prefix="cst", workers=2, api=False) as s:
        yield s


def test_a_cancel_of_the_root_cancels_the_children_a_running_child_spawned_while_the_cancel_ran(
    stack: LocalStack, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The cancel reads the tree (root and child) while the child is in its first turn; before
    it moves anything, the child makes its spawn and its fan-out starts the grandchildren (the
    cancel's first read is held until then: a cancel of a wide tree takes that long). The
    grandchildren must end ``cancelled`` too, and the tree's ledger close: they ran on after the
    root was cancelled, and the child kept their shares reserved for good."""
    assert stack.settings is not None
    store = stack.store()
    slow = {
        "turns": [
            {"text": f"g{i}", "latency_seconds": 1.0, "tool_calls": [call("note_write", key="k", value="v")]}
            for i in range(6)
        ]
        + [{"text": "grandchild done"}]
    }
    child = {
        "goal": "thinks, then splits",
        "script": {
            "turns": [
                {
                    "text": "split",
                    "latency_seconds": 2.0,
                    "tool_calls": [
                        call("spawn_subagents", subagents=[{"goal": f"gc{j}", "tools": ["note_write"], "script": slow}
                                                           for j in range(2)])
                    ],
                },
                {"text": "child done"},
            ]
        },
    }  # fmt: skip
    turns = [
        {"text": "", "tool_calls": [call("spawn_subagents", subagents=[child])]},
        {"text": "root done"},
    ]
    sub = scripted(turns, tools=["spawn_subagents", "note_write"], max_tokens=60_000)
    root = submit(store, build_registry(stack.settings), sub, tenant="t", queues=stack.queues())
    child_id = wait_for(
        lambda: (s := store.spawns.list(root.task_id)) and s[0].children[0], timeout=60, what="the root's spawn"
    )
    wait_for(lambda: status_of(store, child_id) == "running", timeout=60, what="the child running")
    reads: list[int] = []

    def first_read_held(store_: Storage, task: Task) -> list[Task]:
        tree = SUBTREE(store_, task)
        if not reads:  # the first read, made while the child is still in its first turn
            wait_for(lambda: any(s.execution_arn for s in store.spawns.list(child_id)), timeout=60,
                     what="the child's fan-out started")  # fmt: skip
        reads.append(len(tree))
        return tree

    monkeypatch.setattr(subtrees, "subtree", first_read_held)
    cancelled = operations.cancel(
        store, root.task_id, tenant="t", fanout=build_fanout(stack.settings), queues=stack.queues()
    )
    assert reads[0] == 2, "the first read was made before the child's spawn"
    grandchildren = store.spawns.list(child_id)[0].children
    assert set(cancelled) == {root.task_id, child_id, *grandchildren}, ledger_closed(store, root.task_id, 4)[1]
    wait_until_closed(store, root.task_id, 4)
    assert {status_of(store, g) for g in grandchildren} == {"cancelled"}


def test_a_cancel_while_children_are_mid_call_closes_every_budget_once_their_answers_come(stack: LocalStack) -> None:
    """The root is cancelled while its three children's calls are in flight; the calls answer
    after the cancel, their workers' commits are refused and their usage settled as orphans.
    In the end no budget holds anything and the root's ledger is every call, none unknown."""
    assert stack.settings is not None
    store = stack.store()
    slow = {"turns": [{"text": "late answer", "latency_seconds": 3.0, "tool_calls": [call("note_write", key="k",
                                                                                          value="v")]},
                      {"text": "never"}]}  # fmt: skip
    turns = [
        {"text": "", "tool_calls": [call("spawn_subagents", subagents=[
            {"goal": f"c{i}", "tools": ["note_write"], "script": slow} for i in range(3)])]},
        {"text": "root done"},
    ]  # fmt: skip
    sub = scripted(turns, tools=["spawn_subagents", "note_write"], max_tokens=60_000)
    root = submit(store, build_registry(stack.settings), sub, tenant="t", queues=stack.queues())
    children = wait_for(lambda: (s := store.spawns.list(root.task_id)) and s[0].children, timeout=60, what="spawn")
    wait_for(lambda: all(c.inflight is not None for c in store.tasks.get_many(children)), timeout=60,
             what="every child's call in flight")  # fmt: skip
    operations.cancel(store, root.task_id, tenant="t", fanout=build_fanout(stack.settings), queues=stack.queues())
    wait_until_closed(store, root.task_id, 4)
    assert {t.status.value for t in SUBTREE(store, store.tasks.get(root.task_id))} == {"cancelled"}
    assert store.budgets.get(root.task_id).unknown == 0
