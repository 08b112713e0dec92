"""A sub-agent its parent's fan-out gave up on (its deadline passed) ends with everything under
it, on the local stack (real Step Functions on moto, worker processes): its own sub-agents are
stopped, their budgets folded into it, and the tree's ledger closes, as a cancel's does."""

from __future__ import annotations

import json
from typing import Any

import pytest

from agentq.control.submit import submit
from agentq.control.subtrees import subtree
from agentq.core.models import TaskStatus
from agentq.runtime import build_registry
from agentq_dev.stack import LocalStack

from tests.helpers import call, scripted, wait_for
from tests.tree_ledger import ledger_closed, wait_until_closed


@pytest.fixture(scope="module")
def stack() -> Any:
    with LocalStack(prefix="tos", workers=2, api=False) as s:
        yield s


@pytest.mark.parametrize("share", [None, 20_000], ids=["default_share", "a_third_of_the_budget"])
def test_a_child_timed_out_while_its_own_children_run_ends_them_and_the_tree_ledger_closes(
    stack: LocalStack, share: int | None
) -> None:
    """The child (deadline 6 s) runs its two children one after the other (max_concurrency 1),
    each some 4 s of turns: one at least is still running or waiting to when the root's fan-out
    gives up on the child. The root's run ends the child ``timed_out`` and folds its budget;
    what the child started must end with it (``cancelled``, ``ancestor_timed_out``) and be
    folded into it first. It used to run on, the child's ``reserved`` never came back to 0, and
    the root was charged the grandchildren's whole shares as unknown: with the even split
    (``default_share``) that was the root's whole cap, and its next call waited on the unknown
    until the root's own timeout."""
    assert stack.settings is not None
    store = stack.store()
    slow = {
        "turns": [
            {"text": f"g{i}", "latency_seconds": 1.0, "tool_calls": [call("note_write", key="k", value="v")]}
            for i in range(4)
        ]
        + [{"text": "grandchild done"}]
    }
    child = {
        "goal": "splits and waits",
        "deadline_seconds": 6,
        **({"token_share": share} if share else {}),
        "script": {
            "turns": [
                {
                    "text": "split",
                    "tool_calls": [
                        call("spawn_subagents", subagents=[{"goal": f"gc{j}", "tools": ["note_write"], "script": slow}
                                                           for j in range(2)], max_concurrency=1)
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
    try:
        final = wait_for(lambda: (t := store.tasks.get(root.task_id)).status.terminal and t, timeout=90,
                         what="the root's end")  # fmt: skip
    except AssertionError as exc:
        raise AssertionError(f"{exc}: {ledger_closed(store, root.task_id, 4)[1]}") from None
    assert final.status is TaskStatus.SUCCEEDED and final.result == "root done", final.error
    wait_until_closed(store, root.task_id, 4)
    _, child_task, *grandchildren = subtree(store, store.tasks.get(root.task_id))
    assert child_task.status is TaskStatus.TIMED_OUT
    # Each grandchild finished its work (before the timeout, or as it was being ended), or was
    # ended by it; the two together take 8 s of turns, 6 s of deadline: one at least was ended.
    ends = [
        (gc.status.value, (gc.error or {}).get("code"), (gc.error or {}).get("message", "")) for gc in grandchildren
    ]
    assert all(end[0] == "succeeded" or end[:2] == ("cancelled", "ancestor_timed_out") for end in ends), ends
    assert any(end[0] == "cancelled" and child_task.task_id in end[2] for end in ends), ends


def test_a_child_still_queued_at_its_deadline_ends_timed_out_and_never_runs(stack: LocalStack) -> None:
    """A tenant limited to one running task: the root's two children (each one 8 s call, 4 s
    of deadline) are started at once, and whichever is admitted first runs while the other is
    parked (queued) behind it; both deadlines pass and the root is told both timed out. The
    parked one must end ``timed_out`` then and there and never run: ``queued -> timed_out`` was
    no legal move, so the spawn turn's move failed, it told the parent ``timed_out`` all the
    same and folded the child's budget, and the child ran after its parent had ended
    (``cost_exceeded``, its share gone), holding the tenant's slot meanwhile."""
    assert stack.settings is not None
    store = stack.store()
    store.slots.set_limit("solo", 1)
    slow = {"deadline_seconds": 4, "script": {"turns": [{"text": "s", "latency_seconds": 8.0}]}}
    turns = [
        {"text": "", "tool_calls": [call("spawn_subagents", subagents=[{"goal": g, **slow} for g in ("a", "b")])]},
        {"text": "root done"},
    ]
    sub = scripted(turns, tools=["spawn_subagents"], max_tokens=30_000)
    root = submit(store, build_registry(stack.settings), sub, tenant="solo", queues=stack.queues())
    wait_for(lambda: store.tasks.get(root.task_id).status.terminal, timeout=120, what="the root's end")

    def settled() -> bool:
        """The tenant runs nothing, and no message is waiting or being handled: what the root's
        end set off (its slot freed, the parked child woken) is done."""
        attrs = stack.queues().sqs.get_queue_attributes(
            QueueUrl=stack.queues().url("normal"),
            AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"],
        )["Attributes"]
        return store.slots.usage("solo").running == 0 and not any(int(v) for v in attrs.values())

    wait_for(settled, timeout=60, what="the tenant's slot free and every message handled")
    kids = store.tasks.get_many(store.spawns.list(root.task_id)[0].children)
    told = next(s for s in store.steps.load(root.task_id) if s.body.kind == "tools").body.results[0].content
    assert [e["status"] for e in json.loads(told)["subagents"]] == ["timed_out", "timed_out"]
    seen = sorted((c.claim_count, c.status.value, (c.error or {}).get("code")) for c in kids)
    assert seen == [(0, "timed_out", "timeout"), (1, "timed_out", "timeout")], (
        f"the parent was told 'timed_out': {seen}"
    )
    assert all(store.budgets.get(c.task_id).reserved == 0 for c in kids)
