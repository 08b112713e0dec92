"""An outage drill: the model server goes down mid-run; what happens to the tasks and to the provider.

    python bench/outage.py                               # 200 tasks, 2 minutes down, circuit on and off
    python bench/outage.py --tasks 50 --down-seconds 30 --modes on --json

``--tasks`` tasks (``--turns`` LLM turns each, the real ``anthropic`` SDK against a local
Messages API server) run on the local stack with two worker processes. Once a third of all
their calls are answered, the server refuses every connection for ``--down-seconds``, then
answers again.
Modes: ``on`` (the shared circuit breaker: 3 failures within 30 s open it, a probe every
``--cooldown`` seconds) and ``off`` (a threshold no outage reaches: every executor finds the
outage on its own, retries, and its tasks walk toward the DLQ).

Figures (machine-independent first): DLQ messages (target 0) and failed tasks (target 0);
calls the provider received while down, and of those after the circuit opened (target: only
the half-open probes); seconds from recovery to the last task done.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from _benchlib import JsonOut, log, machine, table  # noqa: E402
from _plot import Panel, add_plot_args, plot_from_args  # noqa: E402
from agentq_dev.stack import LocalStack  # noqa: E402

from tests.fake_messages_api import FakeMessagesAPI  # noqa: E402
from tests.helpers import queue_depth  # noqa: E402
from tests.outage_model import OutageModel, submit_lookups  # noqa: E402

KEY = "anthropic/claude-sonnet-4-6"
TIERS = ("high", "normal", "low")


def run(mode: str, tasks: int, turns: int, down_seconds: float, cooldown: float) -> dict[str, Any]:
    behaviour = OutageModel(turns)
    failures = 3 if mode == "on" else 10_000
    with FakeMessagesAPI(responder=behaviour) as api:
        os.environ.update({
            "ANTHROPIC_API_KEY": "bench", "ANTHROPIC_BASE_URL": api.base_url,
            "AGENTQ_PROVIDER_RETRY": json.dumps({"max_attempts": 3, "base_delay": 0.5, "max_delay": 2}),
            "AGENTQ_BREAKER": json.dumps({"failures": failures, "window_seconds": 30, "cooldown_seconds": cooldown,
                                          "probes": 1}),
        })  # fmt: skip
        with LocalStack(prefix=f"outage{mode}", workers=2, api=False, tool_modules=("tests.effect_tools",)) as stack:
            store, queues, ids = submit_lookups(stack, tasks, tenant="bench")
            deadline = time.monotonic() + 300
            while len(behaviour.calls) < tasks * turns // 3 and time.monotonic() < deadline:
                time.sleep(0.1)
            log(f"  {mode}: the model server goes down for {down_seconds:.0f}s")
            behaviour.down, went_down = True, time.time()
            opened_at = None
            while time.time() < went_down + down_seconds:
                if opened_at is None and store.flow.state(KEY).get("state") in ("open", "half_open"):
                    opened_at = time.time()
                time.sleep(0.25)
            behaviour.down, came_back = False, time.time()
            log(f"  {mode}: back up; waiting for every task to end")
            deadline = time.monotonic() + 900
            while time.monotonic() < deadline:
                ended = [t for t in store.tasks.get_many(ids) if t.status.terminal]
                if len(ended) == tasks:
                    break
                time.sleep(1)
            finished = time.time()
            final = store.tasks.get_many(ids)
            dlq = sum(queue_depth(queues, queues.dlq_url(tier)) for tier in TIERS)
    down_calls = [at for at, down in behaviour.calls if down]
    after_open = [at for at in down_calls if opened_at is not None and at > opened_at + 1]
    return {
        "mode": mode,
        "tasks": tasks,
        "down_seconds": round(came_back - went_down, 1),
        "succeeded": sum(1 for t in final if t.status.value == "succeeded"),
        "failed": sum(1 for t in final if t.status.value == "failed"),
        "not_ended": sum(1 for t in final if not t.status.terminal),
        "dlq_messages": dlq,
        "calls_while_down": len(down_calls),
        "calls_after_open": len(after_open) if opened_at is not None else None,
        "circuit_opened_after_s": round(opened_at - went_down, 1) if opened_at is not None else None,
        "recovery_to_last_done_s": round(finished - came_back, 1),
        "calls_total": len(behaviour.calls),
    }


def panels(result: dict[str, Any]) -> list[Panel]:
    rows = result["rows"]
    calls = Panel(
        kind="bar", title="calls the provider received while down", ylabel="calls", x=[r["mode"] for r in rows],
        series={"while down": [r["calls_while_down"] for r in rows],
                "after the circuit opened": [r["calls_after_open"] or 0 for r in rows]},
    )  # fmt: skip
    outcome = Panel(
        kind="bar", title="tasks after the outage", ylabel="tasks", x=[r["mode"] for r in rows],
        series={"succeeded": [r["succeeded"] for r in rows], "failed": [r["failed"] for r in rows],
                "DLQ messages": [r["dlq_messages"] for r in rows]},
    )  # fmt: skip
    return [calls, outcome]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tasks", type=int, default=200)
    ap.add_argument("--turns", type=int, default=6, help="LLM calls per task")
    ap.add_argument("--down-seconds", type=float, default=120)
    ap.add_argument("--cooldown", type=float, default=10, help="seconds the open circuit waits before a probe")
    ap.add_argument("--modes", default="on,off")
    ap.add_argument("--json", action="store_true")
    add_plot_args(ap, "outage")
    args = ap.parse_args(argv)
    with JsonOut(args.json) as out:
        rows = [run(mode, args.tasks, args.turns, args.down_seconds, args.cooldown) for mode in args.modes.split(",")]
        result = {"rows": rows, "machine": machine()}
        if args.json:
            out.emit(result)
        else:
            print(table(
                ["circuit", "tasks", "down s", "succeeded", "failed", "not ended", "DLQ msgs", "calls while down",
                 "after open", "opened after s", "recovery s"],
                [[r["mode"], r["tasks"], r["down_seconds"], r["succeeded"], r["failed"], r["not_ended"],
                  r["dlq_messages"], r["calls_while_down"], r["calls_after_open"], r["circuit_opened_after_s"],
                  r["recovery_to_last_done_s"]] for r in rows],
            ))  # fmt: skip
    plot_from_args(args, "agentq: a model outage, with and without the circuit breaker", panels(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
