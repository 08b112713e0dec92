"""Throughput of the local API server under concurrent clients, and whether requests cross.

    python bench/local_api.py                       # 1, 10, 50, 200 clients; three modes
    python bench/local_api.py --clients 50,200 --modes isolated,serialised --rounds 3 --json

Each cell is a fresh local stack (moto server, auth on as in AWS, no workers) and ``clients``
threads of two tenants that start together; each makes three requests over real HTTP:
``POST /tasks`` with a goal of its own, ``GET`` of that task with its key, and the same ``GET``
with the other tenant's key (a 404 is the right answer). Modes, all over one resolver:

- ``isolated``: the resolver as built (``AgentqResolver`` keeps each request's state apart);
- ``serialised``: the same resolver behind a lock, one request inside it at a time, the
  other way to isolate requests, measured to show what it would cost;
- ``shared``: every request in one state record, as powertools keeps it (on the class, for a
  process that answers one event at a time): what the server did before, and what crosses.

With ``--rounds N`` every cell runs N times, the modes interleaved (this machine's load drifts),
and the table shows each figure's median over the rounds. Figures: requests/s (3 x clients / wall time), latency p50/p99 over all requests, 5xx
answers, and crossed answers (a POST naming a task another request also got, a GET naming
another task or goal, or a task written with another request's goal or tenant). DynamoDB is
serialised by the local moto server, so the API can overlap only its own work (parsing,
validation, SQS) with another request's DynamoDB calls.
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextvars import ContextVar
from typing import Any

from _benchlib import JsonOut, fmt, log, machine, percentile, table
from _plot import Panel, add_plot_args, plot_from_args
from agentq.api.app import AgentqResolver, build_app
from agentq.api.auth import authorize
from agentq.api.http_server import ApiServer
from agentq.runtime import build_fanout, build_queues, build_registry
from agentq_dev.stack import LocalStack

MODES = ("isolated", "serialised", "shared")
Handler = Callable[[dict[str, Any], Any], dict[str, Any]]


def handler_for(app: AgentqResolver, mode: str) -> Handler:
    logging.getLogger("agentq.api").setLevel(logging.CRITICAL if mode == "shared" else logging.NOTSET)
    if mode == "isolated":
        return app.resolve
    if mode == "serialised":
        lock = threading.Lock()

        def serialised(event: dict[str, Any], context: Any) -> dict[str, Any]:
            with lock:
                return app.resolve(event, context)

        return serialised
    # shared: no per-request record; each request writes the one startup record, as powertools
    # writes its class attribute, and every thread reads it. The 500s this mode gets are its
    # figure (counted in the table), so their tracebacks are not logged.
    app._request = ContextVar("never_set", default=None)

    def shared(event: dict[str, Any], context: Any) -> dict[str, Any]:
        app._startup.event, app._startup.lambda_context = app._to_proxy_event(event), context
        return app._checked(event, context)

    return shared


def _http(url: str, method: str, key: str, body: Any = None) -> tuple[int, Any, float]:
    data = json.dumps(body).encode() if body is not None else None
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {key}"}
    request = urllib.request.Request(url, data=data, method=method, headers=headers)
    start = time.perf_counter()
    try:
        with urllib.request.urlopen(request, timeout=600) as resp:
            return resp.status, json.loads(resp.read()), time.perf_counter() - start
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read() or b"null"), time.perf_counter() - start


def run_cell(clients: int, mode: str) -> dict[str, Any]:
    with LocalStack(prefix=f"api{uuid.uuid4().hex[:8]}", workers=0, api=False) as stack:
        assert stack.settings is not None
        settings = stack.settings
        app = build_app(
            stack.store(),
            build_registry(settings),
            build_queues(settings),
            build_fanout(settings),
            defaults=settings.defaults,
        )
        keys_store = stack.keys()
        server = ApiServer(
            handler_for(app, mode), authorizer=lambda header: authorize(keys_store, header).tenant
        ).start()
        try:
            keys = {"team-a": stack.create_api_key("team-a"), "team-b": stack.create_api_key("team-b")}
            start = threading.Barrier(clients)

            def client(n: int) -> dict[str, Any]:
                tenant, other = ("team-a", "team-b") if n % 2 else ("team-b", "team-a")
                goal = f"request {n} of {tenant} {uuid.uuid4().hex}"
                body = {"goal": goal, "provider": "scripted", "script": {"turns": [{"text": goal}]}}
                start.wait()
                out: dict[str, Any] = {
                    "tenant": tenant,
                    "goal": goal,
                    "post": _http(f"{server.url}/tasks", "POST", keys[tenant], body),
                }
                if out["post"][0] == 202:
                    task_id = out["post"][1]["task_id"]
                    out["own"] = _http(f"{server.url}/tasks/{task_id}", "GET", keys[tenant])
                    out["other"] = _http(f"{server.url}/tasks/{task_id}", "GET", keys[other])
                return out

            began = time.perf_counter()
            with ThreadPoolExecutor(max_workers=clients) as pool:
                answers = list(pool.map(client, range(clients)))
            wall = time.perf_counter() - began
        finally:
            server.stop()
        store = stack.store()
        replies = [a[k] for a in answers for k in ("post", "own", "other") if k in a]
        task_ids = [a["post"][1]["task_id"] for a in answers if a["post"][0] == 202]
        crossed = len(task_ids) - len(set(task_ids))
        for a in answers:
            if a["post"][0] != 202:
                continue
            task_id = a["post"][1]["task_id"]
            code, view, _ = a["own"]
            crossed += code != 200 or view.get("task_id") != task_id or view.get("goal") != a["goal"]
            crossed += a["other"][0] != 404
            task = store.tasks.get(task_id)
            crossed += task.tenant != a["tenant"] or task.submission.goal != a["goal"]
        latencies = [r[2] for r in replies]
        return {
            "mode": mode,
            "clients": clients,
            "requests": len(replies),
            "wall_s": wall,
            "requests_per_s": len(replies) / wall,
            "p50_s": percentile(latencies, 50),
            "p99_s": percentile(latencies, 99),
            "errors_5xx": sum(r[0] >= 500 for r in replies),
            "other_errors": sum(400 <= r[0] < 500 for r in replies) - sum(1 for a in answers if "other" in a),
            "crossed": crossed,
        }


def median_row(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Each figure's median over the rounds of one cell; errors and crossings are summed."""
    row = {"mode": runs[0]["mode"], "clients": runs[0]["clients"], "rounds": len(runs)}
    for name in ("requests", "wall_s", "requests_per_s", "p50_s", "p99_s"):
        row[name] = statistics.median(r[name] for r in runs)
    for name in ("errors_5xx", "other_errors", "crossed"):
        row[name] = sum(r[name] for r in runs)
    return row


def panels(rows: list[dict[str, Any]]) -> list[Panel]:
    """Throughput and p99 per mode against concurrent clients; crossed answers are the third
    panel because their only acceptable height is zero."""
    levels = sorted({r["clients"] for r in rows})
    modes = list(dict.fromkeys(r["mode"] for r in rows))
    by = {(r["mode"], r["clients"]): r for r in rows}

    def series(key: str) -> dict[str, list[float | None]]:
        return {m: [by[(m, c)][key] if (m, c) in by else None for c in levels] for m in modes}

    return [
        Panel("line", "requests per second", "req/s", levels, series("requests_per_s"), xlabel="concurrent clients"),
        Panel("line", "p99 latency", "s", levels, series("p99_s"), xlabel="concurrent clients"),
        Panel("bar", "5xx and crossed answers", "answers", levels,
              {f"{m} 5xx+crossed": [by[(m, c)]["errors_5xx"] + by[(m, c)]["crossed"] if (m, c) in by else None
                                     for c in levels] for m in modes}, xlabel="concurrent clients"),
    ]  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", default="1,10,50,200", help="comma-separated client counts")
    parser.add_argument("--modes", default=",".join(MODES), help=f"comma-separated, of {', '.join(MODES)}")
    parser.add_argument("--rounds", type=int, default=1, help="runs of every cell; the table shows medians")
    parser.add_argument("--json", action="store_true", help="one JSON object on stdout")
    add_plot_args(parser, "local_api")
    args = parser.parse_args()
    levels = [int(x) for x in args.clients.split(",")]
    modes = [m for m in args.modes.split(",") if m]
    assert set(modes) <= set(MODES), f"modes are {MODES}"
    runs: list[dict[str, Any]] = []
    with JsonOut(args.json) as out:
        for clients in levels:
            for round_no in range(args.rounds):
                for mode in modes:
                    log(f"{clients} clients, {mode}, round {round_no + 1} of {args.rounds} ...")
                    runs.append(run_cell(clients, mode))
        rows = [median_row([r for r in runs if r["clients"] == c and r["mode"] == m]) for c in levels for m in modes]
        if args.json:
            out.emit({"machine": machine(), "rounds": args.rounds, "rows": rows, "runs": runs})
    plot_from_args(args, "local API server under concurrent clients (agentq dev)", panels(rows))
    if args.json:
        return
    print(
        table(
            ["clients", "mode", "requests", "wall s", "req/s", "p50 s", "p99 s", "5xx", "other 4xx", "crossed"],
            [
                [
                    r["clients"],
                    r["mode"],
                    r["requests"],
                    fmt(r["wall_s"], 2),
                    fmt(r["requests_per_s"], 1),
                    fmt(r["p50_s"], 3),
                    fmt(r["p99_s"], 3),
                    r["errors_5xx"],
                    r["other_errors"],
                    r["crossed"],
                ]
                for r in rows
            ],
        )
    )


if __name__ == "__main__":
    main()
