"""A quiet tenant's first task behind a noisy tenant's burst under ``agentq dev``'s fair defaults:
a burst of sub-agents against the same burst as submissions.

    python bench/quiet_tenant.py                        # 4 roots x 100 sub-agents of a 5 s turn; 400 submissions
    python bench/quiet_tenant.py --roots 1 --children 4 --latency 0.5 --json

Each scenario runs on a fresh local stack as ``agentq dev`` runs it (``LocalStack(fair=True)``:
``--workers`` workers of ``--concurrency``, the fleet's capacity their product, a tenant's
default limit that less the reserve, ``control.defaults.fair_limit``).

- ``sub-agents``: the noisy tenant submits ``--roots`` tasks, each spawning ``--children``
  one-turn sub-agents (a ``--latency`` s turn) in its first turn. Once every root waits for
  its children and the normal tier's queue holds ``--ahead`` messages (default: half the
  sub-agents; the fan-outs send them as fast as moto's Step Functions runs the Map state, and
  the workers take them meanwhile), the quiet tenant submits one one-turn task.
- ``submissions``: the noisy tenant submits ``--roots`` x ``--children`` such tasks itself, then
  the quiet tenant its one.

Measured: the quiet task's first claim less its submission, the messages visible in the queue
when it was submitted, and the noisy tenant's running and waiting counts then. A submission over
its tenant's limit is parked at submission and never enters the queue, so the quiet task's
message has nothing ahead of it; a sub-agent's message is sent by the fan-out's state machine
(``sqs:sendMessage.waitForTaskToken``: the child's callback token exists only in that send) and
is refused, and parked, only when a worker receives it. Locally moto serves a queue in send
order, so the quiet task's message waits for every sub-agent message sent before it to be
received (ARCHITECTURE 12, "Waiting"); an SQS fair queue serves it ahead of them (its tenant is
its ``MessageGroupId``), which this bench cannot show.
"""

from __future__ import annotations

import argparse
import json
import time
import uuid
from typing import Any

from _benchlib import BenchStack, log, patient_clients, table
from _plot import Panel, add_plot_args
from _report import report
from agentq.control.submit import submit_once
from agentq.core.models import TaskSubmission
from agentq.runtime import build_registry
from agentq.worker import WorkerConfig

NOISY, QUIET = "noisy", "quiet"


def one_turn(latency: float) -> TaskSubmission:
    return TaskSubmission.model_validate(
        {
            "goal": "quiet tenant bench: one model turn",
            "provider": "scripted",
            "script": {"turns": [{"text": "done", "latency_seconds": latency}]},
            "constraints": {"max_tokens": 10_000, "max_steps": 2, "timeout_seconds": 3600, "max_output_tokens": 256},
        }
    )


def root(children: int, latency: float) -> TaskSubmission:
    """A root that spawns ``children`` one-turn sub-agents at once, then answers."""
    kids = [
        {"goal": f"k{i}", "script": {"turns": [{"text": "k", "latency_seconds": latency}]}} for i in range(children)
    ]
    spawn = {"name": "spawn_subagents", "input": {"subagents": kids, "max_concurrency": children}}
    max_out = len(json.dumps(spawn)) // 3 + 1024  # the spawn call is the turn's output: it must fit
    return TaskSubmission.model_validate(
        {
            "goal": "quiet tenant bench: a noisy root",
            "provider": "scripted",
            "script": {"turns": [{"text": "", "tool_calls": [spawn]}, {"text": "ok"}]},
            "constraints": {
                "tools": ["spawn_subagents"],
                "max_fanout": children,
                "max_tokens": 4 * max_out + 50_000 + 20_000 * children,
                "max_steps": 5,
                "max_output_tokens": max_out,
                "timeout_seconds": 3600,
            },
        }
    )


def until(predicate: Any, timeout: float, what: str, interval: float = 0.05) -> Any:
    deadline = time.monotonic() + timeout
    while not (value := predicate()):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} not within {timeout:g}s")
        time.sleep(interval)
    return value


def measure(scenario: str, args: argparse.Namespace) -> dict[str, Any]:
    burst = args.roots * args.children
    stack = BenchStack(
        prefix=f"bquiet{uuid.uuid4().hex[:6]}",
        workers=args.workers,
        worker_config=WorkerConfig(concurrency=args.concurrency),
        api=False,
        sweep_every=None,
        fair=True,
    )
    log(f"[{scenario}] starting the local stack ...")
    stack.start()
    try:
        stack.wait_polling()
        assert stack.settings is not None
        defaults = stack.settings.defaults
        store, queues = patient_clients(stack)
        registry = build_registry(stack.settings)
        url = queues.url("normal")

        def visible() -> int:
            attrs = queues.sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["ApproximateNumberOfMessages"])
            return int(attrs["Attributes"]["ApproximateNumberOfMessages"])

        if scenario == "sub-agents":
            spawning = root(args.children, args.latency)
            roots = [submit_once(store, registry, spawning, tenant=NOISY, queues=queues, defaults=defaults).task.task_id
                     for _ in range(args.roots)]  # fmt: skip
            log(f"[{scenario}] {args.roots} roots submitted; waiting for every one to wait for its sub-agents ...")
            until(lambda: all(store.tasks.get(r).status.value == "waiting" for r in roots), 600, "the roots waiting")
            ahead = burst // 2 if args.ahead is None else args.ahead
            try:
                until(lambda: visible() >= ahead, 120, f"{ahead} sub-agent messages in the queue")
            except TimeoutError:
                log(f"[{scenario}] the queue never held {ahead} messages; the quiet task is submitted anyway")
        else:
            work = one_turn(args.latency)
            for _ in range(burst):
                submit_once(store, registry, work, tenant=NOISY, queues=queues, defaults=defaults)
            log(f"[{scenario}] {burst} tasks submitted")
        in_queue = visible()
        noisy = store.slots.with_default(defaults.tenant_max_running, defaults.fleet_capacity).usage(NOISY)
        t0 = time.time()
        quiet = submit_once(store, registry, one_turn(0.0), tenant=QUIET, queues=queues, defaults=defaults)
        claimed = until(lambda: store.tasks.get(quiet.task.task_id).first_claimed_at, 600, "the quiet task's claim")
        waited = float(claimed) - t0
        log(f"[{scenario}] the quiet task waited {waited:.2f}s for its first claim, {in_queue} messages ahead")
        return {
            "scenario": scenario,
            "noisy_tasks": burst,
            "visible_in_queue_at_submission": in_queue,
            "noisy_running": noisy.running,
            "noisy_waiting": noisy.waiting,
            "quiet_first_claim_s": round(waited, 3),
            "fleet_capacity": defaults.fleet_capacity,
            "tenant_limit": defaults.tenant_max_running,
        }
    finally:
        log(f"[{scenario}] stopping the local stack ...")
        stack.stop(grace=5.0)


def run(args: argparse.Namespace) -> dict[str, Any]:
    return {"rows": [measure(s, args) for s in args.scenarios.split(",")]}


def render(result: dict[str, Any]) -> str:
    keys = ("scenario", "noisy_tasks", "visible_in_queue_at_submission", "noisy_running", "noisy_waiting",
            "quiet_first_claim_s")  # fmt: skip
    return table(
        ["scenario", "noisy tasks", "in queue", "noisy running", "noisy parked", "quiet first claim s"],
        [[r[k] for k in keys] for r in result["rows"]],
    )


def panels(result: dict[str, Any]) -> list[Panel]:
    rows = result["rows"]
    return [
        Panel(
            "bar",
            "the quiet tenant's first claim behind the noisy tenant's burst",
            "seconds",
            [r["scenario"] for r in rows],
            {"first claim": [float(r["quiet_first_claim_s"]) for r in rows]},
        )
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scenarios", default="sub-agents,submissions")
    parser.add_argument("--roots", type=int, default=4, help="the noisy tenant's roots (sub-agents)")
    parser.add_argument("--children", type=int, default=100, help="sub-agents per root; submissions: roots x this")
    parser.add_argument("--latency", type=float, default=5.0, help="each noisy task's one model turn, s")
    parser.add_argument("--ahead", type=int, default=None, help="messages in the queue before the quiet submission")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=3)
    parser.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    add_plot_args(parser, "quiet_tenant")
    report(parser.parse_args(), "a quiet tenant behind a noisy tenant's burst", run, render, panels)


if __name__ == "__main__":
    main()
