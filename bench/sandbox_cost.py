"""What isolation costs per python_exec call, and what the SSRF guard costs per fetch.

    .venv/bin/python bench/sandbox_cost.py [--runs 30] [--json]

Rows (each the wall-clock time of one tool call through the registry, `print(1)` as the
script, nearest-rank percentiles over ``--runs`` calls after two warm-up calls):

- ``bwrap``: BwrapSandbox on this host (namespaces, tmpfs, seccomp, supervisor);
- ``lambda handler (local model)``: RemoteSandbox into functions/sandbox/handler.py running in
  the bubblewrap model of its Lambda environment (tests/sandbox_support.py): the handler's
  own work (cleanup before and after, the child, seccomp) plus a pipe round trip; a real
  invocation adds Lambda's network round trip and, cold, the environment's start;
- ``http_fetch (allowlisted loopback)``: a fetch of a 2-byte page from a local server, the
  guard's resolution, check, pinned connection and deadline watchdog included.
"""

from __future__ import annotations

import argparse
import http.server
import json
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _plot import Panel, add_plot_args, plot_from_args
from agentq.core.tools import ToolContext, ToolRegistry, default_registry
from agentq.core.tools.fetch import FetchPolicy, HostRule
from agentq.sandbox.bwrap import BwrapSandbox
from agentq.sandbox.remote import RemoteSandbox

from tests.sandbox_support import LambdaEnvironment

CTX = ToolContext("bench", "toolu_bench", "k")


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[max(0, min(len(ordered) - 1, round(q / 100 * len(ordered) + 0.5) - 1))]


def measure(call: Callable[[], None], runs: int) -> dict[str, float]:
    for _ in range(2):
        call()
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        call()
        times.append((time.perf_counter() - started) * 1000)
    return {"p50_ms": percentile(times, 50), "p90_ms": percentile(times, 90), "max_ms": max(times)}


def exec_call(registry: ToolRegistry) -> Callable[[], None]:
    def call() -> None:
        result = registry.execute("python_exec", {"code": "print(1)"}, CTX, ["python_exec"])
        assert result.status == "ok" and "exit code 0" in result.content, result.content

    return call


class _Page(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, format: str, *args: Any) -> None:
        pass


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--json", action="store_true")
    add_plot_args(parser, "sandbox_cost")
    args = parser.parse_args()

    rows: dict[str, dict[str, float]] = {}
    rows["bwrap"] = measure(exec_call(default_registry(sandbox=BwrapSandbox())), args.runs)
    environment = LambdaEnvironment()
    try:
        remote = default_registry(sandbox=RemoteSandbox(environment.invoke))
        rows["lambda handler (local model)"] = measure(exec_call(remote), args.runs)
    finally:
        environment.close()
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Page)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = server.server_address[1]
    fetcher = default_registry(fetch_policy=FetchPolicy(allow=(HostRule("127.0.0.1", port),)))

    def fetch() -> None:
        result = fetcher.execute("http_fetch", {"url": f"http://127.0.0.1:{port}/"}, CTX, ["http_fetch"])
        assert result.status == "ok", result.content

    rows["http_fetch (allowlisted loopback)"] = measure(fetch, args.runs)
    server.shutdown()

    names = list(rows)
    plot_from_args(
        args,
        f"isolated tool calls, {args.runs} runs each",
        [Panel("bar", "latency per call", "ms", names,
               {q: [rows[n][f"{q}_ms"] for n in names] for q in ("p50", "p90", "max")})],
    )  # fmt: skip
    if args.json:
        print(json.dumps({"runs": args.runs, "rows": rows}))
        return
    print(f"{'call':<36} {'p50 ms':>8} {'p90 ms':>8} {'max ms':>8}   ({args.runs} runs)")
    for name, row in rows.items():
        print(f"{name:<36} {row['p50_ms']:>8.1f} {row['p90_ms']:>8.1f} {row['max_ms']:>8.1f}")


if __name__ == "__main__":
    main()
