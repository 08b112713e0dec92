"""Moving a task to another version of its agent (``control.aliases.move_task``) resolves it
again as its request would be on that version: what the version gives its tasks (outcome,
memory, callback, concurrency key, constraint defaults, besides what it alone defines) comes
from the new version, what its submitter set itself stays. On the in-memory twin, with the real
submission, move and engine code; tests/test_agent_aliases.py moves tasks over HTTP with real
workers."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest

from agentq.control.aliases import move_task
from agentq.control.conversations import send_message
from agentq.control.defaults import Defaults
from agentq.control.submit import submit_once
from agentq.core.agents import AgentSpec
from agentq.core.engine import Engine, EngineConfig
from agentq.core.memory import MemoryStoreSpec
from agentq.core.models import GradeStep, TaskStatus, TaskSubmission
from agentq.core.tools import ToolRegistry
from agentq.storage.container import Storage

STORAGE = "memory"
TENANT = "t"


@pytest.fixture(autouse=True)
def ledger(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "ledger.jsonl"  # where the tests' @graders note each grade
    monkeypatch.setenv("AGENTQ_TEST_LEDGER", str(path))
    return path


class _Queues:
    """Stands in for SQS: a follow-up's run is enqueued here, and run by the test."""

    def send(self, task_id: str, priority: Any, **_: Any) -> None:
        pass

    def forwards(self, submission: Any) -> bool:
        return False


def _version(tag: str, **fields: Any) -> AgentSpec:
    turns = [{"text": f"DONE {tag} answer {i}"} for i in range(1, 4)]
    return AgentSpec.model_validate({"name": "support", "provider": "scripted", "system": tag,
                                     "script": {"turns": turns}, **fields})  # fmt: skip


def _two_versions(store: Storage) -> None:
    for name in ("faq-v1", "faq-v2", "mine"):
        store.memory_stores.create_store(TENANT, MemoryStoreSpec(name=name))
    store.agents.create(TENANT, _version(
        "v1", outcome={"grader": "says_done"}, memory=[{"store": "faq-v1"}],
        notify={"url": "https://v1.example.com/hook"}, concurrency={"key": "v1", "limit": 5},
        constraints={"max_steps": 7, "max_output_tokens": 1000}))  # fmt: skip
    store.agents.create(TENANT, _version(
        "v2", outcome={"grader": "report_written", "max_attempts": 1}, memory=[{"store": "faq-v2"}],
        notify={"url": "https://v2.example.com/hook"}, concurrency={"key": "v2", "limit": 5},
        constraints={"max_steps": 9}))  # fmt: skip


def _run(store: Storage, registry: ToolRegistry, task_id: str) -> Any:
    return Engine(store, worker_id="w", tools=registry, config=EngineConfig(lease_seconds=10)).run(task_id)


def _answered(store: Storage, registry: ToolRegistry, body: dict[str, Any]) -> str:
    task_id = uuid.uuid4().hex
    submit_once(store, registry, body, tenant=TENANT, task_id=task_id)
    assert _run(store, registry, task_id).status is TaskStatus.SUCCEEDED
    return task_id


# What a move may differ in from a new task of the version: the task's own workspace and the
# record of what it set itself are kept; everything else is compared.
KEPT_APART = {"workspace", "online"}


def _as_submitted(submission: TaskSubmission) -> dict[str, Any]:
    return submission.model_dump(exclude=KEPT_APART, exclude_none=True)


def test_a_moved_task_takes_what_the_new_version_gives_and_keeps_what_its_submitter_set(
    store: Storage, registry: ToolRegistry
) -> None:
    """The move kept the old version's outcome, memory, callback, concurrency key and constraint
    defaults (they were already in the resolved submission, and a version's applies only where
    the submission has none): a task moved to a version with another outcome was still graded by
    the old one. Now the moved task is what the same request submitted to the new version is,
    and its submitter's own constraint, memory store, metadata and user stay."""
    _two_versions(store)
    request = {"goal": "g", "user": "alice", "metadata": {"ticket": "42"}, "memory": [{"store": "mine"}],
               "constraints": {"timeout_seconds": 600}}  # fmt: skip
    task_id = _answered(store, registry, {**request, "agent": "support@1"})
    before = store.tasks.get(task_id).submission
    assert (before.outcome and before.outcome.grader, before.constraints.max_steps) == ("says_done", 7)

    assert move_task(store, registry, task_id, 2, tenant=TENANT) == ("support@1", "support@2")
    moved = store.tasks.get(task_id).submission
    fresh = submit_once(store, registry, {**request, "agent": "support@2"}, tenant=TENANT).task.submission
    assert _as_submitted(moved) == _as_submitted(fresh)
    assert moved.outcome is not None and moved.outcome.grader == "report_written"
    assert [a.store for a in moved.memory] == ["faq-v2", "mine"]
    assert moved.notify is not None and moved.notify.url == "https://v2.example.com/hook"
    assert moved.concurrency is not None and moved.concurrency.key == "v2"
    assert (moved.constraints.max_steps, moved.constraints.max_output_tokens) == (9, 4096)  # v2's; v1's gone
    assert moved.constraints.timeout_seconds == 600 and (moved.user, moved.metadata) == ("alice", {"ticket": "42"})

    # Its next answer runs v2 and is graded by v2's outcome: report_written, which it fails.
    send_message(store, _Queues(), task_id, "and now?", tenant=TENANT)  # type: ignore[arg-type]
    result = _run(store, registry, task_id)
    grades = [s.body for s in store.steps.load(task_id) if isinstance(s.body, GradeStep)]
    assert [g.checks[0].name for g in grades] == ["says_done", "report_written"]
    assert result.status is TaskStatus.FAILED_OUTCOME


def test_what_a_submitter_set_itself_stays_across_a_move_and_the_next(store: Storage, registry: ToolRegistry) -> None:
    """An outcome, a callback dropped with null, a concurrency key and a constraint the submitter
    sent are its own: the new version's do not replace them, and a second move keeps them too."""
    _two_versions(store)
    own = {"outcome": {"grader": "says_done", "bar": 0.9}, "notify": None,
           "concurrency": {"key": "customer-7"}, "constraints": {"max_steps": 3}}  # fmt: skip
    task_id = _answered(store, registry, {"goal": "g", "agent": "support@1", **own})
    for version in (2, 1):
        move_task(store, registry, task_id, version, tenant=TENANT)
        moved = store.tasks.get(task_id).submission
        assert moved.agent == f"support@{version}" and moved.system == f"v{version}"
        assert moved.outcome is not None and (moved.outcome.grader, moved.outcome.bar) == ("says_done", 0.9)
        assert moved.notify is None and moved.concurrency is not None and moved.concurrency.key == "customer-7"
        assert moved.constraints.max_steps == 3
        assert [a.store for a in moved.memory] == [f"faq-v{version}"]


def test_a_task_resolved_before_the_record_was_kept_is_told_apart_by_the_version_it_ran(
    store: Storage, registry: ToolRegistry
) -> None:
    """A task stored without ``own_fields`` (submitted before it was recorded): a value its old
    version (or, for a constraint that version left unset, the deployment's or agentq's default)
    gave is taken as that version's and follows the move; any other value is the submitter's
    and stays. The moved task carries the record from then on."""
    _two_versions(store)
    task_id = _answered(store, registry, {"goal": "g", "agent": "support@1", "memory": [{"store": "mine"}],
                                          "constraints": {"timeout_seconds": 600, "max_tokens": 90_000}})  # fmt: skip
    task = store.tasks.get(task_id)
    old = task.submission.model_copy(update={"own_fields": None})
    store.tasks.replace_submission(task_id, old, when_status=task.status)
    move_task(store, registry, task_id, 2, tenant=TENANT, defaults=Defaults(max_tokens=90_000))
    moved = store.tasks.get(task_id).submission
    assert moved.outcome is not None and moved.outcome.grader == "report_written"
    assert [a.store for a in moved.memory] == ["faq-v2", "mine"]
    assert moved.notify is not None and moved.notify.url == "https://v2.example.com/hook"
    assert (moved.constraints.max_steps, moved.constraints.timeout_seconds) == (9, 600)
    assert moved.constraints.max_tokens == 90_000  # its budget, as META holds it
    assert moved.own_fields == ["constraints.timeout_seconds", "memory.mine"]
