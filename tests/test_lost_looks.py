"""A task waiting on a remote agent's task, or on its economy batch, wakes itself with a delayed
look queued after its park commits (a batch look queues the next one itself); a worker that dies
between the two leaves it with nothing to wake it. Its park (and a batch look, before it queues
the next) records when the look is due (``core.status.LOOK_DUE``), so the sweeper sends a lost
look of the right kind once it is overdue, every other move clears the mark, and a look that
arrives while the next one is not due yet is a stray, deleted without a claim and without asking
the provider (two looks never go on as two chains). Against moto server; the whole path with a
real remote and real workers: tests/test_a2a_client.py, with a real batch API and real
processes: tests/test_economy.py."""

from __future__ import annotations

import time
from typing import Any, ClassVar

import pytest

from agentq.core.engine import Engine, EngineConfig
from agentq.core.models import TaskStatus
from agentq.core.providers import LLMRequest, LLMResponse, default_provider_factory
from agentq.core.status import LOOK_DUE
from agentq.queueing.queues import MessageKind, TaskMessage, TaskQueues
from agentq.queueing.sweeper import sweep
from agentq.runtime import build_dispatcher, build_queues, build_registry, build_store
from agentq_dev.moto_server import MotoServer

from tests.helpers import deployment, scripted

STALE = 60.0


class PendingBatches:
    """A batch API whose batches never end, noting each batch it was asked about."""

    name = "anthropic"
    looked: ClassVar[list[str]] = []

    def __init__(self) -> None:
        PendingBatches.looked = []

    def complete(self, request: LLMRequest) -> LLMResponse:
        raise AssertionError("no call is made here")

    def submit_batch(self, request: LLMRequest, custom_id: str) -> str:
        raise AssertionError("no batch is sent here")

    def batch_result(self, batch_id: str, custom_id: str) -> LLMResponse | None:
        PendingBatches.looked.append(batch_id)
        return None


def _world(moto_server: MotoServer, provider: Any = None) -> tuple[Any, TaskQueues, Any]:
    settings = deployment(moto_server)
    store, queues = build_store(settings), build_queues(settings)
    engine = Engine(store, worker_id="w", tools=build_registry(settings), config=EngineConfig(lease_seconds=30),
                    providers=(lambda _: provider) if provider is not None else default_provider_factory)  # fmt: skip
    return store, queues, build_dispatcher(engine, store, queues, max_receive_count=5)


# What a park leaves on META besides the due time: a remote wait nothing more (the remote task is
# on the call's effect), a batch wait its batch (sent as it parks).
WAITS: dict[MessageKind, dict[str, Any]] = {
    "remote_poll": {},
    "batch_poll": {"batch": {"id": "b1", "custom_id": "c1", "step": 1, "epoch": 1}},
}


def _parked(store: Any, *, look_due: float | None, priority: str = "normal", kind: MessageKind = "remote_poll") -> str:
    """A task moved running -> waiting as a park does: with its look's due time, or without (children)."""
    task = store.tasks.create(scripted([{"text": "done"}]).model_copy(update={"priority": priority}), tenant="t")
    store.tasks.transition(task.task_id, TaskStatus.RUNNING)
    extra = {**WAITS[kind], **({LOOK_DUE: look_due} if look_due else {})}
    if "batch" in extra:
        extra["batch"] = {**extra["batch"], "submitted_at": time.time()}
    store.tasks.transition(task.task_id, TaskStatus.WAITING, extra=extra or None)
    return str(task.task_id)


def _received(queues: TaskQueues, tier: str) -> list[TaskMessage]:
    """What the tier's queue holds now or within 3 s (a batch look is sent 1 s late here)."""
    got = queues.sqs.receive_message(QueueUrl=queues.url(tier), WaitTimeSeconds=3, MaxNumberOfMessages=10)
    return [TaskMessage.model_validate_json(m["Body"]) for m in got.get("Messages", [])]


def _look(dispatcher: Any, task_id: str, kind: MessageKind = "batch_poll") -> Any:
    """The dispatcher handles a look of ``kind`` for the task, as its first delivery."""
    return dispatcher.handle(TaskMessage(task_id=task_id, kind=kind).model_dump_json(), tier="normal",
                             receive_count=1)  # fmt: skip


@pytest.mark.parametrize("kind", list(WAITS))
@pytest.mark.parametrize("priority", ["high", "normal", "low"])
def test_a_wait_whose_look_was_lost_is_sent_one_of_its_kind_once_overdue_on_its_own_tier(
    moto_server: MotoServer, priority: str, kind: MessageKind
) -> None:
    store, queues, _ = _world(moto_server)
    due = time.time()
    lost = _parked(store, look_due=due, priority=priority, kind=kind)
    children = _parked(store, look_due=None, priority=priority)  # woken by its fan-out, never by a look
    assert lost not in sweep(store, queues, stale_after=STALE, now=due + STALE - 1).looked  # maybe only late
    report = sweep(store, queues, stale_after=STALE, now=due + STALE + 1)
    assert lost in report.looked and children not in report.looked + report.swept
    assert [(m.task_id, m.kind) for m in _received(queues, priority) if m.task_id in (lost, children)] == [(lost, kind)]
    assert children not in sweep(store, queues, stale_after=STALE, now=due + 100 * STALE).looked


def test_every_move_but_the_park_that_queues_a_look_clears_its_due_time(moto_server: MotoServer) -> None:
    store, queues, _ = _world(moto_server)
    due = time.time()
    task_id = _parked(store, look_due=due)
    assert store.tasks.get(task_id).look_due == pytest.approx(due)
    store.tasks.transition(task_id, TaskStatus.QUEUED)  # the look woke it
    assert store.tasks.get(task_id).look_due is None
    store.tasks.transition(task_id, TaskStatus.RUNNING)
    store.tasks.transition(task_id, TaskStatus.WAITING)  # now waiting on children: no look of its own
    assert store.tasks.get(task_id).look_due is None
    assert task_id not in sweep(store, queues, stale_after=STALE, now=due + 100 * STALE).looked


@pytest.mark.parametrize("kind", list(WAITS))
def test_a_look_that_arrives_before_the_next_one_is_due_is_deleted_without_a_claim(
    moto_server: MotoServer, kind: MessageKind, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AGENTQ_BATCH_POLL_SECONDS", "1")
    store, queues, dispatcher = _world(moto_server, PendingBatches())
    for ahead in (600, 29):  # a look arriving right after a park whose next look is the shortest, 30 s, away
        stray = _parked(store, look_due=time.time() + ahead, kind=kind)
        _assert_dropped(store, dispatcher, stray, kind)
    assert PendingBatches.looked == []  # a stray batch look never asks the provider
    due = _parked(store, look_due=time.time() - 1, kind=kind)  # its look, on time: it goes on
    _look(dispatcher, due, kind)
    if kind == "remote_poll":  # a remote look wakes the task, whose run re-attaches to the remote task
        assert store.tasks.get(due).claim_count == 1
    else:  # a batch look asks the provider, and its batch is still running: the next look is queued
        assert PendingBatches.looked == ["b1"] and store.tasks.get(due).claim_count == 0
        assert [(m.task_id, m.kind) for m in _received(queues, "normal")] == [(due, "batch_poll")]


def _assert_dropped(store: Any, dispatcher: Any, stray: str, kind: MessageKind) -> None:
    before = store.tasks.get(stray)
    action = _look(dispatcher, stray, kind)
    assert (action.kind, action.reason) == ("delete", "a stray look: the task's next look is due later")
    after = store.tasks.get(stray)
    assert (after.status, after.claim_count, after.lease_epoch) == (TaskStatus.WAITING, before.claim_count,
                                                                    before.lease_epoch)  # fmt: skip


def test_a_batch_look_writes_when_the_next_is_due_before_it_queues_it_and_queues_none_for_a_task_moved_on(
    moto_server: MotoServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AGENTQ_BATCH_POLL_SECONDS", "1")
    store, queues, dispatcher = _world(moto_server, PendingBatches())
    task_id = _parked(store, look_due=time.time() - 1, kind="batch_poll")
    written: list[tuple[float, int]] = []  # the due written, and how many looks were queued by then
    next_look = store.tasks.next_look

    def noted(task: str, due: float, *, after: float | None) -> bool:
        written.append((due, len(_received(queues, "normal"))))
        return bool(next_look(task, due, after=after))

    monkeypatch.setattr(store.tasks, "next_look", noted)
    before = time.time()
    _look(dispatcher, task_id)
    (due, queued_by_then), = written  # fmt: skip
    assert queued_by_then == 0 and due >= before + 1  # AGENTQ_BATCH_POLL_SECONDS' floor
    assert store.tasks.get(task_id).look_due == pytest.approx(due)
    assert [(m.task_id, m.kind) for m in _received(queues, "normal")] == [(task_id, "batch_poll")]

    # Woken by another message between the look's read and its write: the write is refused and
    # no look is queued (the run that woke it parks again with a look of its own if it must).
    def woken_first(task: str, due: float, *, after: float | None) -> bool:
        store.tasks.transition(task, TaskStatus.QUEUED)
        return bool(next_look(task, due, after=after))

    monkeypatch.setattr(store.tasks, "next_look", woken_first)
    raced = _parked(store, look_due=time.time() - 1, kind="batch_poll")
    _look(dispatcher, raced)
    assert store.tasks.get(raced).look_due is None and _received(queues, "normal") == []


def test_two_batch_looks_of_one_due_handled_at_once_queue_one_next_look(
    moto_server: MotoServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A redelivered copy, or the sweeper's look beside a late one: both read the same due and
    ask the provider, but only the first to write the next due queues a look."""
    monkeypatch.setenv("AGENTQ_BATCH_POLL_SECONDS", "1")
    store, queues, dispatcher = _world(moto_server, PendingBatches())
    task_id = _parked(store, look_due=time.time() - 1, kind="batch_poll")
    next_look = store.tasks.next_look
    other_copy = [task_id]

    def the_other_look_first(task: str, due: float, *, after: float | None) -> bool:
        if other_copy:  # the other copy, read the same due, runs to its end before this one writes
            _look(dispatcher, other_copy.pop())
        return bool(next_look(task, due, after=after))

    monkeypatch.setattr(store.tasks, "next_look", the_other_look_first)
    _look(dispatcher, task_id)
    assert PendingBatches.looked == ["b1", "b1"]
    assert [(m.task_id, m.kind) for m in _received(queues, "normal")] == [(task_id, "batch_poll")]
    assert _received(queues, "normal") == []


def test_a_slow_batch_look_never_moves_the_due_of_a_park_that_came_after_it(
    moto_server: MotoServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While the look asked the provider, the batch ended, the task ran and parked again on a
    new batch with its own look: the slow look queues nothing and leaves the new due alone."""
    monkeypatch.setenv("AGENTQ_BATCH_POLL_SECONDS", "1")
    store, queues, dispatcher = _world(moto_server, PendingBatches())
    task_id = _parked(store, look_due=time.time() - 1, kind="batch_poll")
    new_due = time.time() + 30
    next_look = store.tasks.next_look

    def parked_again_meanwhile(task: str, due: float, *, after: float | None) -> bool:
        store.tasks.transition(task, TaskStatus.QUEUED)
        store.tasks.transition(task, TaskStatus.RUNNING)
        store.tasks.transition(task, TaskStatus.WAITING, extra={"batch": {"id": "b2"}, LOOK_DUE: new_due})
        return bool(next_look(task, due, after=after))

    monkeypatch.setattr(store.tasks, "next_look", parked_again_meanwhile)
    _look(dispatcher, task_id)
    assert store.tasks.get(task_id).look_due == pytest.approx(new_due, abs=0.01)
    assert _received(queues, "normal") == []


def test_a_batch_look_whose_send_fails_puts_its_due_back_and_delivered_again_is_the_due_look(
    moto_server: MotoServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The next look is due 30 s on (the poll's floor): had the due stayed there after the send
    failed, the message delivered again would be taken for a stray and the task left to the sweeper."""
    store, queues, dispatcher = _world(moto_server, PendingBatches())
    read = time.time() - 1
    task_id = _parked(store, look_due=read, kind="batch_poll")
    send = queues.send
    sent: list[tuple[str, Any]] = []

    def throttled_once(task: str, tier: str, **kwargs: Any) -> Any:
        if not sent:
            sent.append(("refused", kwargs.get("kind")))
            raise RuntimeError("SQS is throttling")
        sent.append(("sent", kwargs.get("kind")))
        return send(task, tier, **kwargs)

    monkeypatch.setattr(queues, "send", throttled_once)
    with pytest.raises(RuntimeError):
        _look(dispatcher, task_id)
    assert store.tasks.get(task_id).look_due == pytest.approx(read, abs=0.01)  # not 30 s ahead: no stray
    action = _look(dispatcher, task_id)  # SQS delivers it again
    assert action.reason != "a stray look: the task's next look is due later"
    assert sent == [("refused", "batch_poll"), ("sent", "batch_poll")]
    assert store.tasks.get(task_id).look_due == pytest.approx(time.time() + 30, abs=5)


@pytest.mark.parametrize("kind", list(WAITS))
def test_a_look_the_sweeper_sent_is_not_sent_again_by_the_next_sweep_while_on_its_way(
    moto_server: MotoServer, kind: MessageKind
) -> None:
    store, queues, _ = _world(moto_server)
    lost = _parked(store, look_due=time.time() - 2 * STALE, kind=kind)
    assert lost in sweep(store, queues, stale_after=STALE, now=time.time()).looked
    assert lost not in sweep(store, queues, stale_after=STALE, now=time.time() + STALE - 5).looked
    assert [m.task_id for m in _received(queues, "normal")].count(lost) == 1


def test_a_sweep_sends_no_look_to_a_task_whose_late_look_came_while_it_swept(
    moto_server: MotoServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Listed overdue; before the sweeper reads the task again, its late look arrives and moves
    the due on: the look is on its way again, and the sweeper sends none."""
    store, queues, _ = _world(moto_server)
    listed = time.time() - 2 * STALE
    task_id = _parked(store, look_due=listed, kind="batch_poll")
    get_many = store.tasks.get_many
    moved = time.time() + 30

    def the_late_look_first(ids: list[str]) -> Any:
        if task_id in ids:  # the sweeper reads the overdue tasks again
            assert store.tasks.next_look(task_id, moved, after=listed)
        return get_many(ids)

    monkeypatch.setattr(store.tasks, "get_many", the_late_look_first)
    assert task_id not in sweep(store, queues, stale_after=STALE, now=time.time()).looked
    assert store.tasks.get(task_id).look_due == pytest.approx(moved, abs=0.01)
    assert _received(queues, "normal") == []
