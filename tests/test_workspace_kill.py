"""The workspace invariant under a real SIGKILL (issue 42's done-criterion): the scripted coding
agent of examples/coding_agent clones a repository served on loopback, fixes a bug, runs its
tests with ``shell`` and returns the diff. Its worker process is SIGKILLed while the test run
is in progress (it has already appended to ``runs.log``, a change its step never commits), and
the task finishes on the other worker with the same files as a run nobody killed: every file
byte for byte with its mode, ``runs.log`` holding one test run, not two."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

from agentq.control.submit import submit
from agentq.core.models import TaskStatus, ToolsStep
from agentq.core.workspace import Manifest
from agentq.core.workspace_restore import restore
from agentq.runtime import build_registry
from agentq_dev.stack import LocalStack

from tests.helpers import wait_for

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples" / "coding_agent"))
import coding_agent  # type: ignore[import-not-found]

# .git/index caches each checked-out file's inode and mtime: the one file two clones never share.
UNSHARED = {"calc/.git/index"}


def _final(store: Any, task_id: str) -> tuple[Manifest, list[str]]:
    meta = store.tasks.get(task_id)
    assert meta.status is TaskStatus.SUCCEEDED, meta.error
    assert meta.workspace is not None
    manifest = Manifest.from_bytes(store.workspaces.get_manifest(task_id, meta.workspace.manifest))
    outputs = [r.content for s in store.steps.load(task_id) if isinstance(s.body, ToolsStep) for r in s.body.results]
    return manifest, outputs


def test_a_coding_agent_killed_mid_test_run_finishes_with_the_files_of_an_unkilled_run(tmp_path: Path) -> None:
    root = tmp_path / "workspaces"
    coding_agent.make_repository(tmp_path / "repo")
    with coding_agent.serve(tmp_path / "repo") as host, LocalStack(
        prefix="wskill", workers=2, api=False, sweep_every=None,
        extra_env={"AGENTQ_HTTP_FETCH_ALLOW": host, "AGENTQ_WORKSPACE_ROOT": str(root)},
    ) as stack:  # fmt: skip
        assert stack.settings is not None
        store, registry, queues = stack.store(), build_registry(stack.settings), stack.queues()

        plain = submit(store, registry, coding_agent.submission(host), tenant="t", queues=queues)
        killed = submit(
            store, registry, coding_agent.submission(host, test_pause_seconds=30), tenant="t", queues=queues
        )

        # Observable event: the test run of the task to kill has appended to runs.log in its
        # worker's directory (a change no committed step holds yet). Then SIGKILL that worker.
        log = wait_for(lambda: next(iter(root.glob(f"*/{killed.task_id}.*/runs.log")), None), 120, "the test run")
        owner = store.tasks.get(killed.task_id).lease_owner or ""
        victim = stack.worker_by_id(owner)
        assert victim is not None and str(victim.pid) in log.parent.parent.name
        os.kill(victim.pid, signal.SIGKILL)
        before = store.tasks.get(killed.task_id).step

        wait_for(lambda: store.tasks.get(plain.task_id).status.terminal, 120, "the unkilled run")
        wait_for(lambda: store.tasks.get(killed.task_id).status.terminal, 180, "the resumed run")

        expected, plain_outputs = _final(store, plain.task_id)
        got, killed_outputs = _final(store, killed.task_id)
        meta = store.tasks.get(killed.task_id)
        assert meta.claim_count == 2 and before < meta.step  # resumed from its last committed step

        # The same files, byte for byte, with their modes (content hashes and modes in the manifest).
        same = {e.path: e for e in expected.entries if e.path not in UNSHARED}
        assert {e.path: e for e in got.entries if e.path not in UNSHARED} == same
        assert "calc/calc.py" in same and same["calc/calc.py"].mode == 0o644
        runs = [e for e in got.entries if e.path == "runs.log"]
        assert runs and runs[0].size == len("test-run\n")  # the killed turn's append is gone: one run

        # The diff handed back is the fix, in both runs; the resumed run's test run passed.
        assert killed_outputs[-1] == plain_outputs[-1] and "+    return a + b" in killed_outputs[-1]
        assert "OK" in killed_outputs[-2]

        # And the committed state restores exactly (the restore checks itself against the manifest).
        target = tmp_path / "restored"
        restore(target, got, lambda digest: store.workspaces.get_blob(killed.task_id, digest))
        assert (target / "calc" / "calc.py").read_text() == "def add(a, b):\n    return a + b\n"
        time.sleep(0)  # nothing to wait for: every wait above is on an observable event
