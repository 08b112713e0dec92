"""How the remote commands print: the API's JSON, a rich console sized for a pipe, a task
followed to its end (changes on stderr), its result (stdout) and the exit code of that end."""

from __future__ import annotations

import errno
import json
import os
import sys
from typing import Any


def dump(model: Any) -> None:
    data = model.model_dump(mode="json", by_alias=True) if hasattr(model, "model_dump") else model
    print(json.dumps(data, indent=2))


def console(stderr: bool = False) -> Any:
    from rich.console import Console

    class PipeConsole(Console):
        def on_broken_pipe(self) -> None:
            """A reader that closed the pipe (``agentq events ID | head -1``) ends the command as it
            does print()'s: BrokenPipeError, which main() answers with 0. Rich's own handler
            raised SystemExit(1), "did not succeed", for a command that did."""
            self.quiet = True
            raise BrokenPipeError(errno.EPIPE, os.strerror(errno.EPIPE))

    stream = sys.stderr if stderr else sys.stdout
    width = None if stream.isatty() else int(os.environ.get("COLUMNS") or 200)  # piped: don't wrap at 80
    return PipeConsole(stderr=stderr, highlight=False, soft_wrap=False, width=width)


def final(view: Any) -> int:
    return 0 if view.status.value == "succeeded" else 1


def follow(client: Any, task_id: str, timeout: float) -> Any:
    """Wait for the end, telling stderr about each change of status or step."""

    def show(view: Any) -> None:
        print(
            f"{view.status.value:<13} step {view.step:<4} tokens {view.tokens.total:<8,} {view.activity or ''}",
            file=sys.stderr,
            flush=True,
        )

    return client.wait(task_id, timeout=timeout, poll=poll_seconds(), on_update=show)


def poll_seconds() -> float:
    return float(os.environ.get("AGENTQ_POLL_SECONDS", "0.5"))


def print_result(result: Any) -> None:
    if result.result is not None:
        print(result.result)
    if result.error:
        print(
            f"agentq: task {result.task_id} {result.status.value}: {result.error.get('message', '')}", file=sys.stderr
        )
    elif not result.complete:
        print(f"agentq: task {result.task_id} {result.status.value}; the result above is partial", file=sys.stderr)


def print_answer(client: Any, task_id: str) -> None:
    """What a followed task ended with, once its events have: the answer on stdout under a
    line that says how it ended (an error or a partial answer also on stderr). A task that
    has not ended (a stream cut short) prints nothing: there is no answer yet."""
    from agentq.api.client import ApiError

    try:
        result = client.result(task_id)
    except ApiError:
        return
    print(f"answer ({result.status.value}):" if result.result is not None else f"no answer ({result.status.value})")
    print_result(result)
