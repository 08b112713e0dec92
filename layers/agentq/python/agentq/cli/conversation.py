"""Talking to a task from the terminal: ``send``, ``interrupt``, ``messages`` and ``chat``.

``chat`` is the loop a person wants: type a message, watch the agent's answer arrive through the
task's event stream (its live text while a model call streams, then each committed answer), type
the next. While the agent works, Ctrl-C interrupts it (it stops at its earliest safe point and waits for your next
message); Ctrl-C at the prompt, or Ctrl-D, leaves the chat and the task as it is.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Iterable
from typing import Any

from agentq.cli.args import add_command, add_wait, wait_timeout
from agentq.cli.output import dump, final, follow, poll_seconds
from agentq.cli.target import api_client, remote
from agentq.core.status import TaskStatus


def _cmd_send(args: argparse.Namespace) -> int:
    timeout = wait_timeout(args)
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
    view = follow(client, args.task_id, timeout)
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


# Where a conversation cannot go on: told before the person types, not after.
CLOSED = frozenset({"failed", "cancelled", "timed_out", "failed_outcome"})


def _cmd_chat(args: argparse.Namespace) -> int:
    client = api_client(args)
    if args.task_id is None:
        return _new_chat(client, args)
    view = client.get(args.task_id)
    why = _cannot_go_on(view)
    if why is not None:
        _history(client, view)
        print(f"agentq: {why}", file=sys.stderr)
        return 1
    print(f"chatting with {view.task_id} ({view.status.value}). Ctrl-C interrupts the agent; Ctrl-D leaves.",
          file=sys.stderr)  # fmt: skip
    _history(client, view)
    cursor = _latest_cursor(client, args.task_id)
    if not (view.status.terminal or view.status.value == "idle"):
        cursor, view = _follow(client, args.task_id, cursor)
    return _talk(client, view.task_id, cursor)


def _new_chat(client: Any, args: argparse.Namespace) -> int:
    """``agentq chat`` without a task: the first line typed is the goal of a new task (with the
    flags' agent, provider, model or script), followed as any conversation."""
    from agentq.cli.submit import load_script

    print("a new conversation: your first message is the task's goal. Ctrl-C interrupts the agent; Ctrl-D leaves.",
          file=sys.stderr)  # fmt: skip
    text = _read()
    if text is None:
        return 0
    body: dict[str, Any] = {"goal": text}
    if args.agent:
        body["agent"] = args.agent
    if args.script:
        body.update(provider="scripted", script=load_script(args.script))
    elif args.provider:
        body["provider"] = args.provider
    elif not args.agent:
        body["provider"] = "anthropic"
    if args.model:
        body["model"] = args.model
    if args.system:
        body["system"] = args.system
    tools = [t.strip() for item in args.tools for t in item.split(",") if t.strip()]
    if tools:
        body["constraints"] = {"tools": tools}
    accepted = client.submit(body)
    print(f"(task {accepted.task_id}: agentq chat {accepted.task_id} goes on with it later)", file=sys.stderr)
    cursor, view = _follow(client, accepted.task_id, None)
    if view.status.value not in ("succeeded", "idle"):
        print(f"agentq: the task is {view.status.value}; the conversation cannot go on", file=sys.stderr)
        return 1
    return _talk(client, accepted.task_id, cursor)


def _talk(client: Any, task_id: str, cursor: str | None) -> int:
    """Read a line, send it, print the answer, until Ctrl-D (or the task can take no more)."""
    while True:
        text = _read()
        if text is None:
            return 0
        sent = client.send(task_id, text)
        cursor, view = _follow(client, task_id, cursor, answering=sent.seq)
        if view.status.value not in ("succeeded", "idle"):
            print(f"agentq: the task is {view.status.value}; the conversation cannot go on", file=sys.stderr)
            return 1


def _read() -> str | None:
    """The person's next message (None: they left with Ctrl-D or Ctrl-C at the prompt)."""
    while True:
        try:
            text = input("you> ")
        except (EOFError, KeyboardInterrupt):
            print(file=sys.stderr)
            return None
        if text.strip():
            return text


def _cannot_go_on(view: Any) -> str | None:
    """Why this task takes no message, read before the person types one (None: it takes it)."""
    status = view.status.value
    if view.parent_id:
        return f"task {view.task_id} is a sub-agent: it takes its instructions from its parent"
    if status in CLOSED:
        return f"task {view.task_id} is {status}: it takes no more messages (agentq fork it to go on)"
    if status == "cost_exceeded":
        return (
            f"task {view.task_id} ran out of budget: raise it first (agentq budget {view.task_id} --add-tokens N), "
            f"or send with the raise (agentq send {view.task_id} TEXT --add-tokens N)"
        )
    return None


def _history(client: Any, view: Any) -> None:
    """What was said so far, in order: the goal, each answer, each message the agent read."""
    from agentq.api.models import LLMCallEvent, MessageEvent

    print(f"you> {view.goal}")
    for event in client.iter_trace(view.task_id):
        if isinstance(event, MessageEvent):
            print(f"you> {event.text}")
        elif isinstance(event, LLMCallEvent) and not event.orphan and event.purpose == "turn" and event.text:
            print(f"agent> {event.text}")
    waiting = [m for m in client.messages(view.task_id) if not m.delivered]
    for m in waiting:
        print(f"you> {m.text}  (not read yet)")


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


def _follow(client: Any, task_id: str, cursor: str | None, answering: int | None = None) -> tuple[str | None, Any]:
    """The agent's output as it comes (its live text, then each answer), until it stops: answered,
    idle after an interrupt, or ended. Ctrl-C interrupts it, and the chat follows it to its stop;
    a task the API will not interrupt (409: only a running or queued one is) is followed on, the
    person told why, and a second Ctrl-C leaves, as after an interrupt.

    ``answering``: the seq of the message just sent. An answer or an idle stop counts only once
    the agent has read it: a stream or a status read just after the send may still say the
    previous answer's ``succeeded`` (the reopening is not yet in the view they came from), and a
    chat that took that for the answer prompted again with nothing printed."""
    from agentq.api.client import Conflict

    interrupted = False
    while True:
        try:
            cursor, stopped = _print_until_stopped(client, task_id, cursor, answering)
            if stopped:
                break
            if _stopped_after(client, task_id, answering):
                # The stream ended before the answer reached it (a view of the task older than
                # the message that reopened it), and the task has answered since: what it said
                # is in the committed log, read page by page from where the chat got to.
                cursor = _print_the_rest(client, task_id, cursor)
                break
            # The stream ended with the task still going (a stream that said "ended" from a view
            # of the task older than the message that reopened it): follow on, after a pause.
            time.sleep(poll_seconds())
        except KeyboardInterrupt:
            if interrupted:
                raise
            interrupted = True
            try:
                client.interrupt(task_id)
            except Conflict as refused:  # paused for an approval, waiting on its children: the chat follows on
                print(f"\n(cannot interrupt: {refused.message}; Ctrl-C again leaves the chat)", file=sys.stderr)
                continue
            print("\n(interrupting: the agent stops at its earliest safe point)", file=sys.stderr)
    view = client.get(task_id)
    if view.status.value == "idle":
        print("(interrupted: say what it should do next)", file=sys.stderr)
    return cursor, view


STOPS = frozenset({TaskStatus.IDLE.value, *(s.value for s in TaskStatus if s.terminal)})  # where a turn stops
# Stops that answer a message (or wait for the next): they count only once the message was read.
ANSWERED = frozenset({TaskStatus.SUCCEEDED.value, TaskStatus.IDLE.value})


def _stopped_after(client: Any, task_id: str, answering: int | None) -> bool:
    """The task stopped, and (``answering``) after reading the message of that seq."""
    status = client.get(task_id).status.value
    if status not in STOPS:
        return False
    return status not in ANSWERED or answering is None or _read_it(client, task_id, answering)


def _read_it(client: Any, task_id: str, seq: int) -> bool:
    return any(m.seq == seq and m.delivered for m in client.messages(task_id))


def _print_the_rest(client: Any, task_id: str, cursor: str | None) -> str | None:
    """Print the committed events after ``cursor`` (JSON pages, not the stream); where they end."""
    while True:
        page = client.events(task_id, after=cursor, limit=200)
        cursor, _ = _print_events(page.events, cursor, None)
        if not page.events or page.next_cursor is None or page.done:
            return cursor
        cursor = str(page.next_cursor)


def _print_until_stopped(
    client: Any, task_id: str, cursor: str | None, answering: int | None = None
) -> tuple[str | None, bool]:
    """Print the stream from ``cursor``; returns where it got to and whether it saw the task stop
    (an answering stop, when ``answering``, only after the stream showed that message read)."""
    return _print_events(client.iter_events(task_id, after=cursor, poll_interval=poll_seconds()), cursor, answering)


def _print_events(events: Iterable[Any], cursor: str | None, answering: int | None) -> tuple[str | None, bool]:
    """Print ``events`` until one says the task stopped (see ``_print_until_stopped``)."""
    streamed = False  # this answer's text already went out as deltas
    read = answering is None
    for event in events:
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
        elif event.type == "user.message":
            read = read or any(m.get("seq") == answering for m in event.data.get("messages", []))
        elif (
            event.type == "task.status"
            and event.data.get("status") in STOPS
            and (read or event.data.get("status") not in ANSWERED)
        ):
            return cursor, True
    return cursor, False


def register(sub: Any) -> None:
    send = remote(add_command(sub, "send", "send a task a message (a follow-up to an answered task continues it)"))
    send.add_argument("task_id")
    send.add_argument("text", help="the message; - reads it from stdin")
    send.add_argument(
        "--add-tokens", type=int, default=0, help="raise the task's token cap with the message (only if it is taken)"
    )
    send.add_argument("--idempotency-key", help="a retry with the same key sends nothing twice")
    add_wait(send, "wait for the agent's answer and print it")
    send.set_defaults(func=_cmd_send)

    stop = remote(add_command(sub, "interrupt", "stop a running task at its earliest safe point; it waits idle"))
    stop.add_argument("task_id")
    stop.set_defaults(func=_cmd_interrupt)

    listed = remote(add_command(sub, "messages", "the messages a task was sent, in the order it reads them"))
    listed.add_argument("task_id")
    listed.set_defaults(func=_cmd_messages)

    chat = remote(
        add_command(
            sub,
            "chat",
            "talk to a task (none: start one): type, read its answer, Ctrl-C interrupts it",
            "Shows what was said so far, then reads a line, sends it and prints the answer as it comes. Without "
            "TASK_ID the first line is the goal of a new task (--agent, --provider, --model, --script, --tools "
            "say which). A task that takes no message (failed, cancelled, timed out, out of budget, a sub-agent) "
            "is said so before you type.",
        ),
        json=False,
    )
    chat.add_argument("task_id", nargs="?", help="the task to go on with (none: a new conversation)")
    chat.add_argument(
        "--agent", help="a new conversation: the agent definition it runs (NAME, NAME@VERSION or NAME@ALIAS)"
    )
    chat.add_argument("--provider", choices=["anthropic", "bedrock", "bedrock-converse", "openai", "scripted"],
                      help="a new conversation: its provider (default anthropic; scripted with --script)")  # fmt: skip
    chat.add_argument("--model", help="a new conversation: its model")
    chat.add_argument("--script", metavar="NAME|FILE|JSON", help="a new conversation: the scripted provider's turns")
    chat.add_argument("--system", help="a new conversation: its system prompt")
    chat.add_argument("--tools", action="append", default=[], metavar="NAME[,NAME]",
                      help="a new conversation: its tool allowlist")  # fmt: skip
    chat.set_defaults(func=_cmd_chat)
