"""A task's workspace as durable state (core.workspace, core.engine._workspace), on moto server's
S3: each tools step that changed it names a manifest whose content is in the bucket, only new
content is uploaded, a fork gets the workspace of its step, a workspace that cannot be restored
fails the task with ``workspace_restore_failed``, and one past its quota is refused and undone.
The SIGKILL case is tests/test_workspace_kill.py; the sandbox's escape probes are
tests/test_workspace_escape.py."""

from __future__ import annotations

import base64
import hashlib
import os
import threading
from pathlib import Path
from typing import Any

import pytest

from agentq.core.engine import Engine, EngineConfig
from agentq.core.models import MAX_GOAL_CHARS, TaskStatus, TaskSubmission, ToolsStep
from agentq.core.tools import default_registry
from agentq.core.workspace import MAX_SEED_ENCODED_BYTES, MAX_SEED_FILES, Entry, Manifest, WorkspaceQuota
from agentq.core.workspace_restore import restore
from agentq.storage.container import Storage
from agentq.storage.workspaces import blob_key, workspace_prefix

from tests.helpers import call, scripted

pytestmark = pytest.mark.skipif(not os.path.exists("/usr/bin/bwrap"), reason="the workspace tools need bubblewrap")


def run(store: Storage, submission: TaskSubmission, tmp_path: Path, **config: Any) -> str:
    task = store.tasks.create(submission, tenant="t")
    engine = Engine(
        store, worker_id="w1", tools=default_registry(),
        config=EngineConfig(lease_seconds=10, workspace_root=str(tmp_path / "root"), **config),
    )  # fmt: skip
    engine.run(task.task_id)
    return task.task_id


def tools_steps(store: Storage, task_id: str) -> list[ToolsStep]:
    return [s.body for s in store.steps.load(task_id) if isinstance(s.body, ToolsStep)]


def manifest_of(store: Storage, task_id: str, digest: str) -> Manifest:
    return Manifest.from_bytes(store.workspaces.get_manifest(task_id, digest))


def s3_keys(store: Storage, prefix: str) -> list[str]:
    s3 = store.payloads.s3  # type: ignore[attr-defined]
    pages = s3.get_paginator("list_objects_v2").paginate(Bucket=store.payloads.bucket, Prefix=prefix)  # type: ignore[attr-defined]
    return [o["Key"] for page in pages for o in page.get("Contents", [])]


def test_each_step_that_changed_the_workspace_names_a_manifest_whose_files_restore_byte_for_byte(
    store: Storage, tmp_path: Path
) -> None:
    payload = bytes(range(256))
    turns = [
        {"text": "write", "tool_calls": [
            call("write_file", path="src/app.py", content="print('hi')\n"),
            call("shell", command="chmod 750 src/app.py && ln -s app.py src/link && mkdir -p empty/dir && "
                 "python3 -c \"open('blob.bin', 'wb').write(bytes(range(256)))\" && chmod 600 blob.bin"),
        ]},
        {"text": "look", "tool_calls": [call("list_files", recursive=True)]},
        {"text": "done"},
    ]  # fmt: skip
    task_id = run(store, scripted(turns, tools=["write_file", "shell", "list_files"]), tmp_path)
    steps = tools_steps(store, task_id)
    assert steps[0].workspace is not None and steps[1].workspace is None  # the listing changed nothing
    meta = store.tasks.get(task_id)
    assert meta.status is TaskStatus.SUCCEEDED and meta.workspace == steps[0].workspace
    manifest = manifest_of(store, task_id, steps[0].workspace.manifest)
    entries = manifest.by_path()
    assert entries["src/app.py"] == Entry("src/app.py", "f", 0o750, 12, hashlib.sha256(b"print('hi')\n").hexdigest())
    assert entries["src/link"] == Entry("src/link", "l", 0o777, 0, "app.py")
    assert entries["empty/dir"].kind == "d" and entries["blob.bin"].mode == 0o600
    for entry in manifest.entries:  # every file's content is in the bucket under its hash
        if entry.kind == "f":
            assert blob_key(task_id, entry.digest) in s3_keys(store, workspace_prefix(task_id))
    target = tmp_path / "restored"
    restore(target, manifest, lambda d: store.workspaces.get_blob(task_id, d))
    assert (target / "blob.bin").read_bytes() == payload
    assert os.readlink(target / "src" / "link") == "app.py" and (target / "empty" / "dir").is_dir()
    assert (target / "src" / "app.py").stat().st_mode & 0o777 == 0o750
    assert not (tmp_path / "root").exists() or not any((tmp_path / "root").rglob("app.py"))  # the run cleaned up


def test_only_content_no_earlier_step_stored_is_uploaded_and_shared_content_is_stored_once(
    store: Storage, tmp_path: Path
) -> None:
    make = "python3 -c \"open('a.txt', 'w').write('a' * 10000); open('b.txt', 'w').write('b' * 20000)\""
    turns = [
        {"text": "1", "tool_calls": [call("shell", command=make)]},
        {"text": "2", "tool_calls": [call("edit_file", path="b.txt", old_string="bbbb", new_string="cccc", replace_all=True)]},
        {"text": "3", "tool_calls": [call("shell", command="cp a.txt copy-of-a.txt && mkdir d && cp a.txt d/again.txt")]},
        {"text": "4", "tool_calls": [call("shell", command="rm b.txt")]},
        {"text": "done"},
    ]  # fmt: skip
    task_id = run(store, scripted(turns, tools=["write_file", "edit_file", "shell"]), tmp_path)
    assert store.tasks.get(task_id).status is TaskStatus.SUCCEEDED, store.tasks.get(task_id).error
    refs = [s.workspace for s in tools_steps(store, task_id)]
    assert len(refs) == 4 and all(r is not None for r in refs)
    assert [r.uploaded_bytes for r in refs if r] == [30_000, 20_000, 0, 0]
    assert [r.files for r in refs if r] == [2, 2, 4, 3]
    blobs = [k for k in s3_keys(store, workspace_prefix(task_id)) if "/blobs/" in k]
    assert len(blobs) == 3  # a, b, b edited: every other file shares one of them


def test_a_fork_from_step_n_starts_with_the_workspace_of_step_n(store: Storage, tmp_path: Path) -> None:
    turns = [
        {"text": "v1", "tool_calls": [call("write_file", path="notes.md", content="version 1\n")]},
        {"text": "v2", "tool_calls": [call("write_file", path="notes.md", content="version 2\n")]},
        {"text": "done"},
    ]
    source_id = run(store, scripted(turns, tools=["write_file", "read_file"]), tmp_path)
    source = store.tasks.get(source_id)
    # The scripted provider's turn k is the conversation's k-th answer: the fork's first is copied.
    reader = scripted([{"text": "(copied)"}, {"text": "read", "tool_calls": [call("read_file", path="notes.md")]},
                       {"text": "ok"}], tools=["write_file", "read_file"])  # fmt: skip
    fork = store.tasks.fork(source, reader, store.steps.load(source_id)[:2], tenant="t")
    assert fork.workspace is not None and fork.workspace == tools_steps(store, source_id)[0].workspace
    Engine(
        store, worker_id="w2", tools=default_registry(),
        config=EngineConfig(lease_seconds=10, workspace_root=str(tmp_path / "root2")),
    ).run(fork.task_id)  # fmt: skip
    read = tools_steps(store, fork.task_id)[-1].results[0]
    assert not read.is_error and read.content.endswith("version 1\n")
    assert s3_keys(store, workspace_prefix(fork.task_id))  # the fork owns its copy


@pytest.mark.parametrize("damage", ["blob_missing", "blob_altered", "manifest_missing", "manifest_altered"])
def test_a_workspace_that_cannot_be_restored_exactly_fails_the_task_with_workspace_restore_failed(
    store: Storage, tmp_path: Path, damage: str
) -> None:
    turns = [
        {"text": "w", "tool_calls": [call("write_file", path="a.txt", content="kept\n")]},
        {"text": "r", "tool_calls": [call("read_file", path="a.txt")]},
        {"text": "done"},
    ]
    submission = scripted(turns, tools=["write_file", "read_file"])
    task = store.tasks.create(submission, tenant="t")
    engine = Engine(store, worker_id="w1", tools=default_registry(),
                    config=EngineConfig(lease_seconds=10, workspace_root=str(tmp_path / "r")))  # fmt: skip
    stop = threading.Event()
    # Run the first turn and its tools step only: stop at the next step boundary after it.
    original = engine._tool_turn.run

    def once(s: Any, llm: Any) -> Any:
        out = original(s, llm)
        stop.set()
        return out

    engine._tool_turn.run = once  # type: ignore[method-assign]
    engine.run(task.task_id, stop=stop)
    meta = store.tasks.get(task.task_id)
    assert meta.workspace is not None and not meta.status.terminal
    digest = meta.workspace.manifest
    blob = hashlib.sha256(b"kept\n").hexdigest()
    s3, bucket = store.payloads.s3, store.payloads.bucket  # type: ignore[attr-defined]
    if damage == "blob_missing":
        s3.delete_object(Bucket=bucket, Key=blob_key(task.task_id, blob))
    elif damage == "blob_altered":
        store.payloads.put_bytes(blob_key(task.task_id, blob), b"changed\n")
    elif damage == "manifest_missing":
        s3.delete_object(Bucket=bucket, Key=f"{workspace_prefix(task.task_id)}manifests/{digest}")
    else:  # an overwrite from outside: the store itself never replaces an object (create-only)
        store.payloads.put_bytes(f"{workspace_prefix(task.task_id)}manifests/{digest}", Manifest().to_bytes())
    Engine(store, worker_id="w2", tools=default_registry(),
           config=EngineConfig(lease_seconds=10, workspace_root=str(tmp_path / "r2"))).run(task.task_id)  # fmt: skip
    failed = store.tasks.get(task.task_id)
    assert failed.status is TaskStatus.FAILED
    assert failed.error is not None and failed.error["code"] == "workspace_restore_failed", failed.error
    assert failed.step == meta.step  # no step ran on the half-restored disk


def test_a_turn_that_takes_the_workspace_past_its_quota_is_refused_and_undone(store: Storage, tmp_path: Path) -> None:
    turns = [
        {"text": "two", "tool_calls": [call("shell", command="echo 1 > one && echo 2 > two")]},
        {"text": "many", "tool_calls": [call("shell", command="for i in $(seq 1 10); do echo $i > f$i; done")]},
        {"text": "look", "tool_calls": [call("list_files")]},
        {"text": "done"},
    ]
    task_id = run(store, scripted(turns, tools=["shell", "list_files"]), tmp_path,
                  workspace_quota=WorkspaceQuota(max_files=5, max_bytes=1_000_000))  # fmt: skip
    steps = tools_steps(store, task_id)
    refused = steps[1].results[0]
    assert refused.is_error and "more than its limit of 5 entries" in refused.content and "undone" in refused.content
    assert steps[1].workspace is None
    assert steps[2].results[0].content.splitlines() == ["one  2 bytes", "two  2 bytes"]


def test_a_submission_starts_the_workspace_with_its_files(store: Storage, tmp_path: Path) -> None:
    submission = scripted(
        [{"text": "r", "tool_calls": [call("shell", command="cat dir/hello.txt && test -x run.sh && echo exec")]},
         {"text": "done"}], tools=["shell"],
    ).model_copy(update={"workspace": TaskSubmission.model_validate({
        "goal": "g", "script": "first_task",
        "workspace": {"files": [
            {"path": "dir/hello.txt", "content_b64": base64.b64encode(b"hello\n").decode()},
            {"path": "run.sh", "content_b64": base64.b64encode(b"#!/bin/sh\n").decode(), "mode": 0o755},
        ]}}).workspace})  # fmt: skip
    task_id = run(store, submission, tmp_path)
    out = tools_steps(store, task_id)[0]
    assert out.results[0].content.startswith("exit code 0\n--- stdout ---\nhello\nexec\n")
    assert out.workspace is not None and out.workspace.uploaded_bytes == len(b"hello\n#!/bin/sh\n")


@pytest.mark.parametrize(
    ("files", "needle"),
    [
        ([{"path": "../out.txt", "content_b64": ""}], "not a relative workspace path"),
        ([{"path": "/etc/passwd", "content_b64": ""}], "not a relative workspace path"),
        ([{"path": "a/./b", "content_b64": ""}], "not a relative workspace path"),
        ([{"path": "x", "content_b64": "!!"}], "not base64"),
        ([{"path": "x", "content_b64": ""}, {"path": "x/y", "content_b64": ""}], "is a file and a directory"),
        ([{"path": "b", "content_b64": "A" * (MAX_SEED_ENCODED_BYTES - 1 + 4) + "="}], "over the"),
        ([{"path": f"f{i}", "content_b64": ""} for i in range(MAX_SEED_FILES + 1)], "at most"),
    ],
)
def test_a_seed_that_would_leave_its_root_or_pass_the_limits_is_refused_naming_the_field(
    files: list[dict[str, Any]], needle: str
) -> None:
    with pytest.raises(ValueError, match=needle) as caught:
        TaskSubmission.model_validate({"goal": "g", "script": "first_task", "workspace": {"files": files}})
    assert "workspace" in str(caught.value)


@pytest.mark.parametrize("goal_char", ["a", "\U0001f600", "\x01"], ids=["ascii", "four_byte", "escaped_control"])
def test_a_seed_at_its_limit_with_a_goal_and_system_prompt_at_theirs_is_stored_in_one_item(
    store: Storage, goal_char: str
) -> None:
    content = base64.b64encode(b"x" * (MAX_SEED_ENCODED_BYTES // 4 * 3 - 3)).decode()
    files = [{"path": "f", "content_b64": content}]
    assert len(content) + 1 <= MAX_SEED_ENCODED_BYTES
    submission = TaskSubmission.model_validate({
        "goal": goal_char * MAX_GOAL_CHARS, "system": goal_char * MAX_GOAL_CHARS, "script": "first_task",
        "workspace": {"files": files},
    })  # fmt: skip
    task = store.tasks.create(submission, tenant="t")
    assert store.tasks.get(task.task_id).submission.workspace == submission.workspace


def test_an_allowed_host_that_is_not_a_host_is_refused_naming_the_field() -> None:
    with pytest.raises(ValueError, match="allow_hosts") as caught:
        TaskSubmission.model_validate({"goal": "g", "script": "first_task", "workspace": {"allow_hosts": ["a b"]}})
    assert "not a host name" in str(caught.value)
