"""Declaring a grader: the ``@grader`` functions a deployment's tool modules hold, and what one
is given (``GradeInput``, with the task's workspace files read-only). An outcome names one
(``outcome.grader``); ``core.grading`` runs it and reads what it returned.

Imports nothing of the models: the tool registry (``core.tools``), which the models import,
keeps the graders beside the tools.
"""

from __future__ import annotations

import typing
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MAX_FILE_BYTES = 10 * 1024 * 1024  # a workspace file a grader may read at once


class WorkspaceFiles(Mapping[str, bytes]):
    """The task's workspace as the answer left it, read-only: ``files["report.md"]`` is the
    file's bytes (``text(path)``: decoded), iterating gives the relative paths. A path that
    leaves the workspace (``..``, a symlink out) is not in it. Reads only: a grader cannot
    change what the task produced."""

    def __init__(self, root: Path) -> None:
        self._root = root.resolve()

    def _path(self, name: object) -> Path | None:
        if not isinstance(name, str) or not name or name.startswith("/"):
            return None
        path = (self._root / name).resolve()
        if not path.is_relative_to(self._root) or not path.is_file():
            return None
        return path

    def __getitem__(self, name: str) -> bytes:
        path = self._path(name)
        if path is None:
            raise KeyError(name)
        if path.stat().st_size > MAX_FILE_BYTES:
            raise ValueError(f"{name}: larger than {MAX_FILE_BYTES} bytes")
        return path.read_bytes()

    def text(self, name: str) -> str:
        return self[name].decode("utf-8", errors="replace")

    def __iter__(self) -> Iterator[str]:
        for path in sorted(self._root.rglob("*")):
            resolved = path.resolve()
            if path.is_file() and resolved.is_relative_to(self._root):
                yield path.relative_to(self._root).as_posix()

    def __len__(self) -> int:
        return sum(1 for _ in self)

    def __contains__(self, name: object) -> bool:
        return self._path(name) is not None


@dataclass(frozen=True)
class GradeInput:
    """What a ``@grader`` function is given."""

    task_id: str
    goal: str
    answer: str  # the result the task would end with: the text, or the JSON of an output_schema answer
    output: Any  # with an output_schema, the answer parsed; else None
    attempt: int
    files: WorkspaceFiles | None  # the workspace, read-only; None: the task has none


@dataclass(frozen=True)
class GraderSpec:
    """A declared grader. Calling it calls the function unchanged, so unit tests stay plain."""

    name: str
    description: str
    fn: Callable[[GradeInput], Any]

    def __call__(self, given: GradeInput) -> Any:
        return self.fn(given)


@typing.overload
def grader(fn: Callable[[GradeInput], Any]) -> GraderSpec: ...


@typing.overload
def grader(fn: None = None, *, name: str | None = None) -> Callable[[Callable[[GradeInput], Any]], GraderSpec]: ...


def grader(
    fn: Callable[[GradeInput], Any] | None = None, *, name: str | None = None
) -> GraderSpec | Callable[[Callable[[GradeInput], Any]], GraderSpec]:
    """Declare a function of a tool module as a grader an outcome may name (``outcome.grader``);
    usable bare (``@grader``) or with a ``name``. It takes a ``GradeInput``."""

    def decorate(f: Callable[[GradeInput], Any]) -> GraderSpec:
        return GraderSpec(name=name or f.__name__, description=(f.__doc__ or "").strip(), fn=f)

    if fn is not None:
        return decorate(fn)
    return decorate
