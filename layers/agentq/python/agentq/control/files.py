"""A task's files as the API serves them: the workspace as of any committed step, one file's
bytes, and what changed between two steps (``core.workspace`` says what a manifest keeps).

The state of step N is the manifest of the last tools step at or before N that changed the
workspace (a step records a manifest only when its turn changed the files), or the starting
files when none did: the same rule a fork from step N follows (``storage.tasks.fork``;
``storage/workspace_state.py`` reads it, for the A2A artifacts too). The
starting files are the submission's inline ones, the clone recorded at the first claim
(``Task.workspace_start``), or stored content the submission names (an uploaded archive, a
parent's workspace); every manifest a step names has all its content in the bucket (the
checkpoint's order, ARCHITECTURE invariant 13), read through ``storage.workspaces``, which looks
content the task did not store itself up where it is (``core.workspace.lookup_of``). Every answer is bounded: a page of entries, a file of at most
``MAX_FILE_BYTES`` (a Lambda answer is 6 MB), a patch of at most ``MAX_PATCH_CHARS``.
"""

from __future__ import annotations

import re

from agentq.core.errors import TaskNotFound, ValidationError
from agentq.core.workspace import Entry, check_path
from agentq.core.workspace_diff import MAX_DIFF_FILE_BYTES as MAX_DIFF_FILE_BYTES
from agentq.core.workspace_diff import Diff, changes
from agentq.core.workspace_diff import text_of as text_of
from agentq.storage.workspace_state import NoWorkspace as NoWorkspace
from agentq.storage.workspace_state import State as State
from agentq.storage.workspace_state import state_at as state_at

MAX_FILE_BYTES = 4 * 1024 * 1024  # served whole; base64 of it fits a 6 MB Lambda answer
MAX_PATCH_CHARS = 256 * 1024  # of unified diff text in one answer
_RANGE = re.compile(r"(\d{1,9})\.\.(\d{1,9})?")


class FileNotInWorkspace(TaskNotFound):
    code = "file_not_found"


def entry(state: State, path: str) -> Entry:
    """The manifest's entry for ``path``; a path that is not relative is 422, one not there 404."""
    try:
        check_path(path)
    except ValueError as exc:
        raise ValidationError(f"path: {exc}", field="path") from None
    found = state.manifest.by_path().get(path)
    if found is None:
        raise FileNotInWorkspace(f"no file {path!r} in the workspace at step {state.step}", field="path")
    return found


def page(state: State, *, after: str | None, limit: int) -> tuple[list[Entry], str | None]:
    """Up to ``limit`` entries after path ``after`` (the manifest is sorted by path), and the
    cursor of the next page."""
    rest = [e for e in state.manifest.entries if after is None or e.path > after]
    shown = rest[:limit]
    return shown, (shown[-1].path if len(rest) > limit else None)


def content(state: State, path: str) -> tuple[Entry, bytes]:
    """One regular file's bytes; a directory, a link or a file over ``MAX_FILE_BYTES`` is 422."""
    found = entry(state, path)
    if found.kind == "d":
        raise ValidationError(f"path: {path!r} is a directory; list the files instead", field="path")
    if found.kind == "l":
        raise ValidationError(f"path: {path!r} is a symbolic link to {found.digest!r}", field="path")
    if found.size > MAX_FILE_BYTES:
        raise ValidationError(
            f"path: {path!r} is {found.size} bytes, over the {MAX_FILE_BYTES} served in one answer", field="path"
        )
    return found, state.read(found.digest)


def parse_range(value: str) -> tuple[int, int | None]:
    """``A..B`` (or ``A..``: to the last step), each a step number."""
    match = _RANGE.fullmatch(value)
    if match is None:
        raise ValidationError(
            f"steps: {value!r} is not a range A..B of step numbers (or A.. for the last)", field="steps"
        )
    first = int(match.group(1))
    last = int(match.group(2)) if match.group(2) is not None else None
    return first, last


def compare(old: State, new: State) -> Diff:
    """Paths added, removed and changed from ``old`` to ``new``, and a unified diff of the text
    files among them (binary and large files named, not shown), cut at ``MAX_PATCH_CHARS``."""
    return changes(old.manifest, old.read, new.manifest, new.read, MAX_PATCH_CHARS)
