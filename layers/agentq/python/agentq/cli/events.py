"""``agentq events``: a task's event stream (``GET /tasks/{id}/events``) as lines or JSON lines,
and the line of each event that ``agentq watch`` shows while it follows the same stream."""

from __future__ import annotations

import argparse
import json
from typing import Any

from agentq.cli.args import add_command
from agentq.cli.output import console, print_answer
from agentq.cli.target import api_client, remote


def stream_line(event: Any, origin: float) -> Any:
    """One committed event in a line: a step as the trace shows it, anything else by its type."""
    from rich.text import Text

    from agentq.api.client import TERMINAL
    from agentq.api.models import LLMCallEvent, ToolCallEvent
    from agentq.cli.views import STATUS_STYLE, cut, event_line

    data = event.data
    if event.type == "agent.message":
        return event_line(LLMCallEvent.model_validate(data), origin)
    if event.type == "agent.tool_results":
        lines = [event_line(ToolCallEvent.model_validate(c), origin) for c in data.get("tool_calls", [])]
        return Text("\n").join(lines) if lines else Text("")
    at = Text.assemble((f"+{event.at - origin:7.2f}s ", "dim"))
    status = str(data.get("status") or "")
    what = {
        "task.created": f"created ({status})",
        "task.retry": f"retry {data.get('attempt')}/{data.get('max_attempts')} ({data.get('scope')}): "
        f"{data.get('code')} {cut(str(data.get('message') or ''), 60)}",
        "approval.requested": f"approval requested: {cut(str(data.get('question') or ''), 80)}",
        "approval.decided": f"approval {'approved' if data.get('approved') else 'rejected'} by {data.get('by')}"
        + (f" (end user {data['by_user']})" if data.get("by_user") else ""),
        "task.spawned": f"spawned {len(data.get('children') or [])} sub-agents",
        "budget.raised": f"budget raised by {data.get('add_tokens')} tokens",
    }.get(event.type, "")
    if event.type == "task.status":
        what = f"finished {status}" if status in TERMINAL else status
        if data.get("worker"):
            what += f" on {data['worker']} (epoch {data.get('epoch')}{', takeover' if data.get('takeover') else ''})"
        if data.get("error"):
            what += f" ({data['error']})"
    return Text.assemble(at, (what or event.type, STATUS_STYLE.get(status, "")))


def tree_label(path: str | None) -> str:
    """``root`` for the root, else its path (``2.1``: the first sub-agent of its second)."""
    return path or "root"


def _cmd_events(args: argparse.Namespace) -> int:
    """The events until the stream ends, which it does when the task has: exit 0 if it ended
    succeeded, else 1, as ``watch`` and ``result`` (how it ended: its last status on the stream,
    else, resumed past it with --after, its view)."""
    from agentq.api.client import TERMINAL

    client = api_client(args)
    screen = console()
    origin: float | None = None
    prefix = args.tree
    ended: str | None = None
    for event in client.iter_events(args.task_id, after=args.after, tree=args.tree, stream=not args.poll):
        if event.committed and event.type == "task.status" and event.task_id == args.task_id:
            status = str(event.data.get("status") or "")
            ended = status if status in TERMINAL else None  # a budget raised after cost_exceeded runs it again
        if args.json:
            if event.committed or args.deltas:
                print(json.dumps(event.model_dump(mode="json")), flush=True)
            continue
        if not event.committed:
            continue  # live text: `agentq watch` shows it; --json --deltas prints it
        origin = event.at if origin is None else origin
        line = stream_line(event, origin)
        if prefix:  # the task's place in the tree: the ids of a tree's tasks share their first 12 characters
            screen.print(f"[dim]{tree_label(event.tree_path):<6}[/dim] ", end="")
        screen.print(line)
    if not args.json:
        print_answer(client, args.task_id)  # the stream ends when the task does: its answer closes it
    if ended is None:
        ended = client.get(args.task_id).status.value
    return 0 if ended == "succeeded" else 1


def register(sub: Any) -> None:
    events = remote(
        add_command(
            sub,
            "events",
            "a task's events as they commit (status, steps, retries, approvals, spawns), until it ends",
            "Follows GET /tasks/{id}/events: reconnects after the last event it received when the stream "
            "drops, so nothing is missed or repeated; polls JSON pages where the API cannot stream. Exit 1 "
            "unless the task ended succeeded, as watch and result.",
        ),
        json_help="one JSON event a line",
    )
    events.add_argument("task_id")
    events.add_argument("--tree", action="store_true", help="the task and its sub-agents (the first 199 spawned)")
    events.add_argument("--after", help="an event id: start after it (resume)")
    events.add_argument("--deltas", action="store_true", help="with --json: also the uncommitted live text")
    events.add_argument("--poll", action="store_true", help="poll JSON pages instead of streaming")
    events.set_defaults(func=_cmd_events)
