"""What changed between two workspace states (``core.workspace`` manifests): the paths added,
removed and changed, and a unified diff of the text files among them, bounded. The API's diff
(``control.files``) and a sub-agent's changes in its spawn result (``core.engine._spawn``) both
show this.

Both run in a shared process (a worker waking the parent, the API) on files a model wrote, so the
diff's work is bounded, not only its size: difflib's matcher is quadratic and worse in the lines
(two 40,000-line files of short repeating lines took ~25 s, 4,000 lines of a period of 99 took
2.4 s). Here it runs on the lines between the two files' common ends only (``_Bounded``), and
counts before each of its searches an upper bound of the line comparisons it makes; a file whose
diff would pass ``MAX_FILE_COMPARISONS``, or the diff's ``MAX_COMPARISONS`` in all, is named
("Large files differ", with both sides' sizes and hashes), not shown.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from itertools import accumulate
from typing import Literal

from agentq.core.workspace import Entry, Manifest, diff

MAX_DIFF_FILE_BYTES = 1024 * 1024  # a file larger than this on either side gets no text diff
MAX_FILE_COMPARISONS = 2_000_000  # line comparisons one file's diff may make (~0.5 s of difflib)
MAX_COMPARISONS = 4_000_000  # line comparisons one diff may make, all its files together (~1 s)
Read = Callable[[str], bytes]  # a content hash -> its bytes
Opcode = tuple[Literal["replace", "delete", "insert", "equal"], int, int, int, int]


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
    left = [MAX_COMPARISONS]
    for path in sorted(paths["added"] + paths["removed"] + paths["changed"]):
        piece = _file_patch(path, before.get(path), after.get(path), read_old, read_new, left)
        if not piece:
            continue
        if size + len(piece) > max_chars:
            truncated = True
            break
        parts.append(piece)
        size += len(piece)
    return Diff(paths["added"], paths["removed"], paths["changed"], "".join(parts), truncated)


def _file_patch(path: str, a: Entry | None, b: Entry | None, read_old: Read, read_new: Read, left: list[int]) -> str:
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
        return f"{head}{note}Large files differ ({_sides(a, b)}): over {MAX_DIFF_FILE_BYTES} bytes\n"
    texts = [text_of(read_old(a.digest)) if a else "", text_of(read_new(b.digest)) if b else ""]
    if texts[0] is None or texts[1] is None:
        return f"{head}{note}Binary files differ\n"
    matcher = _Bounded(texts[0].splitlines(keepends=True), texts[1].splitlines(keepends=True), left[0])
    try:
        lines = list(_unified(matcher))
    except _Spent:
        return (
            f"{head}{note}Large files differ ({_sides(a, b)}): not diffed, more than "
            f"{matcher.budget} line comparisons\n"
        )
    finally:
        left[0] -= matcher.spent
    body = "".join(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n" for line in lines)
    return f"{head}{note}{body}"


def _sides(a: Entry | None, b: Entry | None) -> str:
    """Each side's size and hash, so a reader can fetch and compare them itself."""
    return "; ".join(f"{side}: {e.size} bytes, sha256 {e.digest}" for side, e in (("a", a), ("b", b)) if e)


class _Spent(Exception):
    """The matcher's next search could pass its budget of line comparisons."""


class _Bounded(difflib.SequenceMatcher[str]):
    """difflib's matcher over the lines between the two files' common first and last lines (found
    in one pass), its opcodes given in the whole files' numbering. Before each search for a
    longest match it counts what that search may compare at most: each line of its range of
    ``a`` against every position of that line in ``b`` (``b2j``; autojunk drops lines over 1 %),
    and the match's four extensions, each at most the shorter range; past ``budget`` it raises
    ``_Spent`` instead of searching."""

    a: list[str]  # difflib's own attributes: the lines between the common ends, and where each
    b: list[str]  # line of ``b`` that is not junk is
    b2j: dict[str, list[int]]

    def __init__(self, a: list[str], b: list[str], budget: int) -> None:
        first = _common(zip(a, b, strict=False))
        last = min(_common(zip(reversed(a), reversed(b), strict=False)), min(len(a), len(b)) - first)
        super().__init__(None, a[first : len(a) - last], b[first : len(b) - last])
        self.ends = (first, last, len(a), len(b))
        self.whole = (a, b)
        self.budget, self.spent = min(budget, MAX_FILE_COMPARISONS), 0
        self.costs: list[int] | None = None

    def find_longest_match(
        self, alo: int = 0, ahi: int | None = None, blo: int = 0, bhi: int | None = None
    ) -> difflib.Match:
        ahi = len(self.a) if ahi is None else ahi
        bhi = len(self.b) if bhi is None else bhi
        if self.costs is None:  # per line of ``a``: its positions in ``b``, and itself
            self.costs = list(accumulate((len(self.b2j.get(line, ())) + 1 for line in self.a), initial=0))
        self.spent += self.costs[ahi] - self.costs[alo] + 4 * min(ahi - alo, bhi - blo)
        if self.spent > self.budget:
            raise _Spent
        return super().find_longest_match(alo, ahi, blo, bhi)

    def get_opcodes(self) -> list[Opcode]:
        first, last, la, lb = self.ends
        codes: list[Opcode] = [("equal", 0, first, 0, first)] if first else []
        codes += [
            (tag, i1 + first, i2 + first, j1 + first, j2 + first) for tag, i1, i2, j1, j2 in super().get_opcodes()
        ]
        return codes + ([("equal", la - last, la, lb - last, lb)] if last else [])


def _common(pairs: Iterable[tuple[str, str]]) -> int:
    """How many of the first pairs of lines are equal."""
    n = 0
    for x, y in pairs:
        if x != y:
            break
        n += 1
    return n


def _unified(matcher: _Bounded, context: int = 3) -> Iterator[str]:
    """``difflib.unified_diff``'s hunks (without its two header lines) from ``matcher``."""
    a, b = matcher.whole
    for group in matcher.get_grouped_opcodes(context):
        yield f"@@ -{_range(group[0][1], group[-1][2])} +{_range(group[0][3], group[-1][4])} @@\n"
        for tag, i1, i2, j1, j2 in group:
            if tag == "equal":
                yield from (" " + line for line in a[i1:i2])
                continue
            if tag in ("replace", "delete"):
                yield from ("-" + line for line in a[i1:i2])
            if tag in ("replace", "insert"):
                yield from ("+" + line for line in b[j1:j2])


def _range(start: int, stop: int) -> str:
    """A hunk's range as unified diffs write it (difflib's ``_format_range_unified``)."""
    length = stop - start
    if length == 1:
        return f"{start + 1}"
    return f"{start + 1 if length else start},{length}"
