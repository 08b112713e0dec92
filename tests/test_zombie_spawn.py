"""Invariant 2 on the spawn path with real processes: a parent's worker paused (SIGSTOP) at a
crash point of its spawn, its lease lapsed and its spawn carried to the end by a successor (the
children written, the fan-out run by moto's Step Functions, the parent woken and ended), then
woken (SIGCONT), writes nothing: not the children's META, not the spawn record, not the root's
budget. A worker killed at the same points (SIGKILL, ``AGENTQ_CRASH_AT``) is resumed by the
successor without a child created twice or a share taken twice (tests/test_fanout.py)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agentq.core import faults
from agentq.core.models import TaskStatus
from agentq.storage import keys
from agentq.storage.container import Storage
from agentq_dev.stack import LocalStack

from tests.helpers import agentq_process, call, scripted, wait_for

# Every point a spawn passes (the SPAWN record written; the children written and the record
# created): a zombie woken at any of them must find itself fenced.
SPAWN_POINTS = [p for p in faults.CRASH_POINTS if "spawn" in p]

TURNS: list[dict[str, Any]] = [
    {
        "text": "",
        "tool_calls": [
            call(
                "spawn_subagents",
                subagents=[{"goal": f"c{i}", "script": {"turns": [{"text": f"r{i}"}]}} for i in range(2)],
            )
        ],
    },
    {"text": "done"},
]


@pytest.fixture(scope="module")
def stack() -> Iterator[LocalStack]:
    """One stack worker (the successor) and no sweeper: the test hands the zombie's task on itself."""
    with LocalStack(prefix=f"zsp{os.getpid() % 10000}", workers=1, api=False, sweep_every=None) as s:
        yield s


def _stopped(pid: int) -> bool:
    """Whether process ``pid`` is stopped (SIGSTOP): its state in /proc is ``T``."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] in ("T", "t")


def _items(store: Storage, root_id: str, children: list[str]) -> dict[str, Any]:
    """What a zombie parent could write: the root's META (its budget on it), its SPAWN records,
    and each child's META (its budget on it) and submission, as stored."""
    found = {"root": store.table.get(keys.meta_key(root_id))}
    for record in store.spawns.list(root_id):
        found[f"spawn {record.spawn_id}"] = store.table.get(keys.item_key(root_id, f"{keys.SPAWN}{record.spawn_id}"))
    for child in children:
        found[f"child {child}"] = store.table.get(keys.meta_key(child))
        found[f"submission {child}"] = store.table.get(keys.submission_key(child))
    return found


def _let_go(item: dict[str, Any] | None) -> bool:
    """No worker holds it any more: no owner, no running slot."""
    return item is None or ("owner_worker" not in item and not item.get("slots"))


def _fields_changed(before: dict[str, Any] | None, after: dict[str, Any] | None) -> dict[str, Any]:
    """Each attribute that differs: (before, after)."""
    b, a = before or {}, after or {}
    return {k: (b.get(k), a.get(k)) for k in sorted(set(b) | set(a)) if b.get(k) != a.get(k)}


@pytest.mark.parametrize("point", SPAWN_POINTS)
def test_a_parent_paused_in_its_spawn_and_woken_after_its_successor_finished_writes_nothing(
    stack: LocalStack, point: str
) -> None:
    """Paused at ``point``; the stack worker takes the parent over once the lease lapsed, carries
    the spawn on, the children succeed, the parent is woken, folds their budgets and succeeds.
    Woken then, the zombie's writes are all refused (``lease_lost``). Before the fence, one
    paused after its SPAWN record wrote the children again (``overwrite``: back to ``queued``,
    step 0, a fresh unsettled budget), and its spawn turn folded those budgets into the root a
    second time: ``reserved`` went negative and ``available`` past ``cap - used``."""
    assert stack.settings is not None
    store = stack.store()
    root = store.tasks.create(scripted(TURNS, tools=["spawn_subagents"], max_tokens=30_000), tenant="t")
    env = stack.env(
        PYTHONPATH=os.pathsep.join(filter(None, [os.getcwd(), os.environ.get("PYTHONPATH", "")])),
        AGENTQ_TOOL_MODULES=",".join([*stack.settings.tool_modules, "tests.pause_faults"]),
        AGENTQ_TEST_PAUSE_AT=f"{point}:1",
    )
    zombie = agentq_process(
        ["run-task", root.task_id, "--lease", "1"], env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        wait_for(lambda: _stopped(zombie.pid), timeout=60, what=f"the zombie paused at {point}")
        wait_for(lambda: store.tasks.get(root.task_id).lease_expires < time.time(), what="the zombie's lease lapsed")
        stack.queues().send(root.task_id, "normal", tenant="t")  # its message, as it would come back
        final = wait_for(
            lambda: (t := store.tasks.get(root.task_id)).status.terminal and t, timeout=120, what="the root's end"
        )
        assert final.status is TaskStatus.SUCCEEDED and final.lease_epoch >= 2
        children = store.spawns.list(root.task_id)[0].children
        ended = store.tasks.get_many(children)
        assert [(c.status, c.step) for c in ended] == [(TaskStatus.SUCCEEDED, 1)] * 2
        budget = store.budgets.get(root.task_id)
        assert budget.reserved == 0 and budget.available == budget.cap - budget.used
        # The workers let each task go after its end (slots given back, the owner's marks gone):
        # what the zombie may not change is what is stored once nothing else writes.
        before = wait_for(
            lambda: (i := _items(store, root.task_id, children)) and all(_let_go(v) for v in i.values()) and i,
            what="the workers letting the tasks go",
        )
    finally:
        os.kill(zombie.pid, signal.SIGCONT)
    out, err = zombie.communicate(timeout=60)
    assert json.loads(out.strip().splitlines()[-1])["outcome"] == "lease_lost", err[-2000:]
    after = _items(store, root.task_id, children)
    changed = {name: _fields_changed(before[name], after[name]) for name in before}
    assert {name: fields for name, fields in changed.items() if fields} == {}
    assert store.spawns.list(root.task_id)[0].children == children  # no spawn record but the one
