"""The memory tools in the engine, on the in-memory twin: what one task writes the next reads;
each version records the task, step and call that made it; a stale precondition is an error the
model reads with the current hash; a read-only attachment refuses writes; a resumed task never
writes twice; a fork reads the store as it is now."""

from __future__ import annotations

import json
from typing import Any

from agentq.core.engine import Engine, EngineConfig, task_tools
from agentq.core.memory import Author, MemoryStoreSpec, content_sha256
from agentq.core.models import LLMStep, TaskStatus, TaskSubmission, ToolsStep
from agentq.core.tools import ToolRegistry
from agentq.storage.container import Storage

from tests.helpers import call

STORAGE = "memory"
PERSON = Author(type="api", key_id="k1")


def _submission(turns: list[Any], memory: list[dict[str, Any]], **fields: Any) -> TaskSubmission:
    return TaskSubmission.model_validate(
        {"goal": "g", "provider": "scripted", "script": {"turns": turns}, "memory": memory, **fields}
    )


def _run(store: Storage, registry: ToolRegistry, submission: TaskSubmission, tenant: str = "t") -> tuple[str, Any]:
    task = store.tasks.create(submission, tenant=tenant)
    result = Engine(store, worker_id="w1", tools=registry, config=EngineConfig(lease_seconds=5)).run(task.task_id)
    return task.task_id, result


def _results(store: Storage, task_id: str) -> list[Any]:
    return [r for s in store.steps.load(task_id) if isinstance(s.body, ToolsStep) for r in s.body.results]


def _shop(store: Storage, tenant: str = "t") -> None:
    store.memory_stores.create_store(tenant, MemoryStoreSpec(name="shop"))


def test_what_one_task_writes_the_next_task_reads_and_the_version_names_its_call(
    store: Storage, registry: ToolRegistry
) -> None:
    _shop(store)
    write = call("memory_write", store="shop", path="/customers/ann.md", content="ordered: blue lamp")
    first, result = _run(
        store, registry, _submission([{"tool_calls": [write]}, {"text": "noted"}], [{"store": "shop"}])
    )
    assert result.status is TaskStatus.SUCCEEDED
    [written] = _results(store, first)
    assert not written.is_error and json.loads(written.content)["version"] == 1 and written.side_effects
    read = call("memory_read", store="shop", path="/customers/ann.md")
    second, _ = _run(store, registry, _submission([{"tool_calls": [read]}, {"text": "ok"}], [{"store": "shop"}]))
    [answer] = _results(store, second)
    assert json.loads(answer.content)["content"] == "ordered: blue lamp"
    [version] = store.memory_stores.versions("t", "shop", "/customers/ann.md")
    step_one = store.steps.load(first)[0].body
    assert isinstance(step_one, LLMStep)
    assert version.created_by == Author(type="task", task_id=first, step=1, tool_use_id=step_one.tool_uses()[0]["id"])


def test_a_stale_precondition_is_a_tool_error_giving_the_current_hash_and_writes_nothing(
    store: Storage, registry: ToolRegistry
) -> None:
    _shop(store)
    now, _ = store.memory_stores.write("t", "shop", "/x", "changed by another task", author=PERSON)
    stale = call(
        "memory_write", store="shop", path="/x", content="mine", expected_sha256=content_sha256("as I read it")
    )
    task_id, _ = _run(store, registry, _submission([{"tool_calls": [stale]}, {"text": "ok"}], [{"store": "shop"}]))
    [outcome] = _results(store, task_id)
    assert outcome.is_error and "MemoryConflict" in outcome.content and now.content_sha256 in outcome.content
    assert store.memory_stores.read("t", "shop", "/x").content == "changed by another task"


def test_a_read_only_attachment_refuses_writes_and_alone_offers_no_memory_write(
    store: Storage, registry: ToolRegistry
) -> None:
    _shop(store)
    store.memory_stores.create_store("t", MemoryStoreSpec(name="catalog"))
    only_read = _submission([{"text": "x"}], [{"store": "catalog", "access": "read_only"}])
    assert task_tools(only_read) == ["memory_list", "memory_read", "memory_search"]
    assert task_tools(_submission([{"text": "x"}], [])) == []
    write = call("memory_write", store="catalog", path="/x", content="no")
    both = [{"store": "catalog", "access": "read_only"}, {"store": "shop"}]
    task_id, _ = _run(store, registry, _submission([{"tool_calls": [write]}, {"text": "ok"}], both))
    [outcome] = _results(store, task_id)
    assert outcome.is_error and "read-only" in outcome.content
    assert store.memory_stores.list_documents("t", "catalog") == []


def test_a_store_not_attached_or_of_another_tenant_is_not_reachable(store: Storage, registry: ToolRegistry) -> None:
    _shop(store, tenant="other")
    store.memory_stores.write("other", "shop", "/secret", "theirs", author=PERSON)
    read = call("memory_read", store="shop", path="/secret")
    task_id, _ = _run(store, registry, _submission([{"tool_calls": [read]}, {"text": "ok"}], [{"store": "shop"}]))
    [outcome] = _results(store, task_id)
    assert outcome.is_error and "MemoryStoreNotFound" in outcome.content and "theirs" not in outcome.content


def test_a_resumed_task_does_not_write_again_after_a_write_whose_worker_died(
    store: Storage, registry: ToolRegistry
) -> None:
    _shop(store)
    write = call("memory_write", store="shop", path="/x", content="once")
    submission = _submission([{"tool_calls": [write]}, {"text": "ok"}], [{"store": "shop"}])
    task = store.tasks.create(submission, tenant="t")
    # A first worker commits the LLM step, begins the effect and writes, then dies unrecorded.
    from agentq.core.engine import conversation
    from agentq.core.providers import LLMRequest, default_provider_factory

    lease, claimed = store.tasks.claim(task.task_id, "crashed", 0.01)  # type: ignore[misc]
    response = default_provider_factory(claimed.submission).complete(
        LLMRequest(model="m", messages=conversation("g", []), max_tokens=100, task_id=task.task_id)
    )
    step = LLMStep(content=response.content, stop_reason="tool_use", model="m", usage=response.usage,
                   started_at=0, duration_ms=0)  # fmt: skip
    store.steps.commit(lease, 1, step, root_id=task.task_id)
    use = step.tool_uses()[0]
    assert store.effects.begin(lease, use["id"], "memory_write") is None
    store.memory_stores.write("t", "shop", "/x", "once", author=PERSON, lease=lease)
    import time

    time.sleep(0.05)
    result = Engine(store, worker_id="w2", tools=registry, config=EngineConfig(lease_seconds=5)).run(task.task_id)
    assert result.status is TaskStatus.SUCCEEDED
    [outcome] = _results(store, task.task_id)
    assert outcome.status == "unknown_outcome"
    assert len(store.memory_stores.versions("t", "shop", "/x")) == 1


def test_a_fork_reads_the_store_as_it_is_now_not_as_at_the_fork_point(store: Storage, registry: ToolRegistry) -> None:
    _shop(store)
    store.memory_stores.write("t", "shop", "/x", "before", author=PERSON)
    read = call("memory_read", store="shop", path="/x")
    turns = [{"tool_calls": [read]}, {"tool_calls": [read]}, {"text": "done"}]
    source_id, _ = _run(store, registry, _submission(turns, [{"store": "shop"}]))
    now = store.memory_stores.read("t", "shop", "/x")
    store.memory_stores.write("t", "shop", "/x", "after", author=PERSON, expected_sha256=now.content_sha256)
    source = store.tasks.get(source_id)
    fork = store.tasks.fork(source, source.submission, store.steps.load(source_id)[:2], tenant="t")
    Engine(store, worker_id="w1", tools=registry, config=EngineConfig(lease_seconds=5)).run(fork.task_id)
    copied, fresh = (json.loads(r.content)["content"] for r in _results(store, fork.task_id))
    assert (copied, fresh) == ("before", "after")


def test_a_submission_attaching_a_store_that_does_not_exist_is_refused_naming_the_field(
    store: Storage, registry: ToolRegistry
) -> None:
    import pytest

    from agentq.control.submit import prepare_submission
    from agentq.core.errors import ValidationError

    _shop(store, tenant="other")
    with pytest.raises(ValidationError) as refused:
        prepare_submission(store, registry, _submission([{"text": "x"}], [{"store": "shop"}]), tenant="t")
    assert refused.value.field == "memory[0].store"


def test_an_agent_versions_attachments_are_merged_with_the_submissions_own(
    store: Storage, registry: ToolRegistry
) -> None:
    from agentq.control.agents import create_agent
    from agentq.control.submit import prepare_submission

    _shop(store)
    store.memory_stores.create_store("t", MemoryStoreSpec(name="catalog"))
    store.memory_stores.create_store("t", MemoryStoreSpec(name="ann"))
    agent = {
        "name": "support",
        "provider": "scripted",
        "script": {"turns": [{"text": "x"}]},
        "memory": [{"store": "catalog", "access": "read_only"}, {"store": "shop", "instructions": "orders"}],
    }
    create_agent(store, registry, agent, tenant="t")
    sent = TaskSubmission.model_validate(
        {"goal": "g", "agent": "support", "memory": [{"store": "shop", "access": "read_only"}, {"store": "ann"}]}
    )
    resolved = prepare_submission(store, registry, sent, tenant="t")
    assert [(a.store, a.access) for a in resolved.memory] == [
        ("catalog", "read_only"),
        ("shop", "read_only"),
        ("ann", "read_write"),
    ]


def test_sub_agents_get_their_parents_stores_read_only(store: Storage) -> None:
    from agentq.core.fanout import SpawnInput, plan_children

    _shop(store)
    parent = store.tasks.create(_submission([{"text": "x"}], [{"store": "shop"}]), tenant="t")
    spec = SpawnInput.model_validate({"subagents": [{"goal": "a", "script": {"turns": [{"text": "x"}]}}]})
    [child] = plan_children(parent, "toolu_1", spec, available=10_000)
    assert [(a.store, a.access) for a in child.submission.memory] == [("shop", "read_only")]


def test_memory_write_may_be_named_to_get_a_policy_and_then_waits_for_approval(
    store: Storage, registry: ToolRegistry
) -> None:
    from agentq.control.submit import prepare_submission

    _shop(store)
    write = call("memory_write", store="shop", path="/x", content="asked first")
    sent = _submission(
        [{"tool_calls": [write]}, {"text": "ok"}],
        [{"store": "shop"}],
        constraints={"tools": ["memory_write"], "tool_policies": {"memory_write": "ask"}},
    )
    submission = prepare_submission(store, registry, sent, tenant="t")
    _, result = _run(store, registry, submission)
    assert result.status is TaskStatus.PAUSED
    assert store.memory_stores.list_documents("t", "shop") == []


def test_an_agent_without_memory_keeps_the_digest_it_had_before_agents_could_attach_stores() -> None:
    import hashlib

    from agentq.core.agents import AgentSpec

    spec = AgentSpec(name="helper", provider="scripted", script="research", system="s")
    before = spec.model_dump_json(exclude_none=True).replace(',"memory":[]', "")
    assert spec.digest() == hashlib.sha256(before.encode()).hexdigest()
    assert AgentSpec(**{**spec.model_dump(), "memory": [{"store": "shop"}]}).digest() != spec.digest()


def test_a_request_without_memory_keeps_the_idempotency_hash_it_had_before_memory_existed() -> None:
    import hashlib

    from agentq.control.submit import request_hash

    sent = _submission([{"text": "x"}], [])
    before = sent.model_dump_json(exclude_none=True).replace(',"memory":[]', "")
    assert request_hash(sent) == hashlib.sha256(before.encode()).hexdigest()
    assert request_hash(_submission([{"text": "x"}], [{"store": "shop"}])) != request_hash(sent)
