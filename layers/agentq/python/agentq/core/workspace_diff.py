"""What changed between two workspace states (``core.workspace`` manifests): the paths added,
removed and changed, and a unified diff of the text files among them, bounded. The API's diff
(``control.files``) and a sub-agent's changes in its spawn result (``core.engine._spawn``) both
show this."""

from __future__ import annotations

import difflib
from collections.abc import Callable
from dataclasses import dataclass

from agentq.core.workspace import Entry, Manifest, diff

MAX_DIFF_FILE_BYTES = 1024 * 1024  # a file larger than this on either side gets no text diff
Read = Callable[[str], bytes]  # a content hash -> its bytes


def text_of(data: bytes) -> str | None:
    """The file as text, or None if it is not UTF-8 text (a NUL byte counts as binary)."""
    if b"\x00" in data:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


@dataclass
class Diff:
    added: list[str]
    removed: list[str]
    changed: list[str]
    patch: str
    truncated: bool


def changes(old: Manifest, read_old: Read, new: Manifest, read_new: Read, max_chars: int) -> Diff:
    """Paths added, removed and changed from ``old`` to ``new``, and a unified diff of the text
    files among them (binary and large files named, not shown), cut at ``max_chars``."""
    paths = diff(old, new)
    before, after = old.by_path(), new.by_path()
    parts: list[str] = []
    size, truncated = 0, False
    for path in sorted(paths["added"] + paths["removed"] + paths["changed"]):
        piece = _file_patch(path, before.get(path), after.get(path), read_old, read_new)
        if not piece:
            continue
        if size + len(piece) > max_chars:
            truncated = True
            break
        parts.append(piece)
        size += len(piece)
    return Diff(paths["added"], paths["removed"], paths["changed"], "".join(parts), truncated)


def _file_patch(path: str, a: Entry | None, b: Entry | None, read_old: Read, read_new: Read) -> str:
    head = f"--- {'a/' + path if a else '/dev/null'}\n+++ {'b/' + path if b else '/dev/null'}\n"
    if (a and a.kind != "f") or (b and b.kind != "f"):
        return ""  # directories and links: named in added/removed/changed only
    assert a is not None or b is not None
    note = ""
    if a and b and a.mode != b.mode:
        note = f"mode {a.mode:o} -> {b.mode:o}\n"
    if a and b and a.digest == b.digest:
        return f"{head}{note}" if note else ""
    if (a and a.size > MAX_DIFF_FILE_BYTES) or (b and b.size > MAX_DIFF_FILE_BYTES):
        return f"{head}{note}Large files differ\n"
    texts = [text_of(read_old(a.digest)) if a else "", text_of(read_new(b.digest)) if b else ""]
    if texts[0] is None or texts[1] is None:
        return f"{head}{note}Binary files differ\n"
    lines = difflib.unified_diff(
        texts[0].splitlines(keepends=True), texts[1].splitlines(keepends=True), n=3, lineterm="\n"
    )
    body = "".join(
        line if line.endswith("\n") else line + "\n\\ No newline at end of file\n" for line in list(lines)[2:]
    )
    return f"{head}{note}{body}"
