"""The id of an event in a tree's stream, as text: where the watch stood in each task of the tree.

``tree:<root task id>~<root position>`` then ``~<path>:<position>`` for every sub-agent that has
sent anything, in path order. A sub-agent is named by its *path*, its place in the tree: ``2`` is
the root's second child (counting the children of every ``task.spawned`` event of the root, in
commit order), ``2.1`` that one's first. A path is short and stable, where the sub-agent's task id
(45 characters) would make the id of a 20-task tree a kilobyte; the server turns paths back into
tasks from the parents' spawn events (``Watch.resume``). A sub-agent the watch knows of but has
sent nothing of is left out (its parent's spawn event says it exists), except when the watch is
full (``MAX_TREE_TASKS``): then each such one is listed as ``<path>:-``, because which of the
spawned were admitted is then not implied.

The text has exactly one spelling for one state (paths without leading zeros, in increasing
order, each once), and anything else is refused: an id is never read as something it was not.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from agentq.api.views import InvalidCursor
from agentq.storage.events import Position

TREE = "tree:"
MAX_TREE_TASKS = 200  # a tree's id names each task that has sent anything: it stays a header a proxy passes
Path = tuple[int, ...]  # () is the root; (2, 1): the first child of its second child

_PATH = re.compile(r"[1-9][0-9]{0,5}(?:\.[1-9][0-9]{0,5}){0,10}")
_ROOT = re.compile(r"[A-Za-z0-9_-]{1,128}")  # a task id (api/models.TASK_ID_PATTERN)
SHAPE = "tree:<root task id>~<position>[~<path>:<position>]..."


def path_text(path: Path) -> str:
    return ".".join(str(i) for i in path)


@dataclass(frozen=True)
class TreeCursor:
    """The root's position, and each sub-agent's (None: known of, nothing sent) by its path."""

    root: str
    position: Position
    children: dict[Path, Position | None]

    def __str__(self) -> str:
        parts = [f"{TREE}{self.root}", str(self.position)]
        for path in sorted(self.children):
            pos = self.children[path]
            parts.append(f"{path_text(path)}:{pos if pos is not None else '-'}")
        return "~".join(parts)

    @classmethod
    def parse(cls, text: str, field: str) -> TreeCursor:
        """The cursor ``text`` spells; ``InvalidCursor`` naming ``field`` for anything else."""
        if not text.startswith(TREE):
            raise InvalidCursor(f"{field}: not a tree's event id ({SHAPE})", field=field)
        parts = text[len(TREE) :].split("~")
        if len(parts) < 2 or not _ROOT.fullmatch(parts[0]):
            raise InvalidCursor(f"{field}: not a tree's event id ({SHAPE})", field=field)
        if len(parts) - 1 > MAX_TREE_TASKS:  # the root's id, then one position a task
            raise InvalidCursor(f"{field}: names more than {MAX_TREE_TASKS} tasks", field=field)
        position = _position(parts[1], field)
        children: dict[Path, Position | None] = {}
        last: Path = ()
        for part in parts[2:]:
            name, sep, pos = part.partition(":")
            if not sep or not _PATH.fullmatch(name):
                raise InvalidCursor(
                    f"{field}: {part[:40]!r} is not <path>:<position> (a path is like 2.1)", field=field
                )
            path = tuple(int(i) for i in name.split("."))
            if path <= last:
                raise InvalidCursor(f"{field}: sub-agent {name} is out of order or named twice", field=field)
            last = path
            children[path] = None if pos == "-" else _position(pos, field)
        return cls(parts[0], position, children)


def _position(text: str, field: str) -> Position:
    try:
        return Position.parse(text)
    except ValueError:
        raise InvalidCursor(f"{field}: {text[:40]!r} is not an event position this API issued", field=field) from None
