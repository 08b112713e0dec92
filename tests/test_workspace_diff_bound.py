"""The diff of two workspace states does bounded work (core/workspace_diff.py), whatever the files.

A sub-agent's changes are diffed in its parent's wake (``Workspaces.child_changes``) and a task's
steps in the API's step diff (``control.files``), in a process other tasks share, and the model
writes the files. difflib's matcher ran over any text file up to 1 MB, its time growing faster
than the square of the lines: a child's 160 KB rewrite of a file of short repeating lines took
~25 s, a 12 KB file of 4,000 lines repeating every 99 took 2.4 s. Now the matcher runs on the lines
between the files' common ends, with a budget of line comparisons it counts before each search; a
file past it is named with both sides' sizes and hashes.

Work is measured as the lines of Python run (``sys.settrace``: difflib is pure Python), which
does not depend on the machine's speed or load; the count stops the run once it passes the bound,
so a diff that would take minutes fails in a second. A diff within the bound is still made, as
difflib makes it.
"""

from __future__ import annotations

import difflib
import hashlib
import random
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any

from agentq.core.workspace import Entry, Manifest
from agentq.core.workspace_diff import MAX_COMPARISONS, MAX_FILE_COMPARISONS, Diff, changes


class TooMuchWork(AssertionError):
    pass


@contextmanager
def lines_run(most: int) -> Iterator[list[int]]:
    """Count the lines of Python this thread runs, in every frame; past ``most``, raise."""
    count = [0]

    def local(frame: FrameType, event: str, arg: Any) -> Any:
        if event == "line":
            count[0] += 1
            if count[0] > most:
                raise TooMuchWork(f"more than {most} lines of Python run")
        return local

    previous = sys.gettrace()
    sys.settrace(lambda frame, event, arg: local)
    try:
        yield count
    finally:
        sys.settrace(previous)


def diff_of(files: dict[str, tuple[bytes, bytes]], max_chars: int = 16_000) -> Diff:
    """``changes`` from each file's first content to its second."""
    blobs = {hashlib.sha256(data).hexdigest(): data for pair in files.values() for data in pair}

    def manifest(side: int) -> Manifest:
        entries = (Entry(p, "f", 0o644, len(d[side]), hashlib.sha256(d[side]).hexdigest()) for p, d in files.items())
        return Manifest(tuple(sorted(entries)))

    return changes(manifest(0), blobs.__getitem__, manifest(1), blobs.__getitem__, max_chars)


def named(old: bytes, new: bytes) -> str:
    sides = (
        f"{side}: {len(data)} bytes, sha256 {hashlib.sha256(data).hexdigest()}"
        for side, data in (("a", old), ("b", new))
    )
    return f"Large files differ ({'; '.join(sides)}): not diffed, more than"


def test_a_rewrite_of_a_file_of_short_repeating_lines_is_named_after_work_linear_in_its_lines() -> None:
    rng = random.Random(1)
    vocab = [f"{i:03d}\n" for i in range(110)]  # each line under 1 % of the file: difflib's autojunk keeps them
    old, new = ("".join(rng.choice(vocab) for _ in range(40_000)).encode() for _ in range(2))
    with lines_run(10 * 40_000) as count:  # was: ~25 s of difflib, stopped here at 400,000 lines run
        found = diff_of({"f.txt": (old, new)})
    assert found.changed == ["f.txt"] and named(old, new) in found.patch, found.patch
    assert count[0] < 10 * 40_000


def test_a_file_whose_diff_would_pass_its_budget_is_named_once_the_budget_is_spent() -> None:
    """4,000 lines repeating every 99: small enough to start, costly enough that the matcher's
    budget runs out while it searches (5.9 million comparisons, 2.4 s, before)."""
    old = "".join(f"{i % 99}\n" for i in range(4000)).encode()
    new = "".join(f"{(i * 7) % 99}\n" for i in range(4000)).encode()
    with lines_run(5 * MAX_FILE_COMPARISONS):  # ~4 lines run per comparison counted
        found = diff_of({"f.txt": (old, new)})
    assert named(old, new) in found.patch and f"than {MAX_FILE_COMPARISONS} line comparisons" in found.patch


def test_a_small_change_to_a_large_file_is_diffed_as_difflib_diffs_it_in_work_linear_in_its_lines() -> None:
    old = "".join(f"line {i}\n" for i in range(40_000))
    new = old.replace("line 20000\n", "changed\n") + "a last line without its newline"
    with lines_run(20 * 40_000):
        found = diff_of({"f.txt": (old.encode(), new.encode())}, max_chars=100_000)
    expected = "".join(
        line if line.endswith("\n") else line + "\n\\ No newline at end of file\n"
        for line in difflib.unified_diff(old.splitlines(True), new.splitlines(True), "a/f.txt", "b/f.txt", n=3)
    )
    assert found.patch == expected
    assert "@@ -19998,7 +19998,7 @@" in found.patch and not found.truncated


def test_the_files_of_one_diff_share_its_budget_and_those_past_it_are_named() -> None:
    """Four files of 2,000 lines repeating every 99, each within a file's budget (1.3 million
    comparisons) and together past the diff's: the last is named, not diffed."""
    old = "".join(f"{i % 99}\n" for i in range(2000)).encode()
    new = "".join(f"{(i * 7) % 99}\n" for i in range(2000)).encode()
    found = diff_of({f"f{n}.txt": (old, new) for n in range(4)}, max_chars=10_000_000)
    assert [n for n in range(4) if f"+++ b/f{n}.txt\n@@ " in found.patch] == [0, 1, 2], MAX_COMPARISONS
    assert f"+++ b/f3.txt\n{named(old, new)}" in found.patch
