"""A workspace file's content between the disk and the bucket, a ``CHUNK`` at a time.

The quota counts a file's apparent size, and a sparse file's apparent size costs a process almost
nothing on disk (``truncate -s 100M``): a worker that held files whole would hold up to the
quota per task at every checkpoint and restore (ten such files, a few KB on disk, were 1 GiB in
the worker's memory, and a shared worker runs many tenants' tasks). So nothing here holds more
than a chunk of a file: what a checkpoint or a restore has in memory is bounded by the number
of files it moves at once (``core.workspace_disk.PARALLEL``) times ``CHUNK``, whatever their size.

Hash verification stays whole: an upload (``VerifiedFile``) hashes what it hands out and checks
it against the manifest's hash before it hands out the last byte, so an upload of content that is
not what the scan hashed never completes (S3 stores nothing of a request whose body was not
sent whole; the S3 store also has S3 check the hash, ``ChecksumSHA256``); a restore (``fill``)
writes what it fetches and checks the hash and size at the end, and the restore fails
(``WorkspaceRestoreFailed``) rather than run on it.
"""

from __future__ import annotations

import hashlib
import io
import os
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor, wait
from typing import Self, TypeVar

from agentq.core.ports import Readable
from agentq.core.workspace import Entry, WorkspaceRestoreFailed, WorkspaceUnscannable

CHUNK = 1 << 20  # bytes of a file read, hashed, scrubbed, sent or written at a time
T = TypeVar("T")
U = TypeVar("U")


def each(pool: ThreadPoolExecutor, work: Callable[[T], U], items: Sequence[T]) -> list[U]:
    """``work`` over ``items`` in ``pool``, every call ended before it returns or raises the
    first error: the caller closes the descriptors they use only then (``Executor.map`` raises at
    the first error while other calls still read or write theirs, and a closed descriptor's
    number is soon another file's)."""
    futures = [pool.submit(work, item) for item in items]
    wait(futures)
    return [future.result() for future in futures]


class VerifiedFile:
    """A scanned file open for upload: at most ``size`` bytes, read a chunk at a time, hashed as
    they are read; the read that reaches the end raises ``WorkspaceUnscannable`` instead of
    returning its bytes if the whole does not hash to ``entry.digest`` or the file is longer.
    ``seek(0)`` starts again (a retried request). The mode the scan gave back (``back``) is put
    back when it is closed."""

    def __init__(self, fd: int, entry: Entry, shown: str, back: int | None = None) -> None:
        self.fd, self.entry, self.shown, self.back = fd, entry, shown, back
        self._hash, self._at, self._verified = hashlib.sha256(), 0, False

    def __len__(self) -> int:
        return self.entry.size

    def read(self, size: int = -1, /) -> bytes:
        if size < 0:
            return b"".join(iter(lambda: self.read(CHUNK), b""))
        if self._at == self.entry.size:
            if not self._verified:  # an empty file: nothing was read to verify it
                self._verify()
            return b""
        want = min(size, CHUNK, self.entry.size - self._at)
        data = os.pread(self.fd, want, self._at)
        if len(data) < want:
            raise WorkspaceUnscannable(f"{self.shown!r} changed after the workspace was scanned")
        self._hash.update(data)
        self._at += len(data)
        if self._at == self.entry.size:
            self._verify()
        return data

    def _verify(self) -> None:
        if os.pread(self.fd, 1, self._at) or self._hash.hexdigest() != self.entry.digest:
            raise WorkspaceUnscannable(f"{self.shown!r} changed after the workspace was scanned")
        self._verified = True

    def tell(self) -> int:
        return self._at

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        if (offset, whence) != (0, os.SEEK_SET):
            raise io.UnsupportedOperation("a verified upload only starts again from its beginning")
        self._hash, self._at, self._verified = hashlib.sha256(), 0, False
        return 0

    def close(self) -> None:
        if self.fd < 0:
            return
        try:
            if self.back is not None:
                os.fchmod(self.fd, self.back)
        finally:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


def fill(fd: int, entry: Entry, source: bytes | Readable) -> None:
    """Write ``source`` (a fetched object, read a chunk at a time) into the new file ``fd``, then
    give it ``entry``'s mode; content that is not ``entry.size`` bytes hashing to ``entry.digest``
    raises ``WorkspaceRestoreFailed`` (what was written is removed with the restore's directory)."""
    stream = io.BytesIO(source) if isinstance(source, bytes) else source
    digest, written = hashlib.sha256(), 0
    try:
        while written <= entry.size and (data := stream.read(min(CHUNK, entry.size + 1 - written))):
            digest.update(data)
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            written += len(data)
    finally:
        stream.close()
    if written != entry.size or digest.hexdigest() != entry.digest:
        raise WorkspaceRestoreFailed(f"the stored content of {entry.path!r} does not match its hash")
    os.fchmod(fd, entry.mode)
