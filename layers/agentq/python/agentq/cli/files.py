"""``agentq files`` and ``agentq download``: a task's workspace at a committed step (``GET
/tasks/{id}/files``, ``/files/{path}``, ``/diff``); and ``read_workspace``, the directory
``agentq submit --workspace DIR|FILE`` sends as the submission's starting files (inline when they
fit the submission, else, like an archive FILE, uploaded first: ``POST /workspace-uploads``).

A download writes only under its directory: every path the server names is checked again here
(relative, no ``..``, not named twice), the target is created new (``O_EXCL``, a directory by
``mkdir``) and never reached through a link at its last component (a mode is set through the
descriptor opened with ``O_NOFOLLOW``), and a parent that is a symbolic link is refused, so a
hostile or broken server cannot make the CLI write, or change a mode, elsewhere (a path named a
link, then a directory, would else have had its mode set on what the link names)."""

from __future__ import annotations

import argparse
import base64
import io
import os
import stat
import sys
import tarfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agentq.cli.args import UsageError, add_command, positive
from agentq.cli.output import dump
from agentq.cli.target import api_client, remote
from agentq.core.workspace import MAX_SEED_ENCODED_BYTES, MAX_SEED_FILES, check_path


def read_workspace(root: str, upload: Callable[[bytes], str] | None = None) -> dict[str, Any]:
    """``DIR`` as ``workspace.files`` (regular files, their modes), within the submission's
    limits; with ``upload`` (``Client.upload_workspace``), a DIR past them and an archive FILE
    (tar, compressed or not, or zip) are uploaded first and named as ``workspace.upload``."""
    base = Path(root)
    if base.is_file() and upload is not None:
        try:
            data = base.read_bytes()
        except OSError as exc:
            raise UsageError(f"--workspace: cannot read {root}: {exc.strerror}", field="workspace") from None
        return {"upload": upload(data)}
    if not base.is_dir():
        raise UsageError(f"--workspace: {root} is not a directory or an archive", field="workspace")
    try:
        return _inline(base, root)
    except _TooBig:
        if upload is None:
            raise
        return {"upload": upload(_tar_of(base))}


class _TooBig(UsageError):
    """A directory past what a submission carries inline."""


def _tar_of(base: Path) -> bytes:
    """``base`` as a gzipped tar of its files, directories and links (the server checks every member)."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:gz") as archive:
        for child in sorted(base.iterdir()):
            archive.add(child, arcname=child.name, recursive=True)
    return out.getvalue()


def _inline(base: Path, root: str) -> dict[str, Any]:
    files: list[dict[str, Any]] = []
    encoded = 0
    for dirpath, dirnames, filenames in os.walk(base, followlinks=False):
        dirnames.sort()
        for name in sorted(filenames):
            full = Path(dirpath) / name
            info = full.lstat()
            if not stat.S_ISREG(info.st_mode):
                raise UsageError(f"--workspace: {full} is not a regular file (links are not sent)", field="workspace")
            rel = full.relative_to(base).as_posix()
            try:
                data = full.read_bytes()
            except OSError as exc:
                raise UsageError(f"--workspace: cannot read {full}: {exc.strerror}", field="workspace") from None
            content = base64.b64encode(data).decode()
            encoded += len(content) + len(rel.encode())
            files.append({"path": rel, "content_b64": content, "mode": info.st_mode & 0o777})
            if len(files) > MAX_SEED_FILES:
                raise _TooBig(f"--workspace: more than {MAX_SEED_FILES} files in {root}", field="workspace")
            if encoded > MAX_SEED_ENCODED_BYTES:
                raise _TooBig(
                    f"--workspace: {root} is over the {MAX_SEED_ENCODED_BYTES} bytes of base64 content and paths a "
                    "submission carries; start larger workspaces from a repository",
                    field="workspace",
                )
    return {"files": files}


def _cmd_files(args: argparse.Namespace) -> int:
    client = api_client(args)
    if args.diff:
        first, _, last = args.diff.partition("..")
        if not first.isdigit() or (last and not last.isdigit()):
            raise UsageError(f"--diff: {args.diff!r} is not A..B (step numbers)", field="diff")
        found = client.diff(args.task_id, int(first), int(last) if last else None)
        if args.json:
            dump(found)
            return 0
        for label, paths in (("added", found.added), ("removed", found.removed), ("changed", found.changed)):
            for path in paths:
                print(f"{label:8} {path}", file=sys.stderr)
        sys.stdout.write(found.patch)
        if found.truncated:
            print("agentq: the diff was cut at its size limit", file=sys.stderr)
        return 0
    if args.path:
        sys.stdout.buffer.write(client.file(args.task_id, args.path, step=args.step))
        sys.stdout.flush()
        return 0
    entries = list(client.iter_files(args.task_id, step=args.step))
    if args.json:
        print("[" + ",".join(e.model_dump_json() for e in entries) + "]")
        return 0
    for e in entries:
        extra = f" -> {e.target}" if e.kind == "link" else ""
        print(f"{e.mode:04o} {e.kind:4} {e.size:>10} {e.path}{extra}")
    return 0


def _safe_target(root: Path, path: str) -> Path:
    """``root/path``, refused unless it stays under ``root`` with no link on the way."""
    try:
        check_path(path)
    except ValueError as exc:
        raise UsageError(f"the server named a path outside the directory: {exc}", field="path") from None
    target = root.joinpath(*path.split("/"))
    parent = target.parent
    while parent != root:
        if parent.is_symlink():
            raise UsageError(f"{parent} is a symbolic link: refusing to write {path!r} through it", field="path")
        parent = parent.parent
    return target


def download(client: Any, task_id: str, directory: str, step: int | None = None) -> int:
    """Write the task's workspace at ``step`` under ``directory``; the number of files written."""
    root = Path(directory).resolve()
    try:
        if root.exists() and (not root.is_dir() or any(root.iterdir())):
            # Into an empty directory only: nothing there to overwrite, no link of its own to follow.
            raise UsageError(f"{directory} exists and is not an empty directory", field="directory")
        root.mkdir(parents=True, exist_ok=True)
    except OSError as exc:  # under a file, /proc, a directory not ours: said before anything is asked
        raise UsageError(f"cannot make the directory {directory}: {exc.strerror}", field="directory") from None
    if step is None:  # pin it: the task may commit another step while the files are read
        step = client.files(task_id, limit=1).step
    entries = list(client.iter_files(task_id, step=step))
    seen: set[str] = set()
    for e in entries:
        if e.path in seen:
            raise UsageError(f"the server named {e.path!r} twice: refusing the download", field="path")
        seen.add(e.path)
    written = 0
    for e in entries:
        target = _safe_target(root, e.path)
        if e.kind == "dir":
            target.mkdir(mode=0o700)
            continue
        if e.kind == "link":
            os.symlink(e.target or "", target)
            continue
        data = client.file(task_id, e.path, step=step)
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        with os.fdopen(fd, "wb") as out:
            out.write(data)
            os.fchmod(out.fileno(), e.mode)
        written += 1
    for e in reversed(entries):  # directories' modes last: a read-only one took its files first
        if e.kind == "dir":
            _chmod_dir(_safe_target(root, e.path), e.mode)
    return written


def _chmod_dir(path: Path, mode: int) -> None:
    """Set the mode of the directory ``path`` itself: never of what a link there names."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        os.fchmod(fd, mode)
    finally:
        os.close(fd)


def _cmd_download(args: argparse.Namespace) -> int:
    count = download(api_client(args), args.task_id, args.directory, args.step)
    print(f"{count} file(s) written under {args.directory}", file=sys.stderr)
    return 0


def register(sub: Any) -> None:
    files = remote(
        add_command(
            sub,
            "files",
            "a task's files at a committed step: the listing, one file's bytes, or a diff between steps",
            "Reads GET /tasks/{id}/files (no PATH), /files/PATH (the file's bytes on stdout) or /diff (--diff A..B: "
            "the paths added, removed and changed on stderr, a unified diff of the text files on stdout).",
        )
    )
    files.add_argument("task_id")
    files.add_argument("path", nargs="?", help="a file's path in the workspace: print its bytes")
    files.add_argument("--step", type=positive, help="a committed step (0: the starting files; default the last)")
    files.add_argument("--diff", metavar="A..B", help="what changed from step A to step B (A..: to the last)")
    files.set_defaults(func=_cmd_files)
    down = remote(
        add_command(
            sub,
            "download",
            "write a task's files at a committed step into a directory, with their modes",
            "Every file, directory and link of the workspace at --step (default the last committed step) under DIR, "
            "which must be new or empty; a path the server names outside DIR, or through a link, is refused.",
        ),
        json=False,
    )
    down.add_argument("task_id")
    down.add_argument("directory", metavar="DIR")
    down.add_argument("--step", type=positive, help="a committed step (0: the starting files; default the last)")
    down.set_defaults(func=_cmd_download)
