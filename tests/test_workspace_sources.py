"""Where a workspace's starting files come from (control/workspaces.py, core/workspace_archive.py,
core/engine/_workspace_clone.py): an archive uploaded first (``POST /workspace-uploads``, named by
``workspace.upload``) and a git repository on an allowed host (``workspace.git``), from a
submission or an agent definition.

Real parts throughout: the API served over HTTP on moto server, archives made with tarfile and
zipfile, a git repository served over HTTP on loopback and cloned by real git in the workspace's
bubblewrap sandbox through the egress proxy, the engine with the scripted provider. Every
refusal is checked to have written nothing (no object in the bucket, no task)."""

from __future__ import annotations

import base64
import hashlib
import io
import os
import re
import subprocess
import sys
import tarfile
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agentq.api.app import build_app
from agentq.api.client import ApiError, Client
from agentq.api.http_server import LOCAL_TENANT, ApiServer
from agentq.control.agents import create_agent
from agentq.control.submit import submit
from agentq.core.engine import Engine, EngineConfig
from agentq.core.errors import ValidationError
from agentq.core.models import TaskStatus
from agentq.core.tools import default_registry
from agentq.core.tools.egress import egress_factory
from agentq.core.tools.fetch import FetchPolicy, HostRule
from agentq.core.workspace import WorkspaceQuota
from agentq.core.workspace_archive import ArchiveLimits, ArchiveRefused, unpack
from agentq.storage.container import Storage

from tests.helpers import call, scripted

sys.path.insert(0, str(Path(__file__).parent.parent / "examples" / "coding_agent"))
from coding_agent import make_repository, serve  # type: ignore[import-not-found]

pytestmark = pytest.mark.skipif(not os.path.exists("/usr/bin/bwrap"), reason="the workspace tools need bubblewrap")
TOOLS = ["shell", "write_file", "read_file"]


# ---------------------------------------------------------------- archives


def tar_of(members: list[tuple[tarfile.TarInfo, bytes | None]], mode: str = "w:gz") -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode=mode) as archive:  # type: ignore[call-overload]
        for info, data in members:
            if data is not None:
                info.size = len(data)
            archive.addfile(info, io.BytesIO(data) if data is not None else None)
    return out.getvalue()


def member(name: str, kind: bytes = tarfile.REGTYPE, *, link: str = "", mode: int = 0o644) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname, info.mode = kind, link, mode
    return info


def zip_of(members: list[tuple[str, bytes, int]]) -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, data, unix in members:
            info = zipfile.ZipInfo(name)
            info.external_attr = unix << 16
            archive.writestr(info, data)
    return out.getvalue()


def latin1_tar(info: tarfile.TarInfo, data: bytes | None = None) -> bytes:
    """A tar whose names are Latin-1, not UTF-8 (as a tool on a Latin-1 system writes them)."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.GNU_FORMAT, encoding="latin-1") as archive:
        info.size = len(data or b"")
        archive.addfile(info, io.BytesIO(data) if data is not None else None)
    return out.getvalue()


GOOD = tar_of([
    (member("proj", tarfile.DIRTYPE, mode=0o750), None),
    (member("proj/run.sh", mode=0o4755), b"#!/bin/sh\necho run\n"),
    (member("proj/data.bin"), b"\x00\xff" * 100),
    (member("proj/same.txt"), b"shared\n"),
    (member("proj/again.txt", tarfile.LNKTYPE, link="proj/same.txt"), None),
    (member("proj/latest", tarfile.SYMTYPE, link="run.sh"), None),
    (member("./top.txt"), b"top\n"),
])  # fmt: skip

FILE = (member("ok.txt"), b"ok\n")
# Each archive that would unpack outside its root or is not a workspace's, and a word its refusal says.
BAD_TARS: dict[str, tuple[bytes, str]] = {
    "dotdot": (tar_of([FILE, (member("a/../../x"), b"x")]), "'..'"),
    "absolute": (tar_of([(member("/etc/x"), b"x")]), "absolute"),
    "symlink out": (tar_of([(member("l", tarfile.SYMTYPE, link="../outside"), None)]), "outside the root"),
    "symlink absolute": (tar_of([(member("l", tarfile.SYMTYPE, link="/etc/passwd"), None)]), "outside the root"),
    # x -> . is inside, but x/.. through it climbs out: a link target must be normal
    "symlink through a link": (tar_of([(member("x", tarfile.SYMTYPE, link="."), None),
                                       (member("y", tarfile.SYMTYPE, link="x/.."), None)]), "outside the root"),
    "under a link": (tar_of([(member("d", tarfile.SYMTYPE, link="sub"), None), (member("d/f"), b"f")]), "under"),
    "hardlink out": (tar_of([(member("h", tarfile.LNKTYPE, link="/etc/passwd"), None)]), "hard link"),
    "hardlink to a later member": (tar_of([(member("h", tarfile.LNKTYPE, link="f"), None), (member("f"), b"f")]),
                                   "hard link"),
    "char device": (tar_of([(member("null", tarfile.CHRTYPE), None)]), "device"),
    "block device": (tar_of([(member("sda", tarfile.BLKTYPE), None)]), "device"),
    "fifo": (tar_of([(member("pipe", tarfile.FIFOTYPE), None)]), "FIFO"),
    "twice": (tar_of([FILE, FILE]), "twice"),
    "file and dir": (tar_of([FILE, (member("ok.txt/inner"), b"i")]), "file and a directory"),
    "backslash": (tar_of([(member("a\\..\\b"), b"x")]), "backslash"),
    "not an archive": (b"just some bytes, not an archive", "not a tar"),
    "name not utf8": (latin1_tar(member("caf\xe9.txt"), b"x"), "its name is not UTF-8"),
    "link target not utf8": (latin1_tar(member("l", tarfile.SYMTYPE, link="caf\xe9")), "which is not UTF-8"),
    "zip link target not utf8": (zip_of([("l", b"caf\xe9", 0o120777)]), "which is not UTF-8"),
    "zip dotdot": (zip_of([("../evil", b"x", 0o100644)]), "'..'"),
    "zip absolute": (zip_of([("/evil", b"x", 0o100644)]), "absolute"),
    "zip symlink out": (zip_of([("l", b"../../etc", 0o120777)]), "outside the root"),
    "zip device": (zip_of([("dev", b"", 0o020644)]), "device"),
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(BAD_TARS))
def test_an_archive_member_outside_its_root_or_of_a_bad_kind_is_refused_naming_it(case: str) -> None:
    data, said = BAD_TARS[case]
    with pytest.raises(ArchiveRefused, match="(?i)" + said.replace("(", r"\(").replace(".", r"\.")):
        unpack(data)


def test_an_archive_member_whose_name_or_link_target_is_not_utf8_is_refused_naming_it_escaped() -> None:
    # was: accepted, the manifest holding 'caf\udce9.txt', and every task starting from it failed
    with pytest.raises(ArchiveRefused, match=re.escape("member 'caf\\xe9.txt': its name is not UTF-8")):
        unpack(BAD_TARS["name not utf8"][0])
    for case in ("link target not utf8", "zip link target not utf8"):  # the zip's was kept as 'caf\ufffd'
        with pytest.raises(ArchiveRefused, match=re.escape("member 'l': a symbolic link to 'caf\\xe9'")):
            unpack(BAD_TARS[case][0])


def test_an_archive_past_the_limits_is_refused_however_small_it_is_packed() -> None:
    bomb = tar_of([(member("zeros"), b"\x00" * 2_000_001)], mode="w:xz")  # a few KB packed
    assert len(bomb) < 10_000
    for limit in (1, 1_000, 2_000_000):
        with pytest.raises(ArchiveRefused, match="more than"):
            unpack(bomb, ArchiveLimits(max_bytes=limit))
    unpack(bomb, ArchiveLimits(max_bytes=2_000_001))  # exactly at it: kept
    many = zip_of([(f"f{i}", b"", 0o100644) for i in range(11)])
    with pytest.raises(ArchiveRefused, match="more than 10 members"):
        unpack(many, ArchiveLimits(max_files=10))
    zbomb = zip_of([("z", b"\x00" * 3_000_000, 0o100644)])
    with pytest.raises(ArchiveRefused, match="more than"):
        unpack(zbomb, ArchiveLimits(max_bytes=1_000_000))


def test_a_good_archive_keeps_its_files_modes_and_links_with_set_id_bits_dropped() -> None:
    manifest, blobs = unpack(GOOD)
    rows = {e.path: (e.kind, e.mode, e.size) for e in manifest.entries}
    assert rows == {
        "proj": ("d", 0o750, 0),
        "proj/run.sh": ("f", 0o755, 19),
        "proj/data.bin": ("f", 0o644, 200),
        "proj/same.txt": ("f", 0o644, 7),
        "proj/again.txt": ("f", 0o644, 7),  # the hard link: a second file with the same content
        "proj/latest": ("l", 0o777, 0),
        "top.txt": ("f", 0o644, 4),
    }
    assert manifest.by_path()["proj/latest"].digest == "run.sh"
    assert set(blobs) == manifest.blobs() and len(blobs) == 4  # the shared content once
    for e in manifest.entries:
        if e.kind == "f":
            assert hashlib.sha256(blobs[e.digest]).hexdigest() == e.digest


@pytest.fixture
def api(store: Storage) -> Iterator[Client]:
    server = ApiServer(build_app(store, default_registry(), None, default_tenant=LOCAL_TENANT).resolve).start()  # type: ignore[arg-type]
    try:
        yield Client(server.url)
    finally:
        server.stop()


def objects(store: Storage) -> list[str]:
    s3, bucket = store.payloads.s3, store.payloads.bucket  # type: ignore[attr-defined]
    return [
        o["Key"]
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket)
        for o in page.get("Contents", [])
    ]


def upload(api: Client, data: bytes) -> dict[str, Any]:
    answer: dict[str, Any] = api.request("POST", "/workspace-uploads", {"archive_b64": base64.b64encode(data).decode()})
    return answer


@pytest.mark.parametrize(
    "case", ["dotdot", "symlink out", "hardlink out", "char device", "zip dotdot", "name not utf8"]
)
def test_the_upload_route_refuses_a_bad_archive_with_422_naming_archive_and_writes_nothing(
    store: Storage, api: Client, case: str
) -> None:
    before = objects(store)
    with pytest.raises(ApiError) as refused:
        upload(api, BAD_TARS[case][0])
    assert refused.value.status == 422 and refused.value.field == "archive", refused.value
    assert objects(store) == before


def test_the_upload_route_refuses_bad_base64_and_takes_a_body_past_the_apis_usual_limit(
    store: Storage, api: Client
) -> None:
    for text in ("not base64!", "}\u00bd\u000e1^"):  # the second once a 500 (found by tests/test_api_schema.py)
        with pytest.raises(ApiError) as bad:
            api.request("POST", "/workspace-uploads", {"archive_b64": text})
        assert bad.value.status == 422 and bad.value.field == "archive_b64"
    assert objects(store) == []
    noise = os.urandom(3 * 1024 * 1024)  # 4 MB of base64: over the 256 KB of any other route
    assert upload(api, tar_of([(member("noise"), noise)]))["bytes"] == len(noise)


def test_an_uploaded_archive_is_step_0s_files_shared_not_copied_and_only_changes_are_stored(
    store: Storage, api: Client, tmp_path: Path
) -> None:
    done = upload(api, GOOD)
    want, _ = unpack(GOOD)
    assert done["upload"] == want.digest and done["files"] == 5
    assert upload(api, GOOD)["stored_bytes"] == 0  # content-addressed: the same archive again stores nothing
    turns = [{"text": "1", "tool_calls": [call("write_file", path="new.txt", content="new\n")]}, {"text": "done"}]
    sub = {**scripted(turns, tools=TOOLS).model_dump(mode="json"), "workspace": {"upload": done["upload"]}}
    task_id = api.request("POST", "/tasks", sub)["task_id"]
    assert api.files(task_id, step=0).manifest == want.digest
    Engine(store, worker_id="w", config=EngineConfig(workspace_root=str(tmp_path))).run(task_id)
    assert store.tasks.get(task_id).status is TaskStatus.SUCCEEDED
    listed = {e.path for e in api.files(task_id).files}
    assert listed == {e.path for e in want.entries} | {"new.txt"}
    assert api.file(task_id, "proj/data.bin") == b"\x00\xff" * 100
    own = [k for k in objects(store) if f"/{task_id}/workspace/blobs/" in k]
    assert len(own) == 1  # new.txt's content; the archive's stays where it was uploaded, once


def test_a_submission_naming_an_upload_that_is_not_there_or_a_base_is_refused(store: Storage, api: Client) -> None:
    done = upload(api, GOOD)
    base = scripted([{"text": "x"}], tools=TOOLS).model_dump(mode="json")
    cases = {
        "workspace.upload": {"upload": "0" * 64},
        "workspace.base": {"base": {"manifest": done["upload"], "lookup": ["task:someone-else"]}},
        "workspace.git": {"upload": done["upload"], "git": {"url": "http://h.example/r.git"}, "allow_hosts": ["h.example"]},
    }  # fmt: skip
    for field, workspace in cases.items():
        with pytest.raises(ApiError) as refused:
            api.request("POST", "/tasks", {**base, "workspace": workspace})
        assert refused.value.status == 422 and refused.value.field == field, (field, refused.value)
    # another tenant's upload is not there for this one
    with pytest.raises(ValidationError) as other:
        submit(store, default_registry(), {**base, "workspace": {"upload": done["upload"]}}, tenant="other")
    assert other.value.field == "workspace.upload"


def test_submit_workspace_uploads_a_directory_past_the_inline_limits_and_an_archive_file(
    store: Storage, api: Client, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from agentq.cli.main import main

    big = tmp_path / "big"
    (big / "sub").mkdir(parents=True)
    noise = os.urandom(130 * 1024)  # over the 160 KB of base64 a submission carries inline
    (big / "sub" / "noise").write_bytes(noise)
    (big / "run.sh").write_bytes(b"echo hi\n")
    (big / "run.sh").chmod(0o750)
    archive = tmp_path / "start.tar.gz"
    archive.write_bytes(GOOD)
    for source, path, want in ((big, "sub/noise", noise), (archive, "proj/data.bin", b"\x00\xff" * 100)):
        code = main(["submit", "g", "--url", api.url, "--script", "first_task", "--json", "--workspace", str(source)])
        assert code == 0, capsys.readouterr().err
        import json

        task_id = json.loads(capsys.readouterr().out)["task_id"]
        workspace = store.tasks.get(task_id).submission.workspace
        assert workspace is not None and workspace.upload is not None and not workspace.files
        assert api.file(task_id, path, step=0) == want
    assert {e.path: e.mode for e in api.files(task_id, step=0).files}["proj/run.sh"] == 0o755
    bad = tmp_path / "bad.tar"
    bad.write_bytes(BAD_TARS["symlink out"][0])
    before = objects(store)
    assert main(["submit", "g", "--url", api.url, "--script", "first_task", "--workspace", str(bad)]) != 0
    assert "archive" in capsys.readouterr().err
    assert objects(store) == before


# ---------------------------------------------------------------- git


@pytest.fixture
def repo(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """A repository on loopback: main (add() subtracts), a tag v1 at it, a branch fix (add() adds)."""
    bare = make_repository(tmp_path / "srv")
    work = tmp_path / "fix"
    env = {
        "GIT_AUTHOR_DATE": "2026-01-02T00:00:00Z",
        "GIT_COMMITTER_DATE": "2026-01-02T00:00:00Z",
        "HOME": str(tmp_path),
    }
    git = ["git", "-c", "user.name=d", "-c", "user.email=d@example.com"]
    subprocess.run([*git, "clone", "-q", str(bare), str(work)], check=True, env=env)
    subprocess.run([*git, "tag", "v1"], cwd=work, check=True, env=env)
    subprocess.run([*git, "checkout", "-qb", "fix"], cwd=work, check=True, env=env)
    (work / "calc.py").write_text("def add(a, b):\n    return a + b\n")
    subprocess.run([*git, "commit", "-qam", "fix"], cwd=work, check=True, env=env)
    subprocess.run([*git, "push", "-q", "origin", "fix", "v1"], cwd=work, check=True, env=env)
    subprocess.run(["git", "update-server-info"], cwd=bare, check=True, env=env)
    with serve(tmp_path / "srv") as host:
        yield host, work


def engine(store: Storage, root: Path, host: str, **config: Any) -> Engine:
    policy = FetchPolicy(allow=(HostRule.parse(host),))  # the deployment lets this loopback address through
    return Engine(store, worker_id="w", config=EngineConfig(workspace_root=str(root), **config),
                  egress=egress_factory(policy))  # fmt: skip


def git_task(store: Storage, host: str, ref: str | None, **workspace: Any) -> str:
    turns = [{"text": "1", "tool_calls": [call("shell", command="cat calc.py; git rev-parse --abbrev-ref HEAD")]},
             {"text": "done"}]  # fmt: skip
    git = {"url": f"http://{host}/calc.git", **({"ref": ref} if ref else {})}
    sub = {**scripted(turns, tools=TOOLS).model_dump(mode="json"),
           "workspace": {"git": git, "allow_hosts": [host], **workspace}}  # fmt: skip
    return submit(store, default_registry(), sub, tenant=LOCAL_TENANT).task_id


@pytest.mark.parametrize(("ref", "body"), [(None, "a - b"), ("main", "a - b"), ("v1", "a - b"), ("fix", "a + b")])
def test_a_git_workspace_is_the_repository_at_its_ref_as_step_0s_files(
    store: Storage, api: Client, repo: tuple[str, Path], tmp_path: Path, ref: str | None, body: str
) -> None:
    host, _ = repo
    task_id = git_task(store, host, ref)
    engine(store, tmp_path / "w", host).run(task_id)
    task = store.tasks.get(task_id)
    assert task.status is TaskStatus.SUCCEEDED, task.error
    assert task.workspace_start is not None
    step0 = api.files(task_id, step=0)
    assert step0.manifest == task.workspace_start.manifest
    assert {"calc.py", "test_calc.py", ".git/HEAD"} <= {e.path for e in step0.files}
    assert f"return {body}" in api.file(task_id, "calc.py", step=0).decode()


def test_a_git_commit_id_is_a_ref_too(store: Storage, api: Client, repo: tuple[str, Path], tmp_path: Path) -> None:
    host, work = repo
    commit = subprocess.run(["git", "rev-parse", "fix"], cwd=work, capture_output=True, text=True, check=True).stdout
    task_id = git_task(store, host, commit.strip()[:12])
    engine(store, tmp_path / "w", host).run(task_id)
    assert "a + b" in api.file(task_id, "calc.py", step=0).decode()


def test_a_takeover_restores_the_recorded_clone_and_never_clones_again(
    store: Storage, api: Client, repo: tuple[str, Path], tmp_path: Path
) -> None:
    """The first run clones and records, then its worker is gone (its lease lapses); the branch
    moves on the server; the run that takes over restores the first clone."""
    host, work = repo
    task_id = git_task(store, host, "fix")
    first = engine(store, tmp_path / "a", host, lease_seconds=1)
    lease, task = store.tasks.claim(task_id, "dead-worker", 1)  # type: ignore[misc]
    session_engine = first
    import time

    from agentq.core.engine._session import LeaseState, Session

    held = LeaseState(lease=lease, tenant=task.tenant)
    session = Session(held=held, task=task, steps=[], messages=[], deadline=time.time() + 60)
    session_engine._workspaces.open(session)  # clones and records, as a claim does; then the worker dies
    session_engine._workspaces.close(session)
    recorded = store.tasks.get(task_id).workspace_start
    assert recorded is not None
    (work / "calc.py").write_text("moved on\n")
    env = {
        "HOME": str(tmp_path),
        "GIT_AUTHOR_DATE": "2026-01-03T00:00:00Z",
        "GIT_COMMITTER_DATE": "2026-01-03T00:00:00Z",
    }
    subprocess.run(
        ["git", "-c", "user.name=d", "-c", "user.email=d@e", "commit", "-qam", "moved"], cwd=work, check=True, env=env
    )
    subprocess.run(["git", "push", "-q", "origin", "fix"], cwd=work, check=True, env=env)
    bare = tmp_path / "srv" / "calc.git"
    subprocess.run(["git", "update-server-info"], cwd=bare, check=True, env=env)
    time.sleep(1.1)  # the dead worker's 1 s lease lapses: an observable deadline, not a wait for a race
    engine(store, tmp_path / "b", host).run(task_id)
    task = store.tasks.get(task_id)
    assert task.status is TaskStatus.SUCCEEDED and task.workspace_start == recorded
    assert "a + b" in api.file(task_id, "calc.py", step=0).decode()
    assert "moved on" not in api.file(task_id, "calc.py").decode()


@pytest.mark.parametrize(
    ("git", "field"),
    [
        ({"url": "http://elsewhere.example/calc.git"}, "workspace.git.url"),
        ({"url": "ssh://HOST/calc.git"}, "workspace.git.url"),
        ({"url": "http://user:secret@HOST/calc.git"}, "workspace.git.url"),
        ({"url": "file:///etc"}, "workspace.git.url"),
        ({"url": "http://HOST/calc.git", "ref": "--upload-pack=touch /tmp/x"}, "workspace.git.ref"),
        ({"url": "http://HOST/calc.git", "ref": "a..b"}, "workspace.git.ref"),
        ({"url": "http://HOST/calc.git", "ref": "HEAD@{1}"}, "workspace.git.ref"),
    ],
)
def test_a_git_source_on_a_host_not_allowed_or_malformed_is_422_naming_the_field(
    store: Storage, api: Client, git: dict[str, str], field: str
) -> None:
    host = "127.0.0.1:9"
    git = {k: v.replace("HOST", host) for k, v in git.items()}
    sub = {**scripted([{"text": "x"}], tools=TOOLS).model_dump(mode="json"),
           "workspace": {"git": git, "allow_hosts": [host]}}  # fmt: skip
    with pytest.raises(ApiError) as refused:
        api.request("POST", "/tasks", sub)
    assert refused.value.status == 422 and refused.value.field == field, refused.value


@pytest.mark.parametrize(
    ("case", "code"),
    [("ref", "workspace_git_ref_not_found"), ("repo", "workspace_git_failed"), ("guard", "workspace_git_failed"),
     ("quota", "workspace_git_too_large"), ("name", "workspace_git_failed")],
)  # fmt: skip
def test_a_clone_that_cannot_be_made_fails_the_task_with_its_code_and_records_nothing(
    store: Storage, repo: tuple[str, Path], tmp_path: Path, case: str, code: str
) -> None:
    host, work = repo
    if case == "name":  # a branch holding a file whose name is not UTF-8 (was: processing_failed, UnicodeEncodeError)
        with open(os.path.join(os.fsencode(work), b"caf\xe9.txt"), "w") as f:
            f.write("x")
        git = ["git", "-c", "user.name=d", "-c", "user.email=d@e"]
        for args in (
            ["checkout", "-qb", "latin1"],
            ["add", "-A"],
            ["commit", "-qm", "x"],
            ["push", "-q", "origin", "latin1"],
        ):
            subprocess.run([*git, *args], cwd=work, check=True, env={"HOME": str(tmp_path), "PATH": os.environ["PATH"]})
        subprocess.run(["git", "update-server-info"], cwd=tmp_path / "srv" / "calc.git", check=True)
    task_id = git_task(store, host, {"ref": "no-such-branch", "name": "latin1"}.get(case, "main"))
    if case == "repo":
        sub = store.tasks.get(task_id).submission.model_dump(mode="json")
        sub["workspace"]["git"]["url"] = f"http://{host}/missing.git"
        task_id = submit(store, default_registry(), sub, tenant=LOCAL_TENANT).task_id
    runner = engine(store, tmp_path / "w", host)
    if case == "guard":  # the task allows the host, the deployment's SSRF guard does not (loopback)
        runner = Engine(store, worker_id="w", config=EngineConfig(workspace_root=str(tmp_path / "w")),
                        egress=egress_factory(FetchPolicy()))  # fmt: skip
    if case == "quota":
        runner = engine(store, tmp_path / "w", host, workspace_quota=WorkspaceQuota(max_files=5))
    runner.run(task_id)
    task = store.tasks.get(task_id)
    assert task.status is TaskStatus.FAILED and task.error is not None and task.error["code"] == code, task.error
    assert case != "name" or "'caf\\xe9.txt' is not UTF-8" in task.error["message"]
    assert task.step == 0 and task.workspace is None and task.workspace_start is None
    assert [k for k in objects(store) if f"/{task_id}/workspace/" in k] == []
    assert not any((tmp_path / "w").rglob("calc.py"))  # the half-made directory is gone too


# ---------------------------------------------------------------- agent definitions


def test_an_agent_without_a_workspace_keeps_the_digest_it_had_before_agents_could_carry_one() -> None:
    from agentq.core.agents import AgentSpec

    spec = AgentSpec(name="helper", provider="scripted", script="research", system="s", tools=["shell"])
    # computed with main before this change: a stored version compares equal to the same file applied again
    assert spec.digest() == "38c0eb1e817bc4cc0ccac2cd6058d6a487673cb160d735b181744b406f43ecef"
    with_ws = AgentSpec(**{**spec.model_dump(), "workspace": {"allow_hosts": ["h.example"]}})
    assert with_ws.digest() != spec.digest()


def test_an_agent_defines_its_tasks_hosts_and_a_default_start_and_a_submission_may_name_its_own_start(
    store: Storage, api: Client, repo: tuple[str, Path], tmp_path: Path
) -> None:
    host, _ = repo
    turns = [{"text": "1", "tool_calls": [call("shell", command="cat calc.py")]}, {"text": "done"}]
    create_agent(store, default_registry(), {
        "name": "coder", "provider": "scripted", "script": {"turns": turns}, "tools": TOOLS,
        "workspace": {"allow_hosts": [host], "git": {"url": f"http://{host}/calc.git", "ref": "fix"}},
    }, tenant=LOCAL_TENANT)  # fmt: skip
    own = api.request("POST", "/tasks", {"goal": "g", "agent": "coder"})["task_id"]
    other = api.request(
        "POST",
        "/tasks",
        {"goal": "g", "agent": "coder", "workspace": {"git": {"url": f"http://{host}/calc.git", "ref": "v1"}}},
    )
    for task_id, body in ((own, "a + b"), (other["task_id"], "a - b")):
        engine(store, tmp_path / task_id, host).run(task_id)
        task = store.tasks.get(task_id)
        assert task.status is TaskStatus.SUCCEEDED, task.error
        assert task.submission.workspace is not None and task.submission.workspace.allow_hosts == [host]
        assert f"return {body}" in api.file(task_id, "calc.py", step=0).decode()
    refusals: dict[str, dict[str, Any]] = {
        "workspace.allow_hosts": {"allow_hosts": ["evil.example"]},
        "workspace.git.url": {"git": {"url": "http://evil.example/x.git"}},
    }
    for field, workspace in refusals.items():
        with pytest.raises(ApiError) as refused:
            api.request("POST", "/tasks", {"goal": "g", "agent": "coder", "workspace": workspace})
        assert refused.value.status == 422 and refused.value.field == field, refused.value
    # an agent version is checked as a task would be
    agent_refusals: list[tuple[dict[str, Any], str]] = [
        ({"allow_hosts": ["a.example"], "git": {"url": "http://b.example/r.git"}}, "workspace.git.url"),
        ({"upload": "1" * 64}, "workspace.upload"),
        ({"base": {"manifest": "1" * 64}}, "workspace.base"),
    ]
    for spec, field in agent_refusals:
        with pytest.raises(ApiError) as refused:
            api.request(
                "POST", "/agents", {"name": "bad", "provider": "scripted", "script": "research", "workspace": spec}
            )
        assert refused.value.status == 422 and refused.value.field == field, refused.value
