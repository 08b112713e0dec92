"""A canary split (``core.aliases.pick``) through the real submission path on the in-memory
table: the same task id always gets the same version; the share of a weight over many ids
stays within a binomial bound, for every weight; a task of an end user gets that user's version
whatever its id; raising a canary's weight only moves keys onto it; another tenant or agent
draws independently."""

from __future__ import annotations

import math
import uuid

import pytest

from agentq.control.aliases import aliased_version
from agentq.control.submit import submit_once
from agentq.core.agents import AgentSpec
from agentq.core.aliases import AliasSpec, AliasTarget, pick
from agentq.core.tools.builtin import default_registry
from agentq.storage.container import Storage, memory_storage
from agentq.storage.memory import MemoryPayloads, MemoryTable
from agentq.storage.table import Item

IDS = 4000


def _split(canary_weight: int) -> AliasSpec:
    return AliasSpec(
        versions=[AliasTarget(version=1, weight=100 - canary_weight), AliasTarget(version=2, weight=canary_weight)]
    )


def _ids(n: int) -> list[str]:
    return [uuid.uuid4().hex for _ in range(n)]


def _within(count: int, n: int, p: float) -> bool:
    """``count`` of ``n`` draws of probability ``p`` within 5 standard deviations (a false alarm
    about once in 3.5 million runs)."""
    sd = math.sqrt(n * p * (1 - p))
    return abs(count - n * p) <= 5 * sd + 1


@pytest.mark.parametrize("weight", [1, 10, 25, 50, 90, 99])
def test_the_observed_share_of_each_weight_is_within_a_binomial_bound(weight: int) -> None:
    spec = _split(weight)
    ids = _ids(IDS)
    canaried = sum(pick(spec, tenant="a", agent="support", key=f"task:{i}") == 2 for i in ids)
    assert _within(canaried, IDS, weight / 100), (weight, canaried)


def test_raising_a_canary_only_moves_keys_onto_it() -> None:
    ids = _ids(IDS)
    on = {w: {i for i in ids if pick(_split(w), tenant="a", agent="s", key=i) == 2} for w in (5, 10, 20, 50, 99)}
    assert on[5] <= on[10] <= on[20] <= on[50] <= on[99]


def test_tenants_and_agents_draw_independently() -> None:
    ids = _ids(IDS)
    spec = _split(50)
    a = [pick(spec, tenant="a", agent="s", key=i) for i in ids]
    b = [pick(spec, tenant="b", agent="s", key=i) for i in ids]
    c = [pick(spec, tenant="a", agent="t", key=i) for i in ids]
    for other in (b, c):
        same = sum(x == y for x, y in zip(a, other, strict=True))
        assert _within(same, IDS, 0.5)  # agreeing half the time: independent draws


@pytest.fixture
def store() -> Storage:
    store = memory_storage()
    for i in (1, 2):
        store.agents.create("a", AgentSpec(name="support", provider="scripted", script="research", system=f"v{i}"))
    store.aliases.set("a", "support", "prod", _split(30))
    return store


def _submit(store: Storage, task_id: str, user: str | None = None) -> str:
    raw = {"goal": "g", "agent": "support@prod", **({"user": user} if user else {})}
    task = submit_once(store, default_registry(), raw, tenant="a", task_id=task_id).task
    assert task.submission.agent is not None
    return task.submission.agent


def test_a_task_id_gets_the_same_version_every_time_and_the_one_pick_says(store: Storage) -> None:
    spec = store.aliases.get("a", "support", "prod")
    for task_id in _ids(200):
        want = f"support@{pick(spec, tenant='a', agent='support', key=f'task:{task_id}')}"
        assert _submit(store, task_id) == want
        # the same id again (a schedule's repeated fire resolves before it finds its task): the same version
        assert store.aliases.version("a", "support", int(want.split("@")[1])).ref == want


def test_a_users_tasks_all_get_that_users_version(store: Storage) -> None:
    users = [f"user-{i}" for i in range(60)]
    seen = {u: {_submit(store, uuid.uuid4().hex, user=u) for _ in range(5)} for u in users}
    assert all(len(versions) == 1 for versions in seen.values()), seen
    canaried = sum(versions == {"support@2"} for versions in seen.values())
    assert 0 < canaried < len(users)  # 30% of 60 users: some on each side


class CountingTable(MemoryTable):
    """The in-memory table, counting its point reads (what a DynamoDB bill counts)."""

    def __init__(self) -> None:
        super().__init__()
        self.reads: list[str] = []

    def get(self, key: dict[str, str], *, consistent: bool = True) -> Item | None:
        self.reads.append(key["sk"])
        return super().get(key, consistent=consistent)


def test_an_alias_submission_reads_the_alias_once_and_a_cached_version() -> None:
    """The cost the docs promise: one read (the alias, never cached: a move counts at once) and
    the version it picks from the process's cache once read; a move is seen by the next read."""
    table = CountingTable()
    store = Storage(table, MemoryPayloads())
    for i in (1, 2):
        store.agents.create("a", AgentSpec(name="support", provider="scripted", script="research", system=f"v{i}"))
    store.aliases.set("a", "support", "prod", _split(50))
    for task_id in _ids(40):  # warm: both versions read once
        aliased_version(store, "a", "support", "prod", task_id=task_id, user=None)
    for task_id in _ids(20):
        table.reads.clear()
        aliased_version(store, "a", "support", "prod", task_id=task_id, user=None)
        assert table.reads == ["ALIAS#prod"]
    store.aliases.set("a", "support", "prod", AliasSpec(versions=[AliasTarget(version=2, weight=100)]))
    assert {aliased_version(store, "a", "support", "prod", task_id=t, user=None).version for t in _ids(20)} == {2}


def test_a_schedule_naming_an_alias_resolves_it_at_each_fire_and_an_unknown_alias_is_refused(store: Storage) -> None:
    from agentq.control.schedules import create_schedule, fire
    from agentq.core.errors import ValidationError

    tools = default_registry()
    raw = {"name": "nightly", "expression": "rate(1 day)", "overlap": "allow",
           "submission": {"goal": "g", "agent": "support@nightly"}}  # fmt: skip
    with pytest.raises(ValidationError) as refused:
        create_schedule(store, tools, raw, tenant="a")
    assert refused.value.field == "submission.agent"
    assert store.schedules.list() == []
    store.aliases.set("a", "support", "nightly", AliasSpec(versions=[AliasTarget(version=1, weight=100)]))
    due = create_schedule(store, tools, raw, tenant="a").next_fire_at  # fire times to come: a past one is coalesced
    first = fire(store, tools, None, tenant="a", name="nightly", fire_time=due)
    store.aliases.set("a", "support", "nightly", AliasSpec(versions=[AliasTarget(version=2, weight=100)]))
    second = fire(store, tools, None, tenant="a", name="nightly", fire_time=due + 86400)
    assert first is not None and second is not None
    assert [store.tasks.get(t).submission.agent for t in (first, second)] == ["support@1", "support@2"]
    # the first fire's task keeps 1; a repeated delivery of the first fire finds it, and makes none
    assert fire(store, tools, None, tenant="a", name="nightly", fire_time=due) == first
    assert store.tasks.get(first).submission.agent == "support@1"
