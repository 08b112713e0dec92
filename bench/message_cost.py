"""What talking to an agent costs in AWS calls: a step when no message waits, a message delivered
to a running task, and a follow-up to an answered one.

    python bench/message_cost.py                 # 10 tool turns per conversation
    python bench/message_cost.py --turns 30 --json

Each scenario runs one scripted conversation in this process against the project's moto server
(the engine, the storage and the control plane exactly as a worker and the API run them), with
every botocore call counted by operation:

- ``no message``: the conversation alone; its calls per committed step are the baseline (the
  step commit's META write reads the message counters back, so a step with nothing waiting
  costs what it did before conversations existed: two writes);
- ``message mid-run``: the same, with one message accepted while turn ``turns/2`` is in flight;
  the extra calls are the accept (a read of META, a read of the idempotency key, one
  transaction) and the delivery (a Query of the waiting messages, the message step's two
  writes), plus the extra LLM turn the message causes;
- ``follow-up``: a message to the answered task: the accept, the SQS send that requeues it, a
  claim that rebuilds the conversation, the delivery and the answer.

Figures are calls, not seconds: they are the same on any machine.
"""

from __future__ import annotations

import argparse
import os
import sys
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from _benchlib import InProcessCounter, log, table  # noqa: E402
from _plot import Panel, add_plot_args  # noqa: E402
from _report import report  # noqa: E402
from agentq.control.conversations import send_message  # noqa: E402
from agentq.core.engine import Engine, EngineConfig  # noqa: E402
from agentq.core.models import TaskSubmission  # noqa: E402
from agentq.core.providers import LLMRequest, LLMResponse, default_provider_factory  # noqa: E402
from agentq.resources import QueueSettings, provision  # noqa: E402
from agentq.runtime import Settings, build_queues, build_registry, build_store, session  # noqa: E402
from agentq_dev.moto_server import LOCAL_CREDENTIALS, MotoServer  # noqa: E402


def submission(turns: int) -> TaskSubmission:
    script = [
        {"text": f"turn {i}", "tool_calls": [{"name": "lookup", "input": {"query": f"q{i}"}}]} for i in range(turns)
    ]
    script += [{"text": "answer"}, {"text": "answer to the message"}, {"text": "answer to the follow-up"}]
    return TaskSubmission.model_validate(
        {"goal": "message cost", "provider": "scripted", "script": {"turns": script},
         "constraints": {"tools": ["lookup"], "max_tokens": 10_000_000, "max_steps": 1000}}
    )  # fmt: skip


class During:
    """The scripted provider, running ``action`` inside its ``at``-th call (a person sending a
    message while the model answers)."""

    name = "scripted"

    def __init__(self, sub: TaskSubmission, at: int, action: Callable[[], object]) -> None:
        self.inner, self.at, self.action, self.calls = default_provider_factory(sub), at, action, 0

    def complete(self, request: LLMRequest) -> LLMResponse:
        self.calls += 1
        if self.calls == self.at:
            self.action()
        return self.inner.complete(request)


def run(args: argparse.Namespace) -> dict[str, Any]:
    for key, value in LOCAL_CREDENTIALS.items():
        os.environ.setdefault(key, value)
    counter = InProcessCounter().install()
    rows: list[dict[str, Any]] = []
    with MotoServer() as server:
        settings = Settings.for_prefix(f"mc{uuid.uuid4().hex[:8]}", server.endpoint_url,
                                       tool_modules=("agentq.core.tools.examples", "tests.effect_tools"))  # fmt: skip
        provision(session(settings), settings.names, endpoint_url=settings.endpoint_url, queues=QueueSettings())
        store, queues, tools = build_store(settings), build_queues(settings), build_registry(settings)
        sub = submission(args.turns)

        def engine(provider: Any = None) -> Engine:
            providers = (lambda s: provider) if provider is not None else default_provider_factory
            return Engine(store, worker_id="bench", tools=tools, config=EngineConfig(lease_seconds=30),
                          providers=providers)  # fmt: skip

        def measured(name: str, work: Callable[[], object], task_id: str) -> None:
            counter.tag(name)
            before = store.tasks.get(task_id).step
            work()
            counter.tag("other")
            steps = store.tasks.get(task_id).step - before
            calls = counter.snapshot(name)
            rows.append({"scenario": name, "steps": steps, "calls": dict(sorted(calls.items())),
                         "total": sum(calls.values())})  # fmt: skip
            log(f"{name}: {steps} steps, {sum(calls.values())} calls")

        quiet = store.tasks.create(sub, tenant="bench")
        measured("no message", lambda: engine().run(quiet.task_id), quiet.task_id)

        talked = store.tasks.create(sub, tenant="bench")

        def say_also_this() -> None:
            counter.tag("message mid-run")  # the engine calls the model on a thread of its own (core/engine/_cut.py)
            send_message(store, queues, talked.task_id, "also this")

        person = During(sub, args.turns // 2, say_also_this)
        measured("message mid-run", lambda: engine(person).run(talked.task_id), talked.task_id)

        def follow_up() -> None:
            send_message(store, queues, quiet.task_id, "and one more thing")
            engine().run(quiet.task_id)

        measured("follow-up", follow_up, quiet.task_id)
    counter.uninstall()
    base = rows[0]
    per_step = base["total"] / base["steps"]
    for row in rows:
        row["per_step"] = round(row["total"] / row["steps"], 2)
        row["extra_vs_baseline"] = round(row["total"] - per_step * row["steps"], 1) if row is not base else 0
    return {"turns": args.turns, "scenarios": rows, "baseline_calls_per_step": round(per_step, 2)}


def render(result: dict[str, Any]) -> str:
    ops = sorted({op for r in result["scenarios"] for op in r["calls"]})
    headers = ["scenario", "steps", "calls", "per step", "beyond the baseline", *[o.split(":")[1] for o in ops]]
    rows = [[r["scenario"], r["steps"], r["total"], r["per_step"], r["extra_vs_baseline"],
             *[r["calls"].get(o, 0) for o in ops]] for r in result["scenarios"]]  # fmt: skip
    return table(headers, rows) + (
        f"\n(one conversation of {result['turns']} tool turns; 'beyond the baseline' = calls less the no-message "
        f"rate of {result['baseline_calls_per_step']} per step times the steps)"
    )


def panels(result: dict[str, Any]) -> list[Panel]:
    names = [r["scenario"] for r in result["scenarios"]]
    return [
        Panel(kind="bar", title="AWS calls per committed step", ylabel="calls", x=names,
              series={"per step": [r["per_step"] for r in result["scenarios"]]}),
        Panel(kind="bar", title="calls beyond the no-message rate", ylabel="calls", x=names,
              series={"extra": [r["extra_vs_baseline"] for r in result["scenarios"]]}),
    ]  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--turns", type=int, default=10, help="tool turns in each conversation")
    ap.add_argument("--json", action="store_true")
    add_plot_args(ap, "message_cost")
    args = ap.parse_args(argv)
    report(args, "agentq: what a message costs", run, render, panels)
    return 0


if __name__ == "__main__":
    sys.exit(main())
