"""Stops on every backend: one item per stopped scope of a tenant, a second stop keeps the first
(its time, author and reason), a resume removes it and says so, the one read (every stop of a
tenant) sees only its own tenant's, and racing stops of one scope agree on one."""

from __future__ import annotations

import threading

from agentq.core.stops import StopScope
from agentq.storage.container import Storage


def test_a_stop_is_stored_once_per_scope_and_a_second_keeps_the_first(backend: Storage) -> None:
    alice = StopScope("user", "alice")
    first, created = backend.stops.put("a", alice, by="key_1", reason="runaway")
    assert created and first.scope == alice and first.by == "key_1" and first.reason == "runaway"
    again, created_again = backend.stops.put("a", alice, by="key_2", reason="later")
    assert not created_again and again == first
    backend.stops.put("a", StopScope("agent", "shop"))
    backend.stops.put("a", StopScope("key", "key_0123456789abcdef"))
    backend.stops.put("a", StopScope("tenant", "a"))
    assert {(s.scope.kind, s.scope.value) for s in backend.stops.list("a")} == {
        ("user", "alice"), ("agent", "shop"), ("key", "key_0123456789abcdef"), ("tenant", "a")
    }  # fmt: skip
    assert all(s.tenant == "a" for s in backend.stops.list("a"))


def test_stops_of_one_tenant_are_never_another_tenants(backend: Storage) -> None:
    backend.stops.put("a", StopScope("user", "alice"))
    assert backend.stops.list("b") == []
    assert backend.stops.delete("b", StopScope("user", "alice")) is None
    assert [s.scope.value for s in backend.stops.list("a")] == ["alice"]


def test_a_resume_removes_the_stop_once(backend: Storage) -> None:
    scope = StopScope("agent", "shop")
    stop, _ = backend.stops.put("a", scope, reason="why")
    removed = backend.stops.delete("a", scope)
    assert removed == stop
    assert backend.stops.delete("a", scope) is None
    assert backend.stops.list("a") == []
    assert backend.stops.put("a", scope)[1] is True  # stopped anew


def test_racing_stops_of_one_scope_store_one(backend: Storage) -> None:
    scope = StopScope("user", "bob")
    results: list[bool] = []
    barrier = threading.Barrier(8)

    def stop(i: int) -> None:
        barrier.wait()
        results.append(backend.stops.put("a", scope, by=f"key_{i}")[1])

    threads = [threading.Thread(target=stop, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(results) == [False] * 7 + [True]
    assert len(backend.stops.list("a")) == 1
