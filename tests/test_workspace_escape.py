"""The workspace tools attacked: every bad input of issue 42, through the real tools, in the real
sandbox (bubblewrap with the task's directory bound at /workspace). Each probe gets a precise
tool error, and the outside is checked: the planted file outside the workspace is unchanged,
the other task's workspace unread, the listener saw no connection, no process outlived its call.
"""

from __future__ import annotations

import os
import socket
import subprocess
import threading
from pathlib import Path

import pytest

from agentq.core.engine._workspace import TaskWorkspace
from agentq.core.tools import ToolContext, ToolExecution, default_registry, idempotency_key_for
from agentq.core.workspace import EMPTY, WORKSPACE_TOOLS
from agentq.sandbox.workspace import WorkspaceLimits, WorkspaceSandbox

pytestmark = pytest.mark.skipif(not os.path.exists("/usr/bin/bwrap"), reason="the workspace tools need bubblewrap")
SECRET = "WORKERSECRET-ws-91d2"
ALL = [*WORKSPACE_TOOLS, "python_exec"]


@pytest.fixture
def ws(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> TaskWorkspace:
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)
    directory = tmp_path / "root" / "task-a"
    directory.mkdir(parents=True)
    other = tmp_path / "root" / "task-b"
    other.mkdir()
    (other / "secret.txt").write_text(SECRET)
    (tmp_path / "outside.txt").write_text("untouched")
    limits = WorkspaceLimits(max_file_bytes=1024 * 1024, max_read_bytes=64 * 1024)
    return TaskWorkspace("task-a", directory, EMPTY, set(), WorkspaceSandbox(limits))


def call(ws: TaskWorkspace, name: str, **raw: object) -> ToolExecution:
    ctx = ToolContext("task-a", "toolu_1", idempotency_key_for("task-a", "toolu_1"), workspace=ws)
    return default_registry().execute(name, dict(raw), ctx, ALL)


def sh(ws: TaskWorkspace, command: str, timeout: float = 20) -> str:
    out = call(ws, "shell", command=command, timeout_seconds=timeout)
    assert out.status == "ok", out.content
    return out.content


@pytest.mark.parametrize(
    ("path", "why"),
    [
        ("../task-b/secret.txt", "leaves the workspace"),
        ("sub/../../x", "leaves the workspace"),
        ("/etc/passwd", "outside the workspace"),
        ("/proc/self/environ", "outside the workspace"),
        ("/proc/1/environ", "outside the workspace"),
        ("/dev/zero", "outside the workspace"),
        ("/workspace/../etc/passwd", "outside the workspace"),
    ],
)
def test_a_path_out_of_the_workspace_is_refused_by_every_file_tool(ws: TaskWorkspace, path: str, why: str) -> None:
    for name, extra in (("read_file", {}), ("write_file", {"content": "x"}),
                        ("edit_file", {"old_string": "a", "new_string": "b"}), ("list_files", {}),
                        ("search_files", {"pattern": "x"})):  # fmt: skip
        out = call(ws, name, path=path, **extra)
        assert out.is_error and why in out.content, (name, out.content)
    assert not any(ws.directory.iterdir())


def test_a_symlink_out_is_refused_and_nothing_outside_is_read_or_written(ws: TaskWorkspace, tmp_path: Path) -> None:
    outside = tmp_path / "outside.txt"
    sh(ws, f"ln -s {outside} host && ln -s /etc/passwd pw && ln -s /proc/1/environ env && ln -s /dev/zero z "
           "&& ln -s .. up && ln -s / root")  # fmt: skip
    for path in ("host", "pw", "env", "z", "up/task-b/secret.txt", "root/etc/hostname"):
        read = call(ws, "read_file", path=path)
        assert read.is_error and ("symbolic link" in read.content or "No such file" in read.content), read.content
        wrote = call(ws, "write_file", path=path, content="planted")
        assert wrote.is_error, wrote.content
    assert outside.read_text() == "untouched"
    assert call(ws, "search_files", pattern=SECRET, path="up").is_error


def test_a_hard_link_to_a_file_outside_cannot_be_made(ws: TaskWorkspace) -> None:
    out = sh(ws, "ln /etc/passwd hl; ln /usr/bin/env hl2; ls")
    assert "Invalid cross-device link" in out
    assert out.split("--- stdout ---\n")[1].startswith("\n--- stderr")  # ls: nothing was made
    assert not any(ws.directory.iterdir())


def test_devices_fifos_binary_and_oversized_files_are_refused_with_the_reason(ws: TaskWorkspace) -> None:
    out = sh(ws, "mknod dev c 1 5; mkfifo fifo; head -c 70000 /dev/zero | tr '\\0' a > big.txt; "
                 "printf 'a\\0b' > bin.dat; printf '\\xff\\xfe' > latin.txt")  # fmt: skip
    assert "Operation not permitted" in out  # no device can be made
    assert "not a regular file" in call(ws, "read_file", path="fifo").content  # and no hang
    assert "binary file" in call(ws, "read_file", path="bin.dat").content
    assert "not UTF-8 text" in call(ws, "read_file", path="latin.txt").content
    assert "over the 65536-byte limit" in call(ws, "read_file", path="big.txt").content
    assert "over the" in call(ws, "write_file", path="w.txt", content="x" * (1024 * 1024 + 1)).content
    shell_big = sh(ws, "head -c 2000000 /dev/zero > huge; echo rc=$?; ls -l huge")
    assert "File size limit exceeded" in shell_big or "rc=153" in shell_big or "rc=1" in shell_big


def test_the_shell_sees_no_credentials_no_other_workspace_and_no_host_files(ws: TaskWorkspace, tmp_path: Path) -> None:
    out = sh(
        ws,
        f"env; cat /proc/1/environ /proc/self/environ | tr '\\0' '\\n'; ls / /run; "
        f"ls {tmp_path} 2>&1; ls /workspace/.. ; grep -rs {SECRET} /workspace /tmp /run /home /root; echo end",
    )
    assert SECRET not in out
    assert "task-b" not in out and "outside.txt" not in out
    assert "No such file or directory" in out


def test_the_shell_has_no_network_and_the_listener_sees_nothing(ws: TaskWorkspace) -> None:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    listener.settimeout(0.5)
    port = listener.getsockname()[1]
    out = sh(ws, f"curl -sS -m 3 http://127.0.0.1:{port}/ ; curl -sS -m 3 http://169.254.169.254/ ; "
                 f"python3 -c \"import socket; socket.create_connection(('10.0.0.1', 80), 2)\" ; "
                 f"python3 -c \"import socket; socket.socket(socket.AF_PACKET, socket.SOCK_RAW)\"; echo end")  # fmt: skip
    assert "Couldn't connect" in out or "Failed to connect" in out
    assert "Network is unreachable" in out and "Operation not permitted" in out
    with pytest.raises(TimeoutError):
        listener.accept()


def test_the_shell_cannot_trace_unshare_or_mount(ws: TaskWorkspace) -> None:
    out = sh(ws, "unshare -U true; echo unshare=$?; mount -t tmpfs x /workspace; echo mount=$?; "
                 "python3 -c \"import ctypes; print('ptrace', ctypes.CDLL(None).ptrace(16, 1, 0, 0))\"; "
                 "touch /usr/x /etc/x /x; echo end")  # fmt: skip
    assert ("unshare=1" in out and "mount=32" in out) or "mount=1" in out
    assert "ptrace -1" in out and "Read-only file system" in out


def test_no_process_outlives_the_call_that_started_it(ws: TaskWorkspace) -> None:
    marker = "31337.25"
    sh(
        ws,
        f"sleep {marker} & setsid nohup sleep {marker} > /dev/null 2>&1 & (trap '' TERM HUP; sleep {marker}) & echo started",
    )
    alive = subprocess.run(["pgrep", "-f", f"sleep {marker}"], check=False, capture_output=True, text=True).stdout
    assert alive == ""
    out = call(ws, "shell", command=f"sleep {marker}", timeout_seconds=1)
    assert "timed out" in out.content
    assert subprocess.run(["pgrep", "-f", f"sleep {marker}"], check=False, capture_output=True, text=True).stdout == ""


def test_python_exec_runs_in_the_workspace_and_its_files_stay(ws: TaskWorkspace) -> None:
    out = call(ws, "python_exec", code="open('made.txt', 'w').write('kept'); import os; print(os.getcwd())")
    assert out.status == "ok" and "/workspace" in out.content
    assert (ws.directory / "made.txt").read_text() == "kept"
    assert not (ws.directory / "main.py").exists()  # the runner's copy of the script stays off the workspace


def test_concurrent_calls_of_two_tasks_never_see_each_other(ws: TaskWorkspace, tmp_path: Path) -> None:
    other_dir = tmp_path / "root" / "task-b"
    other = TaskWorkspace("task-b", other_dir, EMPTY, set(), ws.sandbox)
    seen: dict[str, str] = {}

    def look(w: TaskWorkspace) -> None:
        seen[w.task_id] = w.shell("echo mine > own.txt; ls -a; sleep 0.3; ls -a", 10).stdout

    threads = [threading.Thread(target=look, args=(w,)) for w in (ws, other)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert seen["task-a"].split() == [".", "..", "own.txt"] * 2
    assert seen["task-b"].split() == [".", "..", "own.txt", "secret.txt"] * 2
    assert (ws.directory / "own.txt").exists() and (other_dir / "own.txt").exists()
    assert not (ws.directory / "secret.txt").exists()
