"""Talking to a task from the terminal: ``send``, ``interrupt``, ``messages`` and ``chat``.

``chat`` is the loop a person wants: type a message, watch the agent's answer arrive through the
task's event stream (its live text while a model call streams, then each committed answer), type
the next. While the agent works, Ctrl-C interrupts it (it stops at its earliest safe point and waits for your next
message); Ctrl-C at the prompt, or Ctrl-D, leaves the chat and the task as it is.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from agentq.cli.args import add_command
from agentq.cli.output import dump, final, follow, poll_seconds
from agentq.cli.target import api_client, remote
from agentq.core.status import TaskStatus


def _cmd_send(args: argparse.Namespace) -> int:
    client = api_client(args)
    text = sys.stdin.read() if args.text == "-" else args.text
    sent = client.send(args.task_id, text, add_tokens=args.add_tokens, idempotency_key=args.idempotency_key)
    if not args.wait:
        if args.json:
            dump(sent)
        else:
            how = "a follow-up; the task runs again" if sent.reopened else f"the task is {sent.status.value}"
            print(f"message {sent.seq} sent to {sent.task_id}: {how}")
        return 0
    view = follow(client, args.task_id, args.wait_timeout)
    result = client.result(args.task_id)
    if args.json:
        dump(result)
    elif result.result is not None:
        print(result.result)
    return final(view) if view.status.value != "idle" else 0


def _cmd_interrupt(args: argparse.Namespace) -> int:
    done = api_client(args).interrupt(args.task_id)
    if args.json:
        dump(done)
    elif done.status.value == "idle":
        print(f"{done.task_id} is already idle: it waits for your next message")
    else:
        print(f"interrupt recorded for {done.task_id}: it stops at its earliest safe point and waits for a message")
    return 0


def _cmd_messages(args: argparse.Namespace) -> int:
    messages = api_client(args).messages(args.task_id)
    if args.json:
        dump({"task_id": args.task_id, "messages": [m.model_dump(mode="json") for m in messages]})
        return 0
    for m in messages:
        mark = "" if m.delivered else "  (not read yet)"
        print(f"{m.seq:>4}  {m.text}{mark}")
    return 0


def _cmd_chat(args: argparse.Namespace) -> int:
    client = api_client(args)
    view = client.get(args.task_id)
    print(f"chatting with {view.task_id} ({view.status.value}). Ctrl-C interrupts the agent; Ctrl-D leaves.",
          file=sys.stderr)  # fmt: skip
    cursor = _latest_cursor(client, args.task_id)
    if not (view.status.terminal or view.status.value == "idle"):
        cursor, view = _follow(client, args.task_id, cursor)
    while True:
        try:
            text = input("you> ")
        except (EOFError, KeyboardInterrupt):
            print(file=sys.stderr)
            return 0
        if not text.strip():
            continue
        client.send(args.task_id, text)
        cursor, view = _follow(client, args.task_id, cursor)
        if view.status.value not in ("succeeded", "idle"):
            print(f"agentq: the task is {view.status.value}; the conversation cannot go on", file=sys.stderr)
            return 1


def _latest_cursor(client: Any, task_id: str) -> str | None:
    """Where the task's event log ends now: what the chat follows from (history is not replayed)."""
    cursor: str | None = None
    while True:
        page = client.events(task_id, after=cursor, limit=200)
        if not page.events or page.next_cursor is None:
            return cursor
        cursor = str(page.next_cursor)
        if page.done or len(page.events) < 200:
            return cursor


def _follow(client: Any, task_id: str, cursor: str | None) -> tuple[str | None, Any]:
    """The agent's output as it comes (its live text, then each answer), until it stops: answered,
    idle after an interrupt, or ended. Ctrl-C interrupts it, and the chat follows it to its stop."""
    interrupted = False
    while True:
        try:
            cursor = _print_until_stopped(client, task_id, cursor)
            break
        except KeyboardInterrupt:
            if interrupted:
                raise
            interrupted = True
            client.interrupt(task_id)
            print("\n(interrupting: the agent stops at its earliest safe point)", file=sys.stderr)
    view = client.get(task_id)
    if view.status.value == "idle":
        print("(interrupted: say what it should do next)", file=sys.stderr)
    return cursor, view


STOPS = frozenset({TaskStatus.IDLE.value, *(s.value for s in TaskStatus if s.terminal)})  # where a turn stops


def _print_until_stopped(client: Any, task_id: str, cursor: str | None) -> str | None:
    streamed = False  # this answer's text already went out as deltas
    for event in client.iter_events(task_id, after=cursor, poll_interval=poll_seconds()):
        cursor = event.id or cursor
        if event.type == "agent.message_delta":
            if not streamed:
                print("agent> ", end="")
                streamed = True
            if event.data.get("reset"):
                print("\n       ", end="")
            print(event.data.get("text", ""), end="", flush=True)
        elif event.type == "agent.message" and event.data.get("purpose") == "turn" and event.data.get("text"):
            print() if streamed else print(f"agent> {event.data['text']}")
            streamed = False
        elif event.type == "task.status" and event.data.get("status") in STOPS:
            return cursor
    return cursor


def register(sub: Any) -> None:
    send = remote(add_command(sub, "send", "send a task a message (a follow-up to an answered task continues it)"))
    send.add_argument("task_id")
    send.add_argument("text", help="the message; - reads it from stdin")
    send.add_argument("--add-tokens", type=int, default=0, help="raise the task's token cap first")
    send.add_argument("--idempotency-key", help="a retry with the same key sends nothing twice")
    send.add_argument("--wait", action="store_true", help="wait for the agent's answer and print it")
    send.add_argument("--wait-timeout", type=float, default=24 * 3600, help="give up waiting after this many seconds")
    send.set_defaults(func=_cmd_send)

    stop = remote(add_command(sub, "interrupt", "stop a running task at its earliest safe point; it waits idle"))
    stop.add_argument("task_id")
    stop.set_defaults(func=_cmd_interrupt)

    listed = remote(add_command(sub, "messages", "the messages a task was sent, in the order it reads them"))
    listed.add_argument("task_id")
    listed.set_defaults(func=_cmd_messages)

    chat = remote(add_command(sub, "chat", "talk to a task: type, read its answer, Ctrl-C interrupts it"))
    chat.add_argument("task_id")
    chat.set_defaults(func=_cmd_chat)
