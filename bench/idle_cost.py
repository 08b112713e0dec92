"""What an idle worker costs: its AWS calls a minute, their dollars a month, and the local stack's CPU.

    python bench/idle_cost.py                          # idle polls of 1 s and 20 s, 60 s each
    python bench/idle_cost.py --idle-poll-waits 20 --seconds 30 --json

A worker with nothing to do still long-polls each of its three tiers and renews its liveness
every heartbeat. This starts the local stack (moto, ``--workers`` workers counting their AWS
calls with ``bench/_counting_worker.py``, the sweeper, the scheduler and the webhooks deliverer
in this process), waits until every worker polls, and counts for ``--seconds`` with no task
anywhere. Per worker-minute it prints each operation's calls, and what they would cost a month
on AWS at list prices (``bench/_prices.py``): SQS requests, and the liveness's DynamoDB writes
and reads at one unit each (its item is under 1 KB). The calls are the headline: they do not
depend on the machine. The CPU (share of one core, from /proc, over the same window) of the moto
server, of the workers together and of this process is what an idle stack costs the test suite
(issue 41): it depends on the machine.
"""

from __future__ import annotations

import argparse
import time
import uuid
from collections import Counter
from typing import Any

from _benchlib import BenchStack, cpu_seconds, log, table
from _plot import Panel, add_plot_args
from _prices import rate
from _report import report
from agentq.worker import WorkerConfig

MONTH_MINUTES = 30 * 24 * 60
READS = ("dynamodb:GetItem", "dynamodb:Query", "dynamodb:BatchGetItem", "dynamodb:Scan")


def _cpu(stack: BenchStack) -> dict[str, float]:
    assert stack.moto.pid is not None
    return {
        "moto": cpu_seconds(stack.moto.pid),
        "workers": sum(cpu_seconds(p.pid) for p in stack.processes),
        "this process": time.process_time(),
    }


def measure(idle_poll_wait: int, args: argparse.Namespace) -> dict[str, Any]:
    log(f"[idle poll {idle_poll_wait}s] {args.workers} worker(s), {args.seconds:g}s idle ...")
    stack = BenchStack(
        prefix=f"bidle{uuid.uuid4().hex[:8]}",
        workers=args.workers,
        worker_config=WorkerConfig(idle_poll_wait_seconds=idle_poll_wait),
        api=False,
    )
    stack.start()
    try:
        stack.wait_polling()
        time.sleep(idle_poll_wait + 1)  # past every tier's first probe, begun as the worker started polling
        calls, cpu, started = stack.worker_calls(), _cpu(stack), time.monotonic()
        time.sleep(args.seconds)
        elapsed = time.monotonic() - started
        spent = Counter(stack.worker_calls())
        spent.subtract(calls)
        cpu_after = _cpu(stack)
    finally:
        stack.stop()
    worker_minutes = args.workers * elapsed / 60
    per_minute = {op: round(n / worker_minutes, 2) for op, n in sorted(spent.items()) if n > 0}
    sqs = sum(n for op, n in per_minute.items() if op.startswith("sqs:"))
    reads = sum(n for op, n in per_minute.items() if op in READS)
    writes = sum(n for op, n in per_minute.items() if op.startswith("dynamodb:") and op not in READS)
    month = MONTH_MINUTES * (sqs * rate("sqs_request") + writes * rate("dynamodb_wru") + reads * rate("dynamodb_rru"))
    return {
        "idle_poll_wait_seconds": idle_poll_wait,
        "seconds": round(elapsed, 1),
        "calls_per_worker_minute": per_minute,
        "sqs_requests_per_worker_minute": round(sqs, 2),
        "dollars_per_worker_month": round(month, 3),
        "cpu_percent_of_a_core": {k: round(100 * (cpu_after[k] - cpu[k]) / elapsed, 2) for k in cpu},
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    waits = [int(w) for w in args.idle_poll_waits.split(",")]
    return {"workers": args.workers, "rows": [measure(w, args) for w in waits]}


def render(result: dict[str, Any]) -> str:
    rows = result["rows"]
    ops = sorted({op for r in rows for op in r["calls_per_worker_minute"]})
    kinds = list(rows[0]["cpu_percent_of_a_core"]) if rows else []
    return table(
        ["idle poll", *ops, "$ / worker-month", *(f"CPU % {k}" for k in kinds)],
        [
            [
                f"{r['idle_poll_wait_seconds']} s",
                *(r["calls_per_worker_minute"].get(op, 0) for op in ops),
                r["dollars_per_worker_month"],
                *(r["cpu_percent_of_a_core"][k] for k in kinds),
            ]
            for r in rows
        ],
    )


def panels(result: dict[str, Any]) -> list[Panel]:
    rows = result["rows"]
    labels = [f"idle poll {r['idle_poll_wait_seconds']} s" for r in rows]
    kinds = list(rows[0]["cpu_percent_of_a_core"]) if rows else []
    return [
        Panel(
            "bar",
            "SQS requests per idle worker-minute",
            "requests",
            labels,
            {"SQS": [float(r["sqs_requests_per_worker_minute"]) for r in rows]},
        ),
        Panel(
            "bar",
            "an idle local stack's CPU",
            "% of a core",
            labels,
            {k: [float(r["cpu_percent_of_a_core"][k]) for r in rows] for k in kinds},
        ),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--idle-poll-waits", default="1,20", help="the workers' --idle-poll-wait values to compare")
    parser.add_argument("--seconds", type=float, default=60.0, help="how long each stack is watched idle")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    add_plot_args(parser, "idle_cost")
    report(parser.parse_args(), "an idle worker's cost", run, render, panels)


if __name__ == "__main__":
    main()
