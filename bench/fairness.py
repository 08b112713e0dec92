"""Fair share among tenants: one tenant's burst never starves another (issue 26).

    python bench/fairness.py                         # A: 700 then 2,000 tasks of one 30 s turn; B: 10
    python bench/fairness.py --sizes 100 --latency 2 --window 20 --json

For each size, on a fresh local stack (moto server, ``--workers`` worker processes of
``--concurrency`` each): every tenant's running limit is ``--limit`` (an override each, as an
operator sets with ``agentq tenants limit``); tenant A submits ``size`` scripted one-turn tasks
(a ``--latency`` s model turn, the issue's 30 s by default) through the API's own path
(``control.submit.submit_once`` with the deployment's defaults), then tenant B submits
``--b-tasks`` of the same. The bench waits until every B task was claimed, then lets A run for
``--window`` seconds and reads every task's META once:

- B's pickup = first claim - created_at, p50 / p99 / max (target p99 <= 2 s);
- A's throughput = A tasks finished per second over the window, against what the fleet gives A
  alone under its limit (``limit / latency``), and A's running count sampled each second
  (never above the limit);
- AWS calls per admission: the calls A's submissions made per task, by operation, beside what
  a submission costs without a limit (the create transaction and one SendMessage), and what
  the workers spent per finished task (release, wake, the waiters' messages included).

Before the change, the same scenario gave B a pickup of 65.6 s (p50) and 66.5 s (max) at 700
tasks: B's messages stood behind A's whole backlog. Locally moto keeps a standard queue in
send order (it accepts MessageGroupId but does not serve quiet groups first), so the figure here
comes from the limits alone: a task over its tenant's limit never enters the queue.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from _benchlib import (
    MOTO_MODES_HELP,
    BenchStack,
    InProcessCounter,
    JsonOut,
    fmt,
    log,
    machine,
    patient_clients,
    settings_line,
    settings_of,
    summary,
    table,
    worker_config,
)
from _plot import Panel, add_plot_args, plot_from_args
from agentq.control.defaults import Defaults
from agentq.control.submit import submit_once
from agentq.core.models import TaskSubmission
from agentq.queueing.worker import WorkerConfig
from agentq.resources import QueueSettings
from agentq.runtime import build_registry

TARGET_B_PICKUP_P99 = 2.0
TENANT_A, TENANT_B = "tenant-a", "tenant-b"


def submission(latency: float) -> TaskSubmission:
    return TaskSubmission.model_validate(
        {
            "goal": "fairness bench: one model turn",
            "provider": "scripted",
            "script": {"turns": [{"text": "done", "latency_seconds": latency}]},
            "constraints": {"max_tokens": 10_000, "max_steps": 2, "timeout_seconds": 3600, "max_output_tokens": 256},
        }
    )


def run_size(size: int, args: argparse.Namespace, counter: InProcessCounter) -> dict[str, Any]:
    stack = BenchStack(
        prefix=f"bench-fair-{size}",
        workers=args.workers,
        worker_config=worker_config(args),
        queue_settings=QueueSettings(visibility_timeout=args.visibility),
        api=False,
        moto_mode=args.moto,
        sweep_every=None,
    )
    try:
        log(f"[{size}] starting the local stack ...")
        stack.start()
        stack.wait_polling()
        settings = settings_of(stack)
        store, queues = patient_clients(stack, pool=max(args.threads, 16))
        registry = build_registry(stack.settings)  # type: ignore[arg-type]
        defaults = Defaults(tenant_max_running=args.limit)
        for tenant in (TENANT_A, TENANT_B):
            store.slots.set_limit(tenant, args.limit)
        work = submission(args.latency)
        queues.url("normal")

        def submit(tenant: str, tag: str) -> str:
            counter.tag(tag)
            return submit_once(store, registry, work, tenant=tenant, queues=queues, defaults=defaults).task.task_id

        log(f"[{size}] tenant A submits {size} tasks ...")
        t0 = time.time()
        with ThreadPoolExecutor(max_workers=args.threads, thread_name_prefix="submit") as pool:
            a_ids = list(pool.map(lambda _: submit(TENANT_A, "submit-a"), range(size)))
        a_submit_s = time.time() - t0
        a_calls = counter.snapshot("submit-a")
        log(f"[{size}] submitted in {a_submit_s:.1f}s; tenant B submits {args.b_tasks} ...")
        workers_before = stack.worker_calls()
        b_start = time.time()
        b_ids = [submit(TENANT_B, "submit-b") for _ in range(args.b_tasks)]

        running_a: list[int] = []
        stop = threading.Event()

        def sample() -> None:  # A's running count, from its slot item: one read a second
            counter.tag("monitor")
            while not stop.wait(1.0):
                running_a.append(store.slots.usage(TENANT_A, waiting_up_to=1).running)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        deadline = time.monotonic() + args.timeout
        while time.monotonic() < deadline:
            metas = store.tasks.metas(b_ids)
            if len(metas) == len(b_ids) and all(m.get("first_claimed_at") for m in metas):
                break
            time.sleep(0.25)
        window_start = b_start
        time.sleep(max(0.0, window_start + args.window - time.time()))
        window_end = time.time()
        stop.set()
        sampler.join()
        worker_calls = stack.worker_calls() - workers_before

        b = [store.tasks.get(t) for t in b_ids]
        a_metas = [m for i in range(0, len(a_ids), 100) for m in store.tasks.metas(a_ids[i : i + 100])]
        ended = [float(m["finished_at"]) for m in a_metas if m.get("finished_at")]
        a_finished = sum(1 for at in ended if window_start <= at <= window_end)
        pickups = [t.pickup_latency for t in b if t.pickup_latency is not None]
        p = summary(pickups)
        throughput = a_finished / max(1e-9, window_end - window_start)
        alone = min(args.limit, args.workers * args.concurrency) / max(args.latency, 1e-9)
        a_statuses = Counter(str(m.get("status")) for m in a_metas)
        finished_total = sum(1 for m in a_metas if m.get("finished_at")) + sum(1 for t in b if t.finished_at)
        return {
            "size": size,
            "settings": settings,
            "limit": args.limit,
            "latency_s": args.latency,
            "b_tasks": args.b_tasks,
            "b_claimed": len(pickups),
            "b_pickup_s": p,
            "b_pickup_p99_target_s": TARGET_B_PICKUP_P99,
            "b_pickup_p99_met": p["p99"] is not None
            and len(pickups) == args.b_tasks
            and p["p99"] <= TARGET_B_PICKUP_P99,
            "a_submit_s": a_submit_s,
            "a_window_s": window_end - window_start,
            "a_finished_in_window": a_finished,
            "a_throughput_per_s": throughput,
            "a_alone_per_s": alone,
            "a_running_max": max(running_a, default=0),
            "a_running_samples": running_a,
            "a_statuses_at_end": dict(a_statuses),
            "a_submit_calls_per_task": {op: round(n / size, 3) for op, n in sorted(a_calls.items())},
            "worker_calls_per_finished_task": {
                op: round(n / max(1, finished_total), 3) for op, n in sorted(worker_calls.items())
            },
        }
    finally:
        log(f"[{size}] stopping the local stack ...")
        stack.stop(grace=5.0)


def render(result: dict[str, Any]) -> str:
    m = result["machine"]
    out = [
        "agentq fair share: tenant A's burst, then tenant B's tasks (local stack, moto server)",
        f"machine: {m['cpus']} CPUs, Python {m['python']}, moto {m['moto']}; load average at start "
        f"{m['loadavg_at_start']}, at end {m.get('loadavg_at_end')}; code: git {m['git_head']}",
    ]
    if result["rows"]:
        first = result["rows"][0]
        out.append(
            f"settings: {settings_line(first['settings'])}; every tenant's limit {first['limit']} running; "
            f"one scripted turn of {first['latency_s']:g}s per task"
        )
    out.append("")
    rows = [
        [r["size"], r["b_claimed"], r["b_pickup_s"]["p50"], r["b_pickup_s"]["p99"], r["b_pickup_s"]["max"],
         "yes" if r["b_pickup_p99_met"] else "NO", r["a_throughput_per_s"], r["a_alone_per_s"], r["a_running_max"],
         r["a_submit_s"]]
        for r in result["rows"]
    ]  # fmt: skip
    headers = ["A tasks", "B claimed", "B pickup p50 s", "p99 s", "max s", "p99 <= 2 s", "A done/s",
               "A alone/s", "A running max", "A submit s"]  # fmt: skip
    out.append(table(headers, rows))
    out.append("")
    out.append("AWS calls per admission (A's submissions, per task; without a limit a submission costs the")
    out.append("create's TransactWriteItems and one SendMessage):")
    for r in result["rows"]:
        ops = ", ".join(f"{op.split(':', 1)[1]} {n:g}" for op, n in r["a_submit_calls_per_task"].items())
        out.append(f"  {r['size']}: {ops}")
    out.append("Workers, per finished task (run, release, waking the next waiter):")
    for r in result["rows"]:
        ops = ", ".join(f"{op.split(':', 1)[1]} {n:g}" for op, n in r["worker_calls_per_finished_task"].items())
        out.append(f"  {r['size']}: {ops}")
    out.append("")
    out.extend(result["notes"])
    return "\n".join(out)


def notes(result: dict[str, Any]) -> list[str]:
    lines = []
    for r in result["rows"]:
        verdict = "met" if r["b_pickup_p99_met"] else "NOT met"
        lines.append(
            f"{r['size']} A tasks: B pickup p99 {fmt(r['b_pickup_s']['p99'])} s -> target <= "
            f"{TARGET_B_PICKUP_P99:g} s {verdict}; A finished {r['a_finished_in_window']} in "
            f"{r['a_window_s']:.0f} s ({r['a_throughput_per_s']:.2f}/s; its limit alone gives "
            f"{r['a_alone_per_s']:.2f}/s), never more than {r['a_running_max']} running (limit {r['limit']})"
        )
    return lines


def panels(result: dict[str, Any]) -> list[Panel]:
    rows = result["rows"]
    names = [f"A={r['size']}" for r in rows]
    return [
        Panel("bar", "tenant B's pickup while A's burst waits", "s", names,
              {q: [r["b_pickup_s"][q] for r in rows] for q in ("p50", "p99", "max")},
              hlines={f"p99 target {TARGET_B_PICKUP_P99:g} s": TARGET_B_PICKUP_P99}),
        Panel("bar", "tenant A's throughput", "tasks/s", names,
              {"measured": [r["a_throughput_per_s"] for r in rows], "its limit alone": [r["a_alone_per_s"] for r in rows]}),
        Panel("bar", "AWS calls per A submission", "calls", names, {
            "DynamoDB": [sum(n for op, n in r["a_submit_calls_per_task"].items() if op.startswith("dynamodb:"))
                         for r in rows],
            "SQS": [sum(n for op, n in r["a_submit_calls_per_task"].items() if op.startswith("sqs:")) for r in rows],
        }),
    ]  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="700,2000", help="tenant A's burst sizes, comma-separated (one stack each)")
    ap.add_argument("--b-tasks", type=int, default=10, help="tenant B's tasks")
    ap.add_argument("--latency", type=float, default=30.0, help="seconds of the one scripted model turn")
    ap.add_argument("--limit", type=int, default=40, help="each tenant's most running tasks")
    ap.add_argument("--window", type=float, default=60.0, help="seconds A runs after B submits (throughput)")
    ap.add_argument("--workers", type=int, default=2, help="worker processes")
    ap.add_argument("--concurrency", type=int, default=60, help="tasks in flight per worker")
    ap.add_argument("--lease", type=float, default=WorkerConfig().lease_seconds)
    ap.add_argument("--heartbeat", type=float, default=WorkerConfig().heartbeat_seconds)
    ap.add_argument("--visibility", type=int, default=WorkerConfig().visibility_seconds)
    ap.add_argument("--threads", type=int, default=16, help="submitting threads")
    ap.add_argument("--timeout", type=float, default=300, help="max seconds to wait for B's claims")
    ap.add_argument("--moto", choices=["fast", "stock"], default="fast", help=MOTO_MODES_HELP)
    ap.add_argument("--json", action="store_true", help="print one JSON object on stdout, nothing else")
    add_plot_args(ap, "fairness")
    args = ap.parse_args(argv)
    try:
        sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    except ValueError:
        ap.error("--sizes: whole numbers separated by commas")
    if args.limit < 1:
        ap.error("--limit: at least 1")

    with JsonOut(args.json) as out:
        counter = InProcessCounter().install()
        result: dict[str, Any] = {"bench": "fairness", "machine": machine(), "rows": []}
        try:
            for size in sizes:
                result["rows"].append(run_size(size, args, counter))
        finally:
            counter.uninstall()
        result["machine"]["loadavg_at_end"] = [round(x, 2) for x in os.getloadavg()]
        result["notes"] = notes(result)
        if args.json:
            out.emit(result)
        else:
            print(render(result))
    plot_from_args(args, "agentq fair share among tenants", panels(result))
    ok = all(r["b_claimed"] == r["b_tasks"] and r["a_running_max"] <= r["limit"] for r in result["rows"])
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
