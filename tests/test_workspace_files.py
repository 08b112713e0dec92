"""A task's files through the API and the CLI (control.files, api/routes/files.py, cli/files.py),
on moto server with the API served over HTTP: the workspace was made by running the engine with
the scripted provider and the workspace tools, so every listing is checked against what each
committed step recorded."""

from __future__ import annotations

import base64
import hashlib
import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

import pytest

from agentq.api.app import build_app
from agentq.api.client import ApiError, Client
from agentq.api.http_server import LOCAL_TENANT, ApiServer
from agentq.api.models import FileEntry, FileList
from agentq.cli.args import UsageError
from agentq.cli.files import download, read_workspace
from agentq.core.engine import Engine, EngineConfig
from agentq.core.models import TaskSubmission, ToolsStep
from agentq.core.tools import default_registry
from agentq.core.workspace import MAX_SEED_FILES, Manifest
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


def test_each_file_is_served_as_the_step_left_it_and_a_download_round_trips_bytes_and_modes(
    store: Storage, api: Client, task_id: str, tmp_path: Path
) -> None:
    last = store.tasks.get(task_id).step
    for step in range(last + 1):
        manifest = expected_at(store, task_id, step)
        for e in manifest.entries:
            if e.kind == "f":
                assert hashlib.sha256(api.file(task_id, e.path, step=step)).hexdigest() == e.digest
        target = tmp_path / f"down{step}"
        download(api, task_id, str(target), step)
        for e in manifest.entries:
            path = target / e.path
            assert path.is_symlink() == (e.kind == "l")
            if e.kind == "f":
                assert hashlib.sha256(path.read_bytes()).hexdigest() == e.digest
                assert path.stat().st_mode & 0o777 == e.mode
            if e.kind == "l":
                assert os.readlink(path) == e.digest
        assert sorted(p.relative_to(target).as_posix() for p in target.rglob("*")) == sorted(
            e.path for e in manifest.entries
        )


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


def test_submit_workspace_reads_a_directory_with_modes_and_refuses_one_over_the_limits(tmp_path: Path) -> None:
    root = tmp_path / "ws"
    (root / "a" / "b").mkdir(parents=True)
    (root / "a" / "b" / "run.sh").write_bytes(b"#!/bin/sh\necho ok\n")
    os.chmod(root / "a" / "b" / "run.sh", 0o755)
    (root / "data.bin").write_bytes(bytes(range(256)))
    spec = TaskSubmission.model_validate(
        {**scripted([{"text": "x"}]).model_dump(mode="json"), "workspace": read_workspace(str(root))}
    )
    manifest, blobs = spec.workspace.seed()  # type: ignore[union-attr]
    files = {e.path: e for e in manifest.entries if e.kind == "f"}
    assert files["a/b/run.sh"].mode == 0o755 and blobs[files["data.bin"].digest] == bytes(range(256))
    many = tmp_path / "many"
    many.mkdir()
    for i in range(MAX_SEED_FILES + 1):
        (many / f"f{i}").write_bytes(b"")
    with pytest.raises(UsageError, match="more than 1000 files"):
        read_workspace(str(many))
    big = tmp_path / "big"
    big.mkdir()
    (big / "x").write_bytes(os.urandom(130 * 1024))
    with pytest.raises(UsageError, match="over the"):
        read_workspace(str(big))


class HostileServer:
    """A client whose server names paths a real one never would: the download must refuse them."""

    def __init__(self, entries: list[FileEntry]) -> None:
        self.entries = entries

    def files(self, task_id: str, *, step: int | None = None, after: str | None = None, limit: int = 1000) -> Any:
        return FileList(task_id=task_id, step=1, manifest=None, total_files=len(self.entries), total_bytes=0,
                        files=self.entries, next_after=None)  # fmt: skip

    def iter_files(self, task_id: str, *, step: int | None = None) -> Iterator[FileEntry]:
        return iter(self.entries)

    def file(self, task_id: str, path: str, *, step: int | None = None) -> bytes:
        return b"pwned"


@pytest.mark.parametrize(
    "entries",
    [
        [FileEntry(path="../escaped.txt", kind="file", mode=0o644, size=5)],
        [FileEntry(path="/tmp/escaped.txt", kind="file", mode=0o644, size=5)],
        [FileEntry(path="a/../../escaped.txt", kind="file", mode=0o644, size=5)],
        [FileEntry(path="out", kind="link", mode=0o777, size=0, target=".."),
         FileEntry(path="out/escaped.txt", kind="file", mode=0o644, size=5)],
    ],
)  # fmt: skip
def test_a_download_writes_nothing_outside_its_directory(tmp_path: Path, entries: list[FileEntry]) -> None:
    target = tmp_path / "inner" / "dir"
    with pytest.raises(UsageError):
        download(HostileServer(entries), "t", str(target))
    assert not list(tmp_path.rglob("escaped.txt"))
    assert not Path("/tmp/escaped.txt").exists()


@pytest.mark.parametrize("second", ["dir", "file", "link"])
def test_a_download_changes_no_mode_outside_its_directory_when_a_path_is_named_twice(
    tmp_path: Path, second: Literal["dir", "file", "link"]
) -> None:
    outside = tmp_path / "outside"
    outside.mkdir(mode=0o700)
    (outside / "secret").write_text("s")
    os.chmod(outside / "secret", 0o600)
    entries = [FileEntry(path="x", kind="link", mode=0o777, size=0, target=str(outside)),
               FileEntry(path="x", kind=second, mode=0o777, size=5, target=None)]  # fmt: skip
    with pytest.raises(UsageError, match="'x' twice"):
        download(HostileServer(entries), "t", str(tmp_path / "dl"))
    assert stat.S_IMODE(outside.stat().st_mode) == 0o700  # was: 0o777 (mkdir exist_ok and chmod followed x)
    assert (outside / "secret").read_text() == "s" and stat.S_IMODE((outside / "secret").stat().st_mode) == 0o600


def test_a_downloads_modes_are_set_on_its_own_entries_never_through_a_link(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir(mode=0o700)
    entries = [FileEntry(path="d", kind="dir", mode=0o555, size=0),
               FileEntry(path="d/f", kind="file", mode=0o640, size=5),
               FileEntry(path="l", kind="link", mode=0o777, size=0, target=str(outside))]  # fmt: skip
    assert download(HostileServer(entries), "t", str(tmp_path / "dl")) == 1
    dl = tmp_path / "dl"
    assert stat.S_IMODE((dl / "d").stat().st_mode) == 0o555 and stat.S_IMODE((dl / "d" / "f").stat().st_mode) == 0o640
    assert os.readlink(dl / "l") == str(outside) and stat.S_IMODE(outside.stat().st_mode) == 0o700
    os.chmod(dl / "d", 0o755)  # so pytest can remove it


def test_submit_workspace_of_nothing_there_exits_2_naming_workspace(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """(A directory over the inline limits is uploaded: tests/test_workspace_sources.py.)"""
    from agentq.cli.main import main

    missing = tmp_path / "missing"
    code = main(["submit", "g", "--url", "http://127.0.0.1:9", "--script", "first_task", "--workspace", str(missing)])
    assert code == 2 and "--workspace" in capsys.readouterr().err


def test_the_files_command_prints_the_listing_a_file_and_a_diff(
    store: Storage, api: Client, task_id: str, capsysbinary: pytest.CaptureFixture[bytes]
) -> None:
    from agentq.cli.main import main

    assert main(["files", task_id, "--url", api.url]) == 0
    listing = capsysbinary.readouterr().out.decode()
    assert "0750 file         13 src/app.py" in listing and "link -> src/app.py" in listing
    assert main(["files", task_id, "blob.bin", "--url", api.url]) == 0
    assert capsysbinary.readouterr().out == b"\x00\xff"
    assert main(["files", task_id, "--diff", "0..", "--url", api.url]) == 0
    out = capsysbinary.readouterr()
    assert "removed  seed.txt" in out.err.decode() and "+print('bye')" in out.out.decode()
    assert main(["files", task_id, "--diff", "x..y", "--url", api.url]) == 2


def test_answers_stay_bounded_a_large_file_is_refused_and_a_long_diff_is_cut(
    store: Storage, api: Client, tmp_path: Path
) -> None:
    from agentq.control.files import MAX_FILE_BYTES, MAX_PATCH_CHARS

    make = (f"head -c {MAX_FILE_BYTES + 1} /dev/zero > big.bin && "
            "python3 -c \"open('t.txt', 'w').write(''.join(f'line {i}\\n' for i in range(40000)))\"")  # fmt: skip
    sub = scripted([{"text": "1", "tool_calls": [call("shell", command=make)]}, {"text": "done"}], tools=["shell"])
    task = store.tasks.create(sub, tenant=LOCAL_TENANT)
    config = EngineConfig(lease_seconds=10, workspace_root=str(tmp_path / "root"))
    Engine(store, worker_id="w1", tools=default_registry(), config=config).run(task.task_id)
    listed = {e.path: e.size for e in api.files(task.task_id).files}
    assert listed["big.bin"] == MAX_FILE_BYTES + 1
    with pytest.raises(ApiError) as caught:
        api.file(task.task_id, "big.bin")
    assert (caught.value.status, caught.value.field) == (422, "path")
    found = api.diff(task.task_id, 0)
    assert found.added == ["big.bin", "t.txt"] and found.truncated
    named = (
        f"+++ b/big.bin\nLarge files differ (b: {MAX_FILE_BYTES + 1} bytes, sha256 "  # sizes and hashes: compare them
    )
    assert named in found.patch and len(found.patch) <= MAX_PATCH_CHARS


def test_a_download_goes_only_into_a_new_or_empty_directory(tmp_path: Path) -> None:
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "mine.txt").write_text("keep")
    entries = [FileEntry(path="mine.txt", kind="file", mode=0o644, size=5)]
    with pytest.raises(UsageError) as caught:
        download(HostileServer(entries), "t", str(taken))
    assert caught.value.field == "directory" and (taken / "mine.txt").read_text() == "keep"
    assert download(HostileServer(entries), "t", str(tmp_path / "new" / "dir")) == 1
