"""The workspace's file tools, as they run inside the sandbox (standard library only).

``read_file``, ``write_file``, ``edit_file``, ``list_files`` and ``search_files`` do not touch the
worker's disk from the worker: the sandbox runs this module's source with ``python -I -S`` under
python_exec's filter (no process, no socket), the task's workspace bound at ``/workspace`` (read
only for the reading tools) and nothing else of the host writable. So a path that escapes (``..``,
an absolute path, a symlink pointing out) could reach only the sandbox's own read-only root even
if a check below were wrong; the checks are there to give the model a precise error instead.

The request arrives as JSON in the script's last line; the answer is one line of JSON on stdout,
``{"ok": ...}`` or ``{"error": ...}``.
"""

from __future__ import annotations

import json
import os
import re
import stat
from typing import Any

ROOT = "/workspace"
SKIP_DIRS = (".git",)  # search_files skips them unless asked for by path


class Refused(Exception):
    """A bad path or input: the model sees the message."""


def _inside(path: str) -> bool:
    return path == ROOT or path.startswith(ROOT + "/")


def _show(path: str) -> str:
    return os.path.relpath(path, ROOT) if _inside(path) else path


def resolve(path: str) -> str:
    """The absolute path in the sandbox of ``path`` (relative to the workspace, or an absolute
    path under ``/workspace``), refused when it leaves the workspace by any route."""
    if not path or "\x00" in path:
        raise Refused("path: must be a non-empty path without NUL characters")
    if os.path.isabs(path):
        if not _inside(os.path.normpath(path)):
            raise Refused(f"path {path!r} is outside the workspace: give a path relative to it (e.g. 'src/app.py')")
        joined = os.path.normpath(path)
    else:
        joined = os.path.normpath(os.path.join(ROOT, path))
        if not _inside(joined):
            raise Refused(f"path {path!r} leaves the workspace ('..' past its root)")
    real = os.path.realpath(joined)
    if not _inside(real):
        raise Refused(f"path {path!r} resolves outside the workspace through a symbolic link (to {real})")
    return real


def _regular(path: str, shown: str) -> os.stat_result:
    st = os.lstat(path)
    if not stat.S_ISREG(st.st_mode):
        kind = "a directory" if stat.S_ISDIR(st.st_mode) else "not a regular file (a device, FIFO or socket)"
        raise Refused(f"{shown!r} is {kind}")
    return st


def _read_bytes(path: str, shown: str, limit: int) -> bytes:
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise Refused(f"{shown!r} is not a regular file")
        if st.st_size > limit:
            raise Refused(f"{shown!r} is {st.st_size} bytes, over the {limit}-byte limit of this tool")
        chunks = []
        while chunk := os.read(fd, 1 << 20):
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def _text(data: bytes, shown: str) -> str:
    if b"\x00" in data[:8192]:
        raise Refused(f"{shown!r} is a binary file ({len(data)} bytes); read_file shows text only")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise Refused(f"{shown!r} is not UTF-8 text ({len(data)} bytes); read_file shows text only") from None


def read(req: dict[str, Any]) -> str:
    path = resolve(req["path"])
    shown = _show(path)
    _regular(path, shown)
    text = _text(_read_bytes(path, shown, int(req["max_file_bytes"])), shown)
    lines = text.splitlines(keepends=True)
    start = max(1, int(req.get("start_line") or 1))
    count = int(req.get("max_lines") or len(lines) or 1)
    chosen = lines[start - 1 : start - 1 + count]
    body = "".join(chosen)
    cap = int(req["max_output_chars"])
    cut = ""
    if len(body) > cap:
        body = body[:cap]
        cut = f"\n[cut at {cap} characters: read a range with start_line and max_lines]"
    end = start + len(chosen) - 1
    return f"{shown} (lines {start}-{end} of {len(lines)})\n{body}{cut}"


def _writable_target(path: str, shown: str) -> None:
    if os.path.lexists(path) and not stat.S_ISREG(os.lstat(path).st_mode):
        raise Refused(f"{shown!r} exists and is not a regular file")


def _write(path: str, data: bytes, mode: int | None = None) -> None:
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW
    fd = os.open(path, flags, 0o644 if mode is None else mode)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
    finally:
        os.close(fd)


def write(req: dict[str, Any]) -> str:
    path = resolve(req["path"])
    shown = _show(path)
    if path == ROOT:
        raise Refused("path: names the workspace itself, not a file in it")
    if "content_file" in req:  # the content as raw bytes beside the script (sandbox.workspace)
        with open(str(req["content_file"]), "rb") as f:
            data = f.read()
    else:
        data = str(req["content"]).encode("utf-8")
    if len(data) > int(req["max_file_bytes"]):
        raise Refused(f"content is {len(data)} bytes, over the {req['max_file_bytes']}-byte limit for one file")
    parent = os.path.dirname(path)
    os.makedirs(parent, exist_ok=True)
    if not _inside(os.path.realpath(parent)):
        raise Refused(f"{shown!r}: its directory resolves outside the workspace")
    _writable_target(path, shown)
    existed = os.path.exists(path)
    _write(path, data)
    return f"{'overwrote' if existed else 'created'} {shown} ({len(data)} bytes)"


def edit(req: dict[str, Any]) -> str:
    path = resolve(req["path"])
    shown = _show(path)
    _regular(path, shown)
    text = _text(_read_bytes(path, shown, int(req["max_file_bytes"])), shown)
    old, new = str(req["old_string"]), str(req["new_string"])
    if not old:
        raise Refused("old_string: must not be empty (use write_file to create or replace a whole file)")
    if old == new:
        raise Refused("new_string: is the same as old_string; nothing would change")
    found = text.count(old)
    if found == 0:
        raise Refused(f"old_string was not found in {shown}: it must match the file exactly, whitespace included")
    if found > 1 and not req.get("replace_all"):
        raise Refused(
            f"old_string occurs {found} times in {shown}: add surrounding lines to make it unique, "
            "or set replace_all to replace every occurrence"
        )
    changed = text.replace(old, new) if req.get("replace_all") else text.replace(old, new, 1)
    data = changed.encode("utf-8")
    if len(data) > int(req["max_file_bytes"]):
        raise Refused(f"the edited file would be {len(data)} bytes, over the {req['max_file_bytes']}-byte limit")
    _write(path, data, stat.S_IMODE(os.lstat(path).st_mode))
    return f"edited {shown}: replaced {found if req.get('replace_all') else 1} occurrence(s)"


def list_files(req: dict[str, Any]) -> str:
    path = resolve(req.get("path") or ".")
    shown = _show(path)
    if not os.path.isdir(path):
        raise Refused(f"{shown!r} is not a directory")
    limit = int(req.get("max_entries") or 1000)
    out: list[str] = []
    more = 0
    for here, dirs, files in os.walk(path):
        dirs.sort()
        rel = os.path.relpath(here, ROOT)
        names = [(d, True) for d in dirs] + [(f, False) for f in sorted(files)]
        for name, is_dir in sorted(names):
            full = os.path.join(here, name)
            shown_name = os.path.normpath(os.path.join(rel, name))
            st = os.lstat(full)
            if len(out) >= limit:
                more += 1
                continue
            if stat.S_ISLNK(st.st_mode):
                out.append(f"{shown_name} -> {os.readlink(full)}")
            elif is_dir:
                out.append(f"{shown_name}/")
            elif stat.S_ISREG(st.st_mode):
                out.append(f"{shown_name}  {st.st_size} bytes")
            else:
                out.append(f"{shown_name}  (special file)")
        if not req.get("recursive"):
            break
    if more:
        out.append(f"[{more} more entries not shown]")
    return "\n".join(out) if out else f"{shown}/ is empty"


def search(req: dict[str, Any]) -> str:
    try:
        pattern = re.compile(str(req["pattern"]))
    except re.error as exc:
        raise Refused(f"pattern: not a valid regular expression: {exc}") from None
    path = resolve(req.get("path") or ".")
    limit = int(req.get("max_results") or 200)
    hits: list[str] = []
    skipped = 0

    def scan(file: str) -> None:
        nonlocal skipped
        st = os.lstat(file)
        if not stat.S_ISREG(st.st_mode) or st.st_size > int(req["max_file_bytes"]):
            return
        with open(file, "rb") as f:
            data = f.read()
        if b"\x00" in data[:8192]:
            return
        for number, line in enumerate(data.decode("utf-8", errors="replace").splitlines(), 1):
            if pattern.search(line):
                if len(hits) >= limit:
                    skipped += 1
                    return
                hits.append(f"{os.path.relpath(file, ROOT)}:{number}: {line[:300]}")

    if os.path.isfile(path):
        scan(path)
    else:
        for here, dirs, files in os.walk(path):
            dirs[:] = sorted(d for d in dirs if d not in SKIP_DIRS)
            for name in sorted(files):
                scan(os.path.join(here, name))
    if skipped:
        hits.append(f"[more matches not shown: the first {limit} are]")
    return "\n".join(hits) if hits else "no matches"


OPERATIONS = {"read": read, "write": write, "edit": edit, "list": list_files, "search": search}


def main(request: str) -> None:
    req = json.loads(request)
    try:
        answer: dict[str, Any] = {"ok": OPERATIONS[req["op"]](req)}
    except Refused as exc:
        answer = {"error": str(exc)}
    except OSError as exc:
        answer = {"error": f"{exc.strerror or exc}: {_show(exc.filename) if exc.filename else ''}".rstrip(": ")}
    answer = {key: _escaped(str(value)) for key, value in answer.items()}
    print("\n" + fit(answer, int(req.get("max_answer_bytes") or 0)))


def _escaped(text: str) -> str:
    """``text`` with a name's bytes that are not UTF-8 (read as lone surrogates) written ``\\xNN``:
    the answer must encode, and a checkpoint then refuses the name (``core.workspace_disk``)."""
    try:
        return text.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    except UnicodeEncodeError:  # a surrogate no byte was read as (from the request itself)
        return text.encode("utf-8", "backslashreplace").decode()


def fit(answer: dict[str, Any], limit: int) -> str:
    """The answer as one line of JSON (UTF-8 as it is, not escaped) of at most ``limit`` bytes:
    an answer longer than the sandbox passes back is cut, with a note, not left for the worker
    to find truncated."""
    text = json.dumps(answer, ensure_ascii=False)
    if not limit or "ok" not in answer or len(text.encode("utf-8")) <= limit:
        return text
    ok = str(answer["ok"])
    note = f"\n[cut: the answer passed the {limit}-byte output limit; ask for less (a line range, a narrower path or pattern)]"
    keep = len(ok)
    while True:
        keep = max(0, min(keep - 1, keep * limit // len(text.encode("utf-8")) * 9 // 10))
        text = json.dumps({"ok": ok[:keep] + note}, ensure_ascii=False)
        if len(text.encode("utf-8")) <= limit or keep == 0:
            return text
