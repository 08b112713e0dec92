"""The check of bench/workspace_chaos.py finds what it is there to find: a file a committed step
made that the manifest lacks (lost), one no committed step made (extra), a change applied twice
(an append replayed) or content, mode or link target that differ; and a state that matches
reads as clean. Without this, a checker that compared nothing would report the chaos run's
zeros just the same."""

from __future__ import annotations

import hashlib
import random
import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
from agentq.core.workspace import Entry, Manifest
from workspace_chaos import Tree, plan_ops


def manifest_of(tree: Tree) -> Manifest:
    entries = [Entry(d, "d", 0o755) for d in tree.dirs]
    entries += [
        Entry(p, "f", mode, len(data), hashlib.sha256(data).hexdigest()) for p, (data, mode) in tree.files.items()
    ]
    entries += [Entry(p, "l", 0o777, 0, target) for p, target in tree.links.items()]
    return Manifest(tuple(sorted(entries)))


def built(ops: list[dict[str, Any]]) -> Tree:
    tree = Tree()
    for op in ops:
        tree.apply(op)
    return tree


@pytest.mark.parametrize("seed", range(20))
def test_a_workspace_as_its_steps_say_is_clean_and_every_kind_of_damage_is_counted(seed: int) -> None:
    ops = plan_ops(random.Random(seed), 14, f"s{seed}")
    tree = built(ops)
    assert not +tree.compare(manifest_of(tree))  # every count zero

    assert tree.files, ops  # each plan starts with a write: there is a file to damage
    path = sorted(tree.files)[0]
    lost = built(ops)
    del lost.files[path]
    assert tree.compare(manifest_of(lost))["lost"] == 1

    extra = built(ops)
    extra.files["stray.txt"] = (b"a turn that never committed\n", 0o644)
    assert tree.compare(manifest_of(extra))["extra"] == 1

    replayed = built(ops)
    replayed.apply({"op": "append", "path": path, "content": "once more\n"})
    assert tree.compare(manifest_of(replayed))["different"] == 1

    moded = built(ops)
    data, mode = moded.files[path]
    moded.files[path] = (data, mode ^ 0o100)
    assert tree.compare(manifest_of(moded))["different"] == 1
