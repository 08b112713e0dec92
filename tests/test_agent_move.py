"""Moving a task to another version of its agent (``control.aliases.move_task``) resolves it
again as its request would be on that version: what the version gives its tasks (outcome,
memory, callback, concurrency key, constraint defaults, besides what it alone defines) comes
from the new version, what its submitter set itself stays. On the in-memory twin, with the real
submission, move and engine code; tests/test_agent_aliases.py moves tasks over HTTP with real
workers."""

from __future__ import annotations

import os
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agentq.control.agents import create_agent
from agentq.control.aliases import move_task
from agentq.control.conversations import send_message
from agentq.control.defaults import Defaults
from agentq.control.operations import planned_raise
from agentq.control.submit import submit_once
from agentq.core.agents import AgentSpec
from agentq.core.engine import Engine, EngineConfig
from agentq.core.errors import IllegalTransition
from agentq.core.memory import MemoryStoreSpec
from agentq.core.models import GradeStep, TaskStatus, TaskSubmission
from agentq.core.tools import ToolRegistry
from agentq.core.tools.egress import egress_factory
from agentq.core.tools.fetch import FetchPolicy, HostRule
from agentq.storage.container import Storage

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples" / "coding_agent"))
import coding_agent  # type: ignore[import-not-found]

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
    store.tasks.replace_submission(task_id, lambda _: old, when_status=task.status)
    move_task(store, registry, task_id, 2, tenant=TENANT, defaults=Defaults(max_tokens=90_000))
    moved = store.tasks.get(task_id).submission
    assert moved.outcome is not None and moved.outcome.grader == "report_written"
    assert [a.store for a in moved.memory] == ["faq-v2", "mine"]
    assert moved.notify is not None and moved.notify.url == "https://v2.example.com/hook"
    assert (moved.constraints.max_steps, moved.constraints.timeout_seconds) == (9, 600)
    assert moved.constraints.max_tokens == 90_000  # its budget, as META holds it
    assert moved.own_fields == ["constraints.timeout_seconds", "memory.mine"]


# ---------------------------------------------------------------- a move and the task's workspace

BWRAP = pytest.mark.skipif(not os.path.exists("/usr/bin/bwrap"), reason="the workspace tools need bubblewrap")


def test_a_move_between_a_messages_read_and_its_accept_is_kept_by_the_raise_the_message_carries(
    store: Storage, registry: ToolRegistry
) -> None:
    """A message's raise was planned from the sender's read of the task and its submission put as
    planned, whatever was written since: a move in between was undone, its ``agent.moved`` logged."""
    _two_versions(store)
    task_id = _answered(store, registry, {"goal": "g", "agent": "support@1"})
    read = store.tasks.get(task_id)  # the sender's read
    plan = planned_raise(read, add_tokens=0, add_steps=5)
    move_task(store, registry, task_id, 2, tenant=TENANT)  # the move, before the accept
    store.messages.accept(task_id, "go on", raised=plan)
    after = store.tasks.get(task_id).submission
    assert (after.agent, after.system, after.constraints.max_steps) == ("support@2", "v2", 9 + 5)


def test_a_move_between_another_moves_read_and_its_write_refuses_that_one_and_is_never_undone(
    store: Storage, registry: ToolRegistry, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A move is made from the submission it read and written only while it is still that one (a
    raise always moves the task out of the statuses a move takes, so only another move can come
    between): the later one is refused (409, nothing written), the earlier one stands, and the
    later one made again moves the task on from it."""
    _two_versions(store)
    store.agents.create(TENANT, _version("v3"))
    task_id = _answered(store, registry, {"goal": "g", "agent": "support@1"})
    versions = store.agents.get

    def moved_meanwhile(*args: Any, **kwargs: Any) -> Any:
        monkeypatch.setattr(store.agents, "get", versions)  # once
        move_task(store, registry, task_id, 2, tenant=TENANT)
        return versions(*args, **kwargs)

    monkeypatch.setattr(store.agents, "get", moved_meanwhile)  # read by the move after the submission
    with pytest.raises(IllegalTransition, match="changed while it moved") as refused:
        move_task(store, registry, task_id, 3, tenant=TENANT)
    assert refused.value.field == "task_id" and store.tasks.get(task_id).submission.agent == "support@2"
    assert move_task(store, registry, task_id, 3, tenant=TENANT) == ("support@2", "support@3")
    assert store.tasks.get(task_id).submission.system == "v3"


@pytest.fixture
def git_host(tmp_path: Path) -> Iterator[str]:
    """examples/coding_agent's repository, served on loopback: ``host:port``."""
    coding_agent.make_repository(tmp_path / "srv")
    with coding_agent.serve(tmp_path / "srv") as host:
        yield host


def _in_workspace(store: Storage, registry: ToolRegistry, root: Path, host: str) -> Engine:
    """An engine whose workspaces may clone from ``host`` (the deployment lets that loopback through)."""
    policy = FetchPolicy(allow=(HostRule.parse(host),))
    return Engine(store, worker_id="w", tools=registry, egress=egress_factory(policy),
                  config=EngineConfig(lease_seconds=10, workspace_root=str(root)))  # fmt: skip


def _coder(store: Storage, registry: ToolRegistry, host: str, root: Path) -> str:
    """An answered task of coder@1 (a shell, no starting files); coder@2 starts from a repository."""
    one = {"name": "coder", "provider": "scripted", "tools": ["shell"], "script": {"turns": [{"text": "one"}]}}
    create_agent(store, registry, one, tenant=TENANT)
    task_id = uuid.uuid4().hex
    submit_once(store, registry, {"goal": "g", "agent": "coder@1"}, tenant=TENANT, task_id=task_id)
    assert _in_workspace(store, registry, root, host).run(task_id).status is TaskStatus.SUCCEEDED
    two = {**one, "script": {"turns": [{"text": "a"}, {"text": "b"}]},
           "workspace": {"allow_hosts": [host], "git": {"url": f"http://{host}/calc.git"}}}  # fmt: skip
    create_agent(store, registry, two, tenant=TENANT)
    return task_id


@BWRAP
def test_a_task_moved_to_a_version_with_a_git_start_after_its_first_step_never_livelocks(
    store: Storage, registry: ToolRegistry, git_host: str, tmp_path: Path
) -> None:
    """A task that answered with no workspace recorded, moved to a version whose workspace
    starts from a repository: the move kept only a workspace the task had, so the task took the
    version's, and every claim of its follow-up cloned, was refused the record of a start at
    step 1, and ended ``lease_lost`` holding the lease, for ever. A move keeps the task's
    workspace as it was, none included (its history ran without those files)."""
    task_id = _coder(store, registry, git_host, tmp_path / "w1")
    assert move_task(store, registry, task_id, 2, tenant=TENANT) == ("coder@1", "coder@2")
    moved = store.tasks.get(task_id)
    assert moved.submission.workspace is None and moved.submission.constraints.tools == ["shell"]
    send_message(store, _Queues(), task_id, "go on", tenant=TENANT)  # type: ignore[arg-type]
    result = _in_workspace(store, registry, tmp_path / "w2", git_host).run(task_id)
    assert result.outcome != "lease_lost", result.error  # was: lease_lost "... no longer current", every claim
    assert result.status is TaskStatus.SUCCEEDED
    done = store.tasks.get(task_id)
    assert done.result == "b" and done.workspace_start is None and done.workspace is None  # nothing cloned


@BWRAP
def test_a_task_with_steps_and_a_git_start_never_recorded_fails_with_a_precise_code_instead_of_cloning(
    store: Storage, registry: ToolRegistry, git_host: str, tmp_path: Path
) -> None:
    """A task that reached that state before the move kept its workspace (its submission names a
    repository, it has committed steps, no start is recorded): its repository can only be its
    step 0 files, so the claim fails it ``workspace_start_refused`` rather than clone at a later
    step, and the task ends instead of being held and claimed again."""
    task_id = _coder(store, registry, git_host, tmp_path / "w1")
    task = store.tasks.get(task_id)
    given = TaskSubmission.model_validate({**task.submission.model_dump(mode="json", exclude_none=True),
        "workspace": {"allow_hosts": [git_host], "git": {"url": f"http://{git_host}/calc.git"}}})  # fmt: skip
    store.tasks.replace_submission(task_id, lambda _: given, when_status=task.status)
    send_message(store, _Queues(), task_id, "go on", tenant=TENANT)  # type: ignore[arg-type]
    result = _in_workspace(store, registry, tmp_path / "w2", git_host).run(task_id)
    assert result.status is TaskStatus.FAILED, (result.outcome, result.error)  # was: lease_lost, every claim
    ended = store.tasks.get(task_id)
    assert ended.error is not None and ended.error["code"] == "workspace_start_refused"
    assert "workspace.git" in ended.error["message"] and ended.workspace_start is None
    assert [c.epoch for c in store.tasks.claims(task_id)] == [1, 2]  # one claim each run, none held
