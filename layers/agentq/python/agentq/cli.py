"""The ``agentq`` command line.

Exit codes scripts can rely on: 0 success, 1 the task or operation did not succeed,
2 bad usage or bad input, 130 interrupted.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from typing import TYPE_CHECKING


from agentq.errors import AgentqError

if TYPE_CHECKING:
    from agentq.client import Client


def _cmd_demo(args: argparse.Namespace) -> int:
    from agentq.demo import run_demo

    return run_demo(kill_at_step=args.kill_at_step)


def _cmd_run(args: argparse.Namespace) -> int:
    from agentq.demo import run_goal

    return run_goal(args.goal, model=args.model, max_tokens=args.max_tokens)


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


def _cmd_worker(args: argparse.Namespace) -> int:
    from agentq.runtime import Settings
    from agentq.worker import Worker, WorkerConfig

    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(asctime)s %(name)s %(message)s")
    config = WorkerConfig(
        concurrency=args.concurrency,
        lease_seconds=args.lease,
        heartbeat_seconds=args.heartbeat,
        visibility_seconds=args.visibility,
        max_receive_count=args.max_receive_count,
    )
    Worker(Settings.from_env(), config).serve_forever()
    return 0


def _cmd_dev(args: argparse.Namespace) -> int:
    from agentq.local.stack import LocalStack

    stack = LocalStack(workers=args.workers).start()
    assert stack.settings is not None and stack.api_server is not None
    print(f"agentq dev: AWS (moto) {stack.moto.endpoint_url}")
    print(f"            API        {stack.api_server.url}   (POST /tasks, GET /tasks/<id>, GET /health)")
    print(f"            workers    {', '.join(str(p.pid) for p in stack.processes)}")
    print("            env for other shells:")
    for key, value in {**stack.settings.env(), "AGENTQ_URL": stack.api_server.url}.items():
        print(f"              export {key}={value}")
    print("Ctrl-C stops everything.")
    try:
        while all(p.poll() is None for p in stack.processes):
            time.sleep(0.5)
        print("a worker exited; stopping", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 0
    finally:
        stack.stop()


def _cmd_dlq(args: argparse.Namespace) -> int:
    from agentq.dlq import list_dead_letters, redrive
    from agentq.runtime import Settings, build_queues, build_store

    settings = Settings.from_env()
    queues = build_queues(settings)
    if args.dlq_command == "list":
        letters = list_dead_letters(queues, build_store(settings), tier=args.tier, limit=args.limit)
        if args.json:
            print(json.dumps([letter.__dict__ for letter in letters]))
            return 0
        if not letters:
            print("no messages in the dead-letter queues")
        for d in letters:
            print(f"{d.tier:<7} {d.task_id or '-':<34} {d.task_status or '-':<10} {d.reason}")
        return 0
    reports = redrive(queues, tier=args.tier)
    for r in reports:
        moved = "moving asynchronously" if r.moved is None else f"{r.moved} message(s)"
        print(f"{r.tier:<7} {moved} back to the {r.tier} queue ({r.method})")
    return 0


def _client(args: argparse.Namespace) -> "Client":
    from agentq.client import Client

    return Client(args.url, args.api_key)


def _print(view: dict[str, object]) -> None:
    print(json.dumps(view, indent=2))


def _cmd_status(args: argparse.Namespace) -> int:
    _print(_client(args).get(args.task_id))
    return 0


def _cmd_cancel(args: argparse.Namespace) -> int:
    _print(_client(args).cancel(args.task_id))
    return 0


def _cmd_decide(args: argparse.Namespace) -> int:
    client = _client(args)
    view = client.approve(args.task_id, args.note) if args.command == "approve" else client.reject(args.task_id, args.note)
    _print(view)
    return 0


def _cmd_budget(args: argparse.Namespace) -> int:
    _print(_client(args).raise_budget(args.task_id, args.add_tokens, args.add_steps))
    return 0


def _cmd_fork(args: argparse.Namespace) -> int:
    overrides: dict[str, object] = {}
    if args.model:
        overrides["model"] = args.model
    if args.provider:
        overrides["provider"] = args.provider
    if args.script:
        overrides["script"] = args.script
    if args.max_tokens:
        overrides["constraints"] = {"max_tokens": args.max_tokens}
    _print(_client(args).fork(args.task_id, args.at_step, **overrides))
    return 0


def _remote(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    parser.add_argument("--url", help="API URL (default: $AGENTQ_URL)")
    parser.add_argument("--api-key", help="API key (default: $AGENTQ_API_KEY)")
    return parser


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="agentq", description="A durable task queue for long-running AI agents.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    demo = sub.add_parser(
        "demo", help="the local stack end to end: a scripted research agent, its worker SIGKILLed mid-task, resumed"
    )
    demo.add_argument("--kill-at-step", type=int, default=6, help="SIGKILL the worker once this step is committed (0: never)")
    demo.set_defaults(func=_cmd_demo)

    run = sub.add_parser("run", help="run one goal on the local stack (Anthropic if ANTHROPIC_API_KEY is set, else scripted)")
    run.add_argument("goal")
    run.add_argument("--model", default="claude-sonnet-4-6", help="Anthropic model id")
    run.add_argument("--max-tokens", type=int, default=100_000, help="token budget")
    run.set_defaults(func=_cmd_run)

    dev = sub.add_parser("dev", help="start the local stack (moto, queues, table, workers, API) until Ctrl-C")
    dev.add_argument("--workers", type=int, default=2, help="worker processes")
    dev.set_defaults(func=_cmd_dev)

    worker = sub.add_parser("worker", help="long-poll the tier queues and run tasks (uses AGENTQ_* and AWS_* settings)")
    worker.add_argument("--concurrency", type=int, default=256, help="tasks in flight at once")
    worker.add_argument("--lease", type=float, default=3.0, help="lease seconds")
    worker.add_argument("--heartbeat", type=float, default=1.0, help="seconds between lease/visibility extensions")
    worker.add_argument("--visibility", type=int, default=4, help="visibility each heartbeat extends to (> lease)")
    worker.add_argument("--max-receive-count", type=int, default=5, help="the queues' maxReceiveCount")
    worker.add_argument("-v", "--verbose", action="store_true")
    worker.set_defaults(func=_cmd_worker)

    run_task = sub.add_parser("run-task", help="run one task in this process until it ends (no queue)")
    run_task.add_argument("task_id")
    run_task.add_argument("--lease", type=float, default=30.0, help="lease seconds")
    run_task.add_argument("--wait", type=float, default=0.0, help="keep trying to claim for this long if another lease is live")
    run_task.set_defaults(func=_cmd_run_task)

    status = _remote(sub.add_parser("status", help="a task's status, tokens and result"))
    status.add_argument("task_id")
    status.set_defaults(func=_cmd_status)
    cancel = _remote(sub.add_parser("cancel", help="cancel a task and its whole subtree (partial results kept)"))
    cancel.add_argument("task_id")
    cancel.set_defaults(func=_cmd_cancel)
    for verb in ("approve", "reject"):
        decide = _remote(sub.add_parser(verb, help=f"{verb} a task paused by request_approval; it resumes with the decision"))
        decide.add_argument("task_id")
        decide.add_argument("--note", default="", help="a note the agent reads with the decision")
        decide.set_defaults(func=_cmd_decide)
    budget = _remote(sub.add_parser("budget", help="raise a root task's token/step caps; a cost_exceeded task resumes"))
    budget.add_argument("task_id")
    budget.add_argument("--add-tokens", type=int, default=0)
    budget.add_argument("--add-steps", type=int, default=0)
    budget.set_defaults(func=_cmd_budget)
    fork = _remote(sub.add_parser("fork", help="a new task from another's committed steps 1..N (effects not repeated)"))
    fork.add_argument("task_id")
    fork.add_argument("--at-step", type=int, required=True)
    fork.add_argument("--model")
    fork.add_argument("--provider", choices=["anthropic", "bedrock", "scripted"])
    fork.add_argument("--script", help="scripted provider: a built-in script name or a JSON/YAML file")
    fork.add_argument("--max-tokens", type=int)
    fork.set_defaults(func=_cmd_fork)

    dlq = sub.add_parser("dlq", help="inspect or redrive the dead-letter queues")
    dlq_sub = dlq.add_subparsers(dest="dlq_command", required=True, metavar="ACTION")
    dlq_list = dlq_sub.add_parser("list", help="messages in the DLQs, with their task and reason")
    dlq_list.add_argument("--tier", choices=["high", "normal", "low"])
    dlq_list.add_argument("--limit", type=int, default=100)
    dlq_list.add_argument("--json", action="store_true")
    dlq_redrive = dlq_sub.add_parser("redrive", help="move DLQ messages back; their tasks resume from their checkpoints")
    dlq_redrive.add_argument("--tier", choices=["high", "normal", "low"])
    dlq.set_defaults(func=_cmd_dlq)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args))
    except AgentqError as exc:
        where = f" ({exc.field})" if exc.field else ""
        print(f"agentq: {exc.message}{where}", file=sys.stderr)
        status = getattr(exc, "status", None)
        return 1 if status in (404, 409) else 2
    except KeyboardInterrupt:
        return 130


