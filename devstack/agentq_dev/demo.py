"""``agentq demo`` and ``agentq run``: the whole system on the embedded local stack.

The demo submits the scripted research agent through the HTTP API, lets the queue-fed
workers run it, SIGKILLs the worker holding it mid-task, and shows another worker resume at
the same step: the surviving one, or the replacement the stack starts for the killed one
(whichever receives the task's message first once it is visible again). It prints the step
timeline, the resume latency, the ledger and the number of times the side-effecting tool
really ran.
"""

from __future__ import annotations

import json
import os
import signal
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from agentq.core.models import CompactStep, GradeStep, LLMStep, MessageStep, StepRecord, Task
from agentq.core.records import ClaimRecord
from agentq_dev.stack import DEFAULT_TOOL_MODULES, LocalStack

DEMO_TOOLS = ["python_exec", "note_write", "note_read", "send_report"]


def _post(url: str, body: dict[str, Any]) -> dict[str, Any]:
    req = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}, method="POST"
    )
    with urllib.request.urlopen(req, timeout=30) as resp:
        return json.loads(resp.read())  # type: ignore[no-any-return]


def _get(url: str) -> dict[str, Any]:
    with urllib.request.urlopen(url, timeout=30) as resp:
        return json.loads(resp.read())  # type: ignore[no-any-return]


def _describe(record: StepRecord) -> str:
    body = record.body
    if isinstance(body, LLMStep):
        calls = ", ".join(u["name"] for u in body.tool_uses()) or "final answer"
        return f"llm   {calls:<26} in={body.usage.input_tokens:>5} out={body.usage.output_tokens:>4}"
    if isinstance(body, CompactStep):
        return f"compact summary of steps 1-{body.summarised_through} in={body.usage.input_tokens:>5}"
    if isinstance(body, MessageStep):
        return f"message {len(body.messages)} from a person"
    if isinstance(body, GradeStep):
        return f"grade {body.score} (bar {body.bar}) attempt {body.attempt}: {'passed' if body.passed else 'below'}"
    return "tools " + ", ".join(f"{r.name}:{r.status}" for r in body.results)


def print_timeline(task: Task, steps: list[StepRecord], claims: list[ClaimRecord]) -> None:
    workers = {claim.epoch: claim.worker for claim in claims}
    print(f"{'step':>4}  {'t+':>7}  {'worker':<18} what")
    for record in steps:
        who = f"{workers.get(record.epoch, '?')} (e{record.epoch})"
        print(f"{record.number:>4}  {record.committed_at - task.created_at:>6.2f}s  {who:<18} {_describe(record)}")


def _wait_for_end(api: str, task_id: str, timeout: float = 300) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        view = _get(f"{api}/tasks/{task_id}")
        if view["status"] in ("succeeded", "failed", "cancelled", "cost_exceeded", "timed_out"):
            return view
        time.sleep(0.1)
    raise TimeoutError(f"task {task_id} did not finish in {timeout}s")


def run_demo(*, kill_at_step: int = 6) -> int:
    outbox = Path(tempfile.mkdtemp(prefix="agentq-demo-")) / "outbox.jsonl"
    print(
        "agentq demo: starting the local stack (moto server, table, bucket, 3 tier queues + DLQs, 2 workers, API) ..."
    )
    with LocalStack(
        prefix="agentq-demo", workers=2, extra_env={"AGENTQ_OUTBOX": str(outbox)}, supervise=True, announce=print
    ) as stack:
        assert stack.api_server is not None
        api = stack.api_server.url
        store = stack.store()
        c = stack.worker_config
        started = {p.pid for p in stack.processes}
        print(
            f"  API {api}; workers {sorted(started)}; lease {c.lease_seconds:.0f}s, "
            f"heartbeat {c.heartbeat_seconds:.0f}s, visibility {c.visibility_seconds}s\n"
        )
        created = _post(
            f"{api}/tasks",
            {
                "goal": "Analyse our monthly signups for the last year, project next quarter, and send the team a report.",
                "provider": "scripted",
                "script": "research",
                "priority": "high",
                "constraints": {"max_tokens": 60_000, "max_steps": 20, "timeout_seconds": 600, "tools": DEMO_TOOLS},
            },
        )
        task_id = created["task_id"]
        print(f"POST /tasks -> 202 {task_id}")
        killed_at: float | None = None
        victim = None
        while kill_at_step:
            task = store.tasks.get(task_id)
            if task.status.terminal:
                break
            if task.step >= kill_at_step and task.lease_owner:
                victim = stack.worker_by_id(task.lease_owner)
                if victim is not None:
                    os.kill(victim.pid, signal.SIGKILL)
                    killed_at = time.time()
                    print(f"SIGKILL worker {victim.pid} while it holds the task (step {task.step} committed)")
                    break
            time.sleep(0.02)
        view = _wait_for_end(api, task_id)
        task = store.tasks.get(task_id)
        steps = store.steps.load(task_id)
        print()
        claims = store.tasks.claims(task_id)
        print_timeline(task, steps, claims)
        if killed_at is not None and len(claims) > 1:
            resumed = claims[-1]
            pid = int(resumed.worker.rsplit(":", 1)[-1])
            who = "the surviving worker" if pid in started else "the replacement worker"
            print(
                f"\nresumed by {resumed.worker} ({who}) {resumed.at - killed_at:.2f}s after the kill, "
                f"at step {next(s.number for s in steps if s.epoch == resumed.epoch)} "
                f"(pickup latency at submit: {task.pickup_latency:.3f}s)"
            )
        budget = store.budgets.get(task.root_id)
        deliveries = outbox.read_text().splitlines() if outbox.exists() else []
        print(f"\nstatus: {view['status']}   steps: {task.step}   workers that ran it: {len(claims)}")
        print(
            f"tokens: in {task.tokens_in}, out {task.tokens_out}; budget used {budget.used}/{budget.cap}; cost ${budget.cost_usd:.4f}"
        )
        print(f"send_report deliveries: {len(deliveries)} (a side effect runs at most once)")
        print("\nresult:\n" + (task.result or "(none)"))
        return 0 if view["status"] == "succeeded" and len(deliveries) == 1 else 1


def run_goal(
    goal: str,
    *,
    model: str,
    max_tokens: int,
    tool_modules: tuple[str, ...] = (),
    system: str | None = None,
    script: str | dict[str, Any] | None = None,
) -> int:
    """One goal on the local stack: played by ``script`` (the scripted provider) when one is
    given, else Anthropic when a key is set, else the scripted research agent. The agent gets
    the built-in tools and every tool of ``tool_modules`` (yours)."""
    from agentq.tool_modules import load_tool_modules

    yours = [spec.name for spec in load_tool_modules(tool_modules)]
    if script is not None:  # the caller has said which script plays the goal
        submission: dict[str, Any] = {"goal": goal, "provider": "scripted", "script": script}
    elif os.environ.get("ANTHROPIC_API_KEY"):
        submission = {"goal": goal, "provider": "anthropic", "model": model}
        print(f"using Anthropic ({model})")
    else:
        submission = {"goal": goal, "provider": "scripted", "script": "research"}
        print("ANTHROPIC_API_KEY is not set: running the scripted research agent instead")
    if system:
        submission["system"] = system
    tools = ["python_exec", "http_fetch", "note_write", "note_read", *yours]
    if submission["provider"] == "scripted":
        tools.append("send_report")
    submission["constraints"] = {"max_tokens": max_tokens, "tools": list(dict.fromkeys(tools))}
    with LocalStack(
        prefix="agentq-run",
        workers=1,
        tool_modules=(*DEFAULT_TOOL_MODULES, *tool_modules),
        extra_env={k: v for k, v in os.environ.items() if k.startswith("ANTHROPIC_")},
    ) as stack:
        assert stack.api_server is not None
        task_id = _post(f"{stack.api_server.url}/tasks", submission)["task_id"]
        view = _wait_for_end(stack.api_server.url, task_id, timeout=3600)
        store = stack.store()
        print_timeline(store.tasks.get(task_id), store.steps.load(task_id), store.tasks.claims(task_id))
        print(f"\nstatus: {view['status']}\n\n{view.get('result') or view.get('error')}")
        return 0 if view["status"] == "succeeded" else 1
