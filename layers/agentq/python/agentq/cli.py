"""The ``agentq`` command line. Exit codes: 0 ok, 1 the task did not succeed, 2 bad usage."""

from __future__ import annotations

import argparse
import json
import sys

from agentq.errors import AgentqError


def _cmd_demo(args: argparse.Namespace) -> int:
    from agentq.demo import run_demo

    return run_demo(kill_at_step=args.kill_at_step, lease_seconds=args.lease)


def _cmd_run_task(args: argparse.Namespace) -> int:
    from agentq.worker import run_task

    result = run_task(args.task_id, lease_seconds=args.lease, wait_seconds=args.wait)
    print(
        json.dumps(
            {
                "task_id": result.task_id,
                "outcome": result.outcome,
                "status": result.status.value if result.status else None,
                "steps_committed": result.steps_committed,
                "resumed_from_step": result.resumed_from_step,
                "error": result.error,
            }
        )
    )
    done = result.outcome in ("finished", "continue") or (result.status is not None and result.status.terminal)
    return 0 if done else 1


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="agentq", description="A durable task queue for long-running AI agents.")
    sub = parser.add_subparsers(dest="command", required=True)

    demo = sub.add_parser(
        "demo",
        help="run a scripted research agent on an embedded local AWS, kill its worker mid-task, resume it",
    )
    demo.add_argument("--kill-at-step", type=int, default=6, help="SIGKILL the first worker once this step is committed (0: never)")
    demo.add_argument("--lease", type=float, default=2.0, help="lease seconds (how soon a dead worker's task is taken over)")
    demo.set_defaults(func=_cmd_demo)

    run = sub.add_parser("run-task", help="run one task in this process until it ends (uses AGENTQ_* and AWS_* settings)")
    run.add_argument("task_id")
    run.add_argument("--lease", type=float, default=30.0, help="lease seconds")
    run.add_argument("--wait", type=float, default=0.0, help="keep trying to claim for this long if another lease is live")
    run.set_defaults(func=_cmd_run_task)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args))
    except AgentqError as exc:
        print(f"agentq: {exc.message}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
