"""What a stop lists (issue 44 item 3, ``control.stops``): every unfinished task of its scope,
children included, and nothing of another scope or tenant, for every scope kind (user, agent,
key, tenant) and every value a tenant's tasks carry; from the sparse ``tenant_live`` index, at a
cost that does not grow with the other tenants' tasks.

On moto server (the index as DynamoDB defines it). Two tenants hold the same population: every
combination of user, agent and API key (and none of each), each root with a child that inherits
its user and key and runs another agent, a root whose META predates the agent's name on it, and
ended tasks of each kind that must never be listed."""

from __future__ import annotations

import collections
import itertools
import threading
from typing import Any

import pytest

from agentq.control import stops
from agentq.core.errors import LeaseLost
from agentq.core.models import Lease, TaskStatus, TaskSubmission
from agentq.core.stops import StopScope
from agentq.storage import keys
from agentq.storage.container import Storage
from agentq.storage.event_writes import TOGETHER
from agentq.storage.item_size import item_size
from agentq.storage.table import STOPPING, Update
from agentq.storage.task_listing import TENANT_LIVE_PAGE

from tests.storage_conformance._builders import llm_step

USERS = ("alice", "bob", None)
AGENTS = ("shop", "mail@2", None)  # a pinned version is still the agent "mail"
KEYS = ("key_00000000000000a1", "key_00000000000000b2", None)
TENANTS = ("a", "b")


def _submission(user: str | None, agent: str | None) -> TaskSubmission:
    body: dict[str, Any] = {"goal": "g", "provider": "scripted", "script": {"turns": [{"text": "x"}]}}
    if user is not None:
        body["user"] = user
    if agent is not None:
        body["agent"] = agent
    return TaskSubmission.model_validate(body)


def _population(store: Storage, tenant: str) -> dict[str, tuple[str | None, str | None, str | None]]:
    """The tenant's unfinished tasks, each with its (user, agent name, key); ended ones beside them."""
    unfinished: dict[str, tuple[str | None, str | None, str | None]] = {}
    for n, (user, agent, key) in enumerate(itertools.product(USERS, AGENTS, KEYS)):
        root = store.tasks.create(_submission(user, agent), tenant=tenant, key_id=key)
        name = agent.partition("@")[0] if agent else None
        unfinished[root.task_id] = (user, name, key)
        child = store.tasks.create(
            _submission(user, "helper"),
            tenant=tenant,
            parent_id=root.task_id,
            root_id=root.task_id,
            depth=1,
            key_id=key,
        )
        unfinished[child.task_id] = (user, "helper", key)
        if n % 3 == 0:  # some of them running
            assert store.tasks.claim(root.task_id, "w1", 30) is not None
        for ending in (TaskStatus.SUCCEEDED, TaskStatus.CANCELLED):  # ended: never listed
            ended = store.tasks.create(_submission(user, agent), tenant=tenant, key_id=key)
            if ending is TaskStatus.SUCCEEDED:
                assert store.tasks.claim(ended.task_id, "w1", 30) is not None
            store.tasks.transition(ended.task_id, ending)
    # A task created before META carried its agent's name: the index cannot tell its agent.
    old = store.tasks.create(_submission("alice", "shop"), tenant=tenant, key_id=KEYS[0])
    store.table.update(keys.meta_key(old.task_id), Update(remove=["agent"]))
    unfinished[old.task_id] = ("alice", "shop", KEYS[0])
    return unfinished


def _every_scope(tenant: str) -> list[StopScope]:
    names = {a.partition("@")[0] for a in AGENTS if a} | {"helper", "nobody"}
    return (
        [StopScope("user", u) for u in [*filter(None, USERS), "carol"]]
        + [StopScope("agent", a) for a in sorted(names)]
        + [StopScope("key", k) for k in [*filter(None, KEYS), "key_00000000000000ff"]]
        + [StopScope("tenant", tenant)]
    )


def _expected(tasks: dict[str, tuple[str | None, str | None, str | None]], scope: StopScope) -> set[str]:
    index = {"user": 0, "agent": 1, "key": 2}
    if scope.kind == "tenant":
        return set(tasks)
    return {t for t, attrs in tasks.items() if attrs[index[scope.kind]] == scope.value}


def test_the_stop_lists_every_unfinished_task_of_its_scope_children_included_and_none_of_another(
    store: Storage,
) -> None:
    population = {tenant: _population(store, tenant) for tenant in TENANTS}
    for tenant in TENANTS:
        for scope in _every_scope(tenant):
            expected = _expected(population[tenant], scope)
            listed = {t.task_id for t in stops.scope_tasks(store, tenant, scope)}
            assert listed == expected, (tenant, scope)
            entries = {e["task_id"] for e in stops.scope_entries(store, tenant, scope)}
            # The index entries alone decide every task but the one whose META predates its agent's name.
            assert expected <= entries, (tenant, scope)
            assert len(entries - expected) <= (1 if scope.kind == "agent" else 0), (tenant, scope)
    # A tenant's own name is its only tenant scope: another's lists nothing of it.
    assert stops.scope_tasks(store, "a", StopScope("tenant", "b")) == []


class _Calls:
    """The DynamoDB calls of a store's client, by operation (and index, for a Query of one)."""

    def __init__(self, store: Storage) -> None:
        self.counts: collections.Counter[str] = collections.Counter()
        client = store.table.client  # type: ignore[attr-defined]
        client.meta.events.register(
            "before-parameter-build.dynamodb.*", self._count, unique_id=f"stop-calls-{id(self)}"
        )

    def _count(self, model: Any, params: Any = None, **_: Any) -> None:
        index = (params or {}).get("IndexName")
        self.counts[model.name + (f"[{index}]" if index else "")] += 1

    def take(self) -> dict[str, int]:
        taken = dict(self.counts)
        self.counts.clear()
        return taken


@pytest.mark.parametrize("others", [0, 60])
def test_a_stops_calls_grow_with_its_own_scopes_tasks_never_with_other_tenants(store: Storage, others: int) -> None:
    """One Query of the tenant's unfinished tasks (never the ``live`` index of every tenant),
    for each batch of the tasks listed (as many batches as threads, at most ``TOGETHER`` tasks)
    a transaction of their stop marks, a BatchGetItem and one transaction of their moves to
    ``cancelled`` made from it (no read of META), and the
    cancel's bookkeeping (a Query of the task's spawns, one of its dependents, and the tree read
    again once its moves are made, for children a running task spawned meanwhile,
    ``control.subtrees.end_tree``; the slots of a task cancelled queued: one read): the same calls
    however many tasks other tenants run."""
    for _ in range(others):
        store.tasks.create(_submission("alice", "shop"), tenant="elsewhere")
    calls = _Calls(store)
    for n in (5, 70):  # a task a batch; 3 a batch (ceil(70 / THREADS))
        tenant = f"t{n}-{others}"
        ids = [store.tasks.create(_submission("alice", None), tenant=tenant).task_id for _ in range(n)]
        calls.take()
        report = stops.stop(store, tenant, StopScope("user", "alice"))
        assert sorted(report.cancelled) == sorted(ids)
        assert calls.take() == {
            "PutItem": 1,  # the stop
            "Query[tenant_live]": 1,
            "GetItem": n,  # the slots of a task cancelled queued; none before its fence
            "TransactWriteItems": 2 * len(stops.batches(ids, TOGETHER)),  # marks and moves, a transaction each a batch
            "BatchGetItem": len(stops.batches(ids, TOGETHER)),  # the fences' reads, none after
            "Query": 3 * n,  # its spawns, its dependents, its tree read again
        }


def test_tasks_that_move_between_their_batchs_read_and_its_fence_are_fenced_together_from_one_more_read(
    store: Storage,
) -> None:
    """Every task of every batch moves (``seq``: a message delivered, which the stop's mark does
    not fence) between the batch's read and its move to ``cancelled``, once: the batch's
    transaction leaves them all out, and they are read again together and moved in one more
    transaction, a read and a write more a batch, never a read and a write a task (moved alone,
    one after another, they were a stop's tail at 200 running tasks)."""
    n = 70  # 3 a batch
    ids = [store.tasks.create(_submission("alice", None), tenant="mover").task_id for _ in range(n)]
    running = set(ids[::2])
    for task_id in running:
        assert store.tasks.claim(task_id, "w1", 30) is not None
    original = store.tasks.move_together
    moved_once: set[str] = set()
    lock = threading.Lock()

    def move_after_a_step(reads: list[dict[str, Any]], *args: Any, **kwargs: Any) -> list[str | None]:
        with lock:
            fresh = [str(r["task_id"]) for r in reads if r["task_id"] not in moved_once]
            moved_once.update(fresh)
        for task_id in fresh:  # a step commits after the read: seq moves
            store.table.update(keys.meta_key(task_id), Update(add={"seq": 1}))
        return original(reads, *args, **kwargs)

    store.tasks.move_together = move_after_a_step  # type: ignore[method-assign]
    calls = _Calls(store)
    report = stops.stop(store, "mover", StopScope("user", "alice"))
    batches = len(stops.batches(ids, TOGETHER))
    counted = calls.take()
    assert moved_once == set(ids)
    assert sorted(report.cancelled) == sorted(ids)
    assert sorted(report.were_running) == sorted(running)
    assert counted["TransactWriteItems"] == 3 * batches  # the marks, then two rounds of moves
    assert counted["BatchGetItem"] == 2 * batches
    assert all(t.status is TaskStatus.CANCELLED for t in store.tasks.get_many(ids))


def test_a_step_its_worker_commits_after_the_stops_mark_is_refused_and_costs_the_stop_no_round(
    store: Storage,
) -> None:
    """Every running task's worker tries to commit a step right after the stop marked its batch
    (before the batch's read): it is refused (``LeaseLost`` naming the stop: the worker lets the
    task go), so ``seq`` and ``step`` do not move and every batch is
    moved to ``cancelled`` by its first transaction. Before the mark, such a commit made the batch's move refused and
    re-read: at 1,000 running tasks, rounds queued behind the workers' own writes were the stop's
    tail (p99 20-55 s)."""
    n = 70
    ids = [store.tasks.create(_submission("alice", None), tenant="marked").task_id for _ in range(n)]
    leases: dict[str, Lease] = {}
    for task_id in ids:
        claimed = store.tasks.claim(task_id, "w1", 30)
        assert claimed is not None
        leases[task_id] = claimed[0]
    original = store.tasks.mark_stopping
    refused: list[str] = []
    lock = threading.Lock()

    def workers_write_after_the_mark(task_ids: list[str], scope: str) -> list[bool]:
        marked = original(task_ids, scope)
        assert all(marked)
        for task_id in task_ids:
            lease = leases[task_id]
            with pytest.raises(LeaseLost) as lost:  # every kind of worker write: test_stop_mark
                store.steps.commit(lease, 1, llm_step(), root_id=task_id)
            assert lost.value.details == {"stopping": scope}
            with lock:
                refused.append(task_id)
        return marked

    store.tasks.mark_stopping = workers_write_after_the_mark  # type: ignore[method-assign]
    calls = _Calls(store)
    report = stops.stop(store, "marked", StopScope("user", "alice"))
    batches = len(stops.batches(ids, TOGETHER))
    counted = calls.take()
    assert sorted(refused) == sorted(ids)
    assert sorted(report.cancelled) == sorted(ids) == sorted(report.were_running)
    assert counted["TransactWriteItems"] == 2 * batches  # the marks, the moves: no round more
    assert counted["BatchGetItem"] == batches
    metas = store.tasks.metas(ids)
    assert all(m["status"] == "cancelled" and int(m["step"]) == 0 for m in metas)
    assert not any(STOPPING in m for m in metas)  # the move took the mark off


def _smallest_entry(store: Storage) -> dict[str, Any]:
    """The ``tenant_live`` entry of the smallest task there can be: a one-letter tenant, no
    user, key, parent or agent (the entry's keys and projected attributes, as DynamoDB sizes it)."""
    task = store.tasks.create(_submission(None, None), tenant="s")
    meta = store.table.get(keys.meta_key(task.task_id))
    assert meta is not None
    projected = ("pk", "sk", "gsi1pk", "live_sk", "parent_id", "user_pk", "key_id", "agent")
    return {k: meta[k] for k in projected if k in meta}


def test_a_stop_lists_a_tenants_tasks_in_pages_only_dynamodbs_1_mb_ends(memory_store: Storage) -> None:
    """The listing's Limit is above what a 1 MB page holds of the smallest entries, so a page
    ends where DynamoDB's 1 MB does (~3,000 of the largest entries), never sooner; and 1,500
    unfinished tasks (more than the 1,000 a page the listing once asked for) are one Query (on
    the in-memory twin, which pages by Limit as DynamoDB does: 1,500 tasks on moto take minutes)."""
    store = memory_store
    assert TENANT_LIVE_PAGE * item_size(_smallest_entry(store)) >= 1024 * 1024
    tenant = "many"
    ids = {store.tasks.create(_submission("alice", None), tenant=tenant).task_id for _ in range(1500)}
    queries = collections.Counter[str]()
    query_index = store.table.query_index

    def counted(index: str, *args: Any, **kwargs: Any) -> Any:
        queries[index] += 1
        return query_index(index, *args, **kwargs)

    store.table.query_index = counted  # type: ignore[method-assign]
    assert {e["task_id"] for e in stops.scope_entries(store, tenant, StopScope("user", "alice"))} == ids
    assert queries == {"tenant_live": 1}
