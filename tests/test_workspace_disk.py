"""The worker's side of a workspace (core.workspace_disk) against what an agent can leave on the
disk: a link planted at any component of a path is never followed, a file read for upload is the
file the scan hashed (an upload of one that changed never completes), and a worker that is not root scans, reads for upload, restores and removes
files and directories the agent made unreadable, putting their modes back."""

from __future__ import annotations

import hashlib
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from agentq.core.workspace import Entry, Manifest, WorkspaceRestoreFailed, WorkspaceUnscannable
from agentq.core.workspace_disk import open_verified, opened, read_verified, scan, wipe
from agentq.core.workspace_restore import restore
from agentq.core.workspace_stream import CHUNK
from agentq.sandbox.workspace import WorkspaceSandbox
from agentq.storage.container import Storage
from agentq.storage.serdes import MissingObject


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.mark.parametrize("depth", [1, 2, 5])
def test_a_directory_swapped_for_a_link_after_the_scan_is_never_followed_at_any_component(
    tmp_path: Path, depth: int
) -> None:
    root, outside = tmp_path / "ws", tmp_path / "host"
    parts = [f"d{i}" for i in range(depth)]
    (root.joinpath(*parts)).mkdir(parents=True)
    (root.joinpath(*parts) / "secret").write_bytes(b"same bytes")
    (outside.joinpath(*parts[1:])).mkdir(parents=True)
    (outside.joinpath(*parts[1:]) / "secret").write_bytes(b"same bytes")  # the hash check alone would pass
    (entry,) = [e for e in scan(root).entries if e.kind == "f"]
    wipe(root / parts[0])
    (root / parts[0]).symlink_to(outside)  # the first component is now a way out
    with pytest.raises(WorkspaceUnscannable, match="could not be read"):
        read_verified(root, entry)


def test_a_file_whose_content_changed_after_the_scan_is_not_read_for_upload(tmp_path: Path) -> None:
    (tmp_path / "f").write_bytes(b"scanned")
    (entry,) = scan(tmp_path).entries
    assert read_verified(tmp_path, entry) == b"scanned"
    (tmp_path / "f").write_bytes(b"changed")  # same size
    with pytest.raises(WorkspaceUnscannable, match="changed after the workspace was scanned"):
        read_verified(tmp_path, entry)


@pytest.mark.parametrize("change", ["first byte", "last byte", "one byte more", "one byte less"])
def test_an_upload_of_a_file_changed_after_the_scan_never_hands_out_its_last_byte_and_stores_nothing(
    store: Storage, tmp_path: Path, change: str
) -> None:
    """An upload streams the file (``VerifiedFile``) and checks it against the scanned hash
    before it hands out the last byte: whatever changed, the read that would end it raises, so a
    request sending it never completes and the bucket has nothing under the hash. An unchanged
    file is stored whole."""
    data = bytes(range(256)) * (3 * CHUNK // 256) + b"tail"
    (tmp_path / "f").write_bytes(data)
    (entry,) = scan(tmp_path).entries
    with opened(tmp_path) as cursor, open_verified(cursor, entry) as f:
        assert store.workspaces.put_blob("task-a", entry.digest, f) is True
    assert store.workspaces.get_blob("task-a", entry.digest) == data
    with open(tmp_path / "f", "r+b") as changed:
        if change == "one byte more":
            changed.seek(0, os.SEEK_END)
            changed.write(b"!")
        elif change == "one byte less":
            changed.truncate(len(data) - 1)
        else:
            changed.seek(0 if change == "first byte" else len(data) - 1)
            changed.write(b"!")
    handed = 0
    with (
        opened(tmp_path) as cursor,
        open_verified(cursor, entry) as f,
        pytest.raises(WorkspaceUnscannable, match="changed after the workspace was scanned"),
    ):
        while piece := f.read(4096):
            handed += len(piece)
    assert handed < entry.size
    with (
        opened(tmp_path) as cursor,
        open_verified(cursor, entry) as f,
        pytest.raises(WorkspaceUnscannable, match="changed after the workspace was scanned"),
    ):
        store.workspaces.put_blob("task-b", entry.digest, f)
    with pytest.raises(MissingObject):
        store.workspaces.get_blob("task-b", entry.digest)


def test_a_restore_refuses_an_entry_under_a_link_and_writes_nothing_outside(tmp_path: Path) -> None:
    outside = tmp_path / "host"
    outside.mkdir()
    manifest = Manifest((Entry("a", "l", 0o777, 0, str(outside)), Entry("a/x", "f", 0o644, 1, sha(b"x"))))
    with pytest.raises(WorkspaceRestoreFailed):
        restore(tmp_path / "ws", manifest, {sha(b"x"): b"x"}.__getitem__)
    assert list(outside.iterdir()) == []


def test_a_manifest_naming_one_path_twice_is_refused() -> None:
    doubled = b'{"v":1,"entries":[["a","d",493,0,""],["a","f",420,0,"' + sha(b"").encode() + b'"]]}'
    with pytest.raises(ValueError, match="appears twice"):
        Manifest.from_bytes(doubled)


AS_NOBODY = r"""
import hashlib, os, stat, sys
from pathlib import Path
from agentq.core.workspace_disk import read_verified, scan, wipe
from agentq.core.workspace_restore import restore

os.chdir(sys.argv[1])  # owned by nobody; its parents are not theirs to search
os.setgid(65534)
os.setuid(65534)
ws = Path("ws")
(ws / "locked").mkdir(parents=True)
(ws / "locked" / "inner").write_bytes(b"inner")
(ws / "ro").mkdir()
(ws / "ro" / "f").write_bytes(b"ro")
(ws / "secret").write_bytes(b"secret")
os.chmod(ws / "secret", 0)
os.chmod(ws / "ro", 0o500)
os.chmod(ws / "locked", 0)
manifest = scan(ws)
got = {e.path: (e.kind, e.mode, e.digest) for e in manifest.entries}
sha = lambda b: hashlib.sha256(b).hexdigest()
assert got == {
    "locked": ("d", 0, ""), "locked/inner": ("f", 0o644, sha(b"inner")), "ro": ("d", 0o500, ""),
    "ro/f": ("f", 0o644, sha(b"ro")), "secret": ("f", 0, sha(b"secret")),
}, got
assert [stat.S_IMODE(os.lstat(ws / n).st_mode) for n in ("locked", "ro", "secret")] == [0, 0o500, 0]
assert scan(ws).digest == manifest.digest  # the scan put every mode back
assert [read_verified(ws, e) for e in manifest.entries if e.kind == "f"] == [b"inner", b"ro", b"secret"]
assert scan(ws).digest == manifest.digest  # and so did the reads for upload
blobs = {sha(b): b for b in (b"inner", b"ro", b"secret")}
restore(Path("copy"), manifest, blobs.__getitem__)  # checks itself against the manifest
wipe(ws)
wipe(Path("copy"))
assert sorted(os.listdir(".")) == [], os.listdir(".")
print("ok")
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to become uid 65534 (a worker that is not root)")
def test_a_worker_that_is_not_root_scans_reads_restores_and_removes_what_the_agent_made_unreadable(
    tmp_path: Path,
) -> None:
    home = tmp_path / "nobody"
    home.mkdir()
    os.chown(home, 65534, 65534)
    done = subprocess.run(
        [sys.executable, "-c", AS_NOBODY, str(home)], check=False, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0 and done.stdout == "ok\n", done.stderr


# The workspace directory itself made unreadable by the agent (``chmod 000 /workspace``, or any mode
# without u+rwx). A worker that is not root (the EC2 tier's) gave back the access the agent took
# from an entry but not from the root: the scan refused the turn ("could not be read at '.'"), the
# revert's restore then failed the task workspace_restore_failed, and the run's end could not
# remove the directory.
ROOT_AS_NOBODY = r"""
import os, stat, sys
from pathlib import Path
from agentq.core.workspace import Manifest
from agentq.core.workspace_disk import read_verified, scan, wipe
from agentq.core.workspace_restore import restore

os.chdir(sys.argv[1])  # owned by nobody; its parents are not theirs to search
os.setgid(65534)
os.setuid(65534)
ws = Path("ws")
committed = Manifest.from_bytes(sys.argv[2].encode())
turn = scan(ws)  # the checkpoint; was: WorkspaceUnscannable "could not be read at '.': Permission denied"
assert sorted(e.path for e in turn.entries) == ["d", "f"], turn.entries
assert read_verified(ws, turn.by_path()["f"]) == b"x\n"  # the upload's read
restore(ws, committed, {}.__getitem__)  # the revert; was: WorkspaceRestoreFailed "Permission denied"
assert stat.S_IMODE(os.stat(ws).st_mode) & stat.S_IRWXU == stat.S_IRWXU  # the next call can enter it
wipe(ws)  # the run's end; was: PermissionError
assert not ws.exists()
print("ok")
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to become uid 65534 (a worker that is not root)")
def test_a_worker_that_is_not_root_scans_restores_and_removes_a_workspace_directory_the_agent_made_unreadable(
    tmp_path: Path,
) -> None:
    home = tmp_path / "nobody"
    home.mkdir()
    os.chown(home, 65534, 65534)
    ws = home / "ws"
    (ws / "d").mkdir(parents=True, mode=0o700)
    for path in (ws, ws / "d"):
        os.chown(path, 65534, 65534)
    committed = scan(ws)  # the last committed step: one empty directory
    out = WorkspaceSandbox().shell(ws, "echo x > f; chmod 000 /workspace", 20)  # the agent's command
    assert out.exit_code == 0 and stat.S_IMODE(ws.stat().st_mode) == 0, out.stderr
    done = subprocess.run(
        [sys.executable, "-c", ROOT_AS_NOBODY, str(home), committed.to_bytes().decode()],
        check=False, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0 and done.stdout == "ok\n", done.stderr[-600:]


@pytest.mark.skipif(not os.path.exists("/usr/bin/bwrap"), reason="the workspace tools need bubblewrap")
def test_the_call_after_one_that_made_the_workspace_directory_unreadable_can_enter_it(tmp_path: Path) -> None:
    """The checkpoint's scan gives the directory back whoever the worker is (root reads it
    whatever its mode, but the sandbox it starts does not): before, every later call of the run
    failed in bubblewrap ("Can't chdir to /workspace") until a takeover's restore made it anew."""
    ws = tmp_path / "ws"
    ws.mkdir(mode=0o700)
    sandbox = WorkspaceSandbox()
    assert sandbox.shell(ws, "echo x > f; chmod 000 /workspace", 20).exit_code == 0
    assert [e.path for e in scan(ws).entries] == ["f"]  # the checkpoint
    after = sandbox.shell(ws, "cat f", 20)
    assert (after.exit_code, after.stdout) == (0, "x\n"), after.stderr
