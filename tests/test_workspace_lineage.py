"""A workspace across a conversation and down a sub-agent tree (core/fanout.py parent_workspace,
core/engine/_workspace.py child_changes, storage/workspaces.py lookup).

- A follow-up continues in the same workspace: the answered task's files are there for the next
  exchange, on another worker (another directory), byte for byte.
- A sub-agent spawned with ``workspace: "parent"`` starts from the parent's workspace as of the
  spawn, its content shared (looked up under the parent, never copied under the child); its
  changes reach the parent only as ``workspace_changes`` in the spawn result: the parent's files
  stay as the parent left them until the parent's own step applies what it wants. A child
  spawned before the parent's first change (none, or inline, starting files) reports its changes
  from the parent's start.

The sub-agent tests run on the local stack: the real fan-out machine (moto's Step Functions) and
worker processes."""

from __future__ import annotations

import base64
import json
import os
import time
from pathlib import Path
from typing import Any

import pytest

from agentq.control.conversations import send_message
from agentq.control.submit import submit
from agentq.core.engine import Engine, EngineConfig
from agentq.core.models import Task, TaskStatus, ToolsStep
from agentq.core.workspace import Manifest, lookup_of
from agentq.runtime import build_registry
from agentq.storage.container import Storage
from agentq_dev.stack import LocalStack

from tests.helpers import call, scripted

pytestmark = pytest.mark.skipif(not os.path.exists("/usr/bin/bwrap"), reason="the workspace tools need bubblewrap")


class _Queues:
    def __init__(self) -> None:
        self.sent: list[str] = []

    def send(self, task_id: str, priority: Any, **_: Any) -> None:
        self.sent.append(task_id)


def files_of(store: Storage, task: Task) -> dict[str, bytes]:
    assert task.workspace is not None
    lookup = lookup_of(task.submission.workspace, task.tenant)  # a child's shared content is under its parent
    manifest = Manifest.from_bytes(store.workspaces.get_manifest(task.task_id, task.workspace.manifest, lookup))
    return {
        e.path: store.workspaces.get_blob(task.task_id, e.digest, lookup) for e in manifest.entries if e.kind == "f"
    }


def test_a_follow_up_continues_in_the_same_workspace_on_another_worker(store: Storage, tmp_path: Path) -> None:
    turns = [
        {"text": "1", "tool_calls": [call("write_file", path="notes.txt", content="one\n")]},
        {"text": "first answer"},
        {"text": "3", "tool_calls": [call("shell", command="cat notes.txt > seen.txt && echo two >> notes.txt")]},
        {"text": "second answer"},
    ]
    task = store.tasks.create(scripted(turns, tools=["write_file", "shell"]), tenant="t")
    first = Engine(store, worker_id="w1", config=EngineConfig(workspace_root=str(tmp_path / "w1")))
    assert first.run(task.task_id).status is TaskStatus.SUCCEEDED
    answered = store.tasks.get(task.task_id)
    assert files_of(store, answered) == {"notes.txt": b"one\n"}
    queues = _Queues()
    assert send_message(store, queues, task.task_id, "go on", tenant="t").reopened  # type: ignore[arg-type]
    second = Engine(store, worker_id="w2", config=EngineConfig(workspace_root=str(tmp_path / "w2")))
    assert second.run(task.task_id).status is TaskStatus.SUCCEEDED
    done = store.tasks.get(task.task_id)
    assert done.result == "second answer"
    # the follow-up's shell saw the first exchange's file, and its change was committed on top
    assert files_of(store, done) == {"notes.txt": b"one\ntwo\n", "seen.txt": b"one\n"}
    assert not list((tmp_path / "w1").rglob("notes.txt"))  # not read from the first worker's disk


@pytest.fixture(scope="module")
def stack() -> Any:
    with LocalStack(prefix="wslin", workers=2, api=False) as s:
        yield s


def _wait(store: Storage, task_id: str, timeout: float = 120) -> Task:
    deadline = time.monotonic() + timeout
    while not (task := store.tasks.get(task_id)).status.terminal:
        assert time.monotonic() < deadline, f"task still {task.status.value}"
        time.sleep(0.1)
    return task


def _spawn_result(store: Storage, task_id: str) -> dict[str, Any]:
    for record in store.steps.load(task_id):
        if isinstance(record.body, ToolsStep):
            for r in record.body.results:
                if r.name == "spawn_subagents":
                    found: dict[str, Any] = json.loads(r.content)
                    return found
    raise AssertionError("no spawn result")


def objects(store: Storage, prefix: str) -> list[str]:
    s3, bucket = store.payloads.s3, store.payloads.bucket  # type: ignore[attr-defined]
    pages = s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
    return [o["Key"] for page in pages for o in page.get("Contents", [])]


def test_a_sub_agent_starts_from_the_parents_workspace_shared_and_its_changes_come_back_only_as_a_diff(
    stack: LocalStack,
) -> None:
    assert stack.settings is not None
    store = stack.store()
    child_turns = [
        {"text": "c1", "tool_calls": [call("shell", command="cat plan.txt > read.txt && echo child >> plan.txt "
                                                    "&& rm big.bin")]},
        {"text": "child done"},
    ]  # fmt: skip
    turns = [
        {"text": "1", "tool_calls": [call("shell", command="echo plan > plan.txt && head -c 100000 /dev/urandom > big.bin")]},
        {"text": "2", "tool_calls": [call("spawn_subagents", subagents=[
            {"goal": "work on it", "workspace": "parent", "script": {"turns": child_turns}},
            {"goal": "no workspace", "script": {"turns": [{"text": "plain"}]}, "tools": []},
        ])]},
        {"text": "3", "tool_calls": [call("shell", command="ls > after-spawn.txt")]},
        {"text": "parent done"},
    ]  # fmt: skip
    root = submit(store, build_registry(stack.settings), scripted(turns, tools=["shell", "spawn_subagents"],
                  max_tokens=400_000), tenant="t", queues=stack.queues())  # fmt: skip
    final = _wait(store, root.task_id)
    assert final.status is TaskStatus.SUCCEEDED, final.error
    entries = _spawn_result(store, root.task_id)["subagents"]
    shared, plain = entries
    assert shared["status"] == "succeeded" and plain["status"] == "succeeded"
    assert "workspace_changes" not in plain
    changes = shared["workspace_changes"]
    assert (changes["added"], changes["removed"], changes["changed"]) == (["read.txt"], ["big.bin"], ["plan.txt"])
    assert "+child" in changes["patch"] and "+plan" in changes["patch"] and not changes["truncated"]

    child = store.tasks.get(shared["task_id"])
    spec = child.submission.workspace
    assert spec is not None and spec.base is not None
    at_spawn = next(r.body.workspace for r in store.steps.load(root.task_id)
                    if isinstance(r.body, ToolsStep) and r.body.workspace)  # fmt: skip
    assert spec.base.manifest == at_spawn.manifest  # the parent's workspace as of the spawn
    assert files_of(store, child)["read.txt"] == b"plan\n"  # the child saw the parent's file
    # shared, not copied: the child stored only what it wrote; the 100 KB file is the parent's alone
    child_blobs = objects(store, f"tasks/{child.task_id}/workspace/blobs/")
    # only the new plan.txt: read.txt's bytes are the parent's plan.txt's, already stored under the parent
    assert len(child_blobs) == 1
    parent_files = files_of(store, final)
    # the child's changes did not reach the parent's files; the parent's own step after the wake
    # saw its workspace as it left it
    assert parent_files["plan.txt"] == b"plan\n" and len(parent_files["big.bin"]) == 100_000
    assert "read.txt" not in parent_files
    assert parent_files["after-spawn.txt"].split() == [b"after-spawn.txt", b"big.bin", b"plan.txt"]


@pytest.mark.parametrize("seed", [False, True], ids=["no_starting_files", "inline_starting_files"])
def test_a_child_spawned_before_the_parents_first_change_reports_its_changes(stack: LocalStack, seed: bool) -> None:
    """The parent has no stored workspace yet (no starting files, or only inline ones): the child
    starts from the parent's start, and what it changed is measured from there, not dropped."""
    assert stack.settings is not None
    store = stack.store()
    child_turns = [
        {"text": "c", "tool_calls": [call("shell", command="if [ -f plan.txt ]; then cp plan.txt seen.txt; fi; echo fixed > fix.txt")]},
        {"text": "child done"},
    ]  # fmt: skip
    turns = [
        {"text": "1", "tool_calls": [call("spawn_subagents", subagents=[
            {"goal": "write fix.txt", "workspace": "parent", "script": {"turns": child_turns}}])]},
        {"text": "done"},
    ]  # fmt: skip
    body = scripted(turns, tools=["spawn_subagents", "shell"]).model_dump(mode="json")
    if seed:
        body["workspace"] = {"files": [{"path": "plan.txt", "content_b64": base64.b64encode(b"plan\n").decode()}]}
    root = submit(store, build_registry(stack.settings), body, tenant="t", queues=stack.queues())
    assert _wait(store, root.task_id).status is TaskStatus.SUCCEEDED
    (entry,) = _spawn_result(store, root.task_id)["subagents"]
    assert entry["status"] == "succeeded"
    assert "workspace_changes" in entry, entry  # was: missing, the child's fix.txt silently lost
    changes = entry["workspace_changes"]
    added = ["fix.txt", "seen.txt"] if seed else ["fix.txt"]  # the child saw the parent's inline file
    assert (changes["added"], changes["removed"], changes["changed"]) == (added, [], [])
    assert "+fixed" in changes["patch"]
    assert ("+plan" in changes["patch"]) is seed


def test_a_sub_agent_asking_for_a_workspace_its_parent_lacks_is_refused_with_the_reason(stack: LocalStack) -> None:
    assert stack.settings is not None
    store = stack.store()
    turns = [
        {"text": "1", "tool_calls": [call("spawn_subagents", subagents=[
            {"goal": "g", "workspace": "parent", "script": {"turns": [{"text": "x"}]}}])]},
        {"text": "done"},
    ]  # fmt: skip
    root = submit(store, build_registry(stack.settings), scripted(turns, tools=["spawn_subagents"]), tenant="t",
                  queues=stack.queues())  # fmt: skip
    assert _wait(store, root.task_id).status is TaskStatus.SUCCEEDED
    record = next(r for r in store.steps.load(root.task_id) if isinstance(r.body, ToolsStep))
    assert isinstance(record.body, ToolsStep)
    (outcome,) = record.body.results
    assert outcome.is_error and "has no workspace to share" in outcome.content
