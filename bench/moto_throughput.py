"""How many DynamoDB calls a second the local stack's moto server serves, and the server CPU
each call costs, for the calls held tasks make: their turns and their claims.

    python bench/moto_throughput.py                       # agentq's moto_app, then without its fast paths
    python bench/moto_throughput.py --apps agentq --seconds 10 --json

Why: on the local stack every held task's turn waits in the one moto process that serves
DynamoDB (``agentq_dev.moto_app`` serialises DynamoDB requests), so how many tasks a worker
can hold on 30 s turns is that server's calls/s divided by ~0.18 calls per task per second
(``bench/concurrency.py``). This bench measures the server alone, without a worker, so a
change to it shows as calls/s and as CPU ms per call (from /proc: the server's user + system
time over the window, divided by the calls it served; the machine's load changes calls/s
much more than CPU per call).

For each app it starts the server, provisions the stack's table, creates ``--tasks`` scripted
tasks and then, from ``--threads`` client threads for ``--seconds`` each:

1. claims: what a worker does to start a task (``Storage`` calls, as the dispatcher and the
   engine make them): the task's Query (``tasks.get``), the claim (conditional UpdateItem
   ALL_NEW, its ``CLAIM#`` PutItem, the submission's GetItem), the tenant's slot item read,
   the first reservation's UpdateItem;
2. turns: what a held task does each turn: the LLM step's commit (PutItem of the step, the
   fenced META UpdateItem that settles, reserves and renews the lease), ``note_write``'s
   transaction (fence check + PutItem), the tool step's commit.

Apps: ``agentq`` = ``python -m agentq_dev.moto_app`` (what the local stack runs); ``close``
= the same closing every connection after its response, as werkzeug does (without
``devstack/agentq_dev/moto_http.py``: the before of keep-alive); ``plain`` = without the fast paths of
``devstack/agentq_dev/moto_speed.py`` (the before of that change). Calls are counted in this process (botocore's own retries not counted twice).
"""

from __future__ import annotations

import argparse
import itertools
import os
import sys
import threading
import time
import uuid
from decimal import Decimal
from typing import Any

from _benchlib import InProcessCounter, JsonOut, MotoAppServer, cpu_seconds, log, machine, table
from _plot import Panel, add_plot_args, plot_from_args
from agentq.core.models import LLMStep, TaskSubmission, ToolOutcome, ToolsStep, Usage
from agentq.core.records import BudgetDelta, ClaimOwner
from agentq.resources import ResourceNames, provision
from agentq.runtime import Settings, build_store, session
from agentq.storage.container import Storage
from agentq_dev.moto_server import LOCAL_CREDENTIALS

APPS = {
    "agentq": "agentq's moto_app, as the local stack runs it",
    "plain": "agentq's moto_app without the fast paths of devstack/agentq_dev/moto_speed.py",
    "close": "agentq's moto_app closing every connection after its response, as werkzeug does (no devstack/agentq_dev/moto_http.py)",
}
MAIN_KWARGS = {"agentq": "", "plain": "fast_paths=False", "close": "keep_alive=False"}  # moto_app.main's, per app
RESERVE = 2_000
SUBMISSION = TaskSubmission.model_validate(
    {
        "goal": "moto throughput bench: a long agent that waits on its LLM",
        "provider": "scripted",
        "script": {"turns": [{"text": "t1", "tool_calls": [{"name": "note_write", "input": {"key": "p", "value": "1"}}]}]},
        "constraints": {"tools": ["note_write"], "max_tokens": 100_000_000, "max_steps": 10_000, "timeout_seconds": 86_400},
    }
)  # fmt: skip
SETTLE = BudgetDelta(reserved=RESERVE, used=520, cost_usd=Decimal(0), tokens_in=400, tokens_out=120)


class Task:
    """One bench task: its lease once claimed, and the next step number."""

    def __init__(self, task_id: str) -> None:
        self.task_id = task_id
        self.lease: Any = None
        self.step = 0
        self.lock = threading.Lock()


def claim(store: Storage, task: Task, n: int) -> None:
    """What a worker's first run of a task costs the table (see the module)."""
    got = store.tasks.get(task.task_id)
    claimed = store.tasks.claim(
        task.task_id, "bench-worker:1", lease_seconds=1200, owner=ClaimOwner("bench-worker:1", 1)
    )
    if claimed is None:  # a re-claim (the phase loops over its tasks): release, next time it is free
        return
    store.slots.limit(got.tenant)
    lease, _ = claimed
    store.budgets.reserve(lease, task.task_id, RESERVE, 1)
    store.tasks.release(lease)


def turn(store: Storage, task: Task, n: int) -> None:
    """One turn of a held task: LLM step commit, note_write, tool step commit."""
    lease = task.lease
    now = time.time()
    llm = LLMStep(
        content=[{"type": "text", "text": f"turn {n}"}, {"type": "tool_use", "id": f"u{n}", "name": "note_write",
                                                        "input": {"key": "p", "value": str(n)}}],
        stop_reason="tool_use", model="scripted", usage=Usage(input_tokens=400, output_tokens=120),
        reserved_tokens=RESERVE, started_at=now, duration_ms=1,
    )  # fmt: skip
    task.step += 1
    store.steps.commit(lease, task.step, llm, root_id=task.task_id, settle=SETTLE, lease_until=now + 1200)
    store.notes.write(lease, "p", str(n))
    tools = ToolsStep(
        results=[ToolOutcome(tool_use_id=f"u{n}", name="note_write", content="ok", started_at=now, duration_ms=1)]
    )
    task.step += 1
    store.steps.commit(lease, task.step, tools, root_id=task.task_id, reserve_next=RESERVE, lease_until=now + 1200)


def run_phase(name: str, store: Storage, tasks: list[Task], work: Any, args: argparse.Namespace, pid: int,
              counter: InProcessCounter) -> dict[str, Any]:  # fmt: skip
    stop = threading.Event()
    errors: list[str] = []
    picks = itertools.count()

    def loop() -> None:
        counter.tag(name)
        while not stop.is_set():
            i = next(picks)
            task = tasks[i % len(tasks)]
            if not task.lock.acquire(blocking=False):
                continue
            try:
                work(store, task, i)
            except Exception as exc:  # counted, reported
                errors.append(f"{type(exc).__name__}: {exc}")
            finally:
                task.lock.release()

    before_calls = sum(counter.snapshot(name).values())
    cpu0, own0, t0 = cpu_seconds(pid), time.process_time(), time.perf_counter()
    threads = [threading.Thread(target=loop, daemon=True) for _ in range(args.threads)]
    for t in threads:
        t.start()
    time.sleep(args.seconds)
    stop.set()
    for t in threads:
        t.join(timeout=60)
    elapsed, cpu, own = time.perf_counter() - t0, cpu_seconds(pid) - cpu0, time.process_time() - own0
    calls = counter.snapshot(name)
    n = sum(calls.values()) - before_calls
    return {
        "phase": name,
        "seconds": elapsed,
        "calls": n,
        "calls_per_s": n / elapsed,
        "server_cpu_s": cpu,
        "server_cpu_ms_per_call": 1000 * cpu / max(1, n),
        "server_cpu_share": cpu / elapsed,
        "client_cpu_ms_per_call": 1000 * own / max(1, n),
        "by_operation": dict(sorted(calls.items())),
        "errors": len(errors),
        "error_sample": errors[:3],
    }


def run_app(app: str, args: argparse.Namespace, counter: InProcessCounter) -> list[dict[str, Any]]:
    with MotoAppServer(main_kwargs=MAIN_KWARGS[app]) as server:
        moto_pid = server.pid
        assert moto_pid is not None
        names = ResourceNames.for_prefix(f"mt{uuid.uuid4().hex[:8]}")
        settings = Settings(table=names.table, bucket=names.bucket, endpoint_url=server.endpoint_url)
        provision(session(settings), names, endpoint_url=settings.endpoint_url)
        store = build_store(settings, pool=args.threads + 4)
        log(f"[{app}] creating {args.tasks} tasks ...")
        tasks = [Task(store.tasks.create(SUBMISSION, tenant="bench").task_id) for _ in range(args.tasks)]
        log(f"[{app}] claims for {args.seconds:g}s from {args.threads} threads ...")
        rows = [run_phase("claims", store, tasks, claim, args, moto_pid, counter)]
        for task in tasks:  # hold every task for the turns
            claimed = store.tasks.claim(task.task_id, "bench-worker:1", lease_seconds=3600)
            assert claimed is not None, task.task_id
            task.lease, task.step = claimed[0], claimed[1].step
        log(f"[{app}] turns for {args.seconds:g}s from {args.threads} threads ...")
        rows.append(run_phase("turns", store, tasks, turn, args, moto_pid, counter))
        for row in rows:
            row["app"] = app
            log(f"[{app}] {row['phase']}: {row['calls_per_s']:.0f} calls/s, server CPU {row['server_cpu_ms_per_call']:.2f} ms "
                f"per call ({row['errors']} errors)")  # fmt: skip
        return rows


def report(result: dict[str, Any]) -> str:
    m = result["machine"]
    lines = [
        f"moto server DynamoDB throughput: {result['tasks']} tasks, {result['threads']} client threads, "
        f"{result['seconds']:g}s per phase; moto {m['moto']}, {m['cpus']} CPUs, load at start {m['loadavg_at_start']}, "
        f"at end {m['loadavg_at_end']}",
        "",
        table(
            ["app", "phase", "calls/s", "server CPU ms/call", "server CPU share", "client CPU ms/call", "errors"],
            [
                [
                    r["app"],
                    r["phase"],
                    f"{r['calls_per_s']:.0f}",
                    f"{r['server_cpu_ms_per_call']:.2f}",
                    f"{r['server_cpu_share']:.0%}",
                    f"{r['client_cpu_ms_per_call']:.2f}",
                    r["errors"],
                ]
                for r in result["rows"]
            ],
        ),
        "",
        "(calls/s: served to this bench's threads; server CPU: the moto process's user + system time per call; "
        "share: of one core over the phase; client CPU: this process's, per call: boto3 and the storage layer, "
        "what a worker pays per call on the same machine)",
        "",
        *(f"{k}: {v}" for k, v in APPS.items() if k in result["apps"]),
    ]
    for r in result["rows"]:
        if r["errors"]:
            lines.append(f"{r['app']} {r['phase']}: {r['errors']} errors, e.g. {r['error_sample'][0]}")
    return "\n".join(lines)


def panels(result: dict[str, Any]) -> list[Panel]:
    phases = ["claims", "turns"]
    by = {(r["app"], r["phase"]): r for r in result["rows"]}

    def series(key: str) -> dict[str, list[float | None]]:
        return {app: [by[(app, p)][key] if (app, p) in by else None for p in phases] for app in result["apps"]}

    return [
        Panel("bar", "DynamoDB calls served per second", "calls/s", phases, series("calls_per_s")),
        Panel("bar", "moto server CPU per call", "ms", phases, series("server_cpu_ms_per_call")),
    ]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--apps", default="agentq,close,plain", help=f"comma-separated, of {', '.join(APPS)}")
    ap.add_argument("--tasks", type=int, default=200)
    ap.add_argument("--threads", type=int, default=16)
    ap.add_argument("--seconds", type=float, default=15.0, help="per phase")
    ap.add_argument("--json", action="store_true", help="print one JSON object on stdout, nothing else")
    add_plot_args(ap, "moto_throughput")
    args = ap.parse_args(argv)
    apps = [a for a in args.apps.split(",") if a]
    if unknown := [a for a in apps if a not in APPS]:
        ap.error(f"unknown app(s) {unknown}; choose from {', '.join(APPS)}")
    for key, value in LOCAL_CREDENTIALS.items():
        os.environ.setdefault(key, value)
    counter = InProcessCounter().install()
    with JsonOut(args.json) as out:
        result: dict[str, Any] = {"bench": "moto_throughput", "machine": machine(), "apps": apps, "tasks": args.tasks,
                                  "threads": args.threads, "seconds": args.seconds}  # fmt: skip
        rows: list[dict[str, Any]] = []
        for app in apps:
            rows += run_app(app, args, counter)
        result["rows"] = rows
        result["machine"]["loadavg_at_end"] = [round(x, 2) for x in os.getloadavg()]
        if args.json:
            out.emit(result)
        else:
            print(report(result))
    plot_from_args(args, "moto server: DynamoDB calls/s and CPU per call", panels(result))
    return 0 if not any(r["errors"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
