"""A worker running as root never runs model-written code as root: it starts bubblewrap as uid
65534 (``sandbox.stage``), so the sandbox is that uid outside its user namespace too, not root
without capabilities. Checked from the host, with the real bubblewrap: the uid of every process
of a call, the owner of what the code writes, a root-only file it is shown, the process limit the
kernel then holds it to, the files the worker restores for it, and a refusal that says why on a
host where that uid may not make user namespaces. These need a root worker (CI and ``make demo``
are one); a worker that is not root runs bwrap as itself, as before.
"""

from __future__ import annotations

import hashlib
import os
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import pytest

from agentq.core.tools import ToolContext, default_registry, idempotency_key_for
from agentq.core.workspace import Entry, Manifest
from agentq.core.workspace_disk import scan
from agentq.core.workspace_restore import restore
from agentq.sandbox import bwrap
from agentq.sandbox.workspace import WorkspaceLimits, WorkspaceSandbox

pytestmark = [
    pytest.mark.skipif(not os.path.exists("/usr/bin/bwrap"), reason="the sandbox needs bubblewrap"),
    pytest.mark.skipif(os.geteuid() != 0, reason="what a root worker does: needs root"),
]
T = TypeVar("T")
NOBODY = ["65534"] * 4  # real, effective, saved and filesystem ids, as /proc/<pid>/status lists them


def _ids(pid: int) -> dict[str, list[str]]:
    with open(f"/proc/{pid}/status", encoding="utf-8") as f:
        lines = dict(line.split(":", 1) for line in f.read().splitlines() if ":" in line)
    return {key: lines[key].split() for key in ("Uid", "Gid", "PPid", "NSpid")}


def _sandboxed_and_their_ancestors() -> dict[int, dict[str, list[str]]]:
    """Every live process in a PID namespace below this one that descends from this process, and
    each process between it and this one (bwrap's init, bwrap itself), with its ids as the host
    sees them."""
    me = os.getpid()
    found: dict[int, dict[str, list[str]]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            ids = _ids(int(entry))
            chain = {int(entry): ids}
            while int(ids["PPid"][0]) not in (me, 0, 1):
                pid = int(ids["PPid"][0])
                ids = chain[pid] = _ids(pid)
        except (OSError, KeyError):
            continue
        if int(ids["PPid"][0]) == me and len(chain[int(entry)]["NSpid"]) > 1:
            found |= chain
    return found


def _watch(call: Callable[[], T]) -> tuple[T, dict[int, dict[str, list[str]]]]:
    """Run ``call`` in a thread; the processes of its sandbox, sampled while it runs."""
    done: list[T] = []
    thread = threading.Thread(target=lambda: done.append(call()))
    thread.start()
    seen: dict[int, dict[str, list[str]]] = {}
    while thread.is_alive():
        seen |= _sandboxed_and_their_ancestors()
        time.sleep(0.02)
    thread.join()
    return done[0], seen


def _snapshot(root: Path) -> dict[str, tuple[int, int, int, bytes]]:
    """Every entry under ``root``: owner, group, mode and (a file's) content."""
    out = {}
    for path in sorted(root.rglob("*")):
        st = path.lstat()
        out[str(path.relative_to(root))] = (
            st.st_uid,
            st.st_gid,
            st.st_mode,
            path.read_bytes() if path.is_file() else b"",
        )
    return out


def test_every_process_of_a_root_workers_sandbox_is_uid_65534_on_the_host(tmp_path: Path) -> None:
    """bwrap itself, its init and the command, as /proc of the host shows them while the call
    runs: none is root (they were all uid 0 when a root worker started bwrap as root)."""
    directory = tmp_path / "ws"
    directory.mkdir()
    result, seen = _watch(lambda: WorkspaceSandbox().shell(directory, "id -u > inside; id -G; sleep 2", 30))
    assert result.exit_code == 0, result.stderr
    assert result.stdout.split() == ["65534"]  # no supplementary group but its own
    assert len(seen) >= 3, seen  # bwrap, its init in the namespace, the command (and sleep)
    assert {pid: ids["Uid"] for pid, ids in seen.items() if ids["Uid"] != NOBODY} == {}, seen
    assert {pid: ids["Gid"] for pid, ids in seen.items() if ids["Gid"] != NOBODY} == {}, seen
    assert (directory / "inside").read_text() == "65534\n"
    assert (os.stat(directory / "inside").st_uid, os.stat(directory / "inside").st_gid) == (65534, 65534)


def test_python_exec_under_a_root_worker_is_uid_65534_on_the_host_and_so_are_its_files(tmp_path: Path) -> None:
    """python_exec on its own (a tmpfs, no workspace) and in a workspace: the runner's process is
    65534 outside, and a file it writes in the workspace belongs to 65534, not to root."""
    ctx = ToolContext("task-uid", "toolu_1", idempotency_key_for("task-uid", "toolu_1"))
    code = "import os, time\nprint(os.getuid(), os.getgid())\ntime.sleep(2)"
    raw = {"code": code, "timeout_seconds": 20, "memory_mb": 256}
    result, seen = _watch(lambda: default_registry().execute("python_exec", raw, ctx, ["python_exec"]))
    assert "65534 65534" in result.content, result.content
    assert seen and all(ids["Uid"] == NOBODY for ids in seen.values()), seen
    directory = tmp_path / "ws"
    directory.mkdir()
    written = WorkspaceSandbox().python(directory, "open('made.txt', 'w').write('x')", 20, 256)
    assert written.exit_code == 0, written.stderr
    made = os.stat(directory / "made.txt")
    assert (made.st_uid, made.st_gid) == (65534, 65534)


def test_a_root_only_file_shown_to_a_root_workers_sandbox_stays_unread_and_unwritten(tmp_path: Path) -> None:
    """Files only root may read or write, in a root-owned directory of the bound workspace: every
    write, removal, creation and mode change is refused, and the host finds each unchanged. (When
    bwrap ran as root, the code was root outside and did all of it.)"""
    directory = tmp_path / "ws"
    protected = directory / "protected"
    protected.mkdir(parents=True)
    protected.chmod(0o755)
    (protected / "root-only").write_text("root's\n")
    (protected / "root-only").chmod(0o600)
    (protected / "root-readable").write_text("root's\n")
    (protected / "root-readable").chmod(0o644)
    before = _snapshot(directory)
    command = (
        "echo pwned > protected/root-only; echo pwned >> protected/root-readable; cat protected/root-only; "
        "chmod 666 protected/root-readable; rm -f protected/root-readable; touch protected/new; "
        "ln protected/root-readable hard; echo end"
    )
    result = WorkspaceSandbox().shell(directory, command, 30)
    assert result.stdout == "end\n", result.stdout
    assert result.stderr.count("Permission denied") >= 4 and "Operation not permitted" in result.stderr, result.stderr
    assert _snapshot(directory) == before
    assert os.stat(directory).st_uid == 65534  # the workspace itself is the sandbox's, what root put in it is not


def test_a_root_workers_shell_is_held_to_its_process_limit(tmp_path: Path) -> None:
    """RLIMIT_NPROC counts the processes of the uid outside the namespace and the kernel spares
    root: under bwrap started as root, 300 processes ran under a limit of 64. As 65534 the limit
    holds: the fork past it fails."""
    directory = tmp_path / "ws"
    directory.mkdir()
    forks = (
        "import os, time\nn = 0\nfor _ in range(300):\n    try:\n        pid = os.fork()\n"
        "    except BlockingIOError:\n        break\n    if pid == 0:\n        time.sleep(20)\n        os._exit(0)\n"
        '    n += 1\nprint("forked", n)'
    )
    sandbox = WorkspaceSandbox(WorkspaceLimits(max_processes=64))
    result = sandbox.shell(directory, f"python3 -c '{forks}'", 60)
    assert result.exit_code == 0, result.stderr
    forked = int(result.stdout.split()[-1])
    assert 48 < forked < 64, result.stdout


def test_a_restored_workspace_belongs_to_the_sandbox_which_changes_and_hides_what_the_worker_still_scans(
    tmp_path: Path,
) -> None:
    """What the worker restores (as root, as ``Workspaces.open`` does, with ``outside_owner()``)
    is 65534's, links included: the code changes a file and adds one in a directory it was given,
    then makes a file and a directory unreadable (chmod 000); the worker's scan still reads every
    byte and leaves the modes as the code set them."""
    data = b"print('hello')\n"
    digest = hashlib.sha256(data).hexdigest()
    manifest = Manifest(
        (
            Entry("link", "l", 0o777, 0, "src/app.py"),
            Entry("src", "d", 0o755),
            Entry("src/app.py", "f", 0o644, len(data), digest),
        )
    )
    directory = tmp_path / "ws"
    owner = bwrap.outside_owner()
    assert owner == (65534, 65534)
    restore(directory, manifest, {digest: data}.__getitem__, owner=owner)
    for path in (directory, directory / "src", directory / "src" / "app.py", directory / "link"):
        st = path.lstat()
        assert (st.st_uid, st.st_gid) == owner, path
    command = "echo '# edited' >> src/app.py && echo new > src/new.py && chmod 000 src/app.py src && echo ok"
    result = WorkspaceSandbox().shell(directory, command, 30)
    assert result.stdout == "ok\n", result.stderr
    found = {e.path: e for e in scan(directory).entries}
    assert found["src/app.py"].digest == hashlib.sha256(data + b"# edited\n").hexdigest()
    assert found["src/new.py"].size == 4 and found["src"].mode == 0 and found["src/app.py"].mode == 0
    assert stat.S_IMODE(os.lstat(directory / "src").st_mode) == 0


# A root worker in a user namespace that maps uids 0-65535 to the host's and forbids making
# user namespaces in it (user.max_user_namespaces 0, a setting per namespace): the model of a
# host that lets no uid but root make one, without changing this host.
NO_USERNS = r"""
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
ready_r, ready_w = os.pipe()
go_r, go_w = os.pipe()
pid = os.fork()
if pid == 0:
    os.close(ready_r)
    os.close(go_w)
    if libc.unshare(0x10000000) != 0:  # CLONE_NEWUSER
        os._exit(90)
    os.write(ready_w, b"u")
    os.read(go_r, 1)
    with open("/proc/sys/user/max_user_namespaces", "w") as f:
        f.write("0")
    os.execv(sys.executable, [sys.executable, "-c", sys.argv[1]])
os.close(ready_w)
os.close(go_r)
assert os.read(ready_r, 1) == b"u"
for name in ("uid_map", "gid_map"):
    with open(f"/proc/{pid}/{name}", "w") as f:
        f.write("0 0 65536\n")
os.write(go_w, b"m")
_, status = os.waitpid(pid, 0)
sys.exit(os.waitstatus_to_exitcode(status))
"""


def test_a_root_worker_whose_host_refuses_user_namespaces_to_uid_65534_runs_nothing_and_says_why(
    tmp_path: Path,
) -> None:
    marker = tmp_path / "ran"
    code = f"open({str(marker)!r}, 'w')"
    script = (
        "from agentq.core.tools import default_registry, ToolContext\n"
        f"print(default_registry().execute('python_exec', {{'code': {code!r}}}, ToolContext('t', 'u', 'k'), "
        "['python_exec']).content)\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.run(
        [sys.executable, "-c", NO_USERNS, script], capture_output=True, text=True, timeout=60, check=False, env=env
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(
        "ToolError: SandboxUnavailable: bubblewrap could not set up the sandbox, so nothing ran: bwrap: "
        "Creating new namespace failed"
    ), proc.stdout
    assert "bubblewrap runs as uid 65534, gid 65534, which must be allowed to create user namespaces" in proc.stdout
    assert "never run as root instead; this host refuses it: user.max_user_namespaces is 0]" in proc.stdout
    assert not marker.exists()
