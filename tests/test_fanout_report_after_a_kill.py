"""A child's end reaches its parent's fan-out even when the worker that ran the child dies
between the child's end and its report: the child's message comes back to another worker,
which finds the child ended and reports it (``dispatch._ended``). The parent is woken once and
reads each child's result once; its budget closes."""

from __future__ import annotations

import json
import os

from agentq.control.submit import submit
from agentq.core.models import ToolsStep
from agentq.runtime import build_registry
from agentq_dev.stack import LocalStack

from tests.helpers import call, scripted, wait_for


def test_a_childs_end_reaches_its_parent_once_when_its_worker_dies_before_reporting_it() -> None:
    turns = [
        {"text": "", "tool_calls": [call("spawn_subagents", subagents=[
            {"goal": f"c{i}", "script": {"turns": [{"text": f"r{i}"}]}} for i in range(2)])]},
        {"text": "done"},
    ]  # fmt: skip
    with LocalStack(prefix=f"frk{os.getpid() % 10000}", workers=0, api=False) as stack:
        assert stack.settings is not None
        store = stack.store()
        doomed = stack.spawn_worker(
            PYTHONPATH=os.pathsep.join(filter(None, [os.getcwd(), os.environ.get("PYTHONPATH", "")])),
            AGENTQ_TOOL_MODULES=",".join([*stack.settings.tool_modules, "tests.kill_at_child_report"]),
            AGENTQ_TEST_KILL_AT_CHILD_REPORT="1",
        )
        sub = scripted(turns, tools=["spawn_subagents"], max_tokens=30_000)
        root = submit(store, build_registry(stack.settings), sub, tenant="t", queues=stack.queues())
        wait_for(lambda: doomed.poll() is not None, timeout=90, what="the worker killed at a child's report")
        stack.spawn_worker()
        final = wait_for(lambda: (t := store.tasks.get(root.task_id)).status.terminal and t, timeout=120,
                         what="the root's end")  # fmt: skip
        assert final.status.value == "succeeded" and final.claim_count == 2
        tools_steps = [s for s in store.steps.load(root.task_id) if isinstance(s.body, ToolsStep)]
        assert len(tools_steps) == 1
        entries = json.loads(tools_steps[0].body.results[0].content)["subagents"]
        assert [(e["status"], e["result"]) for e in entries] == [("succeeded", "r0"), ("succeeded", "r1")]
        assert store.budgets.get(root.task_id).reserved == 0
