"""``agentq demo``: the whole durability story in one run on an embedded AWS.

Starts moto in server mode, provisions the table and bucket, submits the scripted research
agent, runs it in a worker process, SIGKILLs that worker mid-task, and lets a second worker
take over from the last committed step. Prints the step timeline, the result, the ledger
and how many times the side-effecting tool really ran.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from agentq.local.moto_server import LOCAL_CREDENTIALS, MotoServer
from agentq.models import LLMStep, StepRecord, TaskSubmission
from agentq.resources import ResourceNames, provision
from agentq.runtime import Settings, build_registry, build_store, session
from agentq.submit import submit

DEMO_TOOLS = ["python_exec", "note_write", "note_read", "send_report"]


def _spawn_worker(task_id: str, env: dict[str, str], lease: float, wait: float) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "agentq", "run-task", task_id, "--lease", str(lease), "--wait", str(wait)],
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )


def _describe(record: StepRecord) -> str:
    body = record.body
    if isinstance(body, LLMStep):
        calls = ", ".join(u["name"] for u in body.tool_uses()) or "final answer"
        return f"llm    -> {calls:<28} in={body.usage.input_tokens:>5} out={body.usage.output_tokens:>4}"
    names = ", ".join(f"{r.name}:{r.status}" for r in body.results)
    return f"tools  -> {names}"


def run_demo(*, kill_at_step: int = 6, lease_seconds: float = 2.0) -> int:
    for key, value in LOCAL_CREDENTIALS.items():
        os.environ.setdefault(key, value)
    workdir = Path(tempfile.mkdtemp(prefix="agentq-demo-"))
    outbox = workdir / "outbox.jsonl"
    print("agentq demo: starting an embedded AWS (moto server) ...")
    with MotoServer() as aws:
        names = ResourceNames.for_prefix("agentq-demo")
        settings = Settings(
            table=names.table, bucket=names.bucket, endpoint_url=aws.endpoint_url, tool_modules=("agentq.examples",)
        )
        provision(session(settings), names, endpoint_url=aws.endpoint_url)
        print(f"  moto on {aws.endpoint_url}: table {names.table}, bucket {names.bucket}")
        store = build_store(settings)
        submission = TaskSubmission.model_validate(
            {
                "goal": "Analyse our monthly signups for the last year, project next quarter, and send the team a report.",
                "provider": "scripted",
                "script": "research",
                "constraints": {"max_tokens": 60_000, "max_steps": 20, "timeout_seconds": 600, "tools": DEMO_TOOLS},
            }
        )
        task = submit(store, build_registry(settings), submission, tenant="demo")
        print(f"  submitted task {task.task_id} (scripted research agent, budget 60,000 tokens)\n")

        env = {**os.environ, **settings.env(), "AGENTQ_OUTBOX": str(outbox)}
        first = _spawn_worker(task.task_id, env, lease_seconds, wait=0)
        print(f"worker A (pid {first.pid}) running ...")
        killed_at: float | None = None
        while first.poll() is None:
            step = store.get_task(task.task_id).step
            if kill_at_step and step >= kill_at_step:
                os.kill(first.pid, signal.SIGKILL)
                first.wait()
                killed_at = time.time()
                print(f"worker A SIGKILLed after step {step} was committed")
                break
            time.sleep(0.05)
        if killed_at is not None:
            second = _spawn_worker(task.task_id, env, lease_seconds, wait=60)
            print(f"worker B (pid {second.pid}) waiting for A's lease ({lease_seconds:.0f}s) to lapse ...")
            out, _ = second.communicate(timeout=300)
            report = json.loads(out.strip().splitlines()[-1])
            print(f"worker B resumed from step {report['resumed_from_step']} and committed {report['steps_committed']} more\n")
        else:
            first.communicate(timeout=300)

        final = store.get_task(task.task_id)
        steps = store.load_steps(task.task_id)
        print("step  epoch  committed   what")
        t0 = final.created_at
        for record in steps:
            print(f"{record.number:>4}  {record.epoch:>5}  {record.committed_at - t0:>8.2f}s  {_describe(record)}")
        claims = final.claims
        if killed_at is not None and len(claims) > 1:
            print(f"\nresume latency (kill -> claim by worker B): {claims[-1]['at'] - killed_at:.2f}s "
                  f"(lease {lease_seconds:.0f}s; queue-driven resume arrives with the executor issue)")
        budget = store.get_budget(task.root_id)
        print(f"\nstatus: {final.status.value}")
        print(f"tokens: in {final.tokens_in}, out {final.tokens_out}; root budget used {budget.used}/{budget.cap}, cost ${budget.cost_usd:.4f}")
        deliveries = outbox.read_text().splitlines() if outbox.exists() else []
        print(f"send_report deliveries: {len(deliveries)} (side effects run at most once)")
        print("\nresult:\n" + (final.result or "(none)"))
        return 0 if final.status.value == "succeeded" and len(deliveries) == 1 else 1
