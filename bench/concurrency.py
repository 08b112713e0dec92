"""How many long-running tasks one worker process holds at once, and what that costs it.

    python bench/concurrency.py                         # levels 50,200,500,1000
    python bench/concurrency.py --levels 20,50 --sample-seconds 10 --json

One worker process (``--concurrency`` 1000) on the local stack. The tasks are scripted agents
that never finish during the bench: ``--turns`` turns, each ``--latency`` s (default 2 s) of
LLM time and one ``note_write`` tool call. The ramp is cumulative: at each level the bench
submits tasks until ``level`` have been submitted in all, waits (bounded) until the worker
holds them, then samples for ``--sample-seconds``:

- held: META items with status running, a live lease (lease_expires > now) owned by the
  worker (batched strongly consistent reads of the submitted tasks' META, every
  ``--ddb-every`` s; moto serialises DynamoDB, so these reads are kept sparse);
- SQS in flight: the queue's ApproximateNumberOfMessagesNotVisible (every second);
- RSS (VmRSS) and threads of the worker, from /proc/<pid>/status (every second);
- steps/s committed: the increase of the sum of META.step between the first and last sample
  over the time between them (a turn is 2 steps: the LLM step and the tool-results step);
- the worker's AWS calls/s in the window (counted inside the worker process).

Leases are long for this bench (default lease 1,200 s, heartbeat 60 s, visibility 1,260 s),
and the reason is itself a finding. moto serialises DynamoDB (~100 calls/s here), so once the
held tasks' commits saturate it every call waits ~held/100 s in its queue (each turn is ~3
writes: LLM-step commit, the note, tool-results commit). The worker's HeartbeatHub extends
leases 16 at a time and waits ``heartbeat`` s after each round, so one round over N held tasks
takes ~N/16 x N/100 s: 25 s at 200, 156 s at 500, 625 s at 1,000. With the example settings
(lease 30 s, heartbeat 10 s, visibility 40 s) leases lapse from ~200 held tasks on, the
worker's own poller re-receives the messages, claims the tasks again (new epoch) and the old
runs die on their next fenced write: the held count collapses and threads pile up (measured:
held 66-200 at level 200, 0-1 at level 500 with 1,229 threads). Run with ``--lease 30
--heartbeat 10 --visibility 40`` to see it. The "beat age" column (oldest ``heartbeat_at``
among running tasks) shows how far behind the hub is against the lease.

Liveness (``--liveness``, issue 23): with the default short liveness (lease 3 s, heartbeat 1 s,
visibility 4 s) and long scripted turns (``--latency 30``), the worker keeps its tasks alive
with one liveness item per process (``storage.workers``). The bench reads the worker's own
heartbeat counters (``Worker.stats()``) over each window and reports the liveness calls per
held task per second (DynamoDB writes: the liveness renewal, backstop lease writes, live text;
reads: the Query of every worker's item; SQS: visibility batches), and the dollars of liveness
per 10,000 concurrent tasks per hour at on-demand prices, against the per-task leases it
replaced (0.99 lease writes + ~0.1 SQS calls per held task per second, measured with this
bench at 150 held tasks before the change, issue 23).

steps/s here is the moto server's capacity, not the worker's: the demand is held x 2 steps /
(latency + commit time). The figure that matters is that the held count follows the level
(200+ per process, aim 1,000) with bounded memory and threads.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from _benchlib import (
    MOTO_MODES_HELP,
    BenchStack,
    JsonOut,
    batch_get_meta,
    fmt,
    log,
    machine,
    num,
    patient_clients,
    proc_status,
    queue_in_flight,
    settings_line,
    settings_of,
    table,
    text,
    worker_config,
)
from _plot import Panel, add_plot_args, plot_from_args
from _prices import quote, rate
from agentq.control.submit import submit
from agentq.core.models import TaskSubmission
from agentq.resources import QueueSettings
from agentq.runtime import build_registry

PROJECTION = ["status", "lease_expires", "lease_owner", "lease_epoch", "step", "heartbeat_at"]

PRICED = ("dynamodb_wru", "dynamodb_rru", "sqs_request")  # from the one price table, bench/_prices.py
# Per-task leases before worker liveness, per held task per second (issue 23, this bench at 150
# held tasks, lease 3 s, heartbeat 1 s, visibility 4 s, 20 s turns).
BEFORE_WRITES, BEFORE_SQS = 0.99, 0.1
LIVENESS_COUNTERS = {
    "writes": ("beat_liveness_renewed", "beat_extended", "beat_live_text", "beat_liveness_lapsed"),
    "reads": ("beat_peers_read",),
    "sqs": ("beat_visibility_calls",),
}


def liveness_dollars(writes: float, reads: float, sqs: float, tasks: int = 10_000) -> float:
    """Dollars an hour of liveness calls for ``tasks`` concurrent tasks, per held task per second."""
    return tasks * 3600 * (writes * rate("dynamodb_wru") + reads * rate("dynamodb_rru") + sqs * rate("sqs_request"))


def _hub_counts(stack: BenchStack) -> dict[str, int]:
    total: dict[str, int] = {}
    for stats in stack.worker_stats().values():
        for group, names in LIVENESS_COUNTERS.items():
            total[group] = total.get(group, 0) + sum(int(stats.get(n, 0) or 0) for n in names)
    return total


def submission(turns: int, latency: float) -> TaskSubmission:
    script_turns: list[dict[str, Any]] = [
        {
            "text": f"t{i}",
            "latency_seconds": latency,
            "tool_calls": [{"name": "note_write", "input": {"key": "p", "value": f"{i}"}}],
        }
        for i in range(1, turns + 1)
    ]
    script_turns.append({"text": "done", "latency_seconds": latency})
    return TaskSubmission.model_validate(
        {
            "goal": "concurrency bench: a long agent that waits on its LLM",
            "provider": "scripted",
            "script": {"turns": script_turns},
            "constraints": {
                "tools": ["note_write"],
                "max_steps": turns + 5,
                "max_tokens": 100_000_000,
                "max_output_tokens": 256,
                "timeout_seconds": 24 * 3600,
            },
        }
    )


class Sampler:
    """Reads the submitted tasks' META (sparse) and the worker's /proc status."""

    def __init__(self, stack: BenchStack, worker: Any, submit_threads: int) -> None:
        self.stack, self.worker = stack, worker
        self.store, self.queues = stack.store(), stack.queues()
        # The submitting threads get their own clients: a pool as large as their number and a
        # read timeout long enough that no submit is retried while moto still runs it.
        self.submit_store, self.submit_queues = patient_clients(stack, pool=submit_threads)

    def tasks(self, ids: list[str]) -> dict[str, Any]:
        t0 = time.time()
        items = batch_get_meta(self.store, ids, PROJECTION, parallel=10)
        now = time.time()
        held = 0
        statuses: dict[str, int] = {}
        beat_ages = []
        for item in items.values():
            status = text(item, "status") or "?"
            statuses[status] = statuses.get(status, 0) + 1
            if status == "running" and num(item, "lease_expires") > now and text(item, "lease_owner"):
                held += 1
            if status == "running" and "heartbeat_at" in item:
                beat_ages.append(now - num(item, "heartbeat_at"))
        return {
            "heartbeat_age_max": max(beat_ages) if beat_ages else None,
            "at": (t0 + now) / 2,
            "read_s": now - t0,
            "held": held,
            "statuses": statuses,
            "steps": sum(num(item, "step") for item in items.values()),
            "step_by_id": {t: num(item, "step") for t, item in items.items()},
            "reclaimed": sum(1 for item in items.values() if num(item, "lease_epoch") > 1),
        }

    def process(self) -> dict[str, Any]:
        st = proc_status(self.worker.pid) or {}
        return {
            "at": time.time(),
            "rss_mb": st.get("rss_mb"),
            "threads": st.get("threads"),
            "sqs_in_flight": queue_in_flight(self.queues),
        }


def run_level(
    level: int, ids: list[str], sampler: Sampler, stack: BenchStack, sub: TaskSubmission, args: argparse.Namespace
) -> dict[str, Any]:
    store, queues = sampler.submit_store, sampler.submit_queues
    registry = build_registry(stack.settings)  # type: ignore[arg-type]
    new = level - len(ids)
    errors: list[str] = []

    def one(_: int) -> str | None:
        try:
            return submit(store, registry, sub, tenant="bench", queues=queues).task_id
        except Exception as exc:  # counted and reported; the level then falls short
            errors.append(f"{type(exc).__name__}: {exc}")
            return None

    t0 = time.time()
    if new > 0:
        log(f"[level {level}] submitting {new} tasks ...")
        with ThreadPoolExecutor(max_workers=args.threads) as pool:
            ids.extend(t for t in pool.map(one, range(new)) if t)
    submit_s = time.time() - t0
    if errors:
        log(f"[level {level}] {len(errors)} submit(s) failed, e.g. {errors[0]}")
    # Wait (bounded) until the worker holds the level, polling SQS (cheap) then checking META.
    deadline = time.monotonic() + args.ramp_timeout
    target = len(ids)  # = level unless submits failed
    ramp = ramp_first = sampler.tasks(ids)
    while ramp["held"] < target and time.monotonic() < deadline:
        while queue_in_flight(sampler.queues) < target and time.monotonic() < deadline:
            time.sleep(0.5)
        ramp = sampler.tasks(ids)
        if ramp["held"] < target:
            time.sleep(1.0)
    ramp_s = time.time() - t0
    log(
        f"[level {level}] submitted in {submit_s:.1f}s, held {ramp['held']} after {ramp_s:.1f}s; sampling {args.sample_seconds:g}s ..."
    )
    calls_before = stack.worker_calls()
    hub_before = _hub_counts(stack)
    ddb_samples = [ramp if time.time() - ramp["at"] < 1 else sampler.tasks(ids)]
    proc_samples = [sampler.process()]
    start = time.monotonic()
    next_ddb = start + args.ddb_every
    while time.monotonic() - start < args.sample_seconds:
        time.sleep(1.0)
        proc_samples.append(sampler.process())
        if time.monotonic() >= next_ddb:
            ddb_samples.append(sampler.tasks(ids))
            next_ddb += args.ddb_every
    if time.time() - ddb_samples[-1]["at"] > 1:
        ddb_samples.append(sampler.tasks(ids))
    time.sleep(0.6)  # the worker dumps its call counts every 0.5 s
    calls = stack.worker_calls() - calls_before
    per_worker = stack.worker_stats()
    held_by_worker = [int(st.get("held") or 0) for _, st in sorted(per_worker.items())]
    admission_by_worker = [st.get("admission_limit") for _, st in sorted(per_worker.items())]
    renew_latency = [st.get("lease_write_latency_s") for _, st in sorted(per_worker.items())]
    lapses = sum(int(st.get("beat_liveness_lapsed") or 0) for st in per_worker.values())
    recovered = sum(int(st.get("beat_recovered") or 0) for st in per_worker.values())
    hub_after = _hub_counts(stack)
    first, last = ddb_samples[0], ddb_samples[-1]
    window = max(1e-9, last["at"] - first["at"])
    held = [s["held"] for s in ddb_samples]
    beat_ages = [s["heartbeat_age_max"] for s in ddb_samples if s["heartbeat_age_max"] is not None]
    rss = [s["rss_mb"] for s in proc_samples if s["rss_mb"] is not None]
    threads = [s["threads"] for s in proc_samples if s["threads"] is not None]
    inflight = [s["sqs_in_flight"] for s in proc_samples]
    steps_per_s = (last["steps"] - first["steps"]) / window
    call_window = window + 0.6
    ddb_calls = sum(n for op, n in calls.items() if op.startswith("dynamodb:"))
    progressed = sum(1 for t, n in last["step_by_id"].items() if n > ramp_first["step_by_id"].get(t, 0))
    held_mean = sum(held) / len(held)
    per_task = {
        g: (hub_after.get(g, 0) - hub_before.get(g, 0)) / call_window / max(1.0, held_mean) for g in LIVENESS_COUNTERS
    }
    return {
        "liveness_per_task_per_s": per_task,
        "liveness_calls_per_task_per_s": per_task["writes"] + per_task["sqs"],
        "liveness_usd_per_10k_hour": liveness_dollars(per_task["writes"], per_task["reads"], per_task["sqs"]),
        "level": level,
        "held_by_worker": held_by_worker,
        "admission_limit_by_worker": admission_by_worker,
        "write_latency_s_by_worker": renew_latency,
        "liveness_lapses": lapses,
        "workers_recovered": recovered,
        "submitted": len(ids),
        "submit_errors": len(errors),
        "submit_error_sample": errors[:3],
        "progressed": progressed,
        "progress_window_s": last["at"] - ramp_first["at"],
        "submit_s": submit_s,
        "ramp_s": ramp_s,
        "held_min": min(held),
        "held_mean": sum(held) / len(held),
        "held_max": max(held),
        "sqs_in_flight_min": min(inflight),
        "sqs_in_flight_max": max(inflight),
        "rss_mb_max": max(rss) if rss else None,
        "rss_mb_last": rss[-1] if rss else None,
        "threads_max": max(threads) if threads else None,
        "threads_last": threads[-1] if threads else None,
        "steps_per_s": steps_per_s,
        "turns_per_s": steps_per_s / 2,
        "demand_steps_per_s": last["held"] * 2 / args.latency,
        "window_s": window,
        "ddb_samples": len(ddb_samples),
        "heartbeat_age_max_s": max(beat_ages) if beat_ages else None,
        "meta_read_s_mean": sum(s["read_s"] for s in ddb_samples) / len(ddb_samples),
        "statuses": last["statuses"],
        "reclaimed_tasks": last["reclaimed"],
        "worker_calls_per_s": {op: round(n / call_window, 1) for op, n in sorted(calls.items())},
        "worker_ddb_calls_per_s": ddb_calls / call_window,
        "lease_heartbeats_per_s": calls.get("dynamodb:UpdateItem", 0) / call_window,
    }


def render(result: dict[str, Any]) -> str:
    s, m = result["settings"], result["machine"]
    out = [
        f"agentq in-flight tasks per worker process: local stack (moto server), {s['workers']} worker(s)",
        f"machine: {m['cpus']} CPUs, Python {m['python']}, moto {m['moto']}; load average at start {m['loadavg_at_start']}, at end {m['loadavg_at_end']}; "
        f"code: git {m['git_head']} + {m['core_uncommitted_files']} uncommitted file(s) under layers/",
        f"settings: {settings_line(s)}",
        f"task: {result['task']['turns']} turns x ({result['task']['latency_s']:g}s scripted LLM + note_write), never finishing during the bench; "
        f"idle worker before the ramp: RSS {fmt(result['idle']['rss_mb'], 1)} MB, {result['idle']['threads']} threads",
        "",
    ]
    rows = [
        [
            lv["level"], f"{lv['held_min']}/{lv['held_mean']:.0f}/{lv['held_max']}", f"{lv['sqs_in_flight_min']}-{lv['sqs_in_flight_max']}",
            f"{lv['progressed']}", f"{lv['rss_mb_max']:.1f}", lv["threads_max"], f"{lv['steps_per_s']:.1f}", f"{lv['demand_steps_per_s']:.0f}",
            f"{lv['worker_ddb_calls_per_s']:.0f}", f"{lv['lease_heartbeats_per_s']:.1f}", fmt(lv["heartbeat_age_max_s"], 0),
            lv["reclaimed_tasks"], f"{lv['ramp_s']:.1f}",
        ]
        for lv in result["levels"]
    ]  # fmt: skip
    out.append(
        table(
            [
                "level",
                "held min/mean/max",
                "sqs in flight",
                "progressed",
                "RSS MB",
                "threads",
                "steps/s",
                "demand",
                "ddb calls/s",
                "UpdateItem/s",
                "beat age",
                "reclaimed",
                "ramp s",
            ],
            rows,
        )
    )
    out.append(
        "(held = running tasks with a live lease, from META; sqs in flight = messages received and not deleted; "
        "progressed = tasks whose step advanced between the end of the level's submissions and the end of its window; "
        "RSS/threads = max over the window; steps/s committed over the window; demand = held x 2 steps / LLM latency; "
        "UpdateItem/s = step commits, claims, notes and liveness writes; beat age = oldest last-heartbeat among running tasks, s; "
        "reclaimed = tasks whose lease was ever taken over)"
    )
    out.append("")
    out.extend(
        f"level {lv['level']}: held per worker {lv['held_by_worker']}, admission limit {lv['admission_limit_by_worker']}, "
        f"hub write latency {lv['write_latency_s_by_worker']} s, liveness lapses {lv['liveness_lapses']}, "
        f"workers declared dead {lv['workers_recovered']}"
        for lv in result["levels"]
    )
    out.append("")
    before = liveness_dollars(BEFORE_WRITES, 0.0, BEFORE_SQS)
    live_rows = [
        [
            lv["level"], f"{lv['liveness_per_task_per_s']['writes']:.4f}", f"{lv['liveness_per_task_per_s']['reads']:.4f}",
            f"{lv['liveness_per_task_per_s']['sqs']:.4f}", f"{lv['liveness_calls_per_task_per_s']:.4f}",
            f"{lv['liveness_usd_per_10k_hour']:.3f}", f"{before:.2f}",
        ]
        for lv in result["levels"]
    ]  # fmt: skip
    out.append(
        table(
            ["level", "ddb writes", "ddb reads", "sqs calls", "writes+sqs", "$/h per 10k tasks", "before $/h"],
            live_rows,
        )
    )
    out.append(
        "(liveness calls per held task per second over the window, from the worker's heartbeat counters; "
        f"$ at {quote(*PRICED)}; "
        f"before = per-task leases, {BEFORE_WRITES} writes + {BEFORE_SQS} SQS calls per held task per second, issue 23)"
    )
    out.append("")
    out.extend(result["notes"])
    return "\n".join(out)


def panels(result: dict[str, Any]) -> list[Panel]:
    """Per in-flight level: committed steps/s against the demand, memory, and DynamoDB calls."""
    levels = result["levels"]
    xs = [lv["level"] for lv in levels]
    return [
        Panel("line", "steps per second", "steps/s", xs,
              {"committed": [lv["steps_per_s"] for lv in levels], "demand": [lv["demand_steps_per_s"] for lv in levels]},
              xlabel="tasks in flight"),
        Panel("line", "worker RSS (max over the window)", "MB", xs, {"RSS": [lv["rss_mb_max"] for lv in levels]},
              xlabel="tasks in flight"),
        Panel("line", "worker DynamoDB calls per second", "calls/s", xs,
              {"all": [lv["worker_ddb_calls_per_s"] for lv in levels],
               "lease UpdateItem": [lv["lease_heartbeats_per_s"] for lv in levels]},
              xlabel="tasks in flight"),
        Panel("bar", "liveness $/hour per 10,000 concurrent tasks", "$/h", ["before", *[str(x) for x in xs]],
              {"$/h": [liveness_dollars(BEFORE_WRITES, 0.0, BEFORE_SQS),
                       *[lv["liveness_usd_per_10k_hour"] for lv in levels]]}),
    ]  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--levels", default="50,200,500,1000", help="comma-separated in-flight targets, ascending")
    ap.add_argument("--concurrency", type=int, default=1000, help="the worker's concurrency limit")
    ap.add_argument("--workers", type=int, default=1, help="worker processes (RSS and threads: the first one's)")
    ap.add_argument("--latency", type=float, default=2.0, help="scripted LLM latency per turn (s)")
    ap.add_argument("--turns", type=int, default=120, help="turns per task (enough to outlast the bench)")
    ap.add_argument("--lease", type=float, default=1200.0, help="see the module doc: 30 s collapses at 200+ on moto")
    ap.add_argument("--heartbeat", type=float, default=60.0)
    ap.add_argument("--visibility", type=int, default=1260)
    ap.add_argument("--sample-seconds", type=float, default=20.0, help="sampling window per level")
    ap.add_argument("--ddb-every", type=float, default=5.0, help="seconds between META reads in the window")
    ap.add_argument("--ramp-timeout", type=float, default=180.0, help="max seconds to wait for a level to be held")
    ap.add_argument(
        "--threads", type=int, default=64, help="submitting threads (many: each submit waits its turn in moto)"
    )
    ap.add_argument("--moto", choices=["fast", "stock"], default="fast", help=MOTO_MODES_HELP)
    ap.add_argument("--json", action="store_true", help="print one JSON object on stdout, nothing else")
    add_plot_args(ap, "concurrency")
    args = ap.parse_args(argv)
    levels = [int(x) for x in args.levels.split(",") if x.strip()]
    if levels != sorted(levels) or not levels or levels[0] <= 0:
        ap.error("--levels must be positive and ascending")
    if levels[-1] > args.concurrency:
        log(f"note: the top level {levels[-1]} is above the worker's concurrency {args.concurrency}")

    config = worker_config(args)
    sub = submission(args.turns, args.latency)
    with JsonOut(args.json) as out:
        stack = BenchStack(
            prefix="bench-concurrency",
            workers=args.workers,
            worker_config=config,
            queue_settings=QueueSettings(visibility_timeout=args.visibility),
            api=False,
            moto_mode=args.moto,
        )
        result: dict[str, Any] = {
            "bench": "concurrency",
            "machine": machine(),
            "task": {"turns": args.turns, "latency_s": args.latency},
        }
        levels_out: list[dict[str, Any]] = []
        try:
            log("starting the local stack ...")
            stack.start()
            stack.wait_polling()
            result["settings"] = settings_of(stack)
            worker = stack.processes[0]
            time.sleep(1.0)
            result["idle"] = proc_status(worker.pid) or {}
            sampler = Sampler(stack, worker, args.threads)
            ids: list[str] = []
            for level in levels:
                if worker.poll() is not None:
                    raise RuntimeError(f"the worker exited with code {worker.returncode}")
                lv = run_level(level, ids, sampler, stack, sub, args)
                levels_out.append(lv)
                log(f"[level {level}] held {lv['held_min']}-{lv['held_max']}, RSS {lv['rss_mb_max']:.1f} MB, "
                    f"{lv['threads_max']} threads, {lv['steps_per_s']:.1f} steps/s; liveness per held task per s: "
                    f"{lv['liveness_per_task_per_s']}, ${lv['liveness_usd_per_10k_hour']:.3f}/h per 10k tasks")  # fmt: skip
        finally:
            log("stopping the local stack (the worker drains: each task ends its step in flight) ...")
            stack.stop(grace=20.0)
        result["machine"]["loadavg_at_end"] = [round(x, 2) for x in os.getloadavg()]
        result["levels"] = levels_out
        notes = []
        for lv in levels_out:
            notes.append(
                f"level {lv['level']}: held {lv['held_min']}..{lv['held_max']} of {lv['level']} "
                f"({'all held' if lv['held_min'] >= lv['level'] else 'NOT all held; META statuses ' + str(lv['statuses'])}), RSS {lv['rss_mb_max']:.1f} MB "
                f"(+{(lv['rss_mb_max'] - result['idle'].get('rss_mb', 0)) * 1024 / max(1, lv['held_max']):.0f} KB per held task over idle), "
                f"{lv['threads_max']} threads, {lv['steps_per_s']:.1f} of {lv['demand_steps_per_s']:.0f} steps/s demanded"
            )
        if any(
            lv["statuses"].get("queued")
            and all(
                (limit or 0) > held
                for limit, held in zip(lv["admission_limit_by_worker"], lv["held_by_worker"], strict=True)
            )
            for lv in levels_out
        ):  # queued while admission would have taken more
            notes.append(
                "Tasks left 'queued' while the worker had free slots: the pollers of the empty tiers (high, low) "
                "hold up to 10 slots each during their long polls and the slot pool prefers them (lowest use/weight), "
                "so the busy tier cannot take the last free slots (agentq/worker.py SlotPool/_poll)."
            )
        notes.append(
            "steps/s is bounded by the moto server, not the worker: moto serialises every DynamoDB request in one "
            "process (~3.0 ms of its CPU per call of a turn, bench/moto_throughput.py: ~330 calls/s with a whole core, "
            "half that when the machine is shared) and each turn is "
            "~5.4 DynamoDB calls (two step commits of a PutItem and an UpdateItem each, note_write's transaction), "
            "a claim ~6; once demand passes what moto serves every call waits in its queue, the worker's liveness "
            "renewal too (the 'hub write latency' above), and admission stops taking tasks."
        )
        result["notes"] = notes
        if args.json:
            out.emit(result)
        else:
            print(render(result))
    plot_from_args(args, "agentq in-flight tasks per worker process", panels(result))
    ok = all(lv["held_min"] >= lv["level"] for lv in levels_out) and len(levels_out) == len(levels)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
