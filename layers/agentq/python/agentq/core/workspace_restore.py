"""A workspace put back on the worker's disk exactly as a manifest says (``restore``), through
the descriptor walks of ``core.workspace_disk``: everything there before is removed, each entry is
made relative to its parent's descriptor, never through a link, and the result is scanned back and
compared with the manifest before anything runs on it. What it makes is given to the uid the
sandbox is outside its namespace (``owner``), so the code may change the files it is given back.

A restore fails its task for good (``WorkspaceRestoreFailed``, a deterministic fault:
``core.errors.DETERMINISTIC_FAULTS``) only for what running it again would meet again: content
that does not hash to its manifest, a missing object (the caller's ``LookupError``), a path of
the manifest this disk cannot make (``MANIFEST_ERRNOS``). Anything else it meets is an outage of
the worker or of the bucket, and is raised as it came: a stalled S3 read is botocore's
``ReadTimeoutError`` (an ``OSError``), a disk a command of any task on the worker filled is
``ENOSPC``. The run then gives its lease back and the redelivery restores again, here or on
another worker; before, either failed the task, whoever's it was, at every claim.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from agentq.core.ports import Readable
from agentq.core.workspace import Entry, Manifest, WorkspaceRestoreFailed, WorkspaceUnscannable
from agentq.core.workspace_disk import O_CREATE, PARALLEL, DirCursor, ScanCache, chmod_at, clear, opened, scan
from agentq.core.workspace_stream import each, fill

# The errors of a restore that its manifest causes, the same on every disk and every attempt: a
# parent that is not a directory, a path named twice, a link on the way, a name too long. Every
# other OSError (a full disk or quota, no descriptor or memory left, an I/O error, a network read:
# botocore's timeouts are OSErrors whose errno is None) is the host's or the bucket's.
MANIFEST_ERRNOS = frozenset({errno.ENOENT, errno.ENOTDIR, errno.EEXIST, errno.ELOOP, errno.EISDIR, errno.ENAMETOOLONG})


def restore(
    root: Path,
    manifest: Manifest,
    fetch: Callable[[str], bytes | Readable],
    cache: ScanCache | None = None,
    owner: tuple[int, int] | None = None,
) -> None:
    """Make ``root`` exactly ``manifest`` (everything there before is removed), then check it.

    ``fetch(digest)`` returns a file's content, or a stream of it (called from up to ``PARALLEL``
    threads, each writing its file a ``CHUNK`` at a time); content whose hash or size differs, a
    missing object, an entry whose parent is not a directory of the manifest, or a result that
    does not scan back to the manifest raises ``WorkspaceRestoreFailed``; any other error is an
    outage, raised as it is (``MANIFEST_ERRNOS``). ``owner`` (uid, gid):
    ``root`` and every entry made are given to it (a link itself, never what it names), before
    any mode is set: the sandbox's uid when that is not the worker's.
    """
    root.mkdir(parents=True, mode=0o700, exist_ok=True)
    dirs = [e for e in manifest.entries if e.kind == "d"]
    files = [e for e in manifest.entries if e.kind == "f"]
    try:
        with opened(root) as cursor:
            clear(cursor.chain[0][1])
            _give_root(cursor.chain[0][1], owner)
            for entry in dirs:
                dir_fd, name = cursor.parent(entry.path)
                os.mkdir(name, 0o700, dir_fd=dir_fd)
                _chown_at(dir_fd, name, owner)
            with ThreadPoolExecutor(PARALLEL) as pool:
                for start in range(0, len(files), PARALLEL):
                    _fill_window(cursor, pool, files[start : start + PARALLEL], fetch, owner)
            for entry in manifest.entries:
                if entry.kind == "l":
                    dir_fd, name = cursor.parent(entry.path)
                    os.symlink(entry.digest, name, dir_fd=dir_fd)
                    _chown_at(dir_fd, name, owner)
            for entry in sorted(dirs, key=lambda e: e.path.count("/"), reverse=True):
                dir_fd, name = cursor.parent(entry.path)
                chmod_at(dir_fd, name, entry.mode)
    except OSError as exc:
        if exc.errno not in MANIFEST_ERRNOS:
            raise  # an outage: the same restore may well succeed once it is over
        raise WorkspaceRestoreFailed(f"the workspace could not be written: {exc}") from exc
    try:
        found = scan(root, cache)
    except WorkspaceUnscannable as exc:
        cause = exc.__cause__
        if isinstance(cause, OSError) and cause.errno not in MANIFEST_ERRNOS:
            raise cause from None  # the disk's fault (EIO, EMFILE...), not the manifest's
        raise WorkspaceRestoreFailed(f"the restored workspace could not be checked: {exc.message}") from exc
    if found.digest != manifest.digest:
        raise WorkspaceRestoreFailed(
            f"the restored workspace does not match its manifest ({found.files} files, {found.total_bytes} bytes "
            f"restored; {manifest.files} files, {manifest.total_bytes} bytes expected)"
        )


def _give_root(fd: int, owner: tuple[int, int] | None) -> None:
    """The restored directory itself to ``owner``: the first chown, so the one that says it plainly
    when the owner cannot have files here (a uid not mapped in the worker's user namespace)."""
    if owner is None:
        return
    try:
        os.fchown(fd, *owner)
    except OSError as exc:
        raise WorkspaceRestoreFailed(
            f"the workspace cannot be given to uid {owner[0]}, the sandbox's outside its user namespace: {exc.strerror}"
        ) from exc


def _chown_at(dir_fd: int, name: str, owner: tuple[int, int] | None) -> None:
    """Give the entry ``name`` itself (a link is never followed) to ``owner``, if any."""
    if owner is not None:
        os.chown(name, *owner, dir_fd=dir_fd, follow_symlinks=False)


def _fill_window(
    cursor: DirCursor,
    pool: ThreadPoolExecutor,
    window: list[Entry],
    fetch: Callable[[str], bytes | Readable],
    owner: tuple[int, int] | None = None,
) -> None:
    """Create the window's files here (the cursor is this thread's), each given to ``owner``, then
    fill them in the pool (which sets their mode last: a chown would clear set-id bits after)."""
    fds: list[int] = []
    try:
        for entry in window:
            dir_fd, name = cursor.parent(entry.path)
            fds.append(os.open(name, O_CREATE, 0o600, dir_fd=dir_fd))
            if owner is not None:
                os.fchown(fds[-1], *owner)
        each(pool, lambda pair: fill(pair[1], pair[0], fetch(pair[0].digest)), list(zip(window, fds, strict=True)))
    finally:
        for fd in fds:
            os.close(fd)
