"""What a policy check adds to each call the engine makes: its latency and its AWS calls.

    python bench/policy_latency.py                      # 0, 1, 10 and 100 rules, 2,000 checks each
    python bench/policy_latency.py --rules 100 --checks 500 --json

Each scenario stores a tenant's rules (``N`` rules of the shapes docs/POLICIES.md walks through:
a tool's argument compared, a tool that must have run ok first, a cap on the task's spend, an
agent's model) in DynamoDB on moto server through ``storage.policies``, then times
``core.engine._policy.PolicyGate.check`` (what the engine runs before each call) on a session of
a task with 20 committed tool calls, and counts every DynamoDB call it makes (botocore's
``before-call`` events on the store's client):

- ``cached``: the engine's default (a tenant's documents reused for 5 s): the steady state;
- ``read each check``: ``AGENTQ_POLICY_CACHE_SECONDS=0``, a Query at every check (moto's
  latency, on this machine, is in it);
- ``tree rule``: one rule more, over the tree's spend: a GetItem of the root's budget each check.

Latency is the wall time of one check (the Cedar evaluation, the request built from the session,
and the read when there is one), p50 and p99 over ``--checks``, beside the checking thread's CPU
time (``thread_time``): on a loaded machine the wall-clock tail is mostly waits for a core. The target: p99 <= 5 ms with
100 rules, cached.
"""

from __future__ import annotations

import argparse
import collections
import os
import time
import uuid
from typing import Any

from _benchlib import JsonOut, log, machine, summary, table
from _plot import Panel, add_plot_args, plot_from_args
from agentq.core.engine._policy import PolicyGate
from agentq.core.engine._session import LeaseState, Session
from agentq.core.models import Lease, StepRecord, TaskSubmission, ToolOutcome, ToolsStep
from agentq.core.policies import PolicyCall, check
from agentq.resources import QueueSettings, provision
from agentq.runtime import Settings, build_store, session
from agentq.storage.container import Storage
from agentq_dev.moto_server import LOCAL_CREDENTIALS, MotoServer

TENANT = "bench"
SUBMISSION = TaskSubmission.model_validate(
    {"goal": "check calls", "provider": "scripted", "script": {"turns": [{"text": "x"}]}, "agent": "payments@3"}
)
TOOLS = ("refund", "charge_card", "lookup", "http_fetch", "send_email")


def rules(n: int, tree: bool = False) -> str:
    """``n`` rules cycling through four shapes, each on its own tool and threshold."""
    out: list[str] = []
    for i in range(n):
        tool = f"{TOOLS[i % len(TOOLS)]}_{i}" if i >= len(TOOLS) else TOOLS[i]
        shape = i % 4
        if shape == 0:
            body = f'resource == Tool::"{tool}") when {{ context.args has amount && context.args.amount > {100 + i} }};'
        elif shape == 1:
            body = f'resource == Tool::"{tool}") unless {{ context.history.ok_tools.contains("fraud_check") }};'
        elif shape == 2:
            body = f"resource) when {{ context.history.task_spend_micros > {5_000_000 + i} }};"
        else:
            body = f'resource) when {{ context.agent == "other-{i}" && context.call.kind == "tool" }};'
        out.append(f'@id("r{i}") @message("rule {i}")\nforbid(principal, action == Action::"tool", {body}')
    if tree:
        out.append(
            '@id("tree") forbid(principal, action, resource) when { context.history.tree_spend_micros > 9000000 };'
        )
    return "\n".join(out)


class Calls:
    def __init__(self, client: Any) -> None:
        self.counts: collections.Counter[str] = collections.Counter()
        client.meta.events.register("before-call.*.*", self._count, unique_id=f"policy-calls-{id(client)}")

    def _count(self, model: Any, **_: Any) -> None:
        self.counts[f"{model.service_model.service_id.hyphenize()}:{model.name}"] += 1


def task_session(store: Storage, tenant: str) -> Session:
    task = store.tasks.create(SUBMISSION, tenant=tenant)
    results = [
        ToolOutcome(tool_use_id=f"u{i}", name=TOOLS[i % len(TOOLS)], content="ok", started_at=0.0, duration_ms=1)
        for i in range(20)
    ]
    steps = [StepRecord(task_id=task.task_id, number=2, epoch=1, committed_at=0.0, body=ToolsStep(results=results))]
    lease = Lease(task_id=task.task_id, owner="bench", epoch=1, expires_at=time.time() + 3600)
    return Session(LeaseState(lease), task, steps, [], None)


def measure(store: Storage, calls: Calls, n: int, scenario: str, checks: int) -> dict[str, Any]:
    tenant = f"{TENANT}-{uuid.uuid4().hex[:8]}"
    text = rules(n, tree=scenario == "tree rule")
    if text:
        store.policies.put(tenant, "tenant", text, check(text).digest)
    gate = PolicyGate(store.policies, store.budgets, cache_seconds=0.0 if scenario == "read each check" else 5.0)
    s = task_session(store, tenant)
    call = PolicyCall("tool", tool="refund", args={"amount": 50, "reason": "late"}, model="m")
    gate.check(s, call)  # the first read and compile, as a worker's first call of the tenant pays
    calls.counts.clear()
    times: list[float] = []
    cpu: list[float] = []
    verdicts: collections.Counter[str] = collections.Counter()
    for _ in range(checks):
        started, started_cpu = time.perf_counter(), time.thread_time()
        verdict = gate.check(s, call)
        cpu.append((time.thread_time() - started_cpu) * 1000)
        times.append((time.perf_counter() - started) * 1000)
        verdicts[verdict.effect] += 1
    per_check = {op: round(count / checks, 3) for op, count in sorted(calls.counts.items())}
    return {"rules": n + (scenario == "tree rule"), "scenario": scenario, "checks": checks,
            "latency_ms": summary(times), "cpu_ms": summary(cpu), "aws_calls_per_check": per_check, "verdicts": dict(verdicts)}  # fmt: skip


def render(result: dict[str, Any]) -> str:
    m = result["machine"]
    rows = [
        [r["scenario"], r["rules"], f"{r['latency_ms']['p50']:.3f}", f"{r['latency_ms']['p99']:.3f}",
         f"{r['cpu_ms']['p50']:.3f}", f"{r['cpu_ms']['p99']:.3f}",
         ", ".join(f"{op} {v:g}" for op, v in r["aws_calls_per_check"].items()) or "0"]
        for r in result["rows"]
    ]  # fmt: skip
    return "\n".join(
        [
            "agentq policy checks: latency added per call and AWS calls per check (DynamoDB on moto server)",
            f"code: git {m['git_head']} + {m['core_uncommitted_files']} uncommitted file(s) under layers/",
            "",
            f"load average {result['load'][0]:.1f} on {os.cpu_count()} cores (the wall-clock tail includes waits for a core; "
            "the CPU time of the checking thread does not)",
            "",
            table(["scenario", "rules", "p50 ms", "p99 ms", "cpu p50 ms", "cpu p99 ms", "AWS calls per check"], rows),
        ]
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rules", default="0,1,10,100", help="rule counts (the cached scenario)")
    parser.add_argument("--checks", type=int, default=2000, help="checks timed per scenario")
    parser.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    add_plot_args(parser, "policy_latency")
    args = parser.parse_args()
    counts = [int(n) for n in args.rules.split(",")]
    for key, value in LOCAL_CREDENTIALS.items():
        os.environ.setdefault(key, value)
    with JsonOut(args.json) as out, MotoServer() as server:
        settings = Settings.for_prefix(f"bpol{uuid.uuid4().hex[:8]}", server.endpoint_url)
        provision(session(settings), settings.names, endpoint_url=settings.endpoint_url, queues=QueueSettings())
        store = build_store(settings)
        calls = Calls(store.table.client)  # type: ignore[attr-defined]
        rows = []
        for n in counts:
            log(f"[{n} rules, cached] ...")
            rows.append(measure(store, calls, n, "cached", args.checks))
        top = max(counts)
        for scenario in ("read each check", "tree rule"):
            log(f"[{top} rules, {scenario}] ...")
            rows.append(measure(store, calls, top, scenario, max(1, args.checks // 10)))
        result = {"machine": machine(), "load": os.getloadavg(), "rows": rows}
        cached = [r for r in rows if r["scenario"] == "cached"]
        panel = Panel(
            "line", "latency of one check by rules (cached)", "ms", [float(r["rules"]) for r in cached],
            {"p50": [r["latency_ms"]["p50"] for r in cached], "p99": [r["latency_ms"]["p99"] for r in cached]},
            xlabel="rules",
        )  # fmt: skip
        plot_from_args(args, "agentq policy check latency", [panel])
        if args.json:
            out.emit(result)
        else:
            print(render(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
