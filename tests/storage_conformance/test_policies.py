"""Policy documents on every backend: versioned per tenant and scope from 1, immutable, a lost
race takes the next number, the same text is not a new version, and the engine's one read (every
scope's current document of a tenant) sees its own tenant's documents only."""

from __future__ import annotations

import threading

import pytest

from agentq.core.policies import check
from agentq.storage.container import Storage
from agentq.storage.policies import PolicyNotFound


def _rule(name: str) -> str:
    return f'@id("{name}") forbid(principal, action == Action::"tool", resource == Tool::"{name}");'


def _put(backend: Storage, tenant: str, scope: str, text: str) -> tuple[int, bool]:
    doc, created = backend.policies.put(tenant, scope, text, check(text).digest, by="key1")
    return doc.version, created


def test_versions_are_numbered_per_tenant_and_scope_and_the_same_text_is_not_a_new_one(backend: Storage) -> None:
    assert _put(backend, "a", "tenant", _rule("one")) == (1, True)
    assert _put(backend, "a", "tenant", _rule("one")) == (1, False)
    assert _put(backend, "a", "tenant", _rule("two")) == (2, True)
    assert _put(backend, "a", "agent:bot", _rule("three")) == (1, True)
    assert _put(backend, "b", "tenant", _rule("b")) == (1, True)
    assert backend.policies.get("a", "tenant").text == _rule("two")
    assert backend.policies.get("a", "tenant", 1).text == _rule("one")
    assert backend.policies.get("a", "tenant").created_by == "key1"
    assert [d.version for d in backend.policies.history("a", "tenant")] == [2, 1]
    with pytest.raises(PolicyNotFound):
        backend.policies.get("a", "agent:other")
    with pytest.raises(PolicyNotFound):
        backend.policies.history("c", "tenant")


def test_the_engines_read_is_every_current_document_of_one_tenant_only(backend: Storage) -> None:
    _put(backend, "a", "tenant", _rule("one"))
    _put(backend, "a", "tenant", _rule("two"))
    _put(backend, "a", "agent:bot", _rule("three"))
    _put(backend, "b", "tenant", _rule("theirs"))
    current = {(d.tenant, d.scope, d.version, d.text) for d in backend.policies.current("a")}
    assert current == {("a", "tenant", 2, _rule("two")), ("a", "agent:bot", 1, _rule("three"))}
    assert [d.text for d in backend.policies.current("b")] == [_rule("theirs")]
    assert backend.policies.current("nobody") == []


def test_concurrent_puts_of_one_scope_take_distinct_numbers(backend: Storage) -> None:
    made: list[int] = []
    lock = threading.Lock()

    def put(i: int) -> None:
        version, _ = _put(backend, "a", "tenant", _rule(f"w{i}"))
        with lock:
            made.append(version)

    threads = [threading.Thread(target=put, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(made) == [1, 2, 3, 4, 5, 6]
    assert {d.text for d in backend.policies.history("a", "tenant")} == {_rule(f"w{i}") for i in range(6)}
