"""What watching agents costs an hour in AWS, by design, and what the seed's load costs by way of running.

    python bench/live_cost.py                                  # 100 / 1,000 / 10,000 watchers
    python bench/live_cost.py --live-seconds 3 --watchers-per-task 2 --json

A cost model, not a run in AWS: every unit is priced by ``bench/_prices.py`` and every count is
either a measured figure of another bench (named beside it) or a parameter of the workload (a
committed turn every ``--turn-seconds``, the live text of the model call in flight published
every ``--live-seconds`` while it streams, ``--watchers-per-task`` people watching each task).
The designs (docs/ARCHITECTURE.md, invariant 10, "Live events at scale"):

- ``sse-lambda`` (today in AWS): each watcher holds one invocation of the events function
  (512 MB arm64, the whole hour: four 15-minute streams) polling META with a consistent GetItem
  every 300 ms (one read unit each; ``bench/events.py``), plus a REST request per stream.
- ``appsync-events`` (considered, not built): a watcher holds a WebSocket; per hour a
  ticket (a REST request, an API invocation, a write unit), a connect and a subscribe (two
  operations, two authorizer invocations), 60 connection minutes; each committed event and each
  live-text message is published once (an operation) and delivered to each watcher of its task
  (an operation each). Nothing of ours runs between events: 0 Lambda executions held.
- ``apigw-websocket``: the same workload on an API Gateway WebSocket API: connection minutes and
  one message per delivery (the publisher posts to each connection), a $connect and a
  $disconnect invocation and a connection item written and deleted per watcher, and a Query of
  the task's connections per publish.
- ``fargate-hub`` (built: ``agentq.hub``, infra/hub.py): the API's own event stream served by
  ``--hub-tasks`` Fargate servers (1 vCPU and 2 GB each per ``HUB_WATCHERS_PER_VCPU`` watchers it
  holds) behind an ALB (its hour and its LCUs: active connections, bytes processed). Nothing is
  published: the table's stream (DynamoDB Streams, read by each server every ``STREAM_POLL``
  seconds per shard) nudges the poller of a task that changed; the poller reads META (one
  strongly consistent unit) and the log after it (one unit) per committed event, and META alone
  (eventually consistent: half a unit) per live-text write; one poller per task per server,
  shared by its watchers. 0 Lambda executions, and 0 publishes per committed event (the stream
  carries its two item writes, STEP and META, as two records).

The seed's load (10,000 concurrent agents, ~833 model calls/s, ~1,666 checkpoint writes/s) is
priced per way of running from the step costs ``bench/checkpoint_cost.py`` measured (3.53
write units a step), the liveness ``bench/concurrency.py`` measured (0.0005 calls per held task
per second), a Lambda executor held for the whole task (1 GB, ``executor.memory_mb``), Fargate
workers holding 1,000 tasks each (1 vCPU, 2 GB: ``bench/concurrency.py`` held 1,000 per process),
and economy (Message Batches: the task parked, no compute held; assumed: two 0.5 s executor runs
and five polls of three SQS requests and a META read per call).
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from typing import Any

from _benchlib import JsonOut, table
from _plot import Panel, add_plot_args, plot_from_args
from _prices import READ_ON, as_json, quote, rate

# Measured elsewhere (the bench that measured each is named).
STEP_WRU = 3.53  # bench/checkpoint_cost.py: write units per committed step
STEP_RRU = 0.2  # bench/message_cost.py: ~4 reads of 21 steps ("no message"), half a unit each, rounded up
LIVENESS_CALLS = 0.0005  # bench/concurrency.py: writes + SQS calls per held task per second (two workers)
TASKS_PER_WORKER = 1000  # bench/concurrency.py: held by one worker process on 30 s turns
SSE_POLL_SECONDS = 0.3  # api/event_hub.py: a poller's META read period
SSE_STREAM_SECONDS = 900  # infra/events.py: a stream's longest life
EVENT_BYTES = 600  # a committed step's frame, about (bench/events.py); live-text deltas are smaller
# Sizes of what runs.
SSE_GB, EXECUTOR_GB, API_GB, AUTH_GB = 0.5, 1.0, 0.5, 0.25
API_SECONDS, AUTH_SECONDS = 0.1, 0.05  # a ticket's API invocation, an authorizer's
HUB_WATCHERS_PER_VCPU = 5000  # open streams one hub vCPU is given (an assumption: locally 200 on a shared 2-core box)
STREAM_POLL = 0.4  # agentq.hub: a server's GetRecords per shard every this long (api/stream_feed.py)
DELTA_BYTES = 400  # a live-text frame (its JSON, about a second of text)
# Read units a server spends per committed event of a task it serves: META + the log's new step
# (measured on the fed hub by DynamoDB's rules: 2 for a step item up to 4 KB, one more per 4 KB
# above it, 4 for a tools step with a 10 KB result; before storage/events.py stopped re-reading
# the step already sent, 4 and 7).
COMMIT_READS = 2.0
LIVE_READS = 0.5  # per live-text write: META, eventually consistent
SHARD_WRU = 1000  # write units a second per table partition (one stream shard each)
SEED = {"agents": 10_000, "model_calls_per_s": 833, "checkpoint_writes_per_s": 1666}


@dataclass(frozen=True)
class Workload:
    watchers: int
    turn_seconds: float
    live_seconds: float | None  # None: committed events only
    watchers_per_task: float

    @property
    def tasks(self) -> float:
        return self.watchers / self.watchers_per_task

    @property
    def publishes_per_task_hour(self) -> float:
        commits = 3600 / self.turn_seconds
        live = 0.0 if self.live_seconds is None else 3600 / self.live_seconds
        return commits + live

    @property
    def deliveries_per_hour(self) -> float:
        return self.publishes_per_task_hour * self.tasks * self.watchers_per_task


def _bytes_out(w: Workload) -> float:
    """GB an hour to the watchers: committed frames and live-text frames (the same on every design)."""
    commits = 3600 / w.turn_seconds * w.tasks
    lives = 0.0 if w.live_seconds is None else 3600 / w.live_seconds * w.tasks
    return (commits * EVENT_BYTES + lives * DELTA_BYTES) * w.watchers_per_task / 1e9


def sse_lambda(w: Workload) -> dict[str, Any]:
    hours_held = w.watchers  # one invocation per watcher, the whole hour
    parts = {
        "lambda": hours_held * 3600 * SSE_GB * rate("lambda_arm_gb_second")
        + w.watchers * (3600 / SSE_STREAM_SECONDS) * rate("lambda_request"),
        "dynamodb": w.watchers * (3600 / SSE_POLL_SECONDS) * rate("dynamodb_rru"),
        "api_gateway": w.watchers * (3600 / SSE_STREAM_SECONDS) * rate("apigw_rest_request"),
        "data_out": _bytes_out(w) * rate("data_out_gb"),
    }
    return {"usd": parts, "lambda_held": w.watchers, "messages": w.deliveries_per_hour, "publishes_per_event": 0}


def _ticket(w: Workload) -> float:
    """A watcher's ticket an hour: a REST request, an API invocation, one write unit (the cap)."""
    return w.watchers * (
        rate("apigw_rest_request") + rate("lambda_request") + API_GB * API_SECONDS * rate("lambda_arm_gb_second")
        + rate("dynamodb_wru")
    )  # fmt: skip


def appsync_events(w: Workload) -> dict[str, Any]:
    publishes = w.publishes_per_task_hour * w.tasks
    operations = publishes + w.deliveries_per_hour + 2 * w.watchers  # + a connect and a subscribe each
    parts = {
        "appsync_operations": operations * rate("appsync_events_operation"),
        "appsync_connection_minutes": w.watchers * 60 * rate("appsync_events_connection_minute"),
        "lambda": _ticket(w)
        + w.watchers * 2 * (rate("lambda_request") + AUTH_GB * AUTH_SECONDS * rate("lambda_arm_gb_second")),
        "data_out": _bytes_out(w) * rate("data_out_gb"),
    }
    return {"usd": parts, "lambda_held": 0, "messages": operations, "publishes_per_event": 1}


def apigw_websocket(w: Workload) -> dict[str, Any]:
    publishes = w.publishes_per_task_hour * w.tasks
    parts = {
        "apigw_messages": w.deliveries_per_hour * rate("apigw_ws_message"),
        "apigw_connection_minutes": w.watchers * 60 * rate("apigw_ws_connection_minute"),
        "lambda": _ticket(w)
        + w.watchers * 2 * (rate("lambda_request") + AUTH_GB * AUTH_SECONDS * rate("lambda_arm_gb_second")),
        "dynamodb": w.watchers * 2 * rate("dynamodb_wru") + publishes * 0.5 * rate("dynamodb_rru"),
        "data_out": _bytes_out(w) * rate("data_out_gb"),
    }
    per_event = int(w.watchers_per_task) if float(w.watchers_per_task).is_integer() else w.watchers_per_task
    return {"usd": parts, "lambda_held": 0, "messages": w.deliveries_per_hour, "publishes_per_event": per_event}


def fargate_hub(w: Workload, hub_tasks: int) -> dict[str, Any]:
    """The events hub as built (see the module)."""
    vcpus = max(1, -(-w.watchers // (hub_tasks * HUB_WATCHERS_PER_VCPU)))  # per server
    commits = 3600 / w.turn_seconds * w.tasks
    lives = 0.0 if w.live_seconds is None else 3600 / w.live_seconds * w.tasks
    served = min(float(hub_tasks), w.watchers_per_task)  # servers holding a poller of each task, at most
    table_wru = (commits * STEP_WRU + lives) / 3600
    shards = max(1, -(-int(table_wru) // SHARD_WRU))
    gb = (commits * EVENT_BYTES + lives * DELTA_BYTES) * w.watchers_per_task / 1e9
    lcus = max(w.watchers / 3000, gb, 1 / 25)
    parts = {
        "fargate": hub_tasks * vcpus * (rate("fargate_arm_vcpu_hour") + 2 * rate("fargate_arm_gb_hour")),
        "alb": rate("alb_hour") + lcus * rate("alb_lcu_hour"),
        "dynamodb": served * (commits * COMMIT_READS + lives * LIVE_READS) * rate("dynamodb_rru"),
        "dynamodb_streams": hub_tasks * shards * 3600 / STREAM_POLL * rate("dynamodb_streams_read"),
        "data_out": gb * rate("data_out_gb"),
    }
    return {"usd": parts, "lambda_held": 0, "messages": w.deliveries_per_hour, "publishes_per_event": 0,
            "reads_per_event": COMMIT_READS * served, "shards": shards}  # fmt: skip


def designs(w: Workload, hub_tasks: int) -> dict[str, dict[str, Any]]:
    out = {"sse-lambda": sse_lambda(w), "appsync-events": appsync_events(w), "apigw-websocket": apigw_websocket(w),
           "fargate-hub": fargate_hub(w, hub_tasks)}  # fmt: skip
    for d in out.values():
        d["total_usd"] = sum(d["usd"].values())
        d["per_watcher_usd"] = d["total_usd"] / w.watchers
    return out


def seed_load(live_usd: float) -> dict[str, dict[str, Any]]:
    """The seed's load, per way of running: platform dollars an hour (tokens apart) and quotas."""
    agents, calls, writes = SEED["agents"], SEED["model_calls_per_s"], SEED["checkpoint_writes_per_s"]
    steps = writes / 2  # a step is a STEP put and a META update (bench/checkpoint_cost.py: 2.01 calls/step)
    dynamodb = 3600 * (steps * STEP_WRU * rate("dynamodb_wru") + steps * STEP_RRU * rate("dynamodb_rru"))
    liveness = 3600 * agents * LIVENESS_CALLS * rate("dynamodb_wru")
    workers = -(-agents // TASKS_PER_WORKER)
    ways: dict[str, dict[str, Any]] = {
        "lambda executors": {
            "compute": agents * 3600 * EXECUTOR_GB * rate("lambda_arm_gb_second")
            + agents * (3600 / 900) * rate("lambda_request"),  # one 15-minute slice after another
            "sqs": agents * (3600 / 900) * 3 * rate("sqs_request"),  # a slice's send, receive, delete
            "quota": f"{agents:,} concurrent Lambda executions (default regional quota 1,000: ask for more)",
        },
        "fargate workers": {
            "compute": workers * (rate("fargate_arm_vcpu_hour") + 2 * rate("fargate_arm_gb_hour")),
            "sqs": 3600 * agents * LIVENESS_CALLS * rate("sqs_request"),
            "quota": f"{workers} Fargate tasks, {workers} vCPU (Fargate On-Demand vCPU quota)",
        },
        "economy batches": {
            "compute": calls * 3600 * 2 * (0.5 * EXECUTOR_GB * rate("lambda_arm_gb_second") + rate("lambda_request")),
            "sqs": calls * 3600 * 5 * 3 * rate("sqs_request"),
            "quota": f"~{calls * 2 * 0.5:,.0f} concurrent Lambda executions for the submits and commits; the "
            "provider's batch quotas",
        },
    }
    out = {}
    for name, way in ways.items():
        parts: dict[str, float] = {"compute": way["compute"], "dynamodb": dynamodb + (liveness if name == "fargate workers" else 0),
                 "sqs": way["sqs"], "s3": 0.0, "step_functions": 0.0, "live_path": live_usd}  # fmt: skip
        out[name] = {"usd": parts, "total_usd": sum(parts.values()), "quota": way["quota"],
                     "table_wru_per_s": round(steps * STEP_WRU), "table_rru_per_s": round(steps * STEP_RRU)}  # fmt: skip
    return out


def render(result: dict[str, Any]) -> str:
    w = result["workload"]
    live = "committed events only" if w["live_seconds"] is None else f"live text every {w['live_seconds']:g} s"
    out = [f"agentq live events: dollars an hour by design (a turn every {w['turn_seconds']:g} s, {live}, "
           f"{w['watchers_per_task']:g} watcher(s) per task)", ""]  # fmt: skip
    names = list(result["by_watchers"][0]["designs"])
    rows = []
    for entry in result["by_watchers"]:
        for name in names:
            d = entry["designs"][name]
            rows.append([f"{entry['watchers']:,}", name, f"{d['total_usd']:.2f}", f"{d['per_watcher_usd'] * 1000:.3f}",
                         f"{d['lambda_held']:,}", f"{d['messages'] / 1e6:.2f}", str(d["publishes_per_event"])])  # fmt: skip
    out.append(table(["watchers", "design", "$/h all in", "$/h per 1k watchers", "Lambda held", "M messages/h",
                      "publishes/event"], rows))  # fmt: skip
    out.append(f"(target: <= $5/h for 10,000 watchers, 0 Lambda executions held per idle watcher; prices: "
               f"{quote('lambda_arm_gb_second', 'dynamodb_rru', 'appsync_events_operation', 'apigw_ws_message')})")  # fmt: skip
    out.append("")
    rows = [[("none" if s["live_seconds"] is None else f"{s['live_seconds']:g} s"), *(f"{s[n]:.2f}" for n in names)]
            for s in result["live_sweep"]]  # fmt: skip
    out.append("10,000 watchers, $/h by live-text interval:")
    out.append(table(["live text", *names], rows))
    out.append("")
    out.append(f"The seed's load ({SEED['agents']:,} agents, {SEED['model_calls_per_s']} model calls/s, "
               f"{SEED['checkpoint_writes_per_s']:,} checkpoint writes/s) + one watcher each on the events hub, $/h "
               "(tokens apart):")  # fmt: skip
    rows = [[name, *(f"{v:.2f}" for v in s["usd"].values()), f"{s['total_usd']:.2f}", s["quota"]]
            for name, s in result["seed"].items()]  # fmt: skip
    parts = list(next(iter(result["seed"].values()))["usd"])
    out.append(table(["way of running", *parts, "total", "quota it needs"], rows))
    s = next(iter(result["seed"].values()))
    out.append(f"(table throughput: ~{s['table_wru_per_s']:,} write units/s, ~{s['table_rru_per_s']:,} read units/s, "
               f"on-demand; prices read {READ_ON}, bench/_prices.py)")  # fmt: skip
    return "\n".join(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--watchers", default="100,1000,10000")
    ap.add_argument("--turn-seconds", type=float, default=12.0, help="a committed turn every this long")
    ap.add_argument("--live-seconds", type=float, default=1.0, help="live text published every this long; 0: none")
    ap.add_argument("--watchers-per-task", type=float, default=1.0)
    ap.add_argument(
        "--hub-tasks",
        type=int,
        default=2,
        help="fargate-hub: servers (2, what docs/BENCHMARKS.md records; the stack runs 1, infra/live_settings.py)",
    )
    ap.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    add_plot_args(ap, "live_cost")
    args = ap.parse_args()
    live = args.live_seconds or None
    counts = [int(n) for n in args.watchers.split(",")]
    with JsonOut(args.json) as out:
        by: list[dict[str, Any]] = [{"watchers": n, "designs": designs(Workload(n, args.turn_seconds, live, args.watchers_per_task),
                                                 args.hub_tasks)} for n in counts]  # fmt: skip
        sweep: list[dict[str, Any]] = []
        for seconds in (1.0, 2.0, 5.0, 12.0, None):
            d = designs(Workload(10_000, args.turn_seconds, seconds, args.watchers_per_task), args.hub_tasks)
            sweep.append({"live_seconds": seconds, **{k: v["total_usd"] for k, v in d.items()}})
        ten_k = designs(Workload(SEED["agents"], args.turn_seconds, live, 1.0), args.hub_tasks)
        result = {
            "workload": {
                "turn_seconds": args.turn_seconds,
                "live_seconds": live,
                "watchers_per_task": args.watchers_per_task,
            },
            "by_watchers": by,
            "live_sweep": sweep,
            "seed": seed_load(ten_k["fargate-hub"]["total_usd"]),
            "prices": as_json(
                "lambda_arm_gb_second",
                "lambda_request",
                "dynamodb_wru",
                "dynamodb_rru",
                "apigw_rest_request",
                "appsync_events_operation",
                "appsync_events_connection_minute",
                "apigw_ws_message",
                "apigw_ws_connection_minute",
                "fargate_arm_vcpu_hour",
                "fargate_arm_gb_hour",
                "alb_hour",
                "alb_lcu_hour",
                "dynamodb_streams_read",
                "sqs_request",
                "data_out_gb",
            ),
        }
        names = list(by[0]["designs"])
        plot_from_args(args, "agentq live events: dollars an hour", [
            Panel("line", "all in, by watchers", "$/h", [e["watchers"] for e in by],
                  {n: [e["designs"][n]["total_usd"] for e in by] for n in names}, xlabel="watchers", logx=True,
                  logy=True, hlines={"target $5/h": 5.0}),
            Panel("bar", "10,000 watchers by live-text interval", "$/h",
                  [("none" if s["live_seconds"] is None else f"{s['live_seconds']:g} s") for s in sweep],
                  {n: [s[n] for s in sweep] for n in names}, logy=True),
        ])  # fmt: skip
        if args.json:
            out.emit(result)
        else:
            print(render(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
