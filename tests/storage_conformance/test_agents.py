"""Agent versions on every backend: numbered from 1 per tenant and name, immutable, written
only if absent (a lost race takes the next number), a same-as-latest create writes nothing,
listings are per tenant."""

from __future__ import annotations

import threading

import pytest

from agentq.core.agents import AgentSpec
from agentq.storage.agents import MAX_SPEC_BYTES, AgentNotFound
from agentq.storage.container import Storage


def _spec(name: str, system: str) -> AgentSpec:
    return AgentSpec(name=name, provider="scripted", script="research", system=system, tools=["lookup"])


def test_versions_are_numbered_per_tenant_and_name_and_the_same_definition_is_not_a_new_one(backend: Storage) -> None:
    one, created = backend.agents.create("a", _spec("helper", "v1"))
    assert created and one.version == 1 and one.ref == "helper@1"
    same, created = backend.agents.create("a", _spec("helper", "v1"))
    assert not created and same == one
    two, _ = backend.agents.create("a", _spec("helper", "v2"))
    other_tenant, _ = backend.agents.create("b", _spec("helper", "b's"))
    assert two.version == 2 and other_tenant.version == 1
    assert backend.agents.get("a", "helper").system == "v2"
    assert backend.agents.get("a", "helper", 1) == one
    assert [v.version for v in backend.agents.versions("a", "helper")] == [2, 1]
    assert [(s.name, s.latest_version) for s in backend.agents.list("a")] == [("helper", 2)]
    assert backend.agents.get("b", "helper").system == "b's"
    with pytest.raises(AgentNotFound):
        backend.agents.get("c", "helper")
    with pytest.raises(AgentNotFound, match="no version 3"):
        backend.agents.get("a", "helper", 3)


def test_concurrent_creates_of_one_agent_take_distinct_numbers(backend: Storage) -> None:
    made: list[int] = []
    lock = threading.Lock()

    def create(i: int) -> None:
        version, _ = backend.agents.create("a", _spec("racer", f"writer {i}"))
        with lock:
            made.append(version.version)

    threads = [threading.Thread(target=create, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(made) == [1, 2, 3, 4, 5, 6]
    assert {v.system for v in backend.agents.versions("a", "racer")} == {f"writer {i}" for i in range(6)}


def test_a_definition_too_large_for_one_item_is_refused_and_writes_nothing(
    backend: Storage, monkeypatch: pytest.MonkeyPatch
) -> None:
    from agentq.core.errors import ValidationError
    from agentq.core.models import Script, ScriptTurn

    turns = [ScriptTurn(text="x" * 1000) for _ in range(400)]  # an inline script of ~400 KB
    huge = AgentSpec(name="big", provider="scripted", script=Script(turns=turns))
    assert len(huge.model_dump_json()) > MAX_SPEC_BYTES
    with pytest.raises(ValidationError, match="bytes"):
        backend.agents.create("a", huge)
    assert backend.agents.list("a") == []
    with pytest.raises(AgentNotFound):
        backend.agents.get("a", "big")
