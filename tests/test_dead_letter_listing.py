"""Listings and redrives of the DLQs racing each other (the console polls the listing every 5 s
while a person presses Redrive, another tab polls too): a listing never shows a dead letter whose
task already runs again, since it reads each task's status while it still holds the message; and
neither a listing nor a redrive misses a message another one holds for a moment: it waits for it
(queueing/dlq.py). Each race is made deterministic: the redrive runs at the exact moment the
listing reads the status; the other holder is a receive whose visibility lapses in a second."""

from __future__ import annotations

import time
from typing import Any

import pytest

from agentq.control.submit import submit
from agentq.core.models import TaskStatus
from agentq.core.tools import ToolRegistry
from agentq.queueing import dlq
from agentq.queueing.dlq import list_dead_letters, redrive, redrive_for_tenant
from agentq.queueing.queues import TaskMessage, TaskQueues
from agentq.runtime import build_queues, build_registry, build_store
from agentq.storage import keys
from agentq.storage.container import Storage
from agentq.storage.table import Update
from agentq_dev.moto_server import MotoServer

from tests.helpers import deployment

TIER = "normal"


def _dead_lettered(moto_server: MotoServer) -> tuple[Storage, TaskQueues, str]:
    """A task as the dispatcher leaves it after its last allowed failure: failed, and then
    its message in the DLQ with the reason."""
    settings = deployment(moto_server, max_receive_count=2)
    store, queues = build_store(settings), build_queues(settings)
    body = {"goal": "g", "provider": "scripted", "script": {"turns": [{"text": "x"}]}}
    task = submit(store, build_registry(settings), body, tenant="acme")  # no message: the test plays the queue
    store.tasks.transition(task.task_id, TaskStatus.FAILED, error={"code": "overloaded", "status_code": 529})
    queues.dead_letter(TIER, TaskMessage(task_id=task.task_id).model_dump_json(), "failed after 2 attempts: (529)")
    return store, queues, task.task_id


def _held_for_a_second(queues: TaskQueues) -> None:
    """Another listing or redrive has the message: received, invisible for a second."""
    got = queues.sqs.receive_message(QueueUrl=queues.dlq_url(TIER), VisibilityTimeout=1)
    assert len(got.get("Messages", [])) == 1


def test_a_redrive_racing_a_listing_never_makes_it_show_a_dead_letter_whose_task_runs_again(
    moto_server: MotoServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    store, queues, task_id = _dead_lettered(moto_server)
    # The redrive below runs inside the listing, so it cannot wait for the listing's hold to end.
    monkeypatch.setattr(dlq, "HELD_WAIT_SECONDS", 0.3)

    redriven: list[str] = []
    read: list[list[str]] = []
    read_statuses = store.tasks.get_many  # how a listing reads the tasks of a batch it holds

    def get_while_a_redrive_lands(task_ids: list[str], **_: Any) -> Any:
        read.append(task_ids)
        moved = redrive_for_tenant(queues, store, "acme", TIER)
        for requeued in moved.task_ids:  # what dispatch._ended._requeue_redriven does with the copy
            store.tasks.transition(requeued, TaskStatus.QUEUED, error=None)
        redriven.extend(moved.task_ids)
        return read_statuses(task_ids)

    store.tasks.get_many = get_while_a_redrive_lands  # type: ignore[method-assign]
    letters = list_dead_letters(queues, store, tier=TIER)
    store.tasks.get_many = read_statuses  # type: ignore[method-assign]

    assert [(d.task_id, d.task_status) for d in letters] == [(task_id, "failed")]
    assert read == [[task_id]] and redriven == []  # the listing held the message: the racing redrive found none
    # Once the listing is done, the message is there to redrive, and its task is requeued.
    moved = redrive_for_tenant(queues, store, "acme", TIER)
    assert moved.task_ids == [task_id]
    assert list_dead_letters(queues, store, tier=TIER) == []


def test_a_redrive_waits_for_a_message_another_listing_holds_instead_of_moving_none(
    moto_server: MotoServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    store, queues, task_id = _dead_lettered(moto_server)
    # What is proven is that the redrive waits; how long it may (HELD_WAIT_SECONDS) is not the
    # subject. Under make test's load the held second outlasted the default wait once.
    monkeypatch.setattr(dlq, "HELD_WAIT_SECONDS", 60)
    _held_for_a_second(queues)
    moved = redrive_for_tenant(queues, store, "acme", TIER)
    assert moved.task_ids == [task_id] and moved.moved == 1


def test_a_cli_redrive_waits_for_a_message_a_listing_holds_instead_of_moving_none(
    moto_server: MotoServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A console's poll (GET /dead-letters, every 5 s, any tenant) holds the DLQ's messages for a
    moment: ``agentq dlq redrive`` waits for them as the tenant redrive does. Before, it took the
    empty receive for an empty DLQ, reported 0 moved and left them there."""
    store, queues, task_id = _dead_lettered(moto_server)
    monkeypatch.setattr(dlq, "HELD_WAIT_SECONDS", 60)  # see the test above
    _held_for_a_second(queues)
    (report,) = redrive(queues, tier=TIER)
    assert (report.method, report.moved) == ("receive/send/delete", 1), report
    assert list_dead_letters(queues, store, tier=TIER) == []
    back = queues.sqs.receive_message(QueueUrl=queues.url(TIER), WaitTimeSeconds=1)["Messages"]
    assert [TaskMessage.model_validate_json(m["Body"]).task_id for m in back] == [task_id]


def test_a_listing_waits_for_a_message_another_listing_holds_instead_of_leaving_it_out(
    moto_server: MotoServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    store, queues, task_id = _dead_lettered(moto_server)
    # What is proven is that the listing waits; how long it may (6 s) is not the subject. A run
    # at load ~50 spent those 6 s on a few slow calls before the held second was over.
    monkeypatch.setattr(dlq, "HELD_WAIT_SECONDS", 60)
    _held_for_a_second(queues)
    assert [(d.task_id, d.task_status) for d in list_dead_letters(queues, store, tier=TIER)] == [(task_id, "failed")]


def _unreadable_task(store: Storage, tenant: str) -> str:
    """A task stored as no code of ours can read it (its submission no longer parses): the
    dispatcher dead-letters its message as poison (``dispatch._poison.unreadable_task``)."""
    body = {"goal": "g", "provider": "scripted", "script": {"turns": [{"text": "x"}]}}
    task = submit(store, ToolRegistry(), body, tenant=tenant)
    store.table.update(keys.item_key(task.task_id, "META#SUBMISSION"), Update(set={"submission": "{not json"}))
    return task.task_id


def test_a_tenant_redrive_moves_its_own_dead_letter_past_another_tenants_unreadable_task(
    moto_server: MotoServer,
) -> None:
    """A tier's DLQ is every tenant's: one unreadable task's dead letter is nobody's (an operator
    moves it with ``agentq dlq``), and every tenant's redrive still moves its own past it. Before,
    reading its owner raised pydantic's ValidationError out of every tenant's redrive (a 500)."""
    store, queues, mine = _dead_lettered(moto_server)
    broken = _unreadable_task(store, "other")
    queues.dead_letter(TIER, TaskMessage(task_id=broken).model_dump_json(), "poison: unreadable")
    letters = {d.task_id: d.tenant for d in list_dead_letters(queues, store, tier=TIER)}
    assert letters == {mine: "acme", broken: None}  # the listing copes with it, and shows it as nobody's
    done = redrive_for_tenant(queues, store, "acme", TIER)
    assert done.task_ids == [mine]
    assert redrive_for_tenant(queues, store, "other", TIER).task_ids == []  # not even its own tenant's
    assert [d.task_id for d in list_dead_letters(queues, store, tier=TIER)] == [broken]  # untouched


def test_a_listing_longer_than_its_hold_holds_every_message_it_shows_until_it_returns(
    moto_server: MotoServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A tenant's listing looks at up to 1,000 messages, which can take longer than one hold
    (``PEEK_SECONDS``): it renews its holds, so no redrive takes a message it already read out
    from under it (the race above) however long it looks. Here a hold is 2 s and each batch's
    read takes 1.5 s: by the third read the first batch's hold would have lapsed."""
    settings = deployment(moto_server)
    store, queues = build_store(settings), build_queues(settings)
    body = {"goal": "g", "provider": "scripted", "script": {"turns": [{"text": "x"}]}}
    for _ in range(30):  # of as many tasks: each batch of ten is a read of its own
        task = submit(store, ToolRegistry(), body, tenant="acme")
        queues.dead_letter(TIER, TaskMessage(task_id=task.task_id).model_dump_json(), "failed after 2 attempts")
    monkeypatch.setattr(dlq, "PEEK_SECONDS", 2)
    monkeypatch.setattr(dlq, "RENEW_MARGIN_SECONDS", 1)
    monkeypatch.setattr(dlq, "HELD_WAIT_SECONDS", 0.3)  # the peeks below hold nothing
    taken: list[int] = []
    read_statuses = store.tasks.get_many

    def slow_read(task_ids: list[str]) -> Any:
        time.sleep(1.5)
        got = queues.sqs.receive_message(QueueUrl=queues.dlq_url(TIER), MaxNumberOfMessages=10, VisibilityTimeout=0)
        taken.append(len(got.get("Messages", [])))  # what another listing's, or a redrive's, receive gets
        return read_statuses(task_ids)

    monkeypatch.setattr(store.tasks, "get_many", slow_read)
    letters = list_dead_letters(queues, store, tier=TIER, limit=30, tenant="acme")
    # At the last read the listing holds all 30: another's receive finds none.
    assert len(letters) == 30 and taken == [10, 10, 0], taken
