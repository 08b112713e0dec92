"""Memory writes under real processes on moto server: a worker SIGKILLed around a
``memory_write`` never leads to a second write (the version records the task and step), and two
tasks writing one document from the same read: one wins, the other is told, nothing is lost. A
write (or a store's creation) whose answer was lost after it committed, and that botocore sent
again, is answered as done, not as a conflict with itself."""

from __future__ import annotations

import json
import signal
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from agentq.core.memory import Author, MemoryConflict, MemoryStoreSpec, content_sha256
from agentq.core.models import TaskStatus, TaskSubmission, ToolsStep
from agentq.runtime import Settings, build_store
from agentq.storage.container import Storage
from agentq.worker import run_task

from tests.conftest import child_env
from tests.helpers import agentq_process, call, dynamo

PATH = "/customers/ann.md"


def _writing(task_id: str, content: str, expected: str | None, store: Storage) -> None:
    write = call("memory_write", store="shop", path=PATH, content=content,
                 **({"expected_sha256": expected} if expected else {}))  # fmt: skip
    submission = TaskSubmission.model_validate(
        {
            "goal": "remember",
            "provider": "scripted",
            "script": {"turns": [{"tool_calls": [write]}, {"text": "done"}]},
            "memory": [{"store": "shop"}],
        }
    )
    store.tasks.create(submission, tenant="t", task_id=task_id)


def _worker(settings: Settings, task_id: str, **env: str) -> subprocess.Popen[str]:
    return agentq_process(
        ["run-task", task_id, "--lease", "1"],
        env=child_env(settings, AGENTQ_MAX_CALL_SECONDS="1", **env),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _result(store: Storage, task_id: str) -> Any:
    [outcome] = [r for s in store.steps.load(task_id) if isinstance(s.body, ToolsStep) for r in s.body.results]
    return outcome


@pytest.mark.parametrize(
    ("crash_at", "writes", "status"),
    [
        ("after_effect_begin:1", 0, "unknown_outcome"),  # killed before the write: it never happens
        ("after_tool_run:1", 1, "unknown_outcome"),  # killed after it, unrecorded: not written again
        ("after_effect_finish:1", 1, "replayed"),  # killed after recording it: its result replayed
    ],
)
def test_a_worker_killed_around_a_memory_write_never_writes_twice(
    crash_at: str, writes: int, status: str, settings: Settings
) -> None:
    store = build_store(settings)
    store.memory_stores.create_store("t", MemoryStoreSpec(name="shop"))
    _writing("mem-crash", "ordered: blue lamp", None, store)

    killed = _worker(settings, "mem-crash", AGENTQ_CRASH_AT=crash_at)
    _, stderr = killed.communicate(timeout=120)
    assert killed.returncode == -signal.SIGKILL, stderr[-2000:]

    resumed = run_task("mem-crash", settings=settings, lease_seconds=1, wait_seconds=20)
    assert resumed.status is TaskStatus.SUCCEEDED, resumed
    assert _result(store, "mem-crash").status == status
    if writes == 0:
        assert store.memory_stores.list_documents("t", "shop") == []
        return
    [version] = store.memory_stores.versions("t", "shop", PATH)
    assert version.content == "ordered: blue lamp"
    assert version.created_by.task_id == "mem-crash" and version.created_by.step == 1


def test_two_tasks_writing_one_document_from_the_same_read_one_wins_and_the_other_gets_the_conflict(
    settings: Settings,
) -> None:
    store = build_store(settings)
    store.memory_stores.create_store("t", MemoryStoreSpec(name="shop"))
    base, _ = store.memory_stores.write("t", "shop", PATH, "ordered: lamp", author=Author(type="api"))
    _writing("mem-left", "ordered: lamp; asked for a red shade", base.content_sha256, store)
    _writing("mem-right", "ordered: lamp; returned it", base.content_sha256, store)

    workers = [_worker(settings, task_id) for task_id in ("mem-left", "mem-right")]
    for worker in workers:
        _, stderr = worker.communicate(timeout=120)
        assert worker.returncode == 0, stderr[-2000:]

    outcomes = {task_id: _result(store, task_id) for task_id in ("mem-left", "mem-right")}
    winners = [t for t, o in outcomes.items() if not o.is_error]
    losers = [t for t, o in outcomes.items() if o.is_error]
    assert len(winners) == 1 and len(losers) == 1
    won = store.memory_stores.read("t", "shop", PATH)
    assert json.loads(outcomes[winners[0]].content)["content_sha256"] == won.content_sha256
    # The loser is told, with the hash that won: it can read again and merge.
    assert "MemoryConflict" in outcomes[losers[0]].content and won.content_sha256 in outcomes[losers[0]].content
    history = store.memory_stores.versions("t", "shop", PATH)
    assert [v.version for v in history] == [2, 1] and history[0].created_by.task_id == winners[0]
    assert content_sha256(won.content or "") == won.content_sha256


@contextmanager
def _first_answer_lost(store: Storage, operation_name: str) -> Iterator[list[str]]:
    """botocore sends ``operation_name`` again once after its first answer, as it does when that
    answer is lost (standard retries: a connection error or read timeout, a 5xx): the first
    request reached DynamoDB and committed. moto does not honour ``ClientRequestToken``, so the
    resent request is refused as DynamoDB refuses one whose token it no longer remembers."""
    seen: list[str] = []

    def retry_once(attempts: int, response: Any, operation: Any, **_: Any) -> float | None:
        if operation.name == operation_name and not seen and response is not None:
            seen.append("resent")
            return 0.0  # send it again now
        return None

    events = dynamo(store).client.meta.events
    events.register_first("needs-retry.dynamodb", retry_once)
    try:
        yield seen
    finally:
        events.unregister("needs-retry.dynamodb", retry_once)


def test_a_task_write_the_sdk_sent_twice_is_reported_written_not_a_conflict(store: Storage) -> None:
    store.memory_stores.create_store("t", MemoryStoreSpec(name="shop"))
    base, _ = store.memory_stores.write("t", "shop", PATH, "ordered: lamp", author=Author(type="api"))
    mine = "ordered: lamp; asked for a red shade"
    author = Author(type="task", task_id="task-1", step=1, tool_use_id="toolu_1")
    with _first_answer_lost(store, "TransactWriteItems") as resent:
        doc, written = store.memory_stores.write(
            "t", "shop", PATH, mine, author=author, expected_sha256=base.content_sha256
        )
    assert resent == ["resent"]
    assert written and doc.content_sha256 == content_sha256(mine) and doc.version == 2
    assert [v.version for v in store.memory_stores.versions("t", "shop", PATH)] == [2, 1]


def test_a_delete_the_sdk_sent_twice_answers_its_version_not_that_the_document_is_gone(store: Storage) -> None:
    store.memory_stores.create_store("t", MemoryStoreSpec(name="shop"))
    base, _ = store.memory_stores.write("t", "shop", PATH, "ordered: lamp", author=Author(type="api"))
    with _first_answer_lost(store, "TransactWriteItems") as resent:
        deleted = store.memory_stores.delete_document(
            "t", "shop", PATH, author=Author(type="api"), expected_sha256=base.content_sha256
        )
    assert resent == ["resent"]
    assert (deleted.version, deleted.operation) == (2, "deleted")
    assert store.memory_stores.get_store("t", "shop").documents == 0


def test_a_store_creation_the_sdk_sent_twice_answers_the_store_not_that_it_exists(store: Storage) -> None:
    with _first_answer_lost(store, "PutItem") as resent:
        made = store.memory_stores.create_store("t", MemoryStoreSpec(name="shop", max_documents=5))
    assert resent == ["resent"]
    assert made.name == "shop" and made.max_documents == 5
    with pytest.raises(MemoryConflict):  # another creation under the name is refused still
        store.memory_stores.create_store("t", MemoryStoreSpec(name="shop"))
