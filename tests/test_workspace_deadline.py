"""A workspace call and the task's deadline. The registry gave up on a call at the deadline
(``ToolRegistry.execute`` waited ``min(timeout, deadline - now)``) and the engine went on to scan,
checkpoint, commit and remove the directory, while the call's sandbox still ran: ``shell`` and
``python_exec`` bounded it by ``max(0.5, remaining - 1)`` (0.5 s past a deadline closer than
that), the file tools by 20 s whatever the deadline. docs/SANDBOX.md promises the worker "scans
and checkpoints a directory no process can still be writing to", which holds only if no process
of the call is alive when the call returns.

Now a sandboxed tool bounds itself by the deadline (``ToolContext.bound``: killed a second before
it, not started with less than 1.5 s left) and the registry waits for it in a task with a
workspace (``ToolSpec.bounds_itself``) instead of abandoning it."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from agentq.core.engine._workspace import TaskWorkspace
from agentq.core.tools import ToolContext, ToolExecution, ToolRegistry, default_registry, idempotency_key_for, tool
from agentq.core.workspace import EMPTY, WORKSPACE_TOOLS
from agentq.sandbox.workspace import WorkspaceSandbox

pytestmark = pytest.mark.skipif(not os.path.exists("/usr/bin/bwrap"), reason="the workspace tools need bubblewrap")
ALL = [*WORKSPACE_TOOLS, "python_exec"]


def _ctx(ws: TaskWorkspace | None, deadline_in: float) -> ToolContext:
    key = idempotency_key_for("task-d", "toolu_1")
    return ToolContext("task-d", "toolu_1", key, workspace=ws, deadline=time.time() + deadline_in)


def _live_descendants() -> set[int]:
    """This process's descendants that are not zombies: bwrap, the stage, the sandbox's processes."""
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat", "rb") as f:
                    fields = f.read().rsplit(b")", 1)[1].split()
            except (OSError, IndexError):
                continue
            if fields[0] != b"Z":
                parents[int(entry)] = int(fields[1])
    found: set[int] = set()
    grew = True
    while grew:
        grew = False
        for pid, parent in parents.items():
            if pid not in found and (parent == os.getpid() or parent in found):
                found.add(pid)
                grew = True
    return found


def _call(ws: TaskWorkspace, name: str, deadline_in: float, **raw: object) -> tuple[ToolExecution, set[int]]:
    """The call's result and the processes it left alive when it returned."""
    before = _live_descendants()
    out = default_registry().execute(name, dict(raw), _ctx(ws, deadline_in), ALL)
    return out, _live_descendants() - before


@pytest.mark.parametrize(
    ("name", "deadline_in", "raw"),
    [
        ("shell", 0.3, {"command": "sleep 0.32; echo late > late.txt", "timeout_seconds": 60}),
        ("python_exec", 0.3, {"code": "import time; time.sleep(0.32); open('late.txt', 'w').write('late')"}),
        # validating 40 MB of input takes a few tenths of a second before the call starts
        ("write_file", 1.2, {"path": "late.txt", "content": "\U0001f600" * 10_000_000}),
    ],
)
def test_nothing_of_a_workspace_call_writes_after_the_call_returned(
    tmp_path: Path, name: str, deadline_in: float, raw: dict[str, object]
) -> None:
    """Less than 1.5 s before the deadline: too little to run and be killed before it, so not
    started (before: started, given up on by the registry at the deadline, left running)."""
    ws = TaskWorkspace("task-d", tmp_path, EMPTY, set(), WorkspaceSandbox())
    out, alive = _call(ws, name, deadline_in, **raw)
    assert not alive, f"processes of the call still running after it returned: {alive}"
    assert out.status == "timeout" and f"tool {name!r} was not started: " in out.content, out.content
    at_return = sorted(p.name for p in tmp_path.iterdir())
    time.sleep(2.5)  # what the sandbox, were it still running, would do meanwhile: the engine is scanning now
    assert sorted(p.name for p in tmp_path.iterdir()) == at_return == []


def test_a_file_tool_is_killed_before_the_deadline_not_twenty_seconds_later(tmp_path: Path) -> None:
    """A search that backtracks for ever, 3 s before the deadline: killed at 2 s, and the call
    returns with nothing of it alive (the registry gave up at 3 s and left it running 17 s more)."""
    (tmp_path / "slow.txt").write_text("a" * 40 + "!\n")
    ws = TaskWorkspace("task-d", tmp_path, EMPTY, set(), WorkspaceSandbox())
    started = time.monotonic()
    out, alive = _call(ws, "search_files", 3.0, pattern="(a+)+$")
    assert not alive, f"processes of the call still running after it returned: {alive}"
    assert out.is_error and "the search operation timed out after 2.0s" in out.content, out.content
    assert time.monotonic() - started < 3.0


def test_a_shell_command_is_killed_before_the_deadline_with_every_process_it_started(tmp_path: Path) -> None:
    ws = TaskWorkspace("task-d", tmp_path, EMPTY, set(), WorkspaceSandbox())
    command = "(sleep 30; echo late > late.txt) & sleep 30; echo late > late2.txt"
    out, alive = _call(ws, "shell", 3.0, command=command, timeout_seconds=60)
    assert out.status == "ok" and "timed out after 2.0s" in out.content, out.content
    assert not alive and not list(tmp_path.iterdir())


SLOW_SECONDS = 1.5


@tool(name="slow_sandboxed", bounds_itself=True)
def slow_sandboxed() -> str:
    """Stands for a sandboxed call whose kill and wait end a little after the deadline."""
    time.sleep(SLOW_SECONDS)
    return "ended"


def test_the_registry_waits_past_the_deadline_for_a_tool_that_bounds_itself_in_a_workspace(tmp_path: Path) -> None:
    ws = TaskWorkspace("task-d", tmp_path, EMPTY, set(), WorkspaceSandbox())
    started = time.monotonic()
    out = ToolRegistry([slow_sandboxed]).execute("slow_sandboxed", {}, _ctx(ws, 0.5), ["slow_sandboxed"])
    assert (out.status, out.content) == ("ok", "ended")
    assert time.monotonic() - started >= SLOW_SECONDS


def test_without_a_workspace_the_registry_still_gives_up_at_the_deadline() -> None:
    """Nothing of the call writes what the engine reads next, and a Lambda executor's deadline is
    its function's end: waiting would hold the engine past it."""
    started = time.monotonic()
    out = ToolRegistry([slow_sandboxed]).execute("slow_sandboxed", {}, _ctx(None, 0.5), ["slow_sandboxed"])
    assert out.status == "timeout"
    assert time.monotonic() - started < SLOW_SECONDS
