"""The task event stream on the local stack: commit-to-client latency, many subscribers of one
task on one API server, and the table reads the stream costs.

    python bench/events.py                            # 1, 100 and 1,000 subscribers of one task
    python bench/events.py --subscribers 1,50 --turns 10 --json

For each number S of subscribers: a local stack with its API server in this process and one
worker process; a scripted task (``--turns`` turns of ``--latency`` seconds, each calling the
read-only ``note_read`` tool, so two steps a turn) is submitted while no worker runs, S clients
open ``GET /tasks/{id}/events`` (server-sent events, one socket each, read by one thread with a
selector so the clients cost the server's process little), and then the worker starts.

Measured per S:

- latency, commit to client: for every committed step event every subscriber receives, the
  time it arrived minus the step's ``committed_at`` (written by the worker just before its
  commit; one machine, one clock): p50, p99 and max over all (event, subscriber) pairs;
- reads: the hub's table reads (``EventHub.reads``: META ``GetItem`` per poll tick, log
  ``Query`` per change) over the run, per minute and per subscriber-minute; and what a
  subscriber's connection costs once (the check, the catch-up read), apart;
- the server's process: resident memory added by the S connections and CPU seconds per wall
  second over the run (the clients' single thread is in the same process, a small share).

What it says: one poller per watched task per server process (api/event_hub.py), so the steady
reads do not grow with S; a thread per connection, so memory does.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import selectors
import socket
import sys
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _benchlib import JsonOut, log, machine, summary, table
from _plot import Panel, add_plot_args, plot_from_args
from agentq.api.client import Client
from agentq_dev.stack import LocalStack

STEP_TYPES = ("agent.message", "agent.tool_results")
RAMP = 50  # connections opened at once


def _rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) / 1024


def _cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


class Subscribers:
    """S event-stream connections read by one selector: what arrived, and when."""

    def __init__(self, url: str, path: str) -> None:
        self.parts = urlsplit(url)
        self.selector = selectors.DefaultSelector()
        self.latencies: list[float] = []
        self.ended = 0
        self.refused = 0
        self.steps_seen: dict[int, set[str]] = {}
        self.joined: set[int] = set()  # subscribers that received their first event (caught up)
        self.request = (
            f"GET {path} HTTP/1.1\r\nHost: {self.parts.netloc}\r\nAccept: text/event-stream\r\n\r\n"
        ).encode()

    def connect(self, i: int) -> None:
        sock = socket.create_connection((self.parts.hostname, self.parts.port or 80))
        sock.sendall(self.request)
        sock.setblocking(False)
        self.selector.register(sock, selectors.EVENT_READ, {"i": i, "buf": b"", "head": False})

    def pump(self, until: float) -> None:
        while time.monotonic() < until and self.selector.get_map():
            for key, _ in self.selector.select(timeout=0.2):
                state = key.data
                try:
                    chunk = key.fileobj.recv(65536)  # type: ignore[union-attr]
                except BlockingIOError:
                    continue
                now = time.time()
                if not chunk:
                    self.selector.unregister(key.fileobj)
                    key.fileobj.close()  # type: ignore[union-attr]
                    continue
                state["buf"] += chunk
                if not state["head"]:
                    if b"\r\n\r\n" not in state["buf"]:
                        continue
                    head, state["buf"] = state["buf"].split(b"\r\n\r\n", 1)
                    state["head"] = True
                    if not head.startswith(b"HTTP/1.1 200"):  # the server could not take it: again
                        self.refused += 1
                        self.selector.unregister(key.fileobj)
                        key.fileobj.close()  # type: ignore[union-attr]
                        self.connect(state["i"])
                        continue
                while b"\n\n" in state["buf"]:
                    block, state["buf"] = state["buf"].split(b"\n\n", 1)
                    self._frame(state["i"], block.decode(), now)

    def _frame(self, who: int, block: str, now: float) -> None:
        fields = dict(line.partition(": ")[::2] for line in block.splitlines() if ": " in line)
        if fields.get("event") == "end":
            self.ended += 1
            return
        if "id" in fields:
            self.joined.add(who)
        if "id" not in fields or fields.get("event") not in STEP_TYPES:
            return
        event = json.loads(fields["data"])
        self.latencies.append(now - float(event["at"]))
        self.steps_seen.setdefault(who, set()).add(event["id"])

    def close(self) -> None:
        for key in list(self.selector.get_map().values()):
            key.fileobj.close()  # type: ignore[union-attr]


def run(subscribers: int, turns: int, latency: float, timeout: float) -> dict[str, Any]:
    turn = {"latency_seconds": latency, "tool_calls": [{"name": "note_read", "input": {"key": "k"}}]}
    body = {
        "goal": "stream me",
        "provider": "scripted",
        "constraints": {"tools": ["note_read"], "max_steps": 2 * turns + 5},
        "script": {"turns": [{**turn, "text": f"turn {i}"} for i in range(turns)] + [{"text": "done"}]},
    }
    with LocalStack(prefix=f"bench-events-{subscribers}", workers=0) as stack:
        assert stack.api_server is not None and stack.api_server.hub is not None
        hub = stack.api_server.hub
        client = Client(stack.api_server.url)
        task_id = client.submit(body).task_id
        rss0, reads0 = _rss_mb(), hub.reads
        connect_started = time.monotonic()
        subs = Subscribers(stack.api_server.url, f"/tasks/{task_id}/events")
        for first in range(0, subscribers, RAMP):  # in waves: a thousand at once is a test of moto, not of this
            for i in range(first, min(first + RAMP, subscribers)):
                subs.connect(i)
            while len(subs.joined) < min(first + RAMP, subscribers):
                subs.pump(time.monotonic() + 0.2)
                if time.monotonic() - connect_started > timeout:
                    raise RuntimeError(f"only {len(subs.joined)} of {subscribers} subscribers joined")
        connect_seconds = time.monotonic() - connect_started
        connect_reads = hub.reads - reads0
        rss_connected = _rss_mb()
        log(f"[{subscribers}] connected in {connect_seconds:.1f} s; starting the worker")
        cpu0, wall0, reads1 = _cpu_seconds(), time.monotonic(), hub.reads
        stack.spawn_worker()
        deadline = time.monotonic() + timeout
        while subs.ended < subscribers and time.monotonic() < deadline:
            subs.pump(min(deadline, time.monotonic() + 1.0))
        wall = time.monotonic() - wall0
        cpu = _cpu_seconds() - cpu0
        steady_reads = hub.reads - reads1
        subs.close()
        expected = 2 * turns + 1
        complete = sum(1 for seen in subs.steps_seen.values() if len(seen) == expected)
    return {
        "subscribers": subscribers,
        "steps": expected,
        "subscribers_with_every_step": complete,
        "ended": subs.ended,
        "latency_ms": summary([x * 1000 for x in subs.latencies]),
        "connect_seconds": round(connect_seconds, 2),
        "connects_refused": subs.refused,
        "connect_reads_per_subscriber": round(connect_reads / subscribers, 2),
        "run_seconds": round(wall, 2),
        "reads": steady_reads,
        "reads_per_minute": round(steady_reads / wall * 60, 1),
        "reads_per_subscriber_minute": round(steady_reads / wall * 60 / subscribers, 3),
        "rss_added_mb": round(rss_connected - rss0, 1),
        "rss_per_subscriber_kb": round((rss_connected - rss0) * 1024 / subscribers, 1),
        "cpu_per_wall_second": round(cpu / wall, 3),
    }


def panels(result: dict[str, Any]) -> list[Panel]:
    rows = result["rows"]
    labels = [str(r["subscribers"]) for r in rows]
    return [
        Panel(
            "bar",
            "commit to client",
            "ms",
            labels,
            {"p50": [r["latency_ms"]["p50"] for r in rows], "p99": [r["latency_ms"]["p99"] for r in rows]},
            xlabel="subscribers of one task",
        ),
        Panel(
            "bar",
            "table reads per minute (steady)",
            "reads/min",
            labels,
            {"all subscribers": [r["reads_per_minute"] for r in rows]},
            xlabel="subscribers of one task",
        ),
        Panel(
            "bar",
            "server process",
            "MB / CPU s per s",
            labels,
            {
                "RSS added (MB)": [r["rss_added_mb"] for r in rows],
                "CPU s per s": [r["cpu_per_wall_second"] for r in rows],
            },
            xlabel="subscribers of one task",
        ),
    ]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--subscribers", default="1,100,1000", help="comma list: subscribers of one task, a run each")
    ap.add_argument("--turns", type=int, default=20, help="turns of the task (two steps each)")
    ap.add_argument("--latency", type=float, default=0.3, help="seconds each scripted model call takes")
    ap.add_argument("--timeout", type=float, default=300)
    ap.add_argument("--json", action="store_true", help="print one JSON object on stdout, nothing else")
    add_plot_args(ap, "events")
    args = ap.parse_args(argv)
    counts = [int(x) for x in args.subscribers.split(",") if x.strip()]
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, max(soft, 4 * max(counts) + 256)), hard))
    with JsonOut(args.json) as out:
        rows = [run(n, args.turns, args.latency, args.timeout) for n in counts]
        result = {"bench": "events", "machine": machine(), "turns": args.turns, "rows": rows}
        if args.json:
            out.emit(result)
        else:
            print(table(
                ["subscribers", "every step", "p50 ms", "p99 ms", "max ms", "reads/min", "reads/sub-min",
                 "connect reads/sub", "RSS +MB", "KB/sub", "CPU s/s"],
                [[r["subscribers"], f"{r['subscribers_with_every_step']}/{r['subscribers']}", r["latency_ms"]["p50"],
                  r["latency_ms"]["p99"], r["latency_ms"]["max"], r["reads_per_minute"], r["reads_per_subscriber_minute"],
                  r["connect_reads_per_subscriber"], r["rss_added_mb"], r["rss_per_subscriber_kb"],
                  r["cpu_per_wall_second"]] for r in rows],
            ))  # fmt: skip
        plot_from_args(args, "task event stream (local stack)", panels(result))
    return 0


if __name__ == "__main__":
    os.environ.setdefault("AGENTQ_LOG_LEVEL", "WARNING")
    raise SystemExit(main())
