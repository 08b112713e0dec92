"""A batch the provider billed is charged to its task's budget once, whoever reads it and
whatever is decided meanwhile (ARCHITECTURE 4).

- A batch's answer that is discarded rather than committed (the task's timeout cut it, an
  interrupt) may be read by a run paused past its lease and, again, by the run that claimed the
  task after it: only the run holding the hold's ticket charges it and records its orphan
  (``Answers.discard``). The commit path's twin is in tests/test_economy_caps.py.
- A rule added while the batch ran, or a circuit opened, does not refuse the run that reads it:
  nothing is sent then, and refused, the hold went back and the billed batch was never read
  (``LLMTurn.run``).
On the moto server, as a deployed worker's store."""

from __future__ import annotations

import time
from typing import Any

import pytest

from agentq.control.conversations import interrupt
from agentq.core.engine import Engine, EngineConfig
from agentq.core.models import TaskStatus
from agentq.core.tools import ToolRegistry
from agentq.storage.container import Storage

from tests.helpers import wait_for
from tests.stopped_worker import resume, stopped_at
from tests.test_economy_ledger import _batches_end, _billed, _task, api  # noqa: F401

STORAGE = "moto"


def _engine(store: Storage, registry: ToolRegistry, name: str, lease: float) -> Engine:
    return Engine(store, worker_id=name, tools=registry, config=EngineConfig(lease_seconds=lease))


def test_a_timed_out_batch_read_by_a_paused_run_and_by_its_successor_is_charged_once(
    api: Any, store: Storage, registry: ToolRegistry, monkeypatch: pytest.MonkeyPatch  # noqa: F811
) -> None:
    task_id = _task(store, timeout_seconds=1)
    assert _engine(store, registry, "w", 30).run(task_id).outcome == "waiting"
    started = store.tasks.get(task_id).started_at
    assert started is not None
    _batches_end(api)
    wait_for(lambda: time.time() >= started + 1, what="the task's timeout")
    store.tasks.transition(task_id, TaskStatus.QUEUED)  # the batch's poll message
    with stopped_at(_engine(store, registry, "paused", 1), task_id, "after_llm_call:1", monkeypatch, wakes=True):
        assert resume(_engine(store, registry, "successor", 30), task_id).status is TaskStatus.TIMED_OUT
    billed = _billed(api)
    budget = store.budgets.get(task_id)
    assert billed > 0 and (budget.used, budget.reserved) == (billed, 0), (budget, billed)
    assert len(store.steps.orphans(task_id)) == 1, store.steps.orphans(task_id)


def test_an_interrupted_batch_answer_read_by_a_paused_run_and_by_its_successor_is_charged_once(
    api: Any, store: Storage, registry: ToolRegistry, monkeypatch: pytest.MonkeyPatch  # noqa: F811
) -> None:
    task_id = _task(store)
    assert _engine(store, registry, "w", 30).run(task_id).outcome == "waiting"
    _batches_end(api)
    store.tasks.transition(task_id, TaskStatus.QUEUED)  # the batch's poll message
    interrupt(store, task_id, tenant="acme")
    with stopped_at(_engine(store, registry, "paused", 1), task_id, "after_llm_call:1", monkeypatch, wakes=True):
        assert resume(_engine(store, registry, "successor", 30), task_id).status is TaskStatus.IDLE
    billed = _billed(api)
    budget = store.budgets.get(task_id)
    assert billed > 0 and (budget.used, budget.reserved) == (billed, 0), (budget, billed)
    assert len(store.steps.orphans(task_id)) == 1, store.steps.orphans(task_id)

