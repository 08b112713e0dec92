"""A scripted coding agent in a workspace: clone, fix, test, hand back the diff.

Everything but the model is real: a small git repository served over HTTP on loopback (git's
"dumb" protocol: static files, which Python's own http.server serves), reached from the
agent's ``shell`` only through the worker's egress proxy (the task allows that one host and the
deployment's SSRF guard lets that one loopback address through: ``AGENTQ_HTTP_FETCH_ALLOW``),
``edit_file`` for the fix, the repository's own tests run with ``shell``, and ``git diff`` as
the answer. Each tools step checkpoints the workspace (docs/SANDBOX.md), so a worker killed
in the middle leaves a task that finishes on another worker with the same files.

    .venv/bin/python examples/coding_agent/coding_agent.py      # a local stack, one task, the diff

``tests/test_workspace_kill.py`` runs it with a worker SIGKILLed mid-task.
"""

from __future__ import annotations

import contextlib
import functools
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from agentq.core.models import TaskSubmission

CALC = "def add(a, b):\n    return a - b\n"
TESTS = (
    "import unittest\n\nfrom calc import add\n\n\n"
    "class AddTest(unittest.TestCase):\n"
    "    def test_adds(self):\n"
    "        self.assertEqual(add(2, 3), 5)\n\n\n"
    'if __name__ == "__main__":\n    unittest.main()\n'
)
# The checkout and the test run write no file whose bytes depend on the clock: git's identity
# and dates fixed, no bytecode written. (.git/index caches each file's inode and mtime, so it is
# the one file two checkouts never share byte for byte.)
ENV = (
    "export GIT_AUTHOR_NAME=agent GIT_AUTHOR_EMAIL=agent@example.com GIT_COMMITTER_NAME=agent "
    "GIT_COMMITTER_EMAIL=agent@example.com GIT_AUTHOR_DATE='2026-01-01T00:00:00Z' "
    "GIT_COMMITTER_DATE='2026-01-01T00:00:00Z' PYTHONDONTWRITEBYTECODE=1; "
)


def make_repository(root: Path) -> Path:
    """A bare repository ``root/calc.git`` (one commit: an add() that subtracts, and its test),
    prepared for git's dumb HTTP protocol."""
    work = root / "calc-src"
    work.mkdir(parents=True)
    (work / "calc.py").write_text(CALC)
    (work / "test_calc.py").write_text(TESTS)
    env = {"GIT_AUTHOR_DATE": "2026-01-01T00:00:00Z", "GIT_COMMITTER_DATE": "2026-01-01T00:00:00Z", "HOME": str(root)}
    git = ["git", "-c", "user.name=dev", "-c", "user.email=dev@example.com", "-c", "init.defaultBranch=main"]
    for args in (["init", "-q"], ["add", "."], ["commit", "-qm", "add() and its test"]):
        subprocess.run([*git, *args], cwd=work, check=True, env=env)
    bare = root / "calc.git"
    subprocess.run([*git, "clone", "-q", "--bare", str(work), str(bare)], check=True, env=env)
    subprocess.run(["git", "update-server-info"], cwd=bare, check=True, env=env)
    return bare


class _Quiet(SimpleHTTPRequestHandler):
    def log_message(self, *args: Any) -> None:
        pass


@contextlib.contextmanager
def serve(root: Path) -> Iterator[str]:
    """Serve ``root`` on a free loopback port; yields ``127.0.0.1:<port>``."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_Quiet, directory=str(root)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def turns(host: str, test_pause_seconds: float = 0.0) -> list[dict[str, Any]]:
    """The agent's turns. The test run appends to ``runs.log`` before it pauses, so a worker
    killed during the pause has written a file its step never committed."""
    pause = f" && sleep {test_pause_seconds}" if test_pause_seconds else ""
    return [
        {"text": "Cloning the repository.",
         "tool_calls": [{"name": "shell", "input": {"command": f"{ENV}git clone -q http://{host}/calc.git calc"}}]},
        {"text": "add() subtracts; fixing it.",
         "tool_calls": [{"name": "edit_file", "input": {
             "path": "calc/calc.py", "old_string": "return a - b", "new_string": "return a + b"}}]},
        {"text": "Running the tests.",
         "tool_calls": [{"name": "shell", "input": {
             "command": f"{ENV}echo test-run >> runs.log{pause} && cd calc && python3 -m unittest -v 2>&1",
             "timeout_seconds": 60}}]},
        {"text": "The diff.", "tool_calls": [{"name": "shell", "input": {"command": "cd calc && git diff"}}]},
        {"text": "Fixed add() (it subtracted); the test passes. The diff is the last tool result."},
    ]  # fmt: skip


def submission(host: str, test_pause_seconds: float = 0.0) -> TaskSubmission:
    return TaskSubmission.model_validate(
        {
            "goal": "Clone the calc repository, fix the failing test, and return the diff.",
            "provider": "scripted",
            "script": {"turns": turns(host, test_pause_seconds)},
            "constraints": {"tools": ["shell", "edit_file", "read_file"], "timeout_seconds": 600},
            "workspace": {"allow_hosts": [host]},
        }
    )


def main() -> None:
    from agentq.control.submit import submit
    from agentq.core.models import ToolsStep
    from agentq.runtime import build_registry
    from agentq_dev.stack import LocalStack

    with tempfile.TemporaryDirectory() as tmp:
        make_repository(Path(tmp))
        with (
            serve(Path(tmp)) as host,
            LocalStack(prefix="coding", workers=1, api=False, extra_env={"AGENTQ_HTTP_FETCH_ALLOW": host}) as stack,
        ):
            assert stack.settings is not None
            store = stack.store()
            task = submit(
                store, build_registry(stack.settings), submission(host), tenant="local", queues=stack.queues()
            )
            while not (meta := store.tasks.get(task.task_id)).status.terminal:
                time.sleep(0.2)
            print(f"task {task.task_id}: {meta.status.value}: {meta.result}")
            for record in store.steps.load(task.task_id):
                if isinstance(record.body, ToolsStep):
                    for result in record.body.results:
                        print(f"--- step {record.number} {result.name} ---\n{result.content}")
    sys.exit(0 if meta.status.value == "succeeded" else 1)


if __name__ == "__main__":
    main()
