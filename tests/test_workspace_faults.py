"""What the workspace does when a run, the model or the store does the unexpected (review of issue
42's branch, must-fixes 1 to 5), on moto server's S3 with the real bubblewrap sandbox: two runs of
one task in one process never share a directory; a spawn turn refuses the workspace tools rather
than lose what they wrote; a fork holds every manifest its steps name; a tree deeper than the scan
goes is refused and undone instead of failing the run for ever; every entry counts toward the
quota, and the manifest has a size limit of its own."""

from __future__ import annotations

import contextlib
import hashlib
import os
from pathlib import Path
from typing import Any

import pytest

from agentq.core.engine import Engine, EngineConfig
from agentq.core.engine._session import LeaseState, Session
from agentq.core.engine._workspace import Workspaces
from agentq.core.models import Task, TaskStatus, TaskSubmission, ToolsStep
from agentq.core.tools import default_registry
from agentq.core.workspace import Manifest, WorkspaceQuota
from agentq.storage.container import Storage
from agentq.storage.workspaces import workspace_prefix

from tests.helpers import call, scripted

pytestmark = pytest.mark.skipif(not os.path.exists("/usr/bin/bwrap"), reason="the workspace tools need bubblewrap")


class Fanout:
    """Step Functions' part of a spawn (the children are run by hand)."""

    def start(self, *, parent: Task, spawn_id: str, children: list[Any], max_concurrency: int) -> str:
        return "arn:aws:states:local:000000000000:execution:fanout:1"

    def child_finished(self, task_token: str, task_id: str, status: TaskStatus) -> None:
        raise AssertionError("not reached")


def engine(store: Storage, root: Path, worker: str = "w1", **config: Any) -> Engine:
    return Engine(
        store, worker_id=worker, tools=default_registry(), fanout=Fanout(),
        config=EngineConfig(lease_seconds=30, workspace_root=str(root), **config),
    )  # fmt: skip


def go(runner: Engine, task_id: str) -> TaskStatus | None:
    return runner.run(task_id, keeper=lambda _: contextlib.nullcontext()).status


def run(store: Storage, submission: TaskSubmission, root: Path, **config: Any) -> str:
    task = store.tasks.create(submission, tenant="t")
    go(engine(store, root, **config), task.task_id)
    return task.task_id


def tools_steps(store: Storage, task_id: str) -> list[ToolsStep]:
    return [s.body for s in store.steps.load(task_id) if isinstance(s.body, ToolsStep)]


def files_of(store: Storage, task_id: str, digest: str) -> dict[str, bytes]:
    manifest = Manifest.from_bytes(store.workspaces.get_manifest(task_id, digest))
    return {e.path: store.workspaces.get_blob(task_id, e.digest) for e in manifest.entries if e.kind == "f"}


def leftovers(root: Path) -> list[Path]:
    return [p for worker in root.iterdir() for p in worker.iterdir()] if root.exists() else []


# 1. A run that lost its lease (a zombie) and the run that took the task over, in one process.


def test_two_runs_of_one_task_in_one_process_never_share_a_directory(store: Storage, tmp_path: Path) -> None:
    task = store.tasks.create(scripted([{"text": "done"}], tools=["shell"]), tenant="t")
    claimed = store.tasks.claim(task.task_id, "w1", 30)
    assert claimed is not None
    lease, held = claimed

    def session() -> Session:
        return Session(held=LeaseState(lease=lease, tenant="t"), task=held, steps=[], messages=[], deadline=None)

    workspaces = Workspaces(store.workspaces, worker_id="w1", root=str(tmp_path / "root"), quota=WorkspaceQuota())
    zombie, taker = session(), session()
    workspaces.open(zombie)
    workspaces.open(taker)
    assert zombie.workspace.directory != taker.workspace.directory
    assert zombie.workspace.shell("echo x >> z.log", 10).exit_code == 0
    assert workspaces.checkpoint(taker) is None  # nothing the zombie wrote is the taker's to commit
    assert taker.workspace.shell("echo y >> z.log", 10).exit_code == 0
    workspaces.close(zombie)  # removes the zombie's directory, and only that
    ref = workspaces.checkpoint(taker)
    assert ref is not None and files_of(store, task.task_id, ref.manifest) == {"z.log": b"y\n"}
    assert taker.workspace.shell("cat z.log", 10).stdout == "y\n"
    workspaces.close(taker)
    assert leftovers(tmp_path / "root") == []


# 2. A spawn turn parks before any checkpoint: its workspace calls are refused, not lost.


@pytest.mark.parametrize(
    "write",
    [call("write_file", path="plan.md", content="the plan\n"), call("shell", command="echo 'the plan' > plan.md")],
    ids=["write_file", "shell"],
)
def test_a_workspace_call_in_a_spawn_turn_is_refused_so_no_step_reports_a_write_that_is_lost(
    store: Storage, tmp_path: Path, write: dict[str, Any]
) -> None:
    child = {"goal": "helper", "tools": [], "script": {"turns": [{"text": "helped"}]}}
    turns = [
        {"text": "split", "tool_calls": [write, call("spawn_subagents", subagents=[child])]},
        {"text": "read", "tool_calls": [call("read_file", path="plan.md")]},
        {"text": "done"},
    ]
    submission = scripted(turns, tools=["spawn_subagents", "write_file", "shell", "read_file"])
    root = store.tasks.create(submission, tenant="t")
    assert go(engine(store, tmp_path / "r1"), root.task_id) is TaskStatus.WAITING
    spawn = store.steps.load(root.task_id)[-1].body.tool_uses()[1]["id"]  # type: ignore[union-attr]
    record = store.spawns.get(root.task_id, spawn)
    assert record is not None
    for child_id in record.children:
        go(engine(store, tmp_path / "c", "w3"), child_id)
    store.spawns.mark(root.task_id, record.spawn_id, woken=True)
    store.tasks.transition(root.task_id, TaskStatus.QUEUED)
    assert go(engine(store, tmp_path / "r2", "w2"), root.task_id) is TaskStatus.SUCCEEDED

    split, read = tools_steps(store, root.task_id)
    written = split.results[0]
    assert written.is_error and "do not run in a turn that calls spawn_subagents" in written.content
    assert not split.results[1].is_error  # the spawn itself ran
    assert read.results[0].is_error  # consistent: the write was reported refused, and is not there


# 3. A fork holds every manifest its copied steps name.


def test_a_fork_of_a_fork_at_any_step_restores_that_steps_files_after_the_source_is_purged(
    store: Storage, tmp_path: Path
) -> None:
    versions = [f"version {i}\n" for i in range(1, 4)]
    turns: list[dict[str, Any]] = [
        {"text": f"v{i}", "tool_calls": [call("write_file", path="notes.md", content=v)]}
        for i, v in enumerate(versions)
    ]
    source_id = run(store, scripted([*turns, {"text": "done"}], tools=["write_file", "read_file"]), tmp_path / "s")
    source = store.tasks.get(source_id)
    reader = scripted([{"text": "(copied)"}] * 7 + [{"text": "read", "tool_calls": [call("read_file", path="notes.md")]},
                      {"text": "ok"}], tools=["write_file", "read_file"])  # fmt: skip
    fork = store.tasks.fork(source, reader, store.steps.load(source_id)[:6], tenant="t")  # all three versions
    store.payloads.delete_prefix(workspace_prefix(source_id))  # the source's retention ran
    for upto, expected in [(2, versions[0]), (4, versions[1])]:  # the fork of the fork, at each tools step
        steps = store.steps.load(fork.task_id)[:upto]
        again = store.tasks.fork(store.tasks.get(fork.task_id), reader, steps, tenant="t")
        assert again.workspace is not None
        assert files_of(store, again.task_id, again.workspace.manifest) == {"notes.md": expected.encode()}
        for step in tools_steps(store, again.task_id):  # every manifest a copied step names is the fork's
            assert step.workspace is not None
            files_of(store, again.task_id, step.workspace.manifest)


# 4. What the model may do to the tree does not make the scan or the cleanup fail the run.


def test_a_tree_deeper_than_the_scan_goes_is_refused_and_undone_and_the_task_goes_on(
    store: Storage, tmp_path: Path
) -> None:
    deep = (
        "python3 -c \"import os\nfor _ in range(1100): os.mkdir('d'); os.chdir('d')\nopen('bottom', 'w').write('x')\""
    )
    turns = [
        {"text": "keep", "tool_calls": [call("write_file", path="kept.txt", content="kept\n")]},
        {"text": "deep", "tool_calls": [call("shell", command=deep)]},
        {"text": "look", "tool_calls": [call("list_files")]},
        {"text": "done"},
    ]
    task_id = run(store, scripted(turns, tools=["write_file", "shell", "list_files"]), tmp_path / "root")
    assert store.tasks.get(task_id).status is TaskStatus.SUCCEEDED
    _, refused, look = tools_steps(store, task_id)
    assert refused.results[0].is_error and "directories deep" in refused.results[0].content
    assert refused.workspace is None
    assert look.results[0].content.splitlines() == ["kept.txt  5 bytes"]
    assert leftovers(tmp_path / "root") == []  # the run's end removed the 1,100-deep tree too


@pytest.mark.parametrize(
    ("command", "named"),
    [("printf x > \"$(printf 'bad\\377name')\"", "name 'bad\\xffname'"),
     ("ln -s \"$(printf 'to\\376')\" link", "link target of 'link' 'to\\xfe'")],
    ids=["name", "link_target"],
)  # fmt: skip
def test_a_name_or_link_target_that_is_not_utf8_is_refused_naming_it_and_undone_and_the_task_goes_on(
    store: Storage, tmp_path: Path, command: str, named: str
) -> None:
    turns = [
        {"text": "keep", "tool_calls": [call("write_file", path="kept.txt", content="kept\n")]},
        {"text": "bad", "tool_calls": [call("shell", command=command)]},
        {"text": "look", "tool_calls": [call("list_files")]},
        {"text": "done"},
    ]
    task_id = run(store, scripted(turns, tools=["write_file", "shell", "list_files"]), tmp_path / "root")
    task = store.tasks.get(task_id)
    assert task.status is TaskStatus.SUCCEEDED, task.error  # was: failed processing_failed UnicodeEncodeError
    _, refused, look = tools_steps(store, task_id)
    assert refused.results[0].is_error and f"the {named} is not UTF-8" in refused.results[0].content
    assert refused.workspace is None
    assert look.results[0].content.splitlines() == ["kept.txt  5 bytes"]


# 5. The quota counts every entry, and the manifest has a size limit.


@pytest.mark.parametrize(
    ("command", "quota", "needle"),
    [
        ("mkdir d1 d2 d3 d4 d5 d6", WorkspaceQuota(max_files=5), "5 entries"),
        ("for i in 1 2 3 4 5 6; do ln -s nowhere l$i; done", WorkspaceQuota(max_files=5), "5 entries"),
        ("mkfifo p1 p2 p3 p4 p5 p6", WorkspaceQuota(max_files=5), "5 entries"),
        (
            "for i in 1 2 3 4; do ln -s $(python3 -c \"print('x' * 4000)\") l$i; done",
            WorkspaceQuota(max_manifest_bytes=10_000),
            "10000 bytes of manifest",
        ),
    ],
    ids=["directories", "links", "fifos", "long_link_targets"],
)
def test_every_entry_counts_toward_the_quota_and_the_manifest_has_a_size_limit(
    store: Storage, tmp_path: Path, command: str, quota: WorkspaceQuota, needle: str
) -> None:
    turns = [
        {"text": "fill", "tool_calls": [call("shell", command=command)]},
        {"text": "look", "tool_calls": [call("shell", command="ls -A | wc -l")]},
        {"text": "done"},
    ]
    task_id = run(store, scripted(turns, tools=["shell"]), tmp_path / "root", workspace_quota=quota)
    fill, look = tools_steps(store, task_id)
    assert fill.results[0].is_error and needle in fill.results[0].content, fill.results[0].content
    assert fill.workspace is None and "--- stdout ---\n0\n" in look.results[0].content  # undone


def test_content_is_stored_create_only_so_an_object_under_a_hash_is_never_replaced(store: Storage) -> None:
    task = store.tasks.create(scripted([{"text": "done"}]), tenant="t")
    digest = hashlib.sha256(b"right").hexdigest()
    assert store.workspaces.put_blob(task.task_id, digest, b"right") is True
    assert store.workspaces.put_blob(task.task_id, digest, b"wrong") is False
    assert store.workspaces.get_blob(task.task_id, digest) == b"right"
