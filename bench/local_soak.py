"""The local stack under steady load for a long time: does the moto server's memory stay bounded?

    python bench/local_soak.py --minutes 30            # the figure the docs quote
    python bench/local_soak.py --minutes 2 --rate 1 --json

A local stack (moto server, ``--workers`` worker processes, the sweeper thread) gets ``--rate``
scripted tasks a second for ``--minutes`` (three tool turns of a read-only and a side-effecting
tool each, so every task writes ~10 items and sends ~8 messages), while the moto server's RSS
(``/proc/<pid>/status``, VmRSS) is sampled every ``--sample-seconds``. What it prints: RSS at
the start, at each tenth of the run and at the end, the maximum, and the slope over the last
half of the run (MB per minute), with the table's item count and the tasks finished, so growth
can be told apart from the data the run itself keeps (DynamoDB items are state, not a leak;
deleted SQS messages must not stay). A PNG of RSS and items against time next to the table.

``--retention-seconds N`` purges each finished task N seconds after it ends, with the reaper's
own code (``control.retention.purge_task``): what DynamoDB TTL and the reaper do in AWS after
``AGENTQ_TASK_RETENTION_DAYS``, at a pace a 30-minute run can show. Without it the table only
grows, and so does the moto server, by what its items take.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from _benchlib import JsonOut, dynamo, fmt, log, machine, proc_status, table  # noqa: E402
from _plot import Panel, add_plot_args, plot_from_args  # noqa: E402
from agentq.control.retention import purge_task  # noqa: E402
from agentq.control.submit import submit  # noqa: E402
from agentq.runtime import build_registry  # noqa: E402
from agentq.worker import WorkerConfig  # noqa: E402
from agentq_dev.stack import LocalStack  # noqa: E402

from tests.helpers import call, scripted  # noqa: E402

TURNS = [
    {"text": f"turn {i}", "tool_calls": [call("lookup", query=f"q{i}", size=400), call("charge_card", amount_cents=i, memo="m")]}
    for i in range(3)
] + [{"text": "done"}]  # fmt: skip


def _slope(points: list[tuple[float, float]]) -> float | None:
    """Least-squares slope (y per x) of the points."""
    if len(points) < 2:
        return None
    n = len(points)
    mx, my = sum(p[0] for p in points) / n, sum(p[1] for p in points) / n
    var = sum((p[0] - mx) ** 2 for p in points)
    return sum((p[0] - mx) * (p[1] - my) for p in points) / var if var else None


def _purge_expired(store: Any, submitted: list[str], start: int, retention: float) -> int:
    """Purge, oldest first, the submitted tasks that ended more than ``retention`` seconds ago;
    returns how many (it stops at the first that has not)."""
    done = 0
    cutoff = time.time() - retention
    for batch_start in range(start, len(submitted), 100):
        batch = submitted[batch_start : batch_start + 100]
        tasks = {t.task_id: t for t in store.tasks.get_many(batch)}
        for task_id in batch:
            task = tasks.get(task_id)
            if task is None or not task.status.terminal or (task.finished_at or 0) > cutoff:
                return done
            purge_task(store, task_id)
            done += 1
    return done


def run(args: argparse.Namespace) -> dict[str, Any]:
    stack = LocalStack(
        prefix=f"soak{uuid.uuid4().hex[:6]}",
        workers=args.workers,
        api=False,
        worker_config=WorkerConfig(),
        tool_modules=("agentq.core.tools.examples", "tests.effect_tools"),
        extra_env={
            "AGENTQ_TEST_LEDGER": os.devnull,
            "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
        },
    )
    stack.start()
    samples: list[dict[str, float]] = []
    submitted: list[str] = []
    stop = threading.Event()
    try:
        store, queues = stack.store(), stack.queues()
        registry = build_registry(stack.settings)  # type: ignore[arg-type]
        assert stack.moto.pid is not None
        moto_pid = stack.moto.pid
        table_name = stack.settings.table  # type: ignore[union-attr]
        ddb = dynamo(store).client

        def submitter() -> None:
            period = 1 / args.rate
            next_at = time.monotonic()
            while not stop.is_set():
                sub = scripted(TURNS, tools=["lookup", "charge_card"])
                submitted.append(submit(store, registry, sub, tenant="soak", queues=queues).task_id)
                next_at += period
                stop.wait(max(0.0, next_at - time.monotonic()))

        purged = 0
        thread = threading.Thread(target=submitter, daemon=True)
        began = time.monotonic()
        thread.start()
        end = began + args.minutes * 60
        while True:
            now = time.monotonic()
            status = proc_status(moto_pid) or {}
            items = ddb.describe_table(TableName=table_name)["Table"].get("ItemCount")
            samples.append({"minute": round((now - began) / 60, 3), "rss_mb": status.get("rss_mb", 0.0),
                            "submitted": len(submitted), "items": items or 0})  # fmt: skip
            log(
                f"{samples[-1]['minute']:6.2f} min: moto RSS {samples[-1]['rss_mb']:.0f} MB, {len(submitted)} tasks, "
                f"{items} items, {purged} purged"
            )
            if args.retention_seconds is not None:
                purged += _purge_expired(store, submitted, purged, args.retention_seconds)
            if now >= end:
                break
            time.sleep(min(args.sample_seconds, max(0.0, end - now)))
        stop.set()
        thread.join(timeout=10)
        running = sum(1 for t in store.tasks.get_many(submitted[-200:]) if not t.status.terminal)
    finally:
        stop.set()
        stack.stop()
    second_half = [(s["minute"], s["rss_mb"]) for s in samples if s["minute"] >= args.minutes / 2]
    return {
        "bench": "local_soak",
        "settings": {k: v for k, v in vars(args).items() if k not in ("json", "plot", "no_plot")},
        "samples": samples,
        "rss_start_mb": samples[0]["rss_mb"],
        "rss_end_mb": samples[-1]["rss_mb"],
        "rss_max_mb": max(s["rss_mb"] for s in samples),
        "rss_slope_mb_per_min_second_half": _slope(second_half),
        "tasks_submitted": len(submitted),
        "tasks_purged": purged,
        "last_200_still_running": running,
    }


def render(result: dict[str, Any]) -> str:
    samples = result["samples"]
    step = max(1, len(samples) // 10)
    picked = samples[::step] + ([samples[-1]] if (len(samples) - 1) % step else [])
    rows = [[fmt(s["minute"], 2), fmt(s["rss_mb"], 1), s["submitted"], s["items"]] for s in picked]
    slope = result["rss_slope_mb_per_min_second_half"]
    return "\n".join([
        f"moto server RSS under steady load: {result['settings']}",
        "",
        table(["minute", "moto RSS MB", "tasks submitted", "table items"], rows),
        "",
        f"RSS start {result['rss_start_mb']:.1f} MB, end {result['rss_end_mb']:.1f} MB, max {result['rss_max_mb']:.1f} MB; "
        f"slope over the second half {fmt(slope, 2)} MB/min; {result['tasks_submitted']} tasks submitted, "
        f"{result['last_200_still_running']} of the last 200 still running at the end, {result['tasks_purged']} purged",
    ])  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--minutes", type=float, default=30)
    ap.add_argument("--rate", type=float, default=2.0, help="tasks submitted per second")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--sample-seconds", type=float, default=30)
    ap.add_argument(
        "--retention-seconds", type=float, default=None, help="purge finished tasks this long after they end"
    )
    ap.add_argument("--json", action="store_true")
    add_plot_args(ap, "local_soak")
    args = ap.parse_args(argv)
    with JsonOut(args.json) as out:
        result = run(args)
        result["machine"] = machine()
        if args.json:
            out.emit(result)
        else:
            print(render(result))
    samples = result["samples"]
    xs = [s["minute"] for s in samples]
    plot_from_args(args, "moto server memory under steady load", [
        Panel("line", "moto server RSS", "MB", xs, {"RSS": [s["rss_mb"] for s in samples]}, xlabel="minute"),
        Panel("line", "items in the table", "items", xs, {"items": [float(s["items"]) for s in samples]},
              xlabel="minute"),
    ])  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
