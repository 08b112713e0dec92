"""What watching each other costs a fleet of workers: liveness reads per worker per second.

    python bench/liveness_reads.py                        # fleets of 2 and 10 workers
    python bench/liveness_reads.py --fleets 2,5,10 --seconds 30 --json

Each worker process renews its liveness item every heartbeat and reads those of the peers it
watches (``storage.workers``: its ``WATCHED_PEERS`` successors in the ring of worker ids, one
Query of a few items, two for the last workers of the ring). For each fleet size the bench
starts that many idle workers on the local stack (no task: what is counted is liveness alone),
and over ``--seconds`` reads each worker's own counters (``Worker.stats()``: heartbeat rounds,
liveness Queries and the items they read) and its AWS calls (counted in the worker process).

Reported per worker per second: rounds, liveness Queries, items read, all DynamoDB calls, and
the read units those Queries cost at DynamoDB's pricing (eventually consistent: half a unit per
4 KB a Query reads, rounded up). The "every peer" columns are what the first version of worker
liveness read (one Query of every worker's item each heartbeat, issue 23): items = the fleet
size, so a fleet's reads grow with its square. The last table projects both to fleets this
machine cannot start, from the measured item size.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from typing import Any

from _benchlib import MOTO_MODES_HELP, BenchStack, JsonOut, log, machine, settings_line, settings_of, table
from _plot import Panel, add_plot_args, plot_from_args
from _prices import quote, rate
from agentq.queueing._tuning import WorkerConfig
from agentq.storage.workers import WATCHED_PEERS, WORKERS_PK

READ_UNIT_BYTES = 4096


def read_units(items: float, item_bytes: float) -> float:
    """Read request units of one eventually consistent Query that reads ``items`` items."""
    return 0.5 * max(1, math.ceil(items * item_bytes / READ_UNIT_BYTES))


def liveness_item_bytes(stack: BenchStack) -> float:
    """The mean size of a liveness item as DynamoDB counts it (attribute names + values)."""
    store = stack.store()
    items = store.tasks.table.query(WORKERS_PK)
    sizes = [sum(len(str(k)) + len(str(v)) for k, v in item.items()) for item in items]
    return sum(sizes) / max(1, len(sizes))


def measure(fleet: int, args: argparse.Namespace) -> dict[str, Any]:
    config = WorkerConfig(
        concurrency=8, lease_seconds=args.lease, heartbeat_seconds=args.heartbeat, visibility_seconds=args.visibility
    )
    stack = BenchStack(prefix=f"bench-liveness-{fleet}", workers=fleet, worker_config=config, api=False,
                       moto_mode=args.moto)  # fmt: skip
    try:
        log(f"[{fleet} workers] starting ...")
        stack.start()
        stack.wait_polling(timeout=120)
        time.sleep(2 * args.heartbeat)  # every worker has read its peers at least once
        before_stats, before_calls, t0 = stack.worker_stats(), stack.worker_calls(), time.monotonic()
        time.sleep(args.seconds)
        after_stats, after_calls = stack.worker_stats(), stack.worker_calls()
        window = time.monotonic() - t0
        item_bytes = liveness_item_bytes(stack)
        result: dict[str, Any] = {"settings": settings_of(stack)}
    finally:
        stack.stop(grace=10)

    def delta(name: str) -> float:
        total = sum(float(s.get(name) or 0) for s in after_stats.values())
        return total - sum(float(s.get(name) or 0) for s in before_stats.values())

    per = fleet * window
    rounds, queries, items = (
        delta("beat_rounds") / per,
        delta("beat_peers_read") / per,
        delta("beat_peer_items_read") / per,
    )
    ddb = sum(n - before_calls.get(op, 0) for op, n in after_calls.items() if op.startswith("dynamodb:")) / per
    units = queries * read_units(items / max(queries, 1e-9), item_bytes)
    every_units = rounds * read_units(fleet, item_bytes)
    return {
        **result,
        "fleet": fleet,
        "window_s": window,
        "workers_counted": len(after_stats),
        "rounds_per_s": rounds,
        "queries_per_s": queries,
        "items_per_s": items,
        "ddb_calls_per_s": ddb,
        "read_units_per_s": units,
        "item_bytes": item_bytes,
        "every_peer_items_per_s": rounds * fleet,
        "every_peer_read_units_per_s": every_units,
    }


def render(result: dict[str, Any]) -> str:
    m, rows = result["machine"], result["fleets"]
    headers = ["workers", "rounds/s", "Queries/s", "items/s", "ddb calls/s", "read units/s", "every peer: items/s",
               "every peer: units/s"]  # fmt: skip
    cells = [
        [r["fleet"], f"{r['rounds_per_s']:.2f}", f"{r['queries_per_s']:.2f}", f"{r['items_per_s']:.2f}",
         f"{r['ddb_calls_per_s']:.2f}", f"{r['read_units_per_s']:.2f}", f"{r['every_peer_items_per_s']:.2f}",
         f"{r['every_peer_read_units_per_s']:.2f}"]
        for r in rows
    ]  # fmt: skip
    out = [
        "agentq liveness reads per worker: local stack (moto server), idle workers",
        f"machine: {m['cpus']} CPUs, Python {m['python']}, moto {m['moto']}; load average at start "
        f"{m['loadavg_at_start']}, at end {m['loadavg_at_end']}; code: git {m['git_head']} + "
        f"{m['core_uncommitted_files']} uncommitted file(s) under layers/",
        f"settings: {settings_line(rows[0]['settings'])}; each worker watches {WATCHED_PEERS} successors",
        "",
        table(headers, cells),
        "(per worker per second over the window; ddb calls = every DynamoDB call of an idle worker: its liveness "
        "renewal and Queries; read units at half a unit per 4 KB a Query reads, rounded up; 'every peer' = one "
        "Query of every worker's item per round, as before)",
        "",
    ]
    item_bytes = rows[-1]["item_bytes"]
    rounds = rows[-1]["rounds_per_s"]
    queries = rows[-1]["queries_per_s"]
    proj = []
    for fleet in (10, 100, 1000):
        every = rounds * read_units(fleet, item_bytes)
        ring = queries * read_units(WATCHED_PEERS + 1, item_bytes)
        rru = rate("dynamodb_rru")
        proj.append([fleet, f"{ring:.2f}", f"{every:.2f}", f"{fleet * ring * 3600 * rru:.4f}",
                     f"{fleet * every * 3600 * rru:.4f}"])  # fmt: skip
    out.append(
        table(["workers", "units/s per worker: ring", "every peer", "fleet $/h: ring", "fleet $/h: every peer"], proj)
    )
    out.append(
        f"(projected from the largest fleet measured: {rounds:.2f} rounds and {queries:.2f} Queries per worker per "
        f"second, liveness items of {item_bytes:.0f} bytes; $ at {quote('dynamodb_rru')})"
    )
    return "\n".join(out)


def panels(result: dict[str, Any]) -> list[Panel]:
    rows = result["fleets"]
    xs = [r["fleet"] for r in rows]
    return [
        Panel("line", "liveness items read per worker per second", "items/s", xs,
              {"ring (measured)": [r["items_per_s"] for r in rows],
               "every peer": [r["every_peer_items_per_s"] for r in rows]}, xlabel="workers"),
        Panel("line", "liveness Queries per worker per second", "calls/s", xs,
              {"Queries": [r["queries_per_s"] for r in rows], "all DynamoDB": [r["ddb_calls_per_s"] for r in rows]},
              xlabel="workers"),
    ]  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--fleets", default="2,10", help="comma-separated numbers of worker processes")
    ap.add_argument("--seconds", type=float, default=20.0, help="sampling window per fleet")
    ap.add_argument("--lease", type=float, default=3.0, help="liveness period, s")
    ap.add_argument("--heartbeat", type=float, default=1.0)
    ap.add_argument("--visibility", type=int, default=4)
    ap.add_argument("--moto", choices=["fast", "stock"], default="fast", help=MOTO_MODES_HELP)
    ap.add_argument("--json", action="store_true", help="print one JSON object on stdout, nothing else")
    add_plot_args(ap, "liveness_reads")
    args = ap.parse_args(argv)
    fleets = [int(x) for x in args.fleets.split(",") if x.strip()]
    with JsonOut(args.json) as out:
        result: dict[str, Any] = {"bench": "liveness_reads", "machine": machine()}
        result["fleets"] = [measure(fleet, args) for fleet in fleets]
        result["machine"]["loadavg_at_end"] = [round(x, 2) for x in os.getloadavg()]
        if args.json:
            out.emit(result)
        else:
            print(render(result))
    plot_from_args(args, "agentq liveness reads per worker", panels(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
