"""The history an A2A task shows (``GetTask``, ``ListTasks``, ``SendMessage``): the goal, then each
message sent, the last ``historyLength`` of them; without ``historyLength`` the last
``DEFAULT_HISTORY``; and never more than fit ``HISTORY_BYTES`` as JSON, the latest kept first and
never none. A task takes up to 1,000 messages of 32,000 characters, so its whole history, read
and shown as it was, could be an answer past 100 MB (a Lambda's is at most 6 MB); only the
messages shown are read. On moto, through ``api.a2a_views.history``, which
the server's every view reads (tests/test_a2a_server.py runs it over the wire)."""

from __future__ import annotations

import json

import pytest

from agentq.api.a2a_views import DEFAULT_HISTORY, HISTORY_BYTES, history
from agentq.control.submit import parse_submission
from agentq.storage.container import Storage

STORAGE = "moto"  # the real Query of a range of messages


def _task_with_messages(store: Storage, texts: list[str]) -> str:
    task = store.tasks.create(
        parse_submission({"goal": "the goal", "provider": "scripted", "script": {"turns": [{"text": "x"}]}}), tenant="t"
    )
    for text in texts:
        store.messages.accept(task.task_id, text, tenant="t")
    return task.task_id


def _shown(store: Storage, task_id: str, length: int | None, **kwargs: int) -> list[str]:
    return [m.parts[0].text for m in history(store, store.tasks.get(task_id), length, **kwargs)]


def test_the_history_is_the_last_items_asked_for_and_without_history_length_the_last_default(store: Storage) -> None:
    count = DEFAULT_HISTORY + 30
    task_id = _task_with_messages(store, [f"m{n}" for n in range(1, count + 1)])
    every = ["the goal", *(f"m{n}" for n in range(1, count + 1))]
    assert _shown(store, task_id, None) == every[-DEFAULT_HISTORY:]
    for length in (1, 5, count, count + 1, count + 50):
        assert _shown(store, task_id, length) == every[-length:], length
    assert _shown(store, task_id, 0) == []


@pytest.mark.parametrize("length", [None, 1000])
def test_a_history_of_long_messages_fits_its_budget_keeping_the_latest(store: Storage, length: int | None) -> None:
    """40 messages of 32,000 'é' are 7.7 MB escaped: the history keeps the latest that fit."""
    texts = [f"{n}:" + "é" * 32_000 for n in range(1, 41)]
    task_id = _task_with_messages(store, texts)
    shown = _shown(store, task_id, length)
    assert 0 < len(shown) < len(texts) and shown == texts[-len(shown) :]
    assert sum(len(json.dumps(t)) for t in shown) <= HISTORY_BYTES


def test_a_history_whose_latest_item_alone_passes_the_budget_shows_that_item(store: Storage) -> None:
    task_id = _task_with_messages(store, ["short", "é" * 32_000])
    assert _shown(store, task_id, None, budget=10) == ["é" * 32_000]
