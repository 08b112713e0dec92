"""A task's files through the API and the CLI (control.files, api/routes/files.py, cli/files.py),
on moto server with the API served over HTTP: the workspace was made by running the engine with
the scripted provider and the workspace tools, so every listing is checked against what each
committed step recorded."""

from __future__ import annotations

import base64
import hashlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agentq.api.app import build_app
from agentq.api.client import ApiError, Client
from agentq.api.http_server import LOCAL_TENANT, ApiServer
from agentq.core.engine import Engine, EngineConfig
from agentq.core.models import TaskSubmission, ToolsStep
from agentq.core.tools import default_registry
from agentq.core.workspace import Manifest
from agentq.storage.container import Storage

from tests.helpers import call, scripted

pytestmark = pytest.mark.skipif(not os.path.exists("/usr/bin/bwrap"), reason="the workspace tools need bubblewrap")

TURNS = [
    {"text": "1", "tool_calls": [call("write_file", path="src/app.py", content="print('hi')\n")]},
    {"text": "2", "tool_calls": [call("shell", command="chmod 750 src/app.py && printf '\\x00\\xff' > blob.bin "
                                      "&& ln -s src/app.py link && mkdir -p empty/dir")]},
    {"text": "3", "tool_calls": [call("list_files", recursive=True)]},  # changes nothing
    {"text": "4", "tool_calls": [call("edit_file", path="src/app.py", old_string="hi", new_string="bye"),
                                 call("shell", command="rm seed.txt")]},
    {"text": "done"},
]  # fmt: skip


def submission() -> TaskSubmission:
    sub = scripted(TURNS, tools=["write_file", "edit_file", "shell", "list_files"]).model_dump(mode="json")
    seed = {"files": [{"path": "seed.txt", "content_b64": base64.b64encode(b"seeded\n").decode(), "mode": 0o640}]}
    return TaskSubmission.model_validate({**sub, "workspace": seed})


@pytest.fixture
def api(store: Storage) -> Iterator[Client]:
    server = ApiServer(build_app(store, default_registry(), None, default_tenant=LOCAL_TENANT).resolve).start()  # type: ignore[arg-type]
    try:
        yield Client(server.url)
    finally:
        server.stop()


@pytest.fixture
def task_id(store: Storage, tmp_path: Path) -> str:
    task = store.tasks.create(submission(), tenant=LOCAL_TENANT)
    config = EngineConfig(lease_seconds=10, workspace_root=str(tmp_path / "root"))
    Engine(store, worker_id="w1", tools=default_registry(), config=config).run(task.task_id)
    return task.task_id


def expected_at(store: Storage, task_id: str, step: int) -> Manifest:
    """What step ``step`` committed, read from the step log independently of control.files."""
    refs = [r.body.workspace for r in store.steps.load(task_id) if r.number <= step
            and isinstance(r.body, ToolsStep) and r.body.workspace]  # fmt: skip
    if not refs:
        return submission().workspace.seed()[0]  # type: ignore[union-attr]
    return Manifest.from_bytes(store.workspaces.get_manifest(task_id, refs[-1].manifest))


def test_every_steps_listing_equals_what_that_step_committed(store: Storage, api: Client, task_id: str) -> None:
    last = store.tasks.get(task_id).step
    assert last >= 5
    for step in range(last + 1):
        page = api.files(task_id, step=step)
        want = expected_at(store, task_id, step)
        got = [(e.path, {"file": "f", "dir": "d", "link": "l"}[e.kind], e.mode, e.size, e.sha256 or e.target or "")
               for e in page.files]  # fmt: skip
        assert got == [(e.path, e.kind, e.mode, e.size, e.digest) for e in want.entries], step
        assert page.step == step and page.total_files == want.files
    assert api.files(task_id).step == last
    # pages of one entry walk the same listing
    walked, after = [], None
    while True:
        one = api.files(task_id, step=2, after=after, limit=1)
        walked += [e.path for e in one.files]
        after = one.next_after
        if after is None:
            break
    assert walked == [e.path for e in expected_at(store, task_id, 2).entries]


def test_each_file_is_served_as_the_step_left_it(store: Storage, api: Client, task_id: str, tmp_path: Path) -> None:
    last = store.tasks.get(task_id).step
    for step in range(last + 1):
        manifest = expected_at(store, task_id, step)
        for e in manifest.entries:
            if e.kind == "f":
                assert hashlib.sha256(api.file(task_id, e.path, step=step)).hexdigest() == e.digest


def test_the_diff_names_what_changed_and_shows_the_text(store: Storage, api: Client, task_id: str) -> None:
    first = next(r.number for r in store.steps.load(task_id) if isinstance(r.body, ToolsStep))
    found = api.diff(task_id, first)
    assert found.removed == ["seed.txt"] and "blob.bin" in found.added and "src/app.py" in found.changed
    assert "-print('hi')\n+print('bye')\n" in found.patch and "mode 644 -> 750" in found.patch
    assert "--- a/seed.txt\n+++ /dev/null\n@@ -1 +0,0 @@\n-seeded\n" in found.patch
    assert "Binary files differ" in found.patch and not found.truncated
    same = api.diff(task_id, 3, 3)
    assert same.added == same.removed == same.changed == [] and same.patch == ""


@pytest.mark.parametrize(
    ("path", "query", "status", "field"),
    [
        ("/files", {"step": 999}, 422, "step"),
        ("/files", {"step": -1}, 422, "step"),
        ("/files/nowhere.txt", {}, 404, "path"),
        ("/files/src/../seed.txt", {}, 422, "path"),
        ("/files//etc/passwd", {}, 422, "path"),
        ("/files/src", {}, 422, "path"),
        ("/files/link", {}, 422, "path"),
        ("/diff", {"steps": "1-2"}, 422, "steps"),
        ("/diff", {"steps": "2..999"}, 422, "steps"),
        ("/diff", {}, 422, "steps"),
    ],
)
def test_bad_input_is_a_4xx_naming_the_field(
    api: Client, task_id: str, path: str, query: dict[str, Any], status: int, field: str
) -> None:
    with pytest.raises(ApiError) as caught:
        api.request("GET", f"/tasks/{task_id}{path}", query=query)
    assert (caught.value.status, caught.value.field) == (status, field), caught.value


def test_another_tenants_task_and_a_task_without_a_workspace_are_not_found(store: Storage, api: Client) -> None:
    theirs = store.tasks.create(submission(), tenant="someone-else")
    plain = store.tasks.create(scripted([{"text": "hi"}]), tenant=LOCAL_TENANT)
    for path in ("/files", "/files/seed.txt", "/diff?steps=0..0"):
        with pytest.raises(ApiError) as missing:
            api.request("GET", f"/tasks/no-such-task{path}")
        with pytest.raises(ApiError) as other:
            api.request("GET", f"/tasks/{theirs.task_id}{path}")
        assert (
            (other.value.status, other.value.code)
            == (missing.value.status, missing.value.code)
            == (404, "task_not_found")
        )
        with pytest.raises(ApiError) as none:
            api.request("GET", f"/tasks/{plain.task_id}{path}")
        assert (none.value.status, none.value.code, none.value.field) == (404, "workspace_not_found", "task_id")
