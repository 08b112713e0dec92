"""Step-commit and step-load latency on the local moto server against the number of items in
the table: moto's own DynamoDB (a transaction deep-copies the whole table for its rollback, a
Query sorts the whole table) vs. agentq's moto_app (copies of the items a transaction names,
``devstack/agentq_dev/moto_rollback.py``; a Query reads its partition, ``devstack/agentq_dev/moto_query.py``).

    python bench/local_commit.py                          # 0, 10,000 and 100,000 items
    python bench/local_commit.py --sizes 0,1000 --commits 10 --json

For each it starts the project's moto server (``agentq_dev.moto_app``, DynamoDB requests
serialised; ``main(patch_moto=False)`` for moto's own DynamoDB), provisions the table and
bucket, and for each size, smallest first:

1. tops the table up to that many filler items with BatchWriteItem (other tasks' step items,
   ~450 bytes each, 20 to a partition, as a busy table holds);
2. creates and claims one scripted task and reserves its first LLM call;
3. commits ``--commits`` LLM steps through ``Storage.steps.commit`` exactly as the engine does
   (PutItem of STEP#n, then one UpdateItem of META under the lease fence that advances the step,
   settles the reservation and reserves the next call: two calls, no transaction since the
   budget moved onto META), timing each commit;
4. times ``--commits`` loads of that task's steps (``Storage.steps.load``: the partition Query
   every claim makes) and ``--commits`` PutItem calls of one small item, for scale.

Latency is the wall time of the client call (HTTP to the local server included). Real
DynamoDB has no term that grows with the table; moto's has two: 2-3 whole-table deep copies per
transaction (once per action naming the table), and a sort of the whole table per Query. Since
a step commit is no longer a transaction, only the load column still shows moto's growth; the
transactions that remain (creating a task with its submission, a reservation on another task's
budget) keep the rollback patch's benefit.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import uuid
from decimal import Decimal
from typing import Any

from _benchlib import JsonOut, MotoAppServer, fmt, log, machine, summary, table
from _plot import Panel, add_plot_args, plot_from_args
from agentq.core.models import LLMStep, TaskSubmission, Usage
from agentq.core.records import BudgetDelta
from agentq.resources import ResourceNames, provision
from agentq.runtime import Settings, build_store, session
from agentq.storage.container import Storage
from agentq.storage.serdes import to_item
from agentq_dev.moto_server import LOCAL_CREDENTIALS

MODES = {
    "moto": "moto's own DynamoDB: a transaction deep-copies each table it names, per action; a Query sorts the table",
    "agentq": "agentq's moto_app: a transaction copies the items it names; a Query reads its partition",
}
MAIN_KWARGS = {"moto": "patch_moto=False", "agentq": ""}  # moto_app.main's, per mode
FILLER_PER_PARTITION = 20
BATCH = 25
RESERVE = 2_000
SUBMISSION = TaskSubmission.model_validate(
    {
        "goal": "local commit bench",
        "provider": "scripted",
        "script": {"turns": [{"text": "unused"}]},
        "constraints": {"max_tokens": 100_000_000, "max_steps": 10_000, "timeout_seconds": 86_400},
    }
)


def filler(i: int) -> dict[str, Any]:
    """Step ``i % 20`` of filler task ``i // 20``: shaped like a committed step item."""
    return {
        "pk": f"TASK#filler-{i // FILLER_PER_PARTITION:07d}",
        "sk": f"STEP#{i % FILLER_PER_PARTITION + 1:06d}",
        "number": i % FILLER_PER_PARTITION + 1,
        "epoch": 1,
        "kind": "tools",
        "committed_at": Decimal("1700000000.5"),
        "body": "x" * 380,
    }


def fill(store: Storage, start: int, stop: int) -> float:
    """Write filler items start..stop-1; returns the seconds it took."""
    client, name = store.table.client, store.table.name  # type: ignore[attr-defined]
    began = time.perf_counter()
    for first in range(start, stop, BATCH):
        pending: dict[str, Any] = {
            name: [{"PutRequest": {"Item": to_item(filler(i))}} for i in range(first, min(first + BATCH, stop))]
        }
        while pending:
            pending = client.batch_write_item(RequestItems=pending).get("UnprocessedItems") or {}
    return time.perf_counter() - began


def llm_step(number: int) -> LLMStep:
    return LLMStep(
        content=[{"type": "text", "text": f"turn {number}: " + "y" * 300}],
        stop_reason="end_turn",
        model="scripted",
        usage=Usage(input_tokens=400, output_tokens=120),
        reserved_tokens=RESERVE,
        started_at=time.time(),
        duration_ms=1,
    )


def time_commits(store: Storage, commits: int) -> tuple[str, list[float]]:
    """(task id, seconds per step commit) of one task that commits ``commits`` LLM steps in a row."""
    task = store.tasks.create(SUBMISSION, tenant="bench", task_id=f"bench-{uuid.uuid4().hex[:10]}")
    claimed = store.tasks.claim(task.task_id, "bench-worker", lease_seconds=3600)
    assert claimed is not None, "the new task could not be claimed"
    lease, _ = claimed
    store.budgets.reserve(lease, task.budget_id, RESERVE, 1)
    settle = BudgetDelta(reserved=RESERVE, used=520, cost_usd=Decimal(0), tokens_in=400, tokens_out=120)
    out = []
    for number in range(1, commits + 1):
        body = llm_step(number)
        began = time.perf_counter()
        store.steps.commit(lease, number, body, root_id=task.budget_id, settle=settle, reserve_next=RESERVE)
        out.append(time.perf_counter() - began)
    return task.task_id, out


def time_loads(store: Storage, task_id: str, n: int) -> list[float]:
    out = []
    for _ in range(n):
        began = time.perf_counter()
        store.steps.load(task_id)
        out.append(time.perf_counter() - began)
    return out


def time_puts(store: Storage, n: int) -> list[float]:
    client, name = store.table.client, store.table.name  # type: ignore[attr-defined]
    out = []
    for i in range(n):
        item = to_item({"pk": "BENCH#put", "sk": f"PUT#{i:06d}", "v": i})
        began = time.perf_counter()
        client.put_item(TableName=name, Item=item)
        out.append(time.perf_counter() - began)
    return out


def run_mode(mode: str, sizes: list[int], commits: int) -> list[dict[str, Any]]:
    rows = []
    with MotoAppServer(main_kwargs=MAIN_KWARGS[mode]) as server:
        names = ResourceNames.for_prefix(f"lc{uuid.uuid4().hex[:8]}")
        settings = Settings(table=names.table, bucket=names.bucket, endpoint_url=server.endpoint_url)
        provision(session(settings), names, endpoint_url=settings.endpoint_url)
        store = build_store(settings)
        filled = 0
        for size in sizes:
            log(f"[{mode}] filling to {size:,} items ...")
            fill_s = fill(store, filled, size) if size > filled else 0.0
            filled = max(filled, size)
            log(f"[{mode}] {commits} step commits at {size:,} filler items ...")
            task_id, commit_s = time_commits(store, commits)
            load_s = time_loads(store, task_id, commits)
            put_s = time_puts(store, commits)
            rows.append(
                {
                    "mode": mode,
                    "filler_items": size,
                    "commits": commits,
                    "commit_ms": summary([s * 1000 for s in commit_s]),
                    "load_steps_ms": summary([s * 1000 for s in load_s]),
                    "put_item_ms": summary([s * 1000 for s in put_s]),
                    "fill_seconds": round(fill_s, 1),
                }
            )
            # Each row's own task, steps and puts (~2 x commits items) stay in the table too.
    return rows


def report(result: dict[str, Any]) -> str:
    rows = result["rows"]
    by = {(r["mode"], r["filler_items"]): r for r in rows}
    lines = [
        f"step commit (PutItem of the step, then one fenced META UpdateItem that settles and reserves) and step load "
        f"(Query of the task's partition), {result['commits']} each per row, ms; moto {result['machine']['moto']}, "
        f"{result['machine']['cpus']} cpus, load {result['machine']['loadavg_at_start']}",
        "",
        table(
            ["dynamodb", "filler items", "commit p50", "commit p95", "commit mean", "load p50", "PutItem p50"],
            [
                [
                    r["mode"],
                    f"{r['filler_items']:,}",
                    fmt(r["commit_ms"]["p50"], 1),
                    fmt(r["commit_ms"]["p95"], 1),
                    fmt(r["commit_ms"]["mean"], 1),
                    fmt(r["load_steps_ms"]["p50"], 1),
                    fmt(r["put_item_ms"]["p50"], 1),
                ]
                for r in rows
            ],
        ),
    ]
    lines.append("")
    for what, key in (("commit", "commit_ms"), ("load", "load_steps_ms")):
        ratios = [
            f"{size:,} items: {by[('moto', size)][key]['p50'] / by[('agentq', size)][key]['p50']:.1f}x"
            for size in result["sizes"]
            if ("moto", size) in by and ("agentq", size) in by
        ]
        if ratios:
            lines.append(f"{what} p50, moto's / agentq's: " + ", ".join(ratios))
    lines += ["", *(f"{k}: {v}" for k, v in MODES.items())]
    return "\n".join(lines)


def panels(result: dict[str, Any]) -> list[Panel]:
    """Commit and load p50 against the table's size: flat lines are the point of agentq's moto_app."""
    sizes = result["sizes"]
    modes = sorted({r["mode"] for r in result["rows"]})
    by = {(r["mode"], r["filler_items"]): r for r in result["rows"]}

    def series(key: str) -> dict[str, list[float | None]]:
        return {
            f"{mode} DynamoDB": [by[(mode, n)][key]["p50"] if (mode, n) in by else None for n in sizes]
            for mode in modes
        }

    return [
        Panel("line", "step commit p50", "ms", sizes, series("commit_ms"), xlabel="items in the table", logx=True),
        Panel("line", "step load p50", "ms", sizes, series("load_steps_ms"), xlabel="items in the table", logx=True),
    ]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="0,10000,100000", help="filler item counts, comma-separated")
    ap.add_argument("--commits", type=int, default=10, help="step commits (and loads, PutItems) timed per size")
    ap.add_argument("--dynamodb", choices=[*MODES, "both"], default="both", help="which moto DynamoDB to run")
    ap.add_argument("--json", action="store_true", help="print one JSON object on stdout, nothing else")
    add_plot_args(ap, "local_commit")
    args = ap.parse_args(argv)
    sizes = sorted({int(s) for s in args.sizes.split(",")})
    for key, value in LOCAL_CREDENTIALS.items():
        os.environ.setdefault(key, value)
    with JsonOut(args.json) as out:
        result: dict[str, Any] = {"bench": "local_commit", "machine": machine(), "sizes": sizes,
                                  "commits": args.commits, "modes": MODES}  # fmt: skip
        rows: list[dict[str, Any]] = []
        for mode in MODES if args.dynamodb == "both" else [args.dynamodb]:
            rows += run_mode(mode, sizes, args.commits)
        result["rows"] = rows
        result["machine"]["loadavg_at_end"] = [round(x, 2) for x in os.getloadavg()]
        if args.json:
            out.emit(result)
        else:
            print(report(result))
    plot_from_args(args, "local step commit and load latency against table size", panels(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
