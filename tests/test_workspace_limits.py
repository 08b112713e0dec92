"""A task workspace's limits and retention (issue 42, item 4).

Limits: the deployment's (``AGENTQ_WORKSPACE_MAX_BYTES``, ``AGENTQ_WORKSPACE_MAX_FILES``; ``workspace``
in cdk.json, ``WorkspaceQuota``'s defaults on the local stack) bound every task; a bad value is
refused at startup naming the variable; a submission may ask for less, never more; a turn that
passes the task's limit gets a tool error and its files are not committed, not even in part.

Retention: a task's workspace content lives under its own prefix (``tasks/<id>/workspace/``),
so the reaper that purges an expired task deletes it with the rest, and a live task, even one
holding the very same content, keeps every object its steps name. On moto server, through the
reaper's handler and the stream record of a TTL deletion (tests/test_retention.py's fixtures).
"""

from __future__ import annotations

import base64
import io
import os
import tarfile
from pathlib import Path
from typing import Any

import pytest

from agentq.control.defaults import ConfigurationError, Defaults
from agentq.control.submit import prepare_submission
from agentq.control.workspaces import upload_archive
from agentq.core.engine import Engine, EngineConfig
from agentq.core.errors import ValidationError
from agentq.core.models import TaskStatus, TaskSubmission, ToolsStep
from agentq.core.tools import default_registry
from agentq.core.workspace import Manifest, WorkspaceQuota
from agentq.core.workspace_restore import restore
from agentq.runtime import Settings, engine_config
from agentq.storage.container import Storage
from agentq.storage.keys import META, task_pk
from agentq.storage.serdes import to_item
from agentq.storage.workspaces import workspace_prefix

from tests.helpers import call, dynamo, s3_payloads
from tests.lambda_support import FakeLambdaContext
from tests.test_retention import (  # noqa: F401 (fixtures, shared)
    _lambda_record,
    _removal_of,
    _stream_records,
    reaper,
    retained,
    streamed,
)

BWRAP = pytest.mark.skipif(not os.path.exists("/usr/bin/bwrap"), reason="the workspace tools need bubblewrap")
VARIABLES = {"max_bytes": "AGENTQ_WORKSPACE_MAX_BYTES", "max_files": "AGENTQ_WORKSPACE_MAX_FILES"}


def submission(turns: list[Any], tools: list[str], **workspace: Any) -> TaskSubmission:
    return TaskSubmission.model_validate(
        {
            "goal": "work in files",
            "provider": "scripted",
            "script": {"turns": turns},
            "constraints": {"tools": tools, **workspace.pop("constraints", {})},
            "workspace": workspace,
        }
    )


# -- the deployment's limits ---------------------------------------------------------------------


def test_the_deployments_limits_come_from_the_environment_and_default_to_the_quotas(
    monkeypatch: pytest.MonkeyPatch, settings: Settings
) -> None:
    for variable in VARIABLES.values():
        monkeypatch.delenv(variable, raising=False)
    assert Defaults.from_env().workspace_quota() == WorkspaceQuota()  # the local stack's, and cdk.json's defaults
    monkeypatch.setenv(VARIABLES["max_bytes"], " 5000 ")
    monkeypatch.setenv(VARIABLES["max_files"], "7")
    defaults = Defaults.from_env()
    assert defaults.workspace_quota() == WorkspaceQuota(max_bytes=5000, max_files=7)
    # ...carried to the workers a local stack starts, and into the engine the runtime builds.
    assert {k: v for k, v in defaults.env().items() if k in VARIABLES.values()} == {
        VARIABLES["max_bytes"]: "5000",
        VARIABLES["max_files"]: "7",
    }
    built = Settings(table=settings.table, bucket=settings.bucket, defaults=defaults)
    assert engine_config(built).workspace_quota == WorkspaceQuota(max_bytes=5000, max_files=7)


@pytest.mark.parametrize("name", list(VARIABLES.values()))
@pytest.mark.parametrize("raw", ["0", "-1", "1GB", "1.5", "1e9", "ten", str(1 << 41), "100000000000"])
def test_a_bad_limit_is_refused_at_startup_naming_the_variable(
    monkeypatch: pytest.MonkeyPatch, name: str, raw: str
) -> None:
    if raw == "100000000000" and name == VARIABLES["max_bytes"]:
        raw = str((1 << 40) + 1)  # over a tebibyte of files per task: a typo, not a limit
    monkeypatch.setenv(name, raw)
    with pytest.raises(ConfigurationError) as refused:
        Defaults.from_env()
    assert refused.value.field == name and name in refused.value.message and repr(raw) in refused.value.message


# -- what a task may ask for ---------------------------------------------------------------------


@pytest.mark.parametrize("name", list(VARIABLES))
def test_a_submission_may_ask_for_less_than_the_deployment_never_more(store: Storage, name: str) -> None:
    defaults = Defaults(workspace_max_bytes=10_000, workspace_max_files=50)
    most = defaults.workspace_quota().max_bytes if name == "max_bytes" else defaults.workspace_quota().max_files
    for asked in (1, most // 2, most):
        prepared = prepare_submission(
            store, default_registry(), submission([{"text": "hi"}], ["shell"], **{name: asked}), tenant="t",
            defaults=defaults,
        )  # fmt: skip
        assert prepared.workspace is not None and getattr(prepared.workspace, name) == asked
    for asked in (most + 1, most * 1000):
        with pytest.raises(ValidationError) as refused:
            prepare_submission(
                store, default_registry(), submission([{"text": "hi"}], ["shell"], **{name: asked}), tenant="t",
                defaults=defaults,
            )  # fmt: skip
        assert refused.value.field == f"workspace.{name}"
        assert (
            f"{asked} is more than this deployment allows a task ({most}, {VARIABLES[name]})" in refused.value.message
        )
    with pytest.raises(ValueError, match=name):  # not a limit at all: refused by the model, naming it
        submission([{"text": "hi"}], ["shell"], **{name: 0})


def test_the_task_runs_under_the_smaller_of_its_own_limits_and_the_deployments() -> None:
    deployment = WorkspaceQuota(max_bytes=1000, max_files=20)
    for asked_bytes, asked_files in [(None, None), (10, None), (None, 3), (5000, 3), (10, 5000), (1000, 20)]:
        spec = submission([{"text": "hi"}], ["shell"], max_bytes=asked_bytes, max_files=asked_files).workspace
        quota = deployment.for_task(spec)
        assert quota.max_bytes == min(1000, asked_bytes or 1000)
        assert quota.max_files == min(20, asked_files or 20)
        assert quota.max_manifest_bytes == deployment.max_manifest_bytes


def three_files(store: Storage) -> str:
    """An upload of three 1,000-byte files (three entries, 3,000 bytes); its digest."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as archive:
        for i in range(3):
            info = tarfile.TarInfo(f"f{i}.txt")
            info.size = 1000
            archive.addfile(info, io.BytesIO(bytes([65 + i]) * 1000))
    return upload_archive(store, out.getvalue(), tenant="t").upload


INLINE = [{"path": f"f{i}.txt", "content_b64": base64.b64encode(b"x" * 1000).decode()} for i in range(3)]


@pytest.mark.parametrize(
    ("start", "asked", "deployment", "field", "said"),
    [
        ("upload", {"max_bytes": 1500}, None, "workspace.max_bytes",
         "1500 is less than the 3000 bytes of files workspace.upload starts with"),
        ("upload", {"max_files": 2}, None, "workspace.max_files",
         "2 is less than the 3 entries (files, directories and links) workspace.upload starts with"),
        ("files", {"max_bytes": 2999}, None, "workspace.max_bytes", "the 3000 bytes of files workspace.files"),
        ("upload", {}, Defaults(workspace_max_bytes=2000), "workspace.upload",
         "3000 bytes of files, more than this deployment allows a task (2000, AGENTQ_WORKSPACE_MAX_BYTES)"),
        ("files", {}, Defaults(workspace_max_files=2), "workspace.files",
         "3 entries (files, directories and links), more than this deployment allows a task (2, "
         "AGENTQ_WORKSPACE_MAX_FILES)"),
    ],
    ids=["upload_own_bytes", "upload_own_files", "inline_own_bytes", "upload_deployment", "inline_deployment"],
)  # fmt: skip
def test_a_start_over_the_tasks_own_limits_is_refused_naming_the_field(
    store: Storage, start: str, asked: dict[str, int], deployment: Defaults | None, field: str, said: str
) -> None:
    # was: accepted, and then every turn of the task, a read-only one too, was "refused ... undone"
    source = {"upload": three_files(store)} if start == "upload" else {"files": INLINE}
    sub = submission([{"text": "hi"}], ["list_files"], **source, **asked)
    with pytest.raises(ValidationError) as refused:
        prepare_submission(store, default_registry(), sub, tenant="t", defaults=deployment)
    assert refused.value.field == field and said in refused.value.message, refused.value.message
    fits = {"upload": three_files(store)} if start == "upload" else {"files": INLINE}
    at_the_limit = {name: 3000 if name == "max_bytes" else 3 for name in asked}
    prepare_submission(
        store, default_registry(), submission([{"text": "hi"}], ["list_files"], **fits, **at_the_limit), tenant="t"
    )


@BWRAP
def test_a_turn_that_leaves_a_start_past_the_quota_as_it_was_is_not_refused_and_one_that_changes_it_is(
    store: Storage, tmp_path: Path
) -> None:
    # A deployment whose limit was lowered after the task was accepted (here: the worker's quota
    # is below the upload, which submission checked against the larger default).
    turns = [
        {"tool_calls": [call("list_files")]},
        {"tool_calls": [call("write_file", path="more.txt", content="x")]},
        {"tool_calls": [call("list_files")]},
        {"text": "done"},
    ]
    sub = prepare_submission(
        store,
        default_registry(),
        submission(turns, ["write_file", "list_files"], upload=three_files(store)),
        tenant="t",
    )
    task = store.tasks.create(sub, tenant="t")
    engine = Engine(store, worker_id="w1", tools=default_registry(),
                    config=EngineConfig(lease_seconds=10, workspace_root=str(tmp_path / "root"),
                                        workspace_quota=WorkspaceQuota(max_bytes=1500)))  # fmt: skip
    assert engine.run(task.task_id).status is TaskStatus.SUCCEEDED
    looked, wrote, again = [s.body for s in store.steps.load(task.task_id) if isinstance(s.body, ToolsStep)]
    assert not looked.results[0].is_error, looked.results[0].content  # was: "refused: ... 1500 bytes ... undone"
    assert wrote.results[0].is_error and "more than its limit of 1500 bytes" in wrote.results[0].content
    assert again.results[0].content.splitlines() == ["f0.txt  1000 bytes", "f1.txt  1000 bytes", "f2.txt  1000 bytes"]


@BWRAP
@pytest.mark.parametrize(
    ("limit", "command", "needle"),
    [
        ({"max_files": 4}, "mkdir d && for i in 1 2 3; do echo $i > d/f$i; done", "4 entries"),
        ({"max_bytes": 3000}, "head -c 2000 /dev/zero > big && head -c 2000 /dev/zero > big2", "3000 bytes"),
    ],
)
def test_a_turn_past_the_tasks_own_limit_is_refused_and_none_of_its_files_committed(
    store: Storage, tmp_path: Path, limit: dict[str, int], command: str, needle: str
) -> None:
    turns = [
        {"tool_calls": [call("write_file", path="keep.txt", content="kept")]},
        {"tool_calls": [call("shell", command=command), call("write_file", path="also.txt", content="x")]},
        {"tool_calls": [call("list_files", recursive=True)]},
        {"text": "done"},
    ]
    task = store.tasks.create(submission(turns, ["shell", "write_file", "list_files"], **limit), tenant="t")
    engine = Engine(store, worker_id="w1", tools=default_registry(),
                    config=EngineConfig(lease_seconds=10, workspace_root=str(tmp_path / "root")))  # fmt: skip
    assert engine.run(task.task_id).status is TaskStatus.SUCCEEDED  # the deployment's quota is far larger
    first, refused, listing = [s.body for s in store.steps.load(task.task_id) if isinstance(s.body, ToolsStep)]
    assert first.workspace is not None and refused.workspace is None
    shell, write = refused.results
    assert not shell.is_error  # the turn's last workspace call carries the refusal
    assert write.is_error and f"more than its limit of {needle}" in write.content and "undone" in write.content
    assert listing.results[0].content.splitlines() == ["keep.txt  4 bytes"]
    # Nothing of the refused state reached the bucket: one manifest, the first step's.
    keys = s3_keys(store, workspace_prefix(task.task_id) + "manifests/")
    assert keys == [workspace_prefix(task.task_id) + f"manifests/{first.workspace.manifest}"]


def s3_keys(store: Storage, prefix: str) -> list[str]:
    s3 = s3_payloads(store)
    pages = s3.s3.get_paginator("list_objects_v2").paginate(Bucket=s3.bucket, Prefix=prefix)
    return sorted(o["Key"] for page in pages for o in page.get("Contents", []))


# -- retention ----------------------------------------------------------------------------------


@BWRAP
def test_an_expired_task_loses_its_workspace_objects_and_a_live_one_keeps_all_of_its_own(
    streamed: tuple[Settings, Storage, str],  # noqa: F811 (the fixture imported above)
    reaper: Any,  # noqa: F811
    tmp_path: Path,
) -> None:
    """Both tasks write the same shared content and some of their own over several steps; the
    doomed one finishes and expires (its META deleted by TTL, the reaper called with that stream
    record); the other is live, paused on an approval. After the purge the doomed task has no
    object under its workspace prefix, and every manifest and blob the live task's steps name is
    still there and restores byte for byte."""
    settings, store, stream_arn = streamed
    shared = "the same content in both tasks\n" * 10

    def turns(own: str, *, pause: bool) -> list[dict[str, Any]]:
        return [
            {"tool_calls": [call("write_file", path="shared.txt", content=shared)]},
            {"tool_calls": [call("write_file", path="own.txt", content=own)]},
            {"tool_calls": [call("write_file", path="copy/shared.txt", content=shared)]},
            {"tool_calls": [call("note_write", key="k", value="v")]} if pause else {"text": "done"},
            {"text": "done"},
        ]

    def run(own: str, *, pause: bool) -> str:
        sub = submission(
            turns(own, pause=pause), ["write_file", "note_write"],
            constraints={"tool_policies": {"note_write": "ask"}},
        )  # fmt: skip
        task = store.tasks.create(sub, tenant="t")
        Engine(store, worker_id="w1", tools=default_registry(),
               config=EngineConfig(lease_seconds=10, workspace_root=str(tmp_path / own))).run(task.task_id)  # fmt: skip
        return task.task_id

    doomed, live = run("doomed", pause=False), run("live", pause=True)
    assert store.tasks.get(doomed).status is TaskStatus.SUCCEEDED
    assert store.tasks.get(live).status is TaskStatus.PAUSED
    live_keys = s3_keys(store, workspace_prefix(live))
    assert s3_keys(store, workspace_prefix(doomed)) and live_keys

    dynamo(store).client.delete_item(TableName=store.table.name, Key=to_item({"pk": task_pk(doomed), "sk": META}))
    record = _removal_of(_stream_records(settings, stream_arn), task_pk(doomed), META)
    event = {"Records": [_lambda_record(record, stream_arn, by_ttl=True)]}
    assert reaper.lambda_handler(event, FakeLambdaContext(60)) == {"batchItemFailures": []}

    assert s3_keys(store, workspace_prefix(doomed)) == []
    assert s3_keys(store, workspace_prefix(live)) == live_keys
    named = [s.body.workspace for s in store.steps.load(live) if isinstance(s.body, ToolsStep) and s.body.workspace]
    assert len(named) == 3
    for ref in named:  # every state a live step names restores, from the bucket, exactly
        manifest = Manifest.from_bytes(store.workspaces.get_manifest(live, ref.manifest))
        target = tmp_path / "restored" / ref.manifest
        restore(target, manifest, lambda digest: store.workspaces.get_blob(live, digest))
    assert (tmp_path / "restored" / named[-1].manifest / "copy" / "shared.txt").read_text() == shared
    assert (tmp_path / "restored" / named[-1].manifest / "own.txt").read_text() == "live"
