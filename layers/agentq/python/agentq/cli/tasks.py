"""The commands on tasks that exist: status, watch, result, trace, list, cancel, approve and
reject, budget, fork; and webhook-secret, the tenant's key to check their callbacks."""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from agentq.cli.args import add_command, add_wait, positive, wait_timeout
from agentq.cli.output import console, dump, final, follow, print_answer, print_result
from agentq.cli.submit import load_script, parse_metadata
from agentq.cli.target import api_client, remote

STATUSES = [
    "queued",
    "blocked",
    "running",
    "waiting",
    "paused",
    "idle",
    "succeeded",
    "failed",
    "cancelled",
    "cost_exceeded",
    "timed_out",
    "failed_outcome",
]


def _cmd_status(args: argparse.Namespace) -> int:
    from agentq.cli.views import status_block

    view = api_client(args).get(args.task_id)
    if args.json:
        dump(view)
    else:
        print(status_block(view))
    return 0


def _cmd_result(args: argparse.Namespace) -> int:
    timeout = wait_timeout(args)
    client = api_client(args)
    if args.wait:
        follow(client, args.task_id, timeout)
    result = client.result(args.task_id)
    if args.json:
        dump(result)
    else:
        print_result(result)
    return 0 if result.complete else 1


def _cmd_list(args: argparse.Namespace) -> int:
    from agentq.cli.views import task_table

    client = api_client(args)
    metadata = parse_metadata(args.metadata)
    tasks, cursor = [], args.cursor
    while True:
        page = client.list_tasks(
            args.status,
            limit=args.limit,
            cursor=cursor,
            include_children=args.children,
            metadata=metadata,
            user=args.user,
        )
        tasks.extend(page.tasks)
        cursor = page.next_cursor
        if not (args.all and cursor):
            break
    if args.json:
        print(
            json.dumps(
                {"tasks": [t.model_dump(mode="json", by_alias=True) for t in tasks], "next_cursor": cursor}, indent=2
            )
        )
        return 0
    if tasks:
        console().print(task_table(tasks))
    else:
        print("no tasks" + (f" with status {args.status}" if args.status else ""), file=sys.stderr)
    if cursor:
        again = (f" --status {args.status}" if args.status else "") + "".join(f" --metadata {p}" for p in args.metadata)
        again += f" --user {args.user}" if args.user else ""
        print(f"more: agentq list --cursor {cursor}{again}", file=sys.stderr)
    return 0


def _cmd_trace(args: argparse.Namespace) -> int:
    from agentq.cli.views import trace_tree

    client = api_client(args)
    view = client.get(args.task_id)
    events = list(client.iter_trace(args.task_id))
    if args.json:
        print(json.dumps({"task_id": args.task_id, "events": [e.model_dump(mode="json") for e in events]}, indent=2))
    else:
        console().print(trace_tree(args.task_id, view, events))
    return 0


def _cmd_watch(args: argparse.Namespace) -> int:
    """Follow the task's event stream (``agentq events``); where it cannot be read, poll."""
    from rich.live import Live

    from agentq.api.client import ConnectionFailed, ServerError
    from agentq.cli.events import stream_line
    from agentq.cli.views import watch_view

    client = api_client(args)
    view = client.get(args.task_id)
    recent: list[Any] = []
    with Live(watch_view(view, recent), console=console(), refresh_per_second=8, transient=False) as live:
        try:
            refreshed = time.monotonic()
            for event in client.iter_events(args.task_id, poll_interval=args.interval):
                if event.committed and args.events:
                    recent.append(stream_line(event, view.created_at))
                    del recent[: max(0, len(recent) - args.events)]
                if event.committed or time.monotonic() - refreshed >= args.interval:
                    view, refreshed = client.get(args.task_id), time.monotonic()  # tokens, children, activity
                live.update(watch_view(view, recent))
        except (ConnectionFailed, ServerError):
            _poll_watch(client, args, live, recent)  # no stream (or it keeps failing): poll the task
        view = client.get(args.task_id)
        live.update(watch_view(view, recent))
    if view.status.terminal:
        print_answer(client, args.task_id)
    return final(view)


def _poll_watch(client: Any, args: argparse.Namespace, live: Any, recent: list[Any]) -> None:
    from agentq.cli.views import event_line, watch_view

    view = client.get(args.task_id)
    page_cursor: str | None = None
    seen_on_page = 0

    def tail() -> None:
        """New trace events since the last look: re-read the last page, move on when it fills."""
        nonlocal page_cursor, seen_on_page
        while True:
            page = client.trace(args.task_id, limit=100, cursor=page_cursor)
            fresh = page.events[seen_on_page:]
            recent.extend(event_line(e, view.created_at) for e in fresh)
            del recent[: max(0, len(recent) - args.events)]
            if page.next_cursor:
                page_cursor, seen_on_page = page.next_cursor, 0
            else:
                seen_on_page = len(page.events)
                return

    while True:
        if args.events:
            tail()
        live.update(watch_view(view, recent))
        if view.status.terminal:
            return
        time.sleep(args.interval)
        view = client.get(args.task_id)


def _cmd_cancel(args: argparse.Namespace) -> int:
    result = api_client(args).cancel(args.task_id)
    if args.json:
        dump(result)
    else:
        print(f"cancelled {len(result.cancelled)} task(s): {', '.join(result.cancelled)}")
    return 0


def _cmd_decide(args: argparse.Namespace) -> int:
    """Decide the call the task holds, by its id: ``--tool-use-id`` names the one the person
    saw; without it, the call held now is read, shown (stderr) and named. The API decides that
    call or nothing (409 naming ``tool_use_id`` once it was decided or another is held), so a
    second approve, or one racing another reviewer's, never decides a call nobody was shown."""
    from agentq.cli.views import held_call
    from agentq.core.errors import IllegalTransition

    client = api_client(args)
    use_id = args.tool_use_id
    if use_id is None:
        held = client.get(args.task_id)
        if held.pending_tool_use_id is None:
            raise IllegalTransition(f"task {held.task_id} is {held.status.value}, not waiting for approval",
                                    field="task_id")  # fmt: skip
        use_id = held.pending_tool_use_id
        print(held_call(held), file=sys.stderr)
    decide = client.approve if args.command == "approve" else client.reject
    view = decide(args.task_id, args.note, use_id)
    if args.json:
        dump(view)
    else:
        done = {"approve": "approved", "reject": "rejected"}[args.command]
        print(f"{done} {view.task_id}; it is {view.status.value} and resumes with the decision")
    return 0


def _cmd_webhook_secret(args: argparse.Namespace) -> int:
    secret = api_client(args).webhook_secret()
    print(json.dumps({"secret": secret}) if args.json else secret)
    return 0


def _cmd_budget(args: argparse.Namespace) -> int:
    view = api_client(args).raise_budget(args.task_id, args.add_tokens, args.add_steps, args.add_usd)
    if args.json:
        dump(view)
    else:
        from agentq.cli.views import budget_line, money_line

        print(
            f"{view.task_id}: {view.status.value}; budget {budget_line(view)}{money_line(view)}; "
            f"max steps {view.max_steps}"
        )
    return 0


def _cmd_fork(args: argparse.Namespace) -> int:
    overrides: dict[str, Any] = {}
    if args.model:
        overrides["model"] = args.model
    if args.provider:
        overrides["provider"] = args.provider
    if args.script:
        overrides["script"] = load_script(args.script)
    if args.max_tokens:
        overrides["constraints"] = {"max_tokens": args.max_tokens}
    view = api_client(args).fork(args.task_id, args.at_step, **overrides)
    if args.json:
        dump(view)
    else:
        print(view.task_id)
    return 0


def register(sub: Any) -> None:
    def command(name: str, help: str) -> argparse.ArgumentParser:
        return add_command(sub, name, help)

    secret = remote(command("webhook-secret", "print this tenant's callback signing secret (verify callbacks with it)"))
    secret.set_defaults(func=_cmd_webhook_secret)

    status = remote(command("status", "a task's status, step, tokens against its budget, cost, children and timing"))
    status.add_argument("task_id")
    status.set_defaults(func=_cmd_status)

    watch = remote(command("watch", "a live view of a task until it ends: steps, tokens as a bar, children, activity "
                           "(follows its event stream; polls where there is none)"), json=False)  # fmt: skip
    watch.add_argument("task_id")
    watch.add_argument("--interval", type=float, default=0.5, help="seconds between refreshes of the live text")
    watch.add_argument("--events", type=positive, default=6, help="recent events to show (0: none)")
    watch.set_defaults(func=_cmd_watch)

    result = remote(command("result", "a finished task's result on stdout (exit 1 unless it succeeded)"))
    result.add_argument("task_id")
    add_wait(result, "wait for the task to end first")
    result.set_defaults(func=_cmd_result)

    trace = remote(command("trace", "the task's LLM and tool calls as a tree, with timings and tokens"),
                   json_help="print every event as JSON (all pages)")  # fmt: skip
    trace.add_argument("task_id")
    trace.set_defaults(func=_cmd_trace)

    list_ = remote(command("list", "your tasks, newest first"))
    list_.add_argument("--status", choices=STATUSES, help="only tasks in this status")
    list_.add_argument("--limit", type=int, default=20, help="tasks per page (1-100)")
    list_.add_argument("--cursor", help="continue from a previous page")
    list_.add_argument("--all", action="store_true", help="follow every page")
    list_.add_argument("--children", action="store_true", help="include sub-agents")
    list_.add_argument("--user", metavar="USER", help="only tasks acting for this end user")
    list_.add_argument(
        "--metadata", action="append", default=[], metavar="KEY=VALUE", help="only tasks with this label (repeatable)"
    )
    list_.set_defaults(func=_cmd_list)

    cancel = remote(command("cancel", "cancel a task and its whole subtree (partial results kept)"))
    cancel.add_argument("task_id")
    cancel.set_defaults(func=_cmd_cancel)
    for verb in ("approve", "reject"):
        decide = remote(command(verb, f"{verb} a task paused by request_approval; it resumes with the decision"))
        decide.add_argument("task_id")
        decide.add_argument("--note", default="", help="a note the agent reads with the decision")
        decide.add_argument("--tool-use-id", metavar="ID", help="the held call this decides (agentq status: held); "
                            "default: the one held now, shown first. Decided already, or another held: exit 1")  # fmt: skip
        decide.set_defaults(func=_cmd_decide)
    budget = remote(command("budget", "raise a root task's token/step caps; a cost_exceeded task resumes"))
    budget.add_argument("task_id")
    budget.add_argument("--add-tokens", type=int, default=0, help="tokens to add to the cap")
    budget.add_argument("--add-steps", type=int, default=0, help="LLM turns to add to max_steps")
    budget.add_argument("--add-usd", default=None, help="dollars to add to the money cap (max_cost_usd)")
    budget.set_defaults(func=_cmd_budget)
    fork = remote(
        command("fork", "a new task from another's committed steps 1..N (effects not repeated); prints its id")
    )
    fork.add_argument("task_id")
    fork.add_argument(
        "--at-step", type=int, required=True,
        help="copy steps 1..N of the source (N not the model's turn asking for tool calls: they would be made again)",
    )  # fmt: skip
    fork.add_argument("--model", help="another model for the fork")
    fork.add_argument(
        "--provider",
        choices=["anthropic", "bedrock", "bedrock-converse", "openai", "scripted"],
        help="another provider",
    )
    fork.add_argument("--script", help="scripted provider: a built-in script name or a JSON/YAML file")
    fork.add_argument("--max-tokens", type=int, help="the fork's token budget")
    fork.set_defaults(func=_cmd_fork)
