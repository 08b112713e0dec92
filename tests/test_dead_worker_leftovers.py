"""What a SIGKILLed worker leaves on its host is removed by the next process, never what a live
one holds: its workspace directories (``<root>/<worker>-<pid>/``, ``core.engine._workspace``)
and its egress proxies' socket directories (``agentq-egress-<pid>-*``, ``core.tools.egress``).
Before, each kill left a whole workspace behind (bench/workspace_chaos.py found it)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from agentq.core.engine._workspace import sweep_dead
from agentq.core.tools import egress

# A process that makes what a worker makes (a workspace directory with a file, an egress proxy's
# directory with its socket), says where, and waits to be killed.
LEFTOVERS = textwrap.dedent(
    """
    import os, sys, tempfile, time
    from pathlib import Path
    from agentq.core.tools.egress import EgressProxy
    from agentq.core.tools.fetch import FetchPolicy
    root = Path(sys.argv[1])
    base = root / f"worker_1-{os.getpid()}"
    base.mkdir(parents=True)
    work = Path(tempfile.mkdtemp(prefix="t1.", dir=base))
    (work / "src").mkdir()
    (work / "src" / "app.py").write_text("print(1)")
    os.chmod(work / "src", 0o000)  # what an agent may leave: the sweep must still remove it
    proxy = EgressProxy([], FetchPolicy(), max_connections=1)
    print(base, os.path.dirname(proxy.path), flush=True)
    time.sleep(600)
    """
)


@pytest.fixture
def tmp(tmp_path: Path) -> Iterator[Path]:
    """A short temporary directory of the test's own: a Unix socket's path must stay under 108
    bytes, which pytest's per-test directories pass under xdist."""
    made = Path(tempfile.mkdtemp(prefix="aq-"))
    yield made
    shutil.rmtree(made, ignore_errors=True)


def _killed_leftovers(root: Path, tmp: Path) -> tuple[Path, Path]:
    env = {**os.environ, "TMPDIR": str(tmp)}
    child = subprocess.Popen(
        [sys.executable, "-c", LEFTOVERS, str(root)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )
    assert child.stdout is not None
    line = child.stdout.readline().split()  # the observable event: both made
    if len(line) != 2:
        child.kill()
        raise AssertionError(f"the leftovers process failed: {child.communicate(timeout=30)[1]}")
    child.send_signal(signal.SIGKILL)
    child.wait(timeout=30)
    return Path(line[0]), Path(line[1])


def test_a_killed_workers_workspace_and_socket_directories_are_swept_and_a_live_ones_kept(
    tmp_path: Path, tmp: Path
) -> None:
    root = tmp_path / "workspaces"
    dead_base, dead_socket_dir = _killed_leftovers(root, tmp)
    assert dead_base.exists() and dead_socket_dir.exists()
    live_base = root / f"worker_2-{os.getpid()}"  # this process: alive
    (live_base / "t2.abc").mkdir(parents=True)
    live_socket_dir = tmp / f"{egress.SOCKET_PREFIX}{os.getpid()}-xyz"
    live_socket_dir.mkdir()
    not_ours = root / "notes"
    not_ours.mkdir()

    assert sweep_dead(root) == [dead_base]
    assert egress.sweep_dead(str(tmp)) == [str(dead_socket_dir)]

    assert not dead_base.exists() and not dead_socket_dir.exists()
    assert (live_base / "t2.abc").is_dir() and live_socket_dir.is_dir() and not_ours.is_dir()


def test_a_link_named_like_a_dead_workers_directory_is_not_followed(tmp_path: Path, tmp: Path) -> None:
    """The sweep opens every component without following links: a link planted under the root
    with a dead pid's name removes nothing where it points."""
    root, elsewhere = tmp_path / "workspaces", tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "keep.txt").write_text("precious")
    dead_base, _ = _killed_leftovers(root, tmp)
    dead_pid = dead_base.name.rsplit("-", 1)[1]
    (root / f"planted-{dead_pid}").symlink_to(elsewhere, target_is_directory=True)

    assert sweep_dead(root) == [dead_base]
    assert (elsewhere / "keep.txt").read_text() == "precious"


def test_a_process_sweeps_the_dead_ones_before_its_first_workspace_directory(tmp_path: Path, tmp: Path) -> None:
    """Where the sweep runs: the first claim directory a worker process makes."""
    from agentq.core.engine._workspace import Workspaces
    from agentq.core.workspace import WorkspaceQuota
    from agentq.storage.container import memory_storage

    root = tmp_path / "workspaces"
    dead_base, _ = _killed_leftovers(root, tmp)
    workspaces = Workspaces(memory_storage().workspaces, worker_id="w3", root=str(root), quota=WorkspaceQuota())
    made = workspaces._directory("t3")
    assert not dead_base.exists() and made.is_dir() and made.parent.name == f"w3-{os.getpid()}"
