"""Economy (Message Batches) and the task's budget (ARCHITECTURE 4, "Hard budgets"): a batch the
provider billed is charged to the budget exactly once, however its task's run ends (its
``timeout_seconds`` passed while it ran, an interrupt discarded its answer, its read failed and
the task was redriven); what cannot be known is counted apart as unknown, at most its hold.

Each test sets the budget's ``used`` against what the fake Messages API delivered (billed): the
real ``anthropic`` SDK against tests/fake_messages_api.py, on the in-memory store."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from agentq.control.conversations import interrupt, send_message
from agentq.core.engine import Engine, EngineConfig
from agentq.core.models import LLMStep, TaskStatus, TaskSubmission
from agentq.core.tools import ToolRegistry
from agentq.storage.container import Storage

from tests.fake_messages_api import FakeMessagesAPI, RecordedRequest, message_reply, point_anthropic_at
from tests.helpers import wait_for
from tests.test_conversations import Queues

STORAGE = "memory"


def _answer(request: RecordedRequest) -> Any:
    return message_reply([{"type": "text", "text": "done"}], usage={"input_tokens": 100, "output_tokens": 50})


@pytest.fixture
def api(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeMessagesAPI]:
    with FakeMessagesAPI(responder=_answer, batch_seconds=0.3) as server:
        point_anthropic_at(server, monkeypatch.setenv)
        yield server


def _task(store: Storage, **constraints: Any) -> str:
    sub = TaskSubmission.model_validate({
        "goal": "answer", "provider": "anthropic", "model": "claude-sonnet-4-6",
        "constraints": {"economy": True, "max_output_tokens": 500, **constraints},
    })  # fmt: skip
    return store.tasks.create(sub, tenant="acme").task_id


def _run(store: Storage, registry: ToolRegistry, task_id: str) -> Any:
    return Engine(store, worker_id="w", tools=registry, config=EngineConfig(lease_seconds=30)).run(task_id)


def _batches_end(api: FakeMessagesAPI) -> None:
    last = max(b["created"] for b in api.batches.values())
    wait_for(lambda: time.time() >= last + api.batch_seconds, what="the batches' end")


def _read(store: Storage, registry: ToolRegistry, task_id: str) -> Any:
    store.tasks.transition(task_id, TaskStatus.QUEUED)  # what the batch's poll message does
    return _run(store, registry, task_id)


def _billed(api: FakeMessagesAPI) -> int:
    """What the provider billed: every answer it delivered (a batch's, read or not)."""
    return sum(u["input_tokens"] + u["output_tokens"] for u in api.delivered_usage)


def test_a_task_that_times_out_while_its_batch_runs_is_charged_that_batchs_answer_once(
    api: FakeMessagesAPI, store: Storage, registry: ToolRegistry
) -> None:
    """Its ``timeout_seconds`` passes while the batch runs: the claim that the batch's end brings
    ends the task ``timed_out`` and reads the answer the provider billed, charged once as the
    orphan it is (the answer is cut, as a call in flight at the timeout is), never committed.
    It used to end the task giving the batch's hold back: billed, charged nothing."""
    task_id = _task(store, timeout_seconds=1)
    assert _run(store, registry, task_id).outcome == "waiting"
    started = store.tasks.get(task_id).started_at
    assert started is not None
    _batches_end(api)
    wait_for(lambda: time.time() >= started + 1, what="the task's timeout")
    result = _read(store, registry, task_id)
    assert result.status is TaskStatus.TIMED_OUT, result
    budget = store.budgets.get(task_id)
    assert _billed(api) > 0 and (budget.used, budget.unknown, budget.reserved) == (_billed(api), 0, 0), budget
    [orphan] = store.steps.orphans(task_id)
    assert orphan.reason == "timed_out" and orphan.call.usage.total == _billed(api)
    assert not [s for s in store.steps.load(task_id) if isinstance(s.body, LLMStep)]  # cut, not committed
    assert store.tasks.get(task_id).batch is None


def test_a_batchs_answer_discarded_by_an_interrupt_is_charged_once_and_never_read_again(
    api: FakeMessagesAPI, store: Storage, registry: ToolRegistry
) -> None:
    """An interrupt asked for as the batch's answer is read discards the answer, charged as an
    orphan; the batch is forgotten with that charge, so the run after the next message sends the
    turn anew (the message in it). It used to read the same batch again after the message and
    commit it, charged a second time."""
    task_id = _task(store)
    assert _run(store, registry, task_id).outcome == "waiting"
    _batches_end(api)
    store.tasks.transition(task_id, TaskStatus.QUEUED)  # what the batch's poll message does
    interrupt(store, task_id, tenant="acme")
    assert _run(store, registry, task_id).status is TaskStatus.IDLE
    [orphan] = store.steps.orphans(task_id)
    assert orphan.reason == "interrupted"
    assert store.budgets.get(task_id).used == _billed(api) == orphan.call.usage.total
    send_message(store, Queues(), task_id, "go on", tenant="acme")
    assert _run(store, registry, task_id).outcome == "waiting"
    _batches_end(api)
    assert _read(store, registry, task_id).status is TaskStatus.SUCCEEDED
    budget = store.budgets.get(task_id)
    assert (budget.used, budget.unknown, budget.reserved) == (_billed(api), 0, 0), budget  # each batch once
    assert len(api.batches) == 2  # the turn sent anew, with the message
    assert len([s for s in store.steps.load(task_id) if isinstance(s.body, LLMStep)]) == 1


def test_a_task_failed_on_a_lost_batch_and_redriven_counts_its_hold_as_unknown_once(
    api: FakeMessagesAPI, store: Storage, registry: ToolRegistry
) -> None:
    """The API no longer knows the batch (``batch_not_found``): its hold is counted as unknown,
    and the batch is forgotten in that write, so a redrive sends the turn anew, charged as any
    call, and never reads the lost batch again. It used to read it again at each redrive and
    count a fresh hold as unknown each time."""
    task_id = _task(store)
    assert _run(store, registry, task_id).outcome == "waiting"
    held = store.tasks.get(task_id).inflight
    assert held is not None
    _batches_end(api)
    api.batches.clear()  # gone from the API: whether it was billed is unknown
    delivered = _billed(api)
    result = _read(store, registry, task_id)
    assert result.error is not None and result.error["code"] == "batch_not_found", result
    budget = store.budgets.get(task_id)
    assert (budget.used, budget.unknown, budget.reserved) == (held.amount, held.amount, 0), budget
    store.tasks.transition(task_id, TaskStatus.QUEUED)  # a redrive, as from the DLQ
    resent = _run(store, registry, task_id)
    assert store.budgets.get(task_id).unknown == held.amount  # the lost batch not counted again
    assert resent.outcome == "waiting"  # the turn sent anew
    _batches_end(api)
    assert _read(store, registry, task_id).status is TaskStatus.SUCCEEDED
    budget = store.budgets.get(task_id)
    known = _billed(api) - delivered  # the resent batches, read and committed
    assert (budget.used, budget.unknown, budget.reserved) == (held.amount + known, held.amount, 0), budget
