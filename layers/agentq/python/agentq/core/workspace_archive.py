"""An uploaded archive (tar, any compression tarfile reads, or zip) as a workspace's starting
state: a manifest and its content, or a refusal naming the member, with nothing written.

Nothing is extracted to a disk: each member is read into memory (at most one byte past the
limit, so a member that lies about its size, or a compression bomb, is caught when it passes it),
and its name and kind are checked before it is kept. Refused (``ArchiveRefused``, which the API
turns into a 422 naming ``archive``): a name that is absolute or has a ``..`` component (or a
backslash, NUL, or an empty one), a name or link target that is not UTF-8, a name twice, a member under a symbolic link, a file that is
also a directory, a symbolic link whose target is absolute or leads out of the root, a hard link
to anything but a regular file earlier in the archive, a device, a FIFO or any other kind, a
member deeper than ``MAX_DEPTH`` directories, more members or bytes than the limits. A link
target is kept only when it is *normal* (leading ``..`` components, then plain names): then, no
member lying under a link, every link resolves inside the root whatever the links it crosses
point at (``x/..`` through a link ``x -> .`` would climb out, so it is refused).

Modes keep their permission bits (``0o777``; set-id and sticky bits dropped). A hard link comes
back as a second file with the same content (the manifest keeps no hard links).
"""

from __future__ import annotations

import hashlib
import io
import tarfile
import zipfile
import zlib
from dataclasses import dataclass

from agentq.core.workspace import MAX_DEPTH, Entry, Manifest, escaped, is_utf8

MAX_ARCHIVE_FILES = 100_000  # members of every kind
MAX_ARCHIVE_BYTES = 128 * 1024 * 1024  # unpacked content, held in the API's memory while it is stored


class ArchiveRefused(ValueError):
    """The archive cannot be a workspace's starting state; the message names the member."""


@dataclass(frozen=True)
class ArchiveLimits:
    max_files: int = MAX_ARCHIVE_FILES
    max_bytes: int = MAX_ARCHIVE_BYTES


def unpack(data: bytes, limits: ArchiveLimits | None = None) -> tuple[Manifest, dict[str, bytes]]:
    """The archive's tree as a manifest and its content by SHA-256; ``ArchiveRefused`` otherwise."""
    limits = limits or ArchiveLimits()
    builder = _Builder(limits)
    if data[:4] == b"PK\x03\x04" or data[:4] == b"PK\x05\x06":
        _zip(data, builder)
    else:
        _tar(data, builder)
    return builder.manifest(), builder.blobs


def _name(raw: str) -> str:
    """A member's path relative to the root, or a refusal: what ``core.workspace.check_path``
    accepts, after a leading ``./`` and a trailing ``/`` are dropped."""
    name = raw
    while name.startswith("./"):
        name = name[2:]
    name = name.rstrip("/")
    if not is_utf8(raw):
        raise ArchiveRefused(
            f"member '{escaped(raw)[:200]}': its name is not UTF-8 (a workspace keeps text names only)"
        )
    if "\\" in raw or "\x00" in raw:
        raise ArchiveRefused(f"member {raw[:200]!r}: a backslash or NUL in a name")
    if raw.startswith("/"):
        raise ArchiveRefused(f"member {raw[:200]!r}: an absolute path would unpack outside the root")
    parts = name.split("/")
    if ".." in parts:
        raise ArchiveRefused(f"member {raw[:200]!r}: a '..' component would unpack outside the root")
    if not name or any(p in ("", ".") for p in parts):
        raise ArchiveRefused(f"member {raw[:200]!r}: not a plain relative path")
    if len(parts) > MAX_DEPTH:
        raise ArchiveRefused(f"member {raw[:200]!r}: more than {MAX_DEPTH} directories deep")
    return name


def _inside(path: str, target: str) -> bool:
    """``target`` of a link at ``path``: relative, normal (leading '..', then names), and not
    above the root from where the link is."""
    if not target or target.startswith("/") or "\x00" in target or "\\" in target:
        return False
    parts = [p for p in target.split("/") if p not in ("", ".")]
    ups = 0
    while ups < len(parts) and parts[ups] == "..":
        ups += 1
    if ".." in parts[ups:]:
        return False
    return ups <= len(path.split("/")) - 1


class _Builder:
    def __init__(self, limits: ArchiveLimits) -> None:
        self.limits = limits
        self.entries: dict[str, Entry] = {}
        self.blobs: dict[str, bytes] = {}
        self.explicit: set[str] = set()  # named by a member, not only implied as a parent
        self.links: set[str] = set()
        self.total = 0

    def _count(self) -> None:
        if len(self.entries) > self.limits.max_files:
            raise ArchiveRefused(f"more than {self.limits.max_files} members (files, directories and links)")

    def _parents(self, name: str) -> None:
        parts = name.split("/")
        for i in range(1, len(parts)):
            parent = "/".join(parts[:i])
            if parent in self.links:
                raise ArchiveRefused(f"member {name!r}: it lies under the symbolic link {parent!r}")
            found = self.entries.get(parent)
            if found is not None and found.kind != "d":
                raise ArchiveRefused(f"member {name!r}: {parent!r} is a file and a directory")
            if found is None:
                self.entries[parent] = Entry(parent, "d", 0o755)
        self._count()

    def directory(self, name: str, mode: int) -> None:
        self._parents(name)
        found = self.entries.get(name)
        if name in self.explicit:
            raise ArchiveRefused(f"member {name!r} appears twice")
        if found is not None and found.kind != "d":
            raise ArchiveRefused(f"member {name!r}: a file and a directory")
        self.explicit.add(name)
        self.entries[name] = Entry(name, "d", mode & 0o777)
        self._count()

    def file(self, name: str, mode: int, data: bytes) -> None:
        self._parents(name)
        if name in self.entries:
            raise ArchiveRefused(f"member {name!r} appears twice (or is also a directory)")
        self.explicit.add(name)
        self.total += len(data)
        if self.total > self.limits.max_bytes:
            raise ArchiveRefused(f"member {name!r}: the archive unpacks to more than {self.limits.max_bytes} bytes")
        digest = hashlib.sha256(data).hexdigest()
        self.blobs[digest] = data
        self.entries[name] = Entry(name, "f", mode & 0o777, len(data), digest)
        self._count()

    def link(self, name: str, target: str) -> None:
        self._parents(name)
        if name in self.entries:
            raise ArchiveRefused(f"member {name!r} appears twice (or is also a directory)")
        if not is_utf8(target):
            raise ArchiveRefused(f"member {name!r}: a symbolic link to '{escaped(target)[:200]}', which is not UTF-8")
        if not _inside(name, target):
            raise ArchiveRefused(f"member {name!r}: a symbolic link to {target[:200]!r} leads outside the root")
        self.explicit.add(name)
        self.links.add(name)
        self.entries[name] = Entry(name, "l", 0o777, 0, target)
        self._count()

    def budget(self) -> int:
        """How many more content bytes may be read (one past, to notice passing the limit)."""
        return self.limits.max_bytes - self.total + 1

    def manifest(self) -> Manifest:
        for name in self.entries:  # a member named before the link it turned out to lie under
            for parent in _ancestors(name):
                if parent in self.links:
                    raise ArchiveRefused(f"member {name!r}: it lies under the symbolic link {parent!r}")
        return Manifest(tuple(sorted(self.entries.values())))


def _ancestors(name: str) -> list[str]:
    parts = name.split("/")
    return ["/".join(parts[:i]) for i in range(1, len(parts))]


def _read(stream: io.BufferedIOBase | None, name: str, builder: _Builder) -> bytes:
    if stream is None:
        raise ArchiveRefused(f"member {name!r}: its content cannot be read")
    data = stream.read(builder.budget())
    if len(data) >= builder.budget():
        raise ArchiveRefused(f"member {name!r}: the archive unpacks to more than {builder.limits.max_bytes} bytes")
    return data


def _tar(data: bytes, builder: _Builder) -> None:
    try:
        archive = tarfile.open(fileobj=io.BytesIO(data), mode="r:*")  # noqa: SIM115 (closed by the with below)
    except (tarfile.TarError, EOFError, OSError, ValueError) as exc:
        raise ArchiveRefused(f"not a tar or zip archive (or a damaged one): {exc}") from None
    try:
        with archive:
            files: dict[str, str] = {}  # a regular file member's name -> its digest, for hard links
            for member in archive:
                name = _name(member.name)
                if member.isdir():
                    builder.directory(name, member.mode)
                elif member.isreg():
                    content = _read(archive.extractfile(member), name, builder)  # type: ignore[arg-type]
                    builder.file(name, member.mode, content)
                    files[name] = builder.entries[name].digest
                elif member.issym():
                    builder.link(name, member.linkname)
                elif member.islnk():
                    target = member.linkname
                    while target.startswith("./"):
                        target = target[2:]
                    if target not in files:
                        raise ArchiveRefused(
                            f"member {name!r}: a hard link to {member.linkname[:200]!r}, which is not a file "
                            "earlier in the archive (it would reach outside the root)"
                        )
                    builder.file(name, member.mode, builder.blobs[files[target]])
                else:
                    kind = (
                        "a device" if member.ischr() or member.isblk() else "a FIFO" if member.isfifo() else "a member"
                    )
                    raise ArchiveRefused(f"member {name!r}: {kind} of a kind a workspace does not hold")
    except (tarfile.TarError, zlib.error, EOFError, OSError) as exc:
        raise ArchiveRefused(f"a damaged tar archive: {exc}") from None


S_IFMT, S_IFLNK, S_IFREG, S_IFDIR = 0o170000, 0o120000, 0o100000, 0o040000


def _zip(data: bytes, builder: _Builder) -> None:
    try:
        archive = zipfile.ZipFile(io.BytesIO(data))
    except (zipfile.BadZipFile, OSError, ValueError) as exc:
        raise ArchiveRefused(f"a damaged zip archive: {exc}") from None
    with archive:
        for info in archive.infolist():
            name = _name(info.filename)
            unix = info.external_attr >> 16
            kind = unix & S_IFMT
            mode = unix & 0o777 if unix else (0o755 if info.is_dir() else 0o644)
            try:
                if info.is_dir() or kind == S_IFDIR:
                    builder.directory(name, mode)
                elif kind == S_IFLNK:
                    with archive.open(info) as stream:
                        target = _read(stream, name, builder)  # type: ignore[arg-type]
                    builder.link(name, target.decode("utf-8", errors="surrogateescape"))
                elif kind in (0, S_IFREG):
                    with archive.open(info) as stream:
                        builder.file(name, mode, _read(stream, name, builder))  # type: ignore[arg-type]
                else:
                    raise ArchiveRefused(f"member {name!r}: a device, FIFO or socket, which a workspace does not hold")
            except (zipfile.BadZipFile, zlib.error, OSError, RuntimeError, NotImplementedError, EOFError) as exc:
                raise ArchiveRefused(f"member {name!r}: cannot be read ({exc})") from None
