"""A person's messages to a task (storage/messages.py) are numbered the same way on every backend.

A message is accepted by one transaction built from a read of the conversation (META's
``messages_received``, ``n``): META's count moves from ``n`` to ``n + 1`` only if it is still
``n``, and ``MSG#<n+1>`` is put only if absent. A sender whose read went stale (another message
was accepted after it) must be refused and take the next number on its retry. Either guard alone
refuses that sender, so breaking one of them changes no outcome: the test also asserts that each
of the two refused the stale attempt, which is what makes the loss of either one visible here.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from agentq.core.errors import IllegalTransition
from agentq.core.models import TaskStatus
from agentq.storage import keys
from agentq.storage.container import Storage
from agentq.storage.table import Item, TransactionCancelled

from tests.storage_conformance._builders import new_task


def _task(backend: Storage, status: TaskStatus, earlier: int) -> str:
    """A task in ``status`` (queued: a message waits for its next turn; succeeded: a message is
    a follow-up that reopens it) that has accepted ``earlier`` messages."""
    task_id = new_task(backend)
    for i in range(earlier):
        backend.messages.accept(task_id, f"earlier {i + 1}")
        if status is TaskStatus.SUCCEEDED:  # each one answered in turn
            _answer(backend, task_id)
    if status is TaskStatus.SUCCEEDED and earlier == 0:
        _answer(backend, task_id)
    assert backend.tasks.get(task_id).status is status
    return task_id


def _answer(backend: Storage, task_id: str) -> None:
    got = backend.tasks.claim(task_id, "w1", 30)
    assert got is not None
    backend.tasks.transition(task_id, TaskStatus.SUCCEEDED, lease=got[0])


@pytest.mark.parametrize("earlier", [0, 2])
@pytest.mark.parametrize("status", [TaskStatus.QUEUED, TaskStatus.SUCCEEDED])
def test_a_message_sent_from_a_stale_read_of_the_conversation_is_refused_by_both_guards_then_takes_the_next_number(
    backend: Storage, monkeypatch: pytest.MonkeyPatch, status: TaskStatus, earlier: int
) -> None:
    task_id = _task(backend, status, earlier)
    messages = backend.messages
    real_meta: Callable[..., Item] = messages._meta
    real_transact = messages.table.transact
    refusals: list[frozenset[str]] = []
    stale_reads = 0

    def stale_meta(task: str, tenant: str | None) -> Item:
        """The sender's first read of the conversation, and another message accepted right after it."""
        nonlocal stale_reads
        read = real_meta(task, tenant)
        if stale_reads == 0:
            stale_reads += 1
            monkeypatch.setattr(messages, "_meta", real_meta)
            other = messages.accept(task_id, "the other sender's")
            assert other.message.seq == earlier + 1
            monkeypatch.setattr(messages, "_meta", stale_meta)
        return read

    def transact(actions: Any, **kwargs: Any) -> None:
        try:
            real_transact(actions, **kwargs)
        except TransactionCancelled as exc:
            refusals.append(exc.failed)
            raise

    monkeypatch.setattr(messages, "_meta", stale_meta)
    monkeypatch.setattr(messages.table, "transact", transact)
    late = messages.accept(task_id, "the stale sender's")
    monkeypatch.undo()

    # Refused once, on its count and on its number (each guard on its own), then the next number.
    assert stale_reads == 1 and len(refusals) == 1
    assert {"meta", "message"} <= refusals[0], f"refused only by {sorted(refusals[0])}"
    assert late.message.seq == earlier + 2
    listed = backend.messages.listed(task_id)
    assert [m.seq for m in listed] == list(range(1, earlier + 3))
    assert [m.text for m in listed[earlier:]] == ["the other sender's", "the stale sender's"]
    assert backend.messages.inbox(task_id).received == earlier + 2
    # The other sender's message reopened an answered task; the retry only waits behind it.
    assert late.status is TaskStatus.QUEUED and not late.reopened
    assert backend.tasks.get(task_id).status is TaskStatus.QUEUED
    # Nothing of the refused attempt was written: one accept event per message.
    events = backend.table.query(keys.task_pk(task_id), prefix=keys.EVENT)
    assert [e["type"] for e in events].count("message.received") == earlier + 2


def test_a_message_that_may_not_reopen_a_task_is_refused_by_the_write_when_the_task_ended_after_its_read(
    backend: Storage, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``reopen_ended=False`` (A2A's messages: a task never restarts): the sender read the task
    running, and it was answered before the write. The write, conditioned on the status read,
    takes nothing; the attempt after it reads the end and refuses, naming the status; the task
    stays answered. Without the flag the same message is a follow-up that reopens it."""
    task_id = new_task(backend)
    got = backend.tasks.claim(task_id, "w1", 30)
    assert got is not None
    messages = backend.messages
    real_meta: Callable[..., Item] = messages._meta
    reads = 0

    def ended_after_the_read(task: str, tenant: str | None) -> Item:
        nonlocal reads
        read = real_meta(task, tenant)
        reads += 1
        if reads == 1:  # the task is answered between this read and the write built from it
            backend.tasks.transition(task_id, TaskStatus.SUCCEEDED, lease=got[0])
        return read

    monkeypatch.setattr(messages, "_meta", ended_after_the_read)
    with pytest.raises(IllegalTransition) as refused:
        messages.accept(task_id, "and another thing", reopen_ended=False)
    monkeypatch.undo()
    assert reads == 2 and refused.value.details == {"status": "succeeded"}
    assert backend.tasks.get(task_id).status is TaskStatus.SUCCEEDED
    assert backend.messages.inbox(task_id).received == 0
    assert messages.accept(task_id, "and another thing").reopened  # the HTTP API's follow-up
