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
from collections.abc import Iterator

import pytest

from agentq.control.conversations import interrupt
from agentq.core.engine import Engine, EngineConfig
from agentq.core.models import TaskStatus
from agentq.core.tools import ToolRegistry
from agentq.storage.container import Storage

from tests.fake_messages_api import FakeMessagesAPI, point_anthropic_at
from tests.helpers import wait_for
from tests.stopped_worker import resume, stopped_at
from tests.test_economy_ledger import _answer, _batches_end, _billed, _task

STORAGE = "moto"


@pytest.fixture
def api(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeMessagesAPI]:
    with FakeMessagesAPI(responder=_answer, batch_seconds=0.3) as server:
        point_anthropic_at(server, monkeypatch.setenv)
        yield server


def _engine(store: Storage, registry: ToolRegistry, name: str, lease: float) -> Engine:
    return Engine(store, worker_id=name, tools=registry, config=EngineConfig(lease_seconds=lease))


@pytest.mark.parametrize(("discarded_by", "ends"), [("timeout", TaskStatus.TIMED_OUT), ("interrupt", TaskStatus.IDLE)])
def test_a_discarded_batch_answer_read_by_a_paused_run_and_by_its_successor_is_charged_once(
    api: FakeMessagesAPI,
    store: Storage,
    registry: ToolRegistry,
    monkeypatch: pytest.MonkeyPatch,
    discarded_by: str,
    ends: TaskStatus,
) -> None:
    """The task's timeout passed while its batch ran, or a person interrupted it: the answer is
    read and charged, not committed. A run paused at its read past its lease, and the run that
    claimed the task after it, both read it: one orphan, charged once, what the provider billed."""
    task_id = _task(store, timeout_seconds=1) if discarded_by == "timeout" else _task(store)
    assert _engine(store, registry, "w", 30).run(task_id).outcome == "waiting"
    started = store.tasks.get(task_id).started_at
    assert started is not None
    _batches_end(api)
    if discarded_by == "timeout":
        wait_for(lambda: time.time() >= started + 1, what="the task's timeout")
    store.tasks.transition(task_id, TaskStatus.QUEUED)  # the batch's poll message
    if discarded_by == "interrupt":
        interrupt(store, task_id, tenant="acme")
    with stopped_at(_engine(store, registry, "paused", 1), task_id, "after_llm_call:1", monkeypatch, wakes=True):
        assert resume(_engine(store, registry, "successor", 30), task_id).status is ends
    billed = _billed(api)
    budget = store.budgets.get(task_id)
    assert billed > 0 and (budget.used, budget.reserved) == (billed, 0), (budget, billed)
    assert len(store.steps.orphans(task_id)) == 1, store.steps.orphans(task_id)


def test_a_batch_whose_read_a_rule_now_denies_is_still_charged_what_the_provider_billed(
    api: FakeMessagesAPI,
    store: Storage,
    registry: ToolRegistry,
) -> None:
    """The batch was sent under the rules of its send; a rule added while it ran (or a spend rule
    the user's day now meets) would deny the call now. The run that reads it sends nothing, so it
    is not refused: it reads and commits the answer the provider billed, charged exactly that.
    Refused, the task failed ``policy_denied`` with its hold given back: billed, charged 0."""
    from agentq.core.policies import check

    task_id = _task(store)
    assert _engine(store, registry, "w", 30).run(task_id).outcome == "waiting"
    held = store.tasks.get(task_id).inflight
    assert held is not None
    text = '@id("no-sonnet") forbid(principal, action == Action::"model", resource == Model::"claude-sonnet-4-6");'
    store.policies.put("acme", "tenant", text, check(text).digest)
    _batches_end(api)
    store.tasks.transition(task_id, TaskStatus.QUEUED)  # the batch's poll message
    result = _engine(store, registry, "reader", 30).run(task_id)
    billed = _billed(api)
    budget = store.budgets.get(task_id)
    assert billed > 0 and (budget.used, budget.reserved) == (billed, 0), (result, budget, billed, held)
    assert result.status is TaskStatus.SUCCEEDED, (result, store.tasks.get(task_id).error)
