"""Sub-agent fan-out on the local stack: the real ASL executed by moto's Step Functions,
children run by worker processes that report through their callback tokens."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from agentq.control.submit import submit
from agentq.core import faults
from agentq.core.models import LLMStep, Task, TaskStatus, ToolsStep
from agentq.queueing.dlq import list_dead_letters
from agentq.resources import fanout_definition
from agentq.runtime import build_registry
from agentq.storage.container import Storage
from agentq_dev.stack import LocalStack

from tests.helpers import call, run_agentq, scripted, wait_for


def grandchild(i: int, j: int) -> dict[str, Any]:
    return {"goal": f"grandchild {i}.{j}", "script": {"turns": [{"text": f"fact {i}.{j}"}]}}


def child(i: int) -> dict[str, Any]:
    return {
        "goal": f"child {i}",
        "script": {
            "turns": [
                {
                    "text": f"child {i} splits",
                    "tool_calls": [call("spawn_subagents", subagents=[grandchild(i, 0), grandchild(i, 1)])],
                },
                {"text": f"child {i} summary"},
            ]
        },
    }


def _wait(store: Storage, task_id: str, timeout: float = 90) -> Task:
    deadline = time.monotonic() + timeout
    while not (task := store.tasks.get(task_id)).status.terminal:
        assert time.monotonic() < deadline, f"task still {task.status.value}"
        time.sleep(0.1)
    return task


def _tree(store: Storage, root_id: str) -> list[Task]:
    found = [store.tasks.get(root_id)]
    i = 0
    while i < len(found):
        for record in store.steps.load(found[i].task_id):
            if isinstance(record.body, ToolsStep):
                for r in record.body.results:
                    if r.name == "spawn_subagents" and not r.is_error:
                        found += store.tasks.get_many([s["task_id"] for s in json.loads(r.content)["subagents"]])
        i += 1
    return found


def _every_call(store: Storage, tree: list[Task]) -> int:
    """Usage of every LLM call in the tree: committed steps, plus calls whose worker lost its
    lease before committing (kept in the trace as orphans; they were paid for)."""
    committed = sum(
        s.body.usage.total for t in tree for s in store.steps.load(t.task_id) if isinstance(s.body, LLMStep)
    )
    return committed + sum(c.usage.total for t in tree for c in [o.call for o in store.steps.orphans(t.task_id)])


@pytest.fixture(scope="module")
def stack() -> Any:
    with LocalStack(prefix="fan", workers=2, api=False) as s:
        yield s


def test_a_two_level_tree_completes_and_the_root_ledger_equals_every_call_in_it(stack: LocalStack) -> None:
    assert stack.settings is not None
    store = stack.store()
    turns = [
        {
            "text": "fan out",
            "tool_calls": [call("spawn_subagents", subagents=[child(i) for i in range(5)], max_concurrency=3)],
        },
        {"text": "root summary"},
    ]
    root = submit(
        store,
        build_registry(stack.settings),
        scripted(turns, tools=["spawn_subagents"], max_tokens=400_000),
        tenant="t",
        queues=stack.queues(),
    )
    final = _wait(store, root.task_id)
    assert final.status is TaskStatus.SUCCEEDED and final.result == "root summary"

    steps = store.steps.load(root.task_id)
    assert [s.body.kind for s in steps] == ["llm", "tools", "llm"]
    spawn_result = json.loads(steps[1].body.results[0].content)
    assert [e["status"] for e in spawn_result["subagents"]] == ["succeeded"] * 5
    assert [e["result"] for e in spawn_result["subagents"]] == [f"child {i} summary" for i in range(5)]
    assert final.claim_count == 2  # submitted once, woken once with every result

    tree = _tree(store, root.task_id)
    assert len(tree) == 1 + 5 + 10
    assert all(t.status is TaskStatus.SUCCEEDED for t in tree)
    assert sorted(t.depth for t in tree) == [0] + [1] * 5 + [2] * 10
    assert {t.root_id for t in tree} == {root.task_id}
    assert all(t.task_token for t in tree[1:])  # every child was run by the Step Functions callback
    every_call = _every_call(store, tree)
    budget = store.budgets.get(root.task_id)
    assert budget.used == every_call
    assert budget.reserved == 0 and budget.available == budget.cap - every_call


def test_spawning_past_the_limits_is_an_error_result_not_a_silent_cap(stack: LocalStack) -> None:
    assert stack.settings is not None
    store = stack.store()
    too_wide = [{"goal": f"g{i}", "script": {"turns": [{"text": "x"}]}} for i in range(4)]
    turns = [
        {"text": "", "tool_calls": [call("spawn_subagents", subagents=too_wide)]},
        {
            "text": "",
            "tool_calls": [
                call(
                    "spawn_subagents",
                    subagents=[{"goal": "g", "token_share": 10_000_000, "script": {"turns": [{"text": "x"}]}}],
                )
            ],
        },
        {
            "text": "",
            "tool_calls": [
                call(
                    "spawn_subagents",
                    subagents=[{"goal": "g", "tools": ["python_exec"], "script": {"turns": [{"text": "x"}]}}],
                )
            ],
        },
        {"text": "gave up"},
    ]
    sub = scripted(turns, tools=["spawn_subagents"], max_tokens=50_000)
    sub.constraints.max_fanout = 3
    root = submit(store, build_registry(stack.settings), sub, tenant="t", queues=stack.queues())
    final = _wait(store, root.task_id)
    assert final.status is TaskStatus.SUCCEEDED
    errors = [s.body.results[0] for s in store.steps.load(root.task_id) if isinstance(s.body, ToolsStep)]
    assert all(e.is_error for e in errors)
    assert "4 sub-agents requested, max_fanout is 3" in errors[0].content
    assert "token shares total 10000000" in errors[1].content
    assert "asks for tool 'python_exec'" in errors[2].content
    assert store.budgets.get(root.task_id).reserved == 0


def test_depth_past_max_depth_is_refused(stack: LocalStack) -> None:
    assert stack.settings is not None
    store = stack.store()
    turns = [
        {
            "text": "",
            "tool_calls": [call("spawn_subagents", subagents=[{"goal": "g", "script": {"turns": [{"text": "x"}]}}])],
        },
        {"text": "alone"},
    ]
    sub = scripted(turns, tools=["spawn_subagents"])
    sub.constraints.max_depth = 0
    root = submit(store, build_registry(stack.settings), sub, tenant="t", queues=stack.queues())
    _wait(store, root.task_id)
    result = store.steps.load(root.task_id)[1].body.results[0]
    assert result.is_error and "max_depth is 0" in result.content


def test_a_child_past_its_deadline_becomes_timeout_and_a_child_over_budget_keeps_its_partial_result(
    stack: LocalStack,
) -> None:
    assert stack.settings is not None
    store = stack.store()
    slow = {
        "goal": "slow",
        "deadline_seconds": 2,
        "script": {
            "turns": [
                {"text": f"s{i}", "latency_seconds": 0.8, "tool_calls": [call("note_write", key="k", value="v")]}
                for i in range(20)
            ]
        },
    }
    greedy = {
        "goal": "greedy",
        "token_share": 2100,
        "script": {
            "turns": [
                {"text": f"thinking {i} " + "z" * 600, "tool_calls": [call("note_write", key="k", value="v" * 800)]}
                for i in range(20)
            ]
        },
    }
    quick = {"goal": "quick", "script": {"turns": [{"text": "quick answer"}]}}
    turns = [
        {"text": "", "tool_calls": [call("spawn_subagents", subagents=[slow, greedy, quick])]},
        {"text": "carried on with what it had"},
    ]
    sub = scripted(turns, tools=["spawn_subagents", "note_write"], max_tokens=100_000, max_output_tokens=16_000)
    root = submit(store, build_registry(stack.settings), sub, tenant="t", queues=stack.queues())
    final = _wait(store, root.task_id)
    assert final.status is TaskStatus.SUCCEEDED and final.result == "carried on with what it had"
    entries = json.loads(store.steps.load(root.task_id)[1].body.results[0].content)["subagents"]
    by_goal = {e["goal"]: e for e in entries}
    assert by_goal["slow"]["status"] == "timed_out" and by_goal["slow"]["result"].startswith("[timeout]")
    slow_steps = store.steps.load(by_goal["slow"]["task_id"])
    if any(isinstance(st.body, LLMStep) for st in slow_steps):  # it got going before its deadline
        assert by_goal["slow"]["result"].startswith("[timeout] partial result: s")
    assert by_goal["greedy"]["status"] == "cost_exceeded" and by_goal["greedy"]["result"].startswith("thinking")
    assert by_goal["quick"] == {**by_goal["quick"], "status": "succeeded", "result": "quick answer"}
    budget = store.budgets.get(root.task_id)
    assert budget.reserved == 0 and budget.used <= budget.cap
    greedy_budget = store.budgets.get(by_goal["greedy"]["task_id"])
    assert greedy_budget.used <= 1500  # a child never spends past its share


@pytest.mark.parametrize("point", [p for p in faults.CRASH_POINTS if "spawn" in p])
def test_a_parent_killed_mid_spawn_resumes_without_duplicating_children(stack: LocalStack, point: str) -> None:
    """SIGKILL at each point of the spawn: right after the SPAWN record (shares taken, children
    not yet written: the successor writes them), and after the children and the record are
    written (the successor starts the fan-out). A worker paused there instead and woken after
    its successor is tests/test_zombie_spawn.py."""
    import os
    import signal

    assert stack.settings is not None
    store = stack.store()
    turns = [
        {
            "text": "",
            "tool_calls": [
                call(
                    "spawn_subagents",
                    subagents=[{"goal": f"c{i}", "script": {"turns": [{"text": f"r{i}"}]}} for i in range(3)],
                )
            ],
        },
        {"text": "done"},
    ]
    root = store.tasks.create(scripted(turns, tools=["spawn_subagents"], max_tokens=30_000), tenant="t")
    proc = run_agentq(
        ["run-task", root.task_id, "--lease", "1"], env=stack.env(AGENTQ_CRASH_AT=f"{point}:1"), timeout=60
    )  # fmt: skip
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    time.sleep(1.1)
    stack.queues().send(root.task_id, "normal", tenant="t")  # its message would come back; send it now
    final = _wait(store, root.task_id)
    assert final.status is TaskStatus.SUCCEEDED
    entries = json.loads(store.steps.load(root.task_id)[1].body.results[0].content)["subagents"]
    assert [e["result"] for e in entries] == ["r0", "r1", "r2"]
    budget = store.budgets.get(root.task_id)
    tree = _tree(store, root.task_id)
    assert len(tree) == 4  # three children, created once
    assert budget.used == _every_call(store, tree) and budget.reserved == 0  # shares taken once, settled once
    del os


def test_fifty_subagents_at_once_never_push_the_root_past_its_cap(stack: LocalStack) -> None:
    """Every child tries to spend past its share, all at the same time."""
    assert stack.settings is not None
    store = stack.store()
    # Short turns (the 50 scripts travel inline in the spawn call), but a conversation that grows
    # by a tool call and its result each turn: 12 turns would need several times the 900 tokens.
    hungry = {
        "turns": [{"text": f"step {i}", "tool_calls": [call("note_write", key="k", value="v")]} for i in range(12)]
    }
    subagents = [
        {"goal": f"hungry {i}", "token_share": 900, "tools": ["note_write"], "script": hungry} for i in range(50)
    ]
    turns = [
        {"text": "", "tool_calls": [call("spawn_subagents", subagents=subagents, max_concurrency=50)]},
        {"text": "tallied"},
    ]
    sub = scripted(turns, tools=["spawn_subagents", "note_write"], max_tokens=150_000, max_output_tokens=40_000)
    sub.constraints.max_fanout = 50
    root = submit(store, build_registry(stack.settings), sub, tenant="t", queues=stack.queues())
    final = _wait(store, root.task_id, timeout=240)
    assert final.status is TaskStatus.SUCCEEDED
    tree = _tree(store, root.task_id)
    assert len(tree) == 51
    assert {t.status for t in tree[1:]} == {TaskStatus.COST_EXCEEDED}
    for child_task in tree[1:]:
        assert store.budgets.get(child_task.task_id).used <= 900
    budget = store.budgets.get(root.task_id)
    assert budget.used == _every_call(store, tree) <= budget.cap and budget.reserved == 0


def test_a_child_whose_worker_is_killed_mid_step_resumes_and_the_fan_out_completes(stack: LocalStack) -> None:
    import os
    import signal

    assert stack.settings is not None
    store = stack.store()
    # Quick turns up to the kill (at step 4), slower ones after it: the child must still be running
    # when the test sees step 4 and kills its worker, also on a busy machine.
    slowish = {
        "turns": [
            {
                "text": f"t{i}",
                "latency_seconds": 0.3 if i < 2 else 1.5,
                "tool_calls": [call("note_write", key="k", value=str(i))],
            }
            for i in range(8)
        ]
        + [{"text": "child done"}]
    }
    turns = [
        {
            "text": "",
            "tool_calls": [
                call(
                    "spawn_subagents",
                    subagents=[
                        {"goal": "victim", "script": slowish},
                        {"goal": "bystander", "script": {"turns": [{"text": "ok"}]}},
                    ],
                )
            ],
        },
        {"text": "all back"},
    ]
    root = submit(
        store,
        build_registry(stack.settings),
        scripted(turns, tools=["spawn_subagents", "note_write"], max_tokens=100_000),
        tenant="t",
        queues=stack.queues(),
    )
    deadline = time.monotonic() + 60
    while True:
        kids = _tree(store, root.task_id)[1:] or store.tasks.get_many([])
        spawn = store.spawns.list(root.task_id)
        victim = store.tasks.get(spawn[0].children[0]) if spawn and spawn[0].state == "created" else None
        if victim is not None and victim.step >= 4 and victim.lease_owner:
            break
        assert time.monotonic() < deadline
        time.sleep(0.02)
    proc = stack.worker_by_id(victim.lease_owner)
    assert proc is not None
    os.kill(proc.pid, signal.SIGKILL)
    stack.spawn_worker()  # keep two workers alive for the tests after this one
    final = _wait(store, root.task_id)
    assert final.status is TaskStatus.SUCCEEDED and final.result == "all back"
    child_final = store.tasks.get(victim.task_id)
    assert child_final.status is TaskStatus.SUCCEEDED and child_final.claim_count >= 2
    assert store.tasks.claims(victim.task_id)[-1].worker != victim.lease_owner
    assert [s.number for s in store.steps.load(victim.task_id)] == list(range(1, 18))
    del kids


def _spawn_result(store: Storage, task_id: str) -> dict[str, Any]:
    body = next(s.body for s in store.steps.load(task_id) if isinstance(s.body, ToolsStep))
    assert isinstance(body, ToolsStep)
    result: dict[str, Any] = json.loads(body.results[0].content)
    return result


def test_a_child_script_that_names_a_file_is_refused_at_spawn_and_the_model_reads_why(stack: LocalStack) -> None:
    assert stack.settings is not None
    store = stack.store()
    turns = [
        {
            "text": "",
            "tool_calls": [
                call(
                    "spawn_subagents",
                    subagents=[{"goal": "read it", "script": "/etc/passwd"}, {"goal": "fine", "script": "research"}],
                )
            ],
        },
        {"text": "did it myself"},
    ]
    root = submit(
        store,
        build_registry(stack.settings),
        scripted(turns, tools=["spawn_subagents"]),
        tenant="t",
        queues=stack.queues(),
    )
    final = _wait(store, root.task_id)
    assert final.status is TaskStatus.SUCCEEDED and final.result == "did it myself"
    body = next(s.body for s in store.steps.load(root.task_id) if isinstance(s.body, ToolsStep))
    assert isinstance(body, ToolsStep)
    outcome = body.results[0]
    assert outcome.is_error and "subagents[0].script: unknown script '/etc/passwd'" in outcome.content
    assert "built-in scripts: first_task, research" in outcome.content
    assert store.spawns.list(root.task_id) == []  # nothing created, nothing funded
    assert store.budgets.get(root.task_id).reserved == 0


def test_a_child_that_fails_deterministically_ends_failed_at_once_and_its_parent_wakes(stack: LocalStack) -> None:
    """A child stored with a script path (as spawns made them before the check above) fails to
    load it on every delivery: it ends failed on its first, and the fan-out goes on."""
    assert stack.settings is not None
    store = stack.store()
    slow = {"turns": [{"text": "a", "latency_seconds": 1.5, "tool_calls": [call("note_write", key="k", value="v")]},
                      {"text": "first done", "latency_seconds": 1.5}]}  # fmt: skip
    children = [{"goal": "first", "script": slow}, {"goal": "second", "script": {"turns": [{"text": "unreached"}]}}]
    turns = [
        {"text": "", "tool_calls": [call("spawn_subagents", subagents=children, max_concurrency=1)]},
        {"text": "parent done"},
    ]
    root = submit(
        store,
        build_registry(stack.settings),
        scripted(turns, tools=["spawn_subagents", "note_write"], max_tokens=50_000),
        tenant="t",
        queues=stack.queues(),
    )
    spawn = wait_for(lambda: next((r for r in store.spawns.list(root.task_id) if r.state == "created"), None), 60)
    second = store.tasks.get(spawn.children[1])
    assert second.status is TaskStatus.QUEUED  # its turn comes when the first has ended
    store.tasks.replace_submission(
        second.task_id, lambda s: s.model_copy(update={"script": "/etc/passwd"}), when_status=TaskStatus.QUEUED
    )
    final = _wait(store, root.task_id)
    assert final.status is TaskStatus.SUCCEEDED and final.result == "parent done"
    failed = store.tasks.get(second.task_id)
    assert failed.status is TaskStatus.FAILED and failed.claim_count == 1  # at once, not after every delivery
    assert failed.error is not None and failed.error["code"] == "invalid_script"
    assert "/etc/passwd" in failed.error["message"]
    entries = _spawn_result(store, root.task_id)["subagents"]
    assert [e["status"] for e in entries] == ["succeeded", "failed"]
    assert entries[1]["error"] == failed.error["message"]
    assert second.task_id not in [d.task_id for d in list_dead_letters(stack.queues(), store)]  # deleted: it is done


def _sqs_retries(state: dict[str, Any]) -> list[dict[str, Any]]:
    return [r for r in state.get("Retry", []) if any(e.startswith("SQS.") for e in r["ErrorEquals"])]


def test_a_fanout_retries_sqs_errors_but_never_a_childs_timeout() -> None:
    """RunChild retries only SQS's own errors (a throttle, a 5xx: its message was not sent); a
    child past its timeout (``States.Timeout``) is ``no_report`` at once, never a second run
    message. WakeParent retries whatever fails: there is nothing after it to catch it, and a
    parent whose wake is lost waits (the sweeper leaves a waiting parent alone) until an operator
    wakes it."""
    states = fanout_definition()["States"]
    run_child = states["RunChildren"]["ItemProcessor"]["States"]["RunChild"]
    assert {e for r in run_child["Retry"] for e in r["ErrorEquals"]} == {
        "SQS.AmazonSQSException",
        "SQS.SdkClientException",
    }
    assert _sqs_retries(run_child) and all(r["BackoffRate"] > 1 for r in run_child["Retry"])
    wake = states["WakeParent"]
    assert [r["ErrorEquals"] for r in wake["Retry"]] == [["States.ALL"]]
    assert all(r["BackoffRate"] > 1 and r["MaxAttempts"] >= 5 for r in wake["Retry"])


def test_a_send_sqs_refuses_once_is_tried_again_so_the_child_runs_and_the_parent_wakes(moto_server: Any) -> None:
    """The real ASL on moto's Step Functions: the child's queue and then the parent's do not
    exist at the first try (SQS refuses the send, as a throttle or a 5xx would), and each is
    made once that try has failed. The retry sends the child's run message (not a
    ``no_report``), the child's report goes through its token, and the wake reaches the parent's
    queue (the execution does not fail with the parent left waiting)."""
    from agentq.resources import provision_state_machine
    from agentq.runtime import session

    from tests.helpers import deployment

    settings = deployment(moto_server)
    aws = session(settings)
    sqs = aws.client("sqs", endpoint_url=settings.endpoint_url)
    sfn = aws.client("stepfunctions", endpoint_url=settings.endpoint_url)
    base = sqs.get_queue_url(QueueName=settings.names.queue("normal"))["QueueUrl"].rsplit("/", 1)[0]
    child_queue, parent_queue = f"{settings.names.prefix}-later-child", f"{settings.names.prefix}-later-parent"
    spawn = {
        "parent_id": "p1", "spawn_id": "s1", "children": [{"task_id": "c1", "timeout_seconds": 120}],
        "max_concurrency": 1, "tenant": "acme",
        "child_queue_url": f"{base}/{child_queue}", "parent_queue_url": f"{base}/{parent_queue}",
    }  # fmt: skip
    machine = provision_state_machine(sfn, settings.names)
    execution = sfn.start_execution(stateMachineArn=machine, input=json.dumps(spawn))["executionArn"]

    def failures() -> int:
        events = sfn.get_execution_history(executionArn=execution, maxResults=1000)["events"]
        return len([e for e in events if e["type"] == "TaskFailed"])

    def received(url: str) -> dict[str, Any] | None:
        got = sqs.receive_message(QueueUrl=url, WaitTimeSeconds=1).get("Messages", [])
        return json.loads(got[0]["Body"]) if got else None

    wait_for(lambda: failures() >= 1, 30, "RunChild's first try failing")
    child_url = sqs.create_queue(QueueName=child_queue)["QueueUrl"]
    run = wait_for(lambda: received(child_url), 30, "the child's run message, sent by a retry")
    assert (run["task_id"], run["kind"]) == ("c1", "run")
    sfn.send_task_success(taskToken=run["task_token"], output=json.dumps({"task_id": "c1", "status": "succeeded"}))
    wait_for(lambda: failures() >= 2, 30, "WakeParent's first try failing")
    parent_url = sqs.create_queue(QueueName=parent_queue)["QueueUrl"]
    wake = wait_for(lambda: received(parent_url), 30, "the parent's wake, sent by a retry")
    assert wake == {"task_id": "p1", "kind": "wake", "spawn_id": "s1"}
    done = wait_for(lambda: (d := sfn.describe_execution(executionArn=execution))["status"] != "RUNNING" and d, 30)
    assert done["status"] == "SUCCEEDED"
    events = sfn.get_execution_history(executionArn=execution, maxResults=1000)["events"]
    entered = [e.get("stateEnteredEventDetails", {}).get("name") for e in events]
    assert "ChildDidNotReport" not in entered  # the child reported through its token: not given up
