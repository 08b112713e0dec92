"""Agent aliases on every backend: a move is one conditional write (an alias to a version that
does not exist writes nothing, the alias keeps what it had), each move counts one revision,
concurrent moves each land whole, a move expecting a revision lands only from it, and aliases are
per tenant and per agent."""

from __future__ import annotations

import threading

import pytest

from agentq.core.agents import AgentSpec
from agentq.core.aliases import AliasSpec, AliasTarget
from agentq.core.errors import ValidationError
from agentq.storage.agent_aliases import AliasConflict, AliasNotFound
from agentq.storage.container import Storage


def _versions(backend: Storage, tenant: str, name: str, count: int) -> None:
    for i in range(count):
        backend.agents.create(tenant, AgentSpec(name=name, provider="scripted", script="research", system=f"v{i + 1}"))


def _spec(*pairs: tuple[int, int]) -> AliasSpec:
    return AliasSpec(versions=[AliasTarget(version=v, weight=w) for v, w in pairs])


def test_an_alias_moves_in_one_write_and_counts_its_revisions(backend: Storage) -> None:
    _versions(backend, "a", "support", 3)
    first = backend.aliases.set("a", "support", "prod", _spec((1, 100)))
    assert (first.revision, [t.version for t in first.versions]) == (1, [1])
    moved = backend.aliases.set("a", "support", "prod", _spec((2, 90), (3, 10)))
    assert moved.revision == 2 and [(t.version, t.weight) for t in moved.versions] == [(2, 90), (3, 10)]
    assert backend.aliases.get("a", "support", "prod") == moved
    back = backend.aliases.set("a", "support", "prod", _spec((1, 100)))  # a rollback is a move
    assert back.revision == 3 and [t.version for t in back.versions] == [1]


@pytest.mark.parametrize("missing_at", [0, 1])
def test_an_alias_to_a_missing_version_writes_nothing_and_names_the_target(backend: Storage, missing_at: int) -> None:
    _versions(backend, "a", "support", 2)
    before = backend.aliases.set("a", "support", "prod", _spec((1, 100)))
    pairs = [(2, 50), (2, 50)]
    pairs[missing_at] = (9, 50)
    with pytest.raises(ValidationError) as err:
        backend.aliases.set("a", "support", "prod", _spec(*pairs))
    assert err.value.field == f"versions[{missing_at}].version"
    assert backend.aliases.get("a", "support", "prod") == before
    with pytest.raises(ValidationError):  # nor does an alias of an agent that does not exist
        backend.aliases.set("a", "nobody", "prod", _spec((1, 100)))
    with pytest.raises(AliasNotFound):
        backend.aliases.get("a", "nobody", "prod")


def test_aliases_are_per_tenant_and_per_agent_and_deleted_once(backend: Storage) -> None:
    _versions(backend, "a", "support", 2)
    _versions(backend, "a", "billing", 1)
    _versions(backend, "b", "support", 1)
    backend.aliases.set("a", "support", "prod", _spec((2, 100)))
    backend.aliases.set("a", "support", "canary", _spec((1, 100)))
    with pytest.raises(AliasNotFound):
        backend.aliases.get("b", "support", "prod")
    with pytest.raises(AliasNotFound):
        backend.aliases.get("a", "billing", "prod")
    assert [a.alias for a in backend.aliases.list("a", "support")] == ["canary", "prod"]
    assert backend.aliases.list("b", "support") == []
    assert [v.version for v in backend.agents.versions("a", "support")] == [2, 1]  # aliases are not versions
    backend.aliases.delete("a", "support", "canary")
    with pytest.raises(AliasNotFound):
        backend.aliases.delete("a", "support", "canary")
    with pytest.raises(AliasNotFound):
        backend.aliases.delete("b", "support", "prod")
    assert [a.alias for a in backend.aliases.list("a", "support")] == ["prod"]


def test_concurrent_moves_each_land_whole(backend: Storage) -> None:
    _versions(backend, "a", "support", 4)
    moves = [_spec((1, 100)), _spec((2, 100)), _spec((3, 70), (4, 30)), _spec((4, 50), (1, 50))]
    errors: list[BaseException] = []

    def move(spec: AliasSpec) -> None:
        try:
            backend.aliases.set("a", "support", "prod", spec)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=move, args=(m,)) for m in moves]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    final = backend.aliases.get("a", "support", "prod")
    assert final.revision == len(moves)
    assert final.versions in [m.versions for m in moves]


def test_a_move_expecting_a_revision_lands_only_from_it_and_answers_its_own_write(backend: Storage) -> None:
    """``expected_revision``: the move is made only from the revision its caller read (0: no
    alias yet), else ``AliasConflict`` naming it, nothing written; the answer is the write."""
    _versions(backend, "a", "support", 2)
    made = backend.aliases.set("a", "support", "prod", _spec((1, 90), (2, 10)), expected_revision=0)
    assert made.revision == 1 and backend.aliases.get("a", "support", "prod") == made
    backend.aliases.set("a", "support", "prod", _spec((1, 100)))  # another caller's rollback: revision 2
    for stale in (0, 1, 3):
        with pytest.raises(AliasConflict) as err:
            backend.aliases.set("a", "support", "prod", _spec((1, 50), (2, 50)), expected_revision=stale)
        assert (err.value.code, err.value.field) == ("alias_conflict", "expected_revision")
    now = backend.aliases.get("a", "support", "prod")
    assert (now.revision, [t.version for t in now.versions]) == (2, [1])
    bumped = backend.aliases.set("a", "support", "prod", _spec((1, 50), (2, 50)), expected_revision=2)
    assert bumped.revision == 3 and backend.aliases.get("a", "support", "prod") == bumped
