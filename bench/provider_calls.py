"""What a model call costs the worker besides the model: its CPU and its connections.

    python bench/provider_calls.py                  # 200 calls a provider and mode
    python bench/provider_calls.py --calls 50 --json

The engine asks the provider factory (``agentq.core.providers.default_provider_factory``) for
a provider at every model call, as a worker does. Each call here goes that way to a local server
that speaks the provider's wire protocol and keeps connections alive as a real one does
(``tests/fake_messages_api.py``, ``tests/fake_model_servers.py``), through the real ``anthropic``
and ``openai`` SDKs. ``shared``: the SDK client the process keeps per setting
(``agentq/core/providers/shared_clients.py``); ``per call``: an SDK client built at every call,
as before it. Per call: this process's CPU (the SDKs, the provider, the HTTP client; the server
runs in other threads of this process, so its CPU is counted too: the same per request in both
modes, and a connection accepted and a thread started per call in ``per call``), and
the TCP connections the server accepted, each of which is a TLS handshake with a real provider.
The connections do not depend on the machine; the CPU does.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from _benchlib import log, table
from _plot import Panel, add_plot_args
from _report import report
from agentq.core.models import TaskSubmission
from agentq.core.providers import LLMRequest, default_provider_factory, shared_clients

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.fake_messages_api import FakeMessagesAPI, text_reply
from tests.fake_model_servers import FakeChatCompletions, chat_completion

MODELS = {"anthropic": "claude-sonnet-4-6", "openai": "gpt-4.1-mini"}
MODES = ("per call", "shared")


def _calls(provider: str, calls: int, shared: bool) -> tuple[float, int, float]:
    """CPU seconds and wall seconds of ``calls`` calls, and the connections the server accepted."""
    submission = TaskSubmission(goal="hi", provider=provider, model=MODELS[provider])  # type: ignore[arg-type]
    request = LLMRequest(model=MODELS[provider], messages=[{"role": "user", "content": "hi"}], max_tokens=64)
    server: FakeMessagesAPI | FakeChatCompletions
    if provider == "anthropic":
        server = FakeMessagesAPI()
        os.environ.update(ANTHROPIC_BASE_URL=server.base_url, ANTHROPIC_API_KEY="sk-ant-bench")
        server.enqueue(*[text_reply("hi") for _ in range(calls + 1)])
    else:
        server = FakeChatCompletions()
        os.environ.update(OPENAI_BASE_URL=server.openai_base_url, OPENAI_API_KEY="sk-bench")
        server.enqueue(*[chat_completion("hi") for _ in range(calls + 1)])
    with server:
        default_provider_factory(submission).complete(request)  # the imports and the first client, in both modes
        cpu, wall = time.process_time(), time.monotonic()  # every thread's: the server's too
        for _ in range(calls):
            if not shared:
                shared_clients.forget()
            default_provider_factory(submission).complete(request)
        cpu, wall = time.process_time() - cpu, time.monotonic() - wall
        connections = len({r.connection for r in server.requests[1:]})
    return cpu, connections, wall


def run(args: argparse.Namespace) -> dict[str, Any]:
    if args.stream_above is not None:
        os.environ["AGENTQ_STREAM_ABOVE_TOKENS"] = str(args.stream_above)
    rows = []
    for provider in args.providers.split(","):
        for mode in MODES:
            log(f"[{provider}, {mode}] {args.calls} calls ...")
            cpu, connections, wall = _calls(provider, args.calls, mode == "shared")
            rows.append({
                "provider": provider, "mode": mode, "calls": args.calls,
                "cpu_ms_per_call": round(1000 * cpu / args.calls, 2),
                "connections": connections,
                "connections_per_100_calls": round(100 * connections / args.calls, 1),
                "wall_ms_per_call": round(1000 * wall / args.calls, 2),
            })  # fmt: skip
    return {"stream_above": args.stream_above, "rows": rows}


def render(result: dict[str, Any]) -> str:
    keys: list[tuple[str, Callable[[dict[str, Any]], Any]]] = [
        ("provider", lambda r: r["provider"]),
        ("SDK client", lambda r: r["mode"]),
        ("calls", lambda r: r["calls"]),
        ("connections / 100 calls", lambda r: r["connections_per_100_calls"]),
        ("CPU ms / call", lambda r: r["cpu_ms_per_call"]),
        ("wall ms / call", lambda r: r["wall_ms_per_call"]),
    ]
    return table([k for k, _ in keys], [[get(r) for _, get in keys] for r in result["rows"]])


def panels(result: dict[str, Any]) -> list[Panel]:
    rows = result["rows"]
    providers = list(dict.fromkeys(r["provider"] for r in rows))

    def by_mode(field: str) -> dict[str, list[float]]:
        return {m: [float(r[field]) for p in providers for r in rows if r["provider"] == p and r["mode"] == m]
                for m in MODES}  # fmt: skip

    return [
        Panel(
            "bar", "TCP connections per 100 model calls", "connections", providers, by_mode("connections_per_100_calls")
        ),
        Panel("bar", "the worker's CPU per model call", "ms", providers, by_mode("cpu_ms_per_call")),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=200, help="calls a provider and mode")
    parser.add_argument("--providers", default="anthropic,openai")
    parser.add_argument(
        "--stream-above", type=int, help="AGENTQ_STREAM_ABOVE_TOKENS (0: every call streamed); default: each provider's"
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    add_plot_args(parser, "provider_calls")
    report(parser.parse_args(), "a model call's client cost", run, render, panels)


if __name__ == "__main__":
    main()
