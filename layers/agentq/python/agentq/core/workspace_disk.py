"""A workspace on the worker's disk: scanned into a manifest, read for upload, removed (restored
from a manifest by ``core.workspace_restore``, through the walks here).

Everything here works through directory file descriptors: a path is never resolved as a whole,
each component is opened relative to its parent's descriptor with ``O_NOFOLLOW`` (a directory
also ``O_DIRECTORY``), so a symbolic link anywhere on a path, not only at its end, is never
followed: a link the agent planted is an entry of the manifest, never a way out. The walks are
iterative (a tree as deep as the agent likes neither overflows Python's stack nor, for the scan,
holds more than ``MAX_DEPTH`` descriptors: deeper is refused). A worker that is not root owns
every file of the workspace (the sandbox's uid maps to it), so one the agent made unreadable
(``chmod 000``) is given ``u+rwx`` for the read or the removal and, for the scan, its mode put
back afterwards (the workspace directory itself is given ``u+rwx`` for good: ``open_root``); a root worker's sandbox is uid 65534 outside (``sandbox.bwrap.outside_owner``),
which owns the files then, and root reads and removes them whatever their mode. ``core.workspace_restore``
gives what it makes to that owner, so the code may change the files the worker put back.
A checkpoint of a run that opened a credential scrubs the files in this same walk
(``core.workspace_scrub``), so what is stored is exactly what was scrubbed.

The scan runs only after every process of the tool call is dead, in a directory no other run
uses (``core.engine._workspace`` makes one per claim), so nothing should change under it; if
something does, the read of a file checks it against what the scan saw (inode, then the content's
hash before the upload's last byte leaves, ``core.workspace_stream``) and the scan fails
(``WorkspaceUnscannable``) rather than record bytes that are not what the manifest says. No file
is held whole: the scan, the upload and the restore move ``CHUNK`` bytes of a file at a time.
"""

from __future__ import annotations

import errno
import hashlib
import os
import secrets
import stat
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from agentq.core.workspace import (
    MAX_DEPTH,
    Entry,
    Manifest,
    WorkspaceQuota,
    WorkspaceTooLarge,
    WorkspaceUnscannable,
    escaped,
    is_utf8,
)
from agentq.core.workspace_scrub import MAX_REWRITE_BYTES, OVERLAP, Scrub
from agentq.core.workspace_stream import CHUNK, VerifiedFile

O_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
O_READ = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
O_CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
PARALLEL = 16  # files a checkpoint or a restore moves at once (a CHUNK of each in memory)
CLEAR_DEPTH = MAX_DEPTH // 2  # the removal's levels hold two descriptors each (its own, its listing's)
ROW_OVERHEAD = 96  # a manifest row's bytes besides its path and link target (kind, mode, size, hash)

# What a scan remembers of a file it hashed, so the next scan hashes only what changed: size,
# mtime, ctime (which no one can set back) and inode.
Signature = tuple[int, int, int, int]


@dataclass
class ScanCache:
    known: dict[str, tuple[Signature, str]] = field(default_factory=dict)


def chmod_at(dir_fd: int, name: str, mode: int) -> None:
    """chmod without following a link: Python refuses fchmodat's AT_SYMLINK_NOFOLLOW with a
    dir_fd, so through an O_PATH descriptor of the entry itself (what glibc does too)."""
    fd = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
    try:
        if stat.S_ISLNK(os.fstat(fd).st_mode):
            raise OSError(errno.ELOOP, f"{name!r} became a symbolic link")
        os.chmod(f"/proc/self/fd/{fd}", mode)
    finally:
        os.close(fd)


def _open_at(dir_fd: int, name: str, flags: int, need: int) -> tuple[int, int | None]:
    """Open ``name`` in ``dir_fd``; if the agent took the worker's own access away, give it
    ``need`` (owner bits) first. Returns the descriptor and the mode to put back (or None)."""
    try:
        return os.open(name, flags, dir_fd=dir_fd), None
    except PermissionError:
        before = stat.S_IMODE(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode)
        chmod_at(dir_fd, name, before | need)
        return os.open(name, flags, dir_fd=dir_fd), before


def open_dir(dir_fd: int, name: str) -> tuple[int, int | None]:
    return _open_at(dir_fd, name, O_DIR, stat.S_IRWXU)


def open_root(root: Path) -> int:
    """The workspace directory itself, open, its owner's ``u+rwx`` given back first if the agent
    took any of it (``chmod 000 /workspace``: a worker that is not root could then neither scan,
    restore nor remove it, and no sandbox of either kind could enter it). Not put back: the root
    is no entry of the manifest, and a takeover's claim makes it anew, 0700 (``mkdtemp``), so a
    mode with ``u+rwx`` is what a takeover would start from too."""
    fd = os.open(root, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        mode = stat.S_IMODE(os.fstat(fd).st_mode)
        if mode & stat.S_IRWXU != stat.S_IRWXU:
            os.chmod(f"/proc/self/fd/{fd}", mode | stat.S_IRWXU)
        return os.open(".", O_DIR, dir_fd=fd)
    finally:
        os.close(fd)


@dataclass
class _Frame:
    fd: int
    prefix: str
    names: list[str]
    mode: int | None  # the directory's own mode, to put back once it is read
    at: int = 0


def scan(
    root: Path, cache: ScanCache | None = None, quota: WorkspaceQuota | None = None, scrub: Scrub | None = None
) -> Manifest:
    """The manifest of ``root`` as it is now (``cache``: files whose signature did not change
    are not read again). Every entry (directory, file, link, FIFO...) counts toward
    ``quota.max_files``, and the manifest's size toward ``quota.max_manifest_bytes``: over
    either, or the bytes, raises ``WorkspaceTooLarge``; a tree deeper than ``MAX_DEPTH`` or one
    that cannot be read raises ``WorkspaceUnscannable``. ``scrub``: each file read is rewritten
    if it holds a credential's value, and a manifest whose names hold one is refused
    (``WorkspaceHoldsCredential``)."""
    cache = cache if cache is not None else ScanCache()
    shown = scrub.shown if scrub is not None else str
    entries: list[Entry] = []
    seen: dict[str, tuple[Signature, str]] = {}
    count = total = size = 0
    stack: list[_Frame] = []
    rel = "."

    def over(what: str) -> WorkspaceTooLarge:
        assert quota is not None
        return WorkspaceTooLarge(f"the workspace holds more than its limit of {what}")

    def too_many() -> WorkspaceTooLarge:
        assert quota is not None
        return over(f"{quota.max_files} entries (files, directories, links and others)")

    def listed(fd: int) -> list[str]:
        """The names of the directory ``fd``, sorted; refused as soon as they pass what the quota
        can still count (each is an entry, and those listed but not counted yet are held too)."""
        room = None if quota is None else quota.max_files - count - sum(len(f.names) - f.at for f in stack)
        names = _names(fd, room)
        if names is None:
            raise too_many()
        return sorted(names)

    try:
        fd = open_root(root)
        stack.append(_Frame(fd, "", [], None))
        stack[-1].names = listed(fd)
        while stack:
            frame = stack[-1]
            if frame.at == len(frame.names):
                stack.pop()
                _close(frame)
                continue
            name = frame.names[frame.at]
            frame.at += 1
            rel = f"{frame.prefix}{name}"
            _utf8(rel, "name", shown)
            st = os.stat(name, dir_fd=frame.fd, follow_symlinks=False)
            count += 1
            if quota is not None and count > quota.max_files:
                raise too_many()
            mode = stat.S_IMODE(st.st_mode) & 0o777
            if stat.S_ISLNK(st.st_mode):
                entry = Entry(rel, "l", 0o777, 0, _utf8(os.readlink(name, dir_fd=frame.fd), "link target", shown, rel))
            elif stat.S_ISDIR(st.st_mode):
                if len(stack) >= MAX_DEPTH:
                    raise WorkspaceUnscannable(f"{shown(rel)!r} is more than {MAX_DEPTH} directories deep")
                entry = Entry(rel, "d", mode)
                child, back = open_dir(frame.fd, name)
                stack.append(_Frame(child, rel + "/", [], back))
                stack[-1].names = listed(child)
            elif stat.S_ISREG(st.st_mode):
                total += st.st_size
                if quota is not None and total > quota.max_bytes:
                    raise over(f"{quota.max_bytes} bytes")
                sig = (st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino)
                known = cache.known.get(rel)
                if known is not None and known[0] == sig:
                    digest = known[1]
                else:
                    sig, digest = _content(frame.fd, name, st, scrub, rel)
                    total += sig[0] - st.st_size  # a rewrite's redactions change its size
                    if quota is not None and total > quota.max_bytes:
                        raise over(f"{quota.max_bytes} bytes")
                seen[rel] = (sig, digest)
                entry = Entry(rel, "f", mode, sig[0], digest)
            else:
                continue  # FIFOs, sockets, devices: counted, not part of the durable state
            size += row_bytes(entry)
            if quota is not None and size > quota.max_manifest_bytes:
                raise over(f"{quota.max_manifest_bytes} bytes of manifest (its paths and link targets)")
            entries.append(entry)
    except OSError as exc:
        raise WorkspaceUnscannable(f"the workspace could not be read at {shown(rel)!r}: {exc.strerror or exc}") from exc
    finally:
        while stack:
            _close(stack.pop())
    manifest = Manifest(tuple(sorted(entries)))
    if scrub is not None:
        scrub.check(manifest)
    cache.known = seen
    return manifest


def _names(fd: int, most: int | None) -> list[str] | None:
    """The names in the directory ``fd``, read one at a time (``os.scandir``); None as soon as
    there are more than ``most``, before the rest is read. ``os.listdir`` held them all: a
    command may make millions in a call (135 MB of the worker per million)."""
    names: list[str] = []
    with os.scandir(fd) as listing:
        for entry in listing:
            if most is not None and len(names) >= most:
                return None
            names.append(entry.name)
    return names


def row_bytes(entry: Entry) -> int:
    """What ``entry`` counts toward ``WorkspaceQuota.max_manifest_bytes``."""
    return len(entry.path.encode()) + len(entry.digest.encode()) + ROW_OVERHEAD


def _utf8(text: str, what: str, shown: Callable[[str], str], rel: str | None = None) -> str:
    """``text`` (a name or a link target as the disk gave it), or ``WorkspaceUnscannable`` naming
    it with its bytes escaped if it is not UTF-8: the manifest, the API's JSON and the archives
    hold text only, and Python reads such bytes as lone surrogates, which no encoder takes (so
    the turn that made it is undone, as for any entry the workspace cannot keep)."""
    if not is_utf8(text):
        where = "" if rel is None else f" of {shown(rel)!r}"  # ``rel`` itself was checked first
        raise WorkspaceUnscannable(
            f"the {what}{where} '{shown(escaped(text))}' is not UTF-8; a workspace keeps text names only"
        )
    return text


def _close(frame: _Frame) -> None:
    try:
        if frame.mode is not None:
            os.fchmod(frame.fd, frame.mode)
    finally:
        os.close(frame.fd)


def _content(dir_fd: int, name: str, seen: os.stat_result, scrub: Scrub | None, rel: str) -> tuple[Signature, str]:
    """A regular file's signature and hash, read ``CHUNK`` bytes at a time (a sparse file's
    apparent size is never held); with ``scrub``, rewritten first if a window of it holds a
    credential's value. A mode taken away is given back to the owner, then put back."""
    fd, back = _open_at(dir_fd, name, O_READ, stat.S_IRUSR)
    try:
        _same(fd, scrub.shown(rel) if scrub is not None else rel, seen)
        digest, window, dirty = hashlib.sha256(), b"", False
        while chunk := os.read(fd, CHUNK):
            digest.update(chunk)
            if scrub is not None:
                window = window[max(0, len(window) - OVERLAP) :] + chunk
                if window.count(0) < len(window) and scrub.holds(window):  # NULs alone hold no spelling
                    dirty = True
                    break
        if dirty:
            assert scrub is not None
            digest = _rewrite(fd, scrub, rel)
    finally:
        try:
            if back is not None:
                os.fchmod(fd, back)
            now = os.fstat(fd)
        finally:
            os.close(fd)
    return (now.st_size, now.st_mtime_ns, now.st_ctime_ns, now.st_ino), digest.hexdigest()


def _rewrite(fd: int, scrub: Scrub, rel: str) -> hashlib._Hash:
    """Rewrite the file open as ``fd`` (the same inode, reopened for writing through /proc) with
    the values it holds redacted; the hash of what it now holds."""
    size = os.fstat(fd).st_size
    if size > MAX_REWRITE_BYTES:
        raise scrub.too_large(rel, size)
    data = os.pread(fd, size + 1, 0)
    if len(data) != size:
        raise WorkspaceUnscannable(f"{scrub.shown(rel)!r} changed while the workspace was scanned")
    cleaned = scrub.cleaned(data)
    mode = stat.S_IMODE(os.fstat(fd).st_mode)
    try:
        out, put_back = os.open(f"/proc/self/fd/{fd}", os.O_WRONLY | os.O_CLOEXEC), False
    except PermissionError:
        os.fchmod(fd, mode | stat.S_IWUSR)
        out, put_back = os.open(f"/proc/self/fd/{fd}", os.O_WRONLY | os.O_CLOEXEC), True
    try:
        os.ftruncate(out, 0)
        view = memoryview(cleaned)
        while view:
            view = view[os.write(out, view) :]
    finally:
        try:
            if put_back:
                os.fchmod(fd, mode)
        finally:
            os.close(out)
    return hashlib.sha256(cleaned)


def _same(fd: int, name: str, seen: os.stat_result) -> None:
    now = os.fstat(fd)
    if not stat.S_ISREG(now.st_mode) or (now.st_ino, now.st_dev) != (seen.st_ino, seen.st_dev):
        raise WorkspaceUnscannable(f"{name!r} changed while the workspace was scanned")


class DirCursor:
    """Descriptors of the directories on the way to the entry last asked for, each opened from
    its parent with ``O_NOFOLLOW``: entries asked for in sorted order reuse the shared part. A
    directory the agent made unreadable is given ``u+rwx`` while it is on the way, and its mode
    put back when it leaves it (an upload's read must not change what the next scan sees)."""

    def __init__(self, root_fd: int) -> None:
        self.chain: list[tuple[str, int, int | None]] = [("", root_fd, None)]

    def parent(self, path: str) -> tuple[int, str]:
        *dirs, name = path.split("/")
        keep = 0
        while keep < len(dirs) and keep + 1 < len(self.chain) and self.chain[keep + 1][0] == dirs[keep]:
            keep += 1
        self.close(keep + 1)
        for part in dirs[keep:]:
            fd, back = open_dir(self.chain[-1][1], part)
            self.chain.append((part, fd, back))
        return self.chain[-1][1], name

    def close(self, keep: int = 1) -> None:
        while len(self.chain) > keep:
            _, fd, back = self.chain.pop()
            try:
                if back is not None:
                    os.fchmod(fd, back)
            finally:
                os.close(fd)


@contextmanager
def opened(root: Path) -> Iterator[DirCursor]:
    fd = open_root(root)
    cursor = DirCursor(fd)
    try:
        yield cursor
    finally:
        cursor.close()
        os.close(fd)


def open_verified(cursor: DirCursor, entry: Entry, shown: Callable[[str], str] = str) -> VerifiedFile:
    """A scanned file open for upload (``core.workspace_stream.VerifiedFile``: checked against
    the hash its manifest records before its last byte is handed out); ``shown``: how an error
    names it."""
    try:
        dir_fd, name = cursor.parent(entry.path)
        fd, back = _open_at(dir_fd, name, O_READ, stat.S_IRUSR)
    except OSError as exc:
        raise WorkspaceUnscannable(f"{shown(entry.path)!r} could not be read: {exc.strerror or exc}") from exc
    opened_file = VerifiedFile(fd, entry, shown(entry.path), back)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        opened_file.close()
        raise WorkspaceUnscannable(f"{shown(entry.path)!r} changed after the workspace was scanned")
    return opened_file


def read_verified(root: Path, entry: Entry) -> bytes:
    """A scanned file's bytes, whole, checked against the hash its manifest records."""
    try:
        with opened(root) as cursor, open_verified(cursor, entry) as f:
            return f.read()
    except OSError as exc:
        raise WorkspaceUnscannable(f"{entry.path!r} could not be read: {exc.strerror or exc}") from exc


def clear(dir_fd: int) -> None:
    """Remove everything in the directory ``dir_fd`` (not itself), however deep and whatever
    modes the agent left (each directory is given ``u+rwx`` first). Iterative, each directory
    read as it is emptied (an entry removed as ``os.scandir`` hands it out), so what it holds is a
    listing's buffer per level, never a directory's names; a subtree more than ``CLEAR_DEPTH``
    below ``dir_fd`` is first moved up into ``dir_fd`` (a rename, found by the next pass), so no
    more than twice that many descriptors are ever open."""
    stack: list[tuple[int, str, int, os._ScandirIterator[str]]] = []  # parent, name, own fd, its listing
    try:
        while _names(dir_fd, 0) is None:  # anything left in it (moved up, or made while it was read)
            stack = [(dir_fd, "", dir_fd, os.scandir(dir_fd))]
            while stack:
                parent, name, own, listing = stack[-1]
                child = next(listing, None)
                if child is None:
                    stack.pop()
                    listing.close()
                    if stack:  # not dir_fd itself: the outer loop reads that again
                        os.close(own)
                        os.rmdir(name, dir_fd=parent)
                    continue
                st = os.stat(child.name, dir_fd=own, follow_symlinks=False)
                if not stat.S_ISDIR(st.st_mode):
                    os.unlink(child.name, dir_fd=own)
                elif len(stack) > CLEAR_DEPTH:  # too deep to hold its chain open: move it up
                    os.rename(child.name, f".agentq-deep-{secrets.token_hex(8)}", src_dir_fd=own, dst_dir_fd=dir_fd)
                else:
                    fd, _ = open_dir(own, child.name)
                    try:
                        os.fchmod(fd, stat.S_IRWXU)
                        inner = os.scandir(fd)
                    except BaseException:
                        os.close(fd)
                        raise
                    stack.append((own, child.name, fd, inner))
    finally:
        for level, (_, _, own, listing) in enumerate(stack):
            listing.close()
            if level:
                os.close(own)


def wipe(root: Path) -> None:
    """Remove ``root`` and everything under it (nothing if it is not there)."""
    try:
        fd = open_root(root)
    except FileNotFoundError:
        return
    try:
        clear(fd)
    finally:
        os.close(fd)
    os.rmdir(root)
