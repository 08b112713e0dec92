"""``agentq dev --reload``: restart the workers when a tool module's source changes.

The watched files are the tool modules' own (every ``.py`` under a package), found by
``importlib`` and polled for their modification time, since a dev loop needs no file-system
notification library. A change is first imported in this process, afresh: a module that no
longer imports (a syntax error mid-edit) is reported in one line and the running workers are
kept, instead of replacing them with workers that would exit at start. Workers are stopped
with SIGTERM, so each ends its tasks at a step boundary and the new ones resume them.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path


def module_files(names: tuple[str, ...]) -> list[Path]:
    """The source files of ``names`` (a package: every ``.py`` below it)."""
    files: list[Path] = []
    for name in names:
        spec = importlib.util.find_spec(name)
        if spec is None:
            continue
        if spec.submodule_search_locations:
            for location in spec.submodule_search_locations:
                files += sorted(Path(location).rglob("*.py"))
        elif spec.origin and spec.origin.endswith(".py"):
            files.append(Path(spec.origin))
    return files


class ModuleWatcher:
    def __init__(self, names: tuple[str, ...]) -> None:
        self.names = names
        self._seen = self._snapshot()

    def _snapshot(self) -> dict[Path, float]:
        stamps = {}
        for path in module_files(self.names):
            try:
                stamps[path] = path.stat().st_mtime
            except OSError:
                continue
        return stamps

    def changed(self) -> list[Path]:
        """Files added, removed or modified since the last call."""
        now = self._snapshot()
        changed = [p for p in now.keys() | self._seen.keys() if now.get(p) != self._seen.get(p)]
        self._seen = now
        return sorted(changed)


def forget(names: tuple[str, ...]) -> None:
    """Drop ``names`` and their submodules from ``sys.modules``, so the next import reads the
    files again."""
    for loaded in list(sys.modules):
        if any(loaded == n or loaded.startswith(n + ".") for n in names):
            del sys.modules[loaded]
