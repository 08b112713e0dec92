"""A checkpoint of a run that opened a credential stores its workspace without the value
(core.workspace_scrub, ARCHITECTURE invariant 15): a file holding it is stored redacted wherever
the process put it (below a path past PATH_MAX, behind a mode that took the worker's access away,
across the scan's read windows, in UTF-16 or UTF-32), and a workspace holding it where it cannot
be redacted (a path, a link's target, a file too large to rewrite) is refused, the turn undone,
with nothing of it stored."""

from __future__ import annotations

import base64
import os
import subprocess
import sys
import urllib.parse
from collections.abc import Iterator
from pathlib import Path

import pytest

from agentq.core import workspace_disk
from agentq.core.engine._session import LeaseState, Session
from agentq.core.engine._workspace import Workspaces
from agentq.core.workspace import Manifest, WorkspaceHoldsCredential, WorkspaceQuota
from agentq.core.workspace_disk import read_verified, scan
from agentq.core.workspace_scrub import MAX_REWRITE_BYTES, OVERLAP, Scrub
from agentq.observe.redaction import REDACTED, REDACTOR, spellings
from agentq.observe.redaction_bytes import WIDEST
from agentq.storage.container import Storage

from tests.helpers import scripted

STORAGE = "memory"
needs_bwrap = pytest.mark.skipif(not os.path.exists("/usr/bin/bwrap"), reason="the workspace tools need bubblewrap")

SECRET = "sk-live-REVIEW-7f3a9c1e55d0b2"
SPLIT = "tok/9Zq3xLw2-split"  # a value with a "/", which a path splits across two names


class OpenedCredentials:
    """A run that opened a credential (its values held by the redactor)."""

    opened = True


@pytest.fixture
def held() -> Iterator[None]:
    hold = REDACTOR.hold()
    hold.add(SECRET, SPLIT)
    try:
        yield
    finally:
        hold.release()


def _session(store: Storage) -> Session:
    task = store.tasks.create(scripted([{"text": "done"}], tools=["shell"]), tenant="t")
    claimed = store.tasks.claim(task.task_id, "w1", 30)
    assert claimed is not None
    lease, task_held = claimed
    s = Session(held=LeaseState(lease=lease, tenant="t"), task=task_held, steps=[], messages=[], deadline=None)
    s.credentials = OpenedCredentials()
    return s


def _stored(store: Storage, task_id: str, digest: str) -> dict[str, bytes]:
    manifest = Manifest.from_bytes(store.workspaces.get_manifest(task_id, digest))
    return {e.path: store.workspaces.get_blob(task_id, e.digest) for e in manifest.entries if e.kind == "f"}


def _bucket_holds_a_value(store: Storage) -> list[str]:
    objects: dict[str, bytes] = store.workspaces.payloads.objects  # type: ignore[attr-defined]
    return [key for key, data in objects.items() if SECRET.encode() in data or SPLIT.encode() in data]


@needs_bwrap
def test_a_credential_a_process_writes_below_a_path_longer_than_path_max_is_stored_redacted(
    store: Storage, tmp_path: Path, held: None
) -> None:
    """A directory chain whose absolute path passes PATH_MAX (4096 bytes) cannot be walked by
    path; the checkpoint's scan walks it by descriptor, and the scrub is done in that walk, so
    the file the process wrote at its bottom is stored redacted, like one at the top."""
    s = _session(store)
    workspaces = Workspaces(store.workspaces, worker_id="w1", root=str(tmp_path / "root"), quota=WorkspaceQuota())
    workspaces.open(s)
    command = (
        'for i in $(seq 18); do n=$(printf "d%.0s" $(seq 250)); mkdir "$n" && cd "$n"; done; '
        f"echo 'token={SECRET}' > echo.txt; echo 'token={SECRET}' > /workspace/plain.txt"
    )
    result = s.workspace.shell(command, 30)
    assert result.exit_code == 0, result.stderr
    ref = workspaces.checkpoint(s)
    workspaces.close(s)
    assert ref is not None
    stored = _stored(store, s.task_id, ref.manifest)
    deep = [path for path in stored if path.endswith("/echo.txt")]
    assert len(deep) == 1 and len(deep[0]) > 4096, "the file is not below PATH_MAX"
    assert stored[deep[0]] == stored["plain.txt"] == f"token={REDACTED}\n".encode()
    assert _bucket_holds_a_value(store) == []


AS_NOBODY = r"""
import itertools, os, stat, sys
from pathlib import Path
from agentq.core.workspace import WorkspaceRefused
from agentq.core.workspace_disk import read_verified, scan
from agentq.core.workspace_scrub import Scrub
from agentq.observe.redaction import REDACTED, REDACTOR

os.chdir(sys.argv[1])  # owned by nobody
os.setgid(65534)
os.setuid(65534)
REDACTOR.hold().add(sys.argv[2])
refused = []
for dir_bits, file_bits in itertools.product(range(8), range(8)):
    ws = Path(f"ws-{dir_bits}{file_bits}")
    (ws / "d").mkdir(parents=True)
    (ws / "d" / "echo.txt").write_text(f"token={sys.argv[2]}\n")
    os.chmod(ws / "d" / "echo.txt", file_bits << 6)  # what the process did before its call ended
    os.chmod(ws / "d", dir_bits << 6)
    try:
        manifest = scan(ws, scrub=Scrub())
        stored = {e.path: read_verified(ws, e) for e in manifest.entries if e.kind == "f"}
    except WorkspaceRefused:
        refused.append(f"{dir_bits}{file_bits}")
        continue
    assert stored == {"d/echo.txt": f"token={REDACTED}\n".encode()}, (dir_bits, file_bits, stored)
    assert {e.path: e.mode for e in manifest.entries} == {"d": dir_bits << 6, "d/echo.txt": file_bits << 6}
    assert scan(ws).digest == manifest.digest, (dir_bits, file_bits)  # every mode put back
print(" ".join(refused))
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to become uid 65534 (a worker that is not root)")
def test_a_credential_behind_any_mode_the_process_left_is_stored_redacted_or_the_checkpoint_refused(
    tmp_path: Path,
) -> None:
    """A worker that is not root (Fargate's uid 65534, the EC2 tier's ``agentq``) owns the
    sandbox's files, so a process's chmod takes the worker's own access away. For every owner
    mode of a file and of its directory, the scan gives itself access as it does for the hash and
    stores the file redacted, or refuses the checkpoint (a directory it may list but not search):
    never stored as it is. The modes are recorded as the process left them."""
    home = tmp_path / "nobody"
    home.mkdir()
    os.chown(home, 65534, 65534)
    done = subprocess.run(
        [sys.executable, "-c", AS_NOBODY, str(home), SECRET], check=False, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [f"{d}{f}" for d in (4, 6) for f in range(8)]  # r without x: unsearchable


ENCODINGS = ["utf-8", "utf-16-le", "utf-16-be", "utf-32-le", "utf-32-be"]


@pytest.mark.parametrize(("before", "after"), [(b"x", b"y"), (b"\0", b"\0"), (b"x", b"\0"), (b"\0", b"y")])
@pytest.mark.parametrize("encoding", ENCODINGS)
def test_a_credential_across_the_scans_read_windows_is_redacted_at_every_offset(
    tmp_path: Path, held: None, monkeypatch: pytest.MonkeyPatch, encoding: str, before: bytes, after: bytes
) -> None:
    """The scan reads a file a window at a time, keeping the last ``OVERLAP`` bytes of one in
    the next (in the code, more than the longest spelling of any value in the widest encoding),
    and passes over a window of NULs alone. With windows of 1 KiB and the overlap cut to the
    least that keeps this value whole in one window (its bytes less one), the value in any
    encoding, between text or NULs, at every offset across a window's end, is redacted in the
    stored bytes as in the whole file at once."""
    value = SECRET.encode(encoding)
    assert len(value) <= WIDEST * max(len(s) for s in spellings(SECRET)) <= OVERLAP
    monkeypatch.setattr(workspace_disk, "CHUNK", 1024)
    monkeypatch.setattr(workspace_disk, "OVERLAP", len(value) - 1)
    root = tmp_path / "ws"
    root.mkdir()
    written = {f"{at:05}": before * at + value + after * 3000 for at in range(1024 - len(value) - 1, 1024 + 2)}
    for name, data in written.items():
        (root / name).write_bytes(data)
    manifest = scan(root, scrub=Scrub())
    for entry in manifest.entries:
        whole = REDACTOR.redact_encoded(written[entry.path])
        assert read_verified(root, entry) == whole != written[entry.path], entry.path
        if (before, after) == (b"x", b"y"):  # NULs around it may read as another encoding of it
            assert whole == before * int(entry.path) + REDACTED.encode(encoding) + after * 3000


def test_a_file_over_what_is_rewritten_that_holds_a_credential_refuses_the_checkpoint(
    tmp_path: Path, held: None
) -> None:
    """A file holding a value is rewritten whole in memory, so up to ``MAX_REWRITE_BYTES``; a
    larger one (sparse here: the size is apparent) refuses the checkpoint wherever the value is
    in it, naming the file redacted. One at the limit is rewritten, one over it without a value
    is stored as it is."""
    root = tmp_path / "ws"
    root.mkdir()
    for name, size in (("at-limit", MAX_REWRITE_BYTES), ("over-clean", MAX_REWRITE_BYTES + 1)):
        with open(root / name, "wb") as f:
            f.truncate(size - len(SECRET) - 1)
            f.seek(0, os.SEEK_END)
            f.write(b"=" + (SECRET.encode() if name == "at-limit" else b"x" * len(SECRET)))
    manifest = scan(root, scrub=Scrub())
    assert {e.path: e.size for e in manifest.entries} == {
        "at-limit": MAX_REWRITE_BYTES - len(SECRET) + len(REDACTED),
        "over-clean": MAX_REWRITE_BYTES + 1,
    }
    for where in (0, MAX_REWRITE_BYTES // 2, MAX_REWRITE_BYTES + 1 - len(SECRET)):
        with open(root / f"name-{SECRET}", "wb") as f:
            f.truncate(MAX_REWRITE_BYTES + 1)
            f.seek(where)
            f.write(SECRET.encode())
        with pytest.raises(WorkspaceHoldsCredential, match="over the") as refused:
            scan(root, scrub=Scrub())
        assert SECRET not in refused.value.message and REDACTED in refused.value.message


NAMES = {
    "a file's name": f"touch 'name-{SECRET}'",
    "a directory's name": f"mkdir 'dir-{SECRET}'",
    "a link's name": f"ln -s keep.txt 'link-{SECRET}'",
    "a link's target": f"ln -s 'token={SECRET}' link",
    "a path, across two names": f"mkdir -p 'a/{SPLIT.partition('/')[0]}' && touch 'a/{SPLIT}'",
    "a name, percent-encoded": f"touch 'q={urllib.parse.quote(SPLIT, safe='')}'",
    "a name, in base64": f"touch '{base64.urlsafe_b64encode(SECRET.encode()).decode().rstrip('=')}'",
    "a deep file's name": f"mkdir -p {'/'.join('d' * 20)} && touch '{'/'.join('d' * 20)}/{SECRET}.txt'",
}


@needs_bwrap
@pytest.mark.parametrize("where", list(NAMES))
def test_a_credential_a_process_puts_in_a_path_or_a_link_target_refuses_the_checkpoint_and_keeps_the_committed_files(
    store: Storage, tmp_path: Path, held: None, where: str
) -> None:
    """A path or a link's target goes into the stored manifest and the files API as it is, and
    cannot be rewritten without changing what the process left: the checkpoint is refused, naming
    the entry redacted; the turn is undone to the committed step, whose files are all there; and
    no object of the bucket holds the value."""
    s = _session(store)
    workspaces = Workspaces(store.workspaces, worker_id="w1", root=str(tmp_path / "root"), quota=WorkspaceQuota())
    workspaces.open(s)
    try:
        assert s.workspace.shell("echo kept > keep.txt", 30).exit_code == 0
        ref = workspaces.checkpoint(s)
        assert ref is not None
        workspaces.committed(s)
        s.task = s.task.model_copy(update={"workspace": ref})
        result = s.workspace.shell(f"echo more >> keep.txt && {NAMES[where]}", 30)
        assert result.exit_code == 0, result.stderr
        with pytest.raises(WorkspaceHoldsCredential) as refused:
            workspaces.checkpoint(s)
        assert SECRET not in refused.value.message and SPLIT not in refused.value.message
        workspaces.revert(s)  # what the tools turn does with a refusal
        assert sorted(os.listdir(s.workspace.directory)) == ["keep.txt"]
        assert (s.workspace.directory / "keep.txt").read_text() == "kept\n"
    finally:
        workspaces.close(s)
    assert _bucket_holds_a_value(store) == []
