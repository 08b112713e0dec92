"""Fair by default (issue 44): with the defaults `agentq dev` ships (``LocalStack(fair=True)``:
the fleet's capacity is what its workers run, and a tenant's default running limit leaves the
fleet's reserve free, ``control.defaults.fair_limit``), a quiet tenant's first task is claimed
while another tenant's burst still holds every slot it may take and has tasks waiting, so it
never waits for one of the burst's tasks to end; and the fleet stays work-conserving: a lone
tenant runs all of it but the reserve, and a second tenant's tasks fill it.

Real worker processes on the local stack (moto server). The burst's tasks call ``hold``
(tests/gate_tools.py), which returns only when the test opens that task's gate, so the order of
events is the test's own: nothing here is timed. A deadline bounds each wait for an event
(without the kept slot, the quiet task's claim never comes, and the test fails there)."""

from __future__ import annotations

import json
import os
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from agentq.control.defaults import Defaults, fair_limit, fleet_reserve
from agentq.control.submit import submit_once
from agentq.core.models import Task, TaskStatus
from agentq.queueing._tuning import WorkerConfig
from agentq.runtime import build_registry
from agentq.storage.fleet_slots import SHARDS, shard_pk
from agentq.storage.table import plain
from agentq_dev.stack import LocalStack
from infra.settings import resolve
from infra.task_runners import defaults_env

from tests.helpers import call, scripted

WORKERS, CONCURRENCY = 2, 3
RUNS = WORKERS * CONCURRENCY  # what the workers run at once: the fleet's capacity under agentq dev's rule
LIMIT = fair_limit(RUNS)  # 5: one slot kept free of any one tenant
BURST = 2 * RUNS  # more than the fleet runs: the rest of the burst waits
WAIT_S = 90.0  # bounds a wait for an event; never asserted on


class Fleet:
    """A fair-by-default local stack, its gates, and the submissions of its tenants."""

    def __init__(self, stack: LocalStack, gates: Path) -> None:
        assert stack.settings is not None
        self.stack, self.gates = stack, gates
        self.store = stack.store()
        self.queues = stack.queues()
        self.registry = build_registry(stack.settings)
        self.defaults = stack.settings.defaults
        self.slots = self.defaults.running_slots(self.store)
        self.labels: list[str] = []  # every gate a submitted task holds on

    def submit(self, tenant: str, label: str | None) -> str:
        """A one-turn task; with a ``label``, its turn calls ``hold`` and it runs until that gate opens."""
        turns: list[object] = [{"text": "done"}]
        if label is not None:
            self.labels.append(label)
            turns = [{"text": "holding", "tool_calls": [call("hold", label=label)]}, {"text": "done"}]
        work = scripted(turns, tools=["hold"] if label is not None else [])
        submitted = submit_once(self.store, self.registry, work, tenant=tenant, queues=self.queues,
                                defaults=self.defaults)  # fmt: skip
        return submitted.task.task_id

    def fleet_running(self) -> int:
        """The fleet's slots taken, as its shards count them."""
        shards = [self.store.table.get({"pk": shard_pk(i), "sk": "RUNNING"}) or {} for i in range(SHARDS)]
        return sum(int(plain(s).get("running", 0)) for s in shards)

    def open(self, label: str) -> None:
        (self.gates / label).touch()

    def tasks(self, ids: list[str]) -> list[Task]:
        return [self.store.tasks.get(t) for t in ids]

    def claimed(self, ids: list[str]) -> list[Task]:
        return [t for t in self.tasks(ids) if t.first_claimed_at is not None]

    def until(self, what: str, done: Callable[[], Any]) -> Any:
        deadline = time.monotonic() + WAIT_S
        while not (seen := done()):
            assert time.monotonic() < deadline, f"never happened: {what}"
            time.sleep(0.05)
        return seen


@contextmanager
def gated_fleet(tmp_path: Path, prefix: str, workers: int, concurrency: int, **stack: Any) -> Iterator[Fleet]:
    """A local stack (no API) whose workers run ``tests.gate_tools``, as a ``Fleet``; ``stack``:
    ``LocalStack``'s other options. At the end every gate a task held on is opened, so the
    workers stop promptly."""
    gates = tmp_path / "gates"
    gates.mkdir()
    pythonpath = os.pathsep.join(filter(None, [os.getcwd(), os.environ.get("PYTHONPATH", "")]))
    with LocalStack(prefix=f"{prefix}-{uuid.uuid4().hex[:6]}", workers=workers, api=False,
                    worker_config=WorkerConfig(concurrency=concurrency), tool_modules=("tests.gate_tools",),
                    extra_env={"AGENTQ_TEST_GATE_DIR": str(gates), "PYTHONPATH": pythonpath},
                    **stack) as local:  # fmt: skip
        fleet = Fleet(local, gates)
        yield fleet
        for label in fleet.labels:
            fleet.open(label)


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[Fleet]:
    with gated_fleet(tmp_path, "fair", WORKERS, CONCURRENCY, fair=True) as made:
        yield made


def test_agent_dev_defaults_set_the_fleet_to_what_its_workers_run_and_keep_its_reserve_from_any_one_tenant(
    fleet: Fleet,
) -> None:
    assert fleet.defaults.fleet_capacity == RUNS
    assert fleet.defaults.tenant_max_running == LIMIT == RUNS - fleet_reserve(RUNS) < RUNS


def test_a_quiet_tenants_first_task_is_claimed_before_any_task_of_another_tenants_burst_ends(fleet: Fleet) -> None:
    burst = [fleet.submit("burst", f"a{i}") for i in range(BURST)]
    fleet.until(f"{LIMIT} of the burst claimed", lambda: len(fleet.claimed(burst)) >= LIMIT)

    quiet = fleet.submit("quiet", None)
    # No task of the burst can end before its gate opens, and none is opened before the quiet
    # task is claimed: without a slot kept free of the burst, that claim never comes (its
    # message stands behind the burst's in the queue, or it waits for a slot the burst holds).
    fleet.until("the quiet task claimed", lambda: fleet.store.tasks.get(quiet).first_claimed_at)
    assert [t for t in fleet.tasks(burst) if t.finished_at is not None] == []
    usage = fleet.slots.usage("burst")  # it held every slot it may take, and the rest of it waited
    assert (usage.running, usage.waiting) == (LIMIT, BURST - LIMIT)
    done = fleet.until("the quiet task done", lambda: fleet.store.tasks.get(quiet).status.terminal)
    assert done and fleet.store.tasks.get(quiet).status is TaskStatus.SUCCEEDED


def test_a_lone_tenant_runs_all_the_fleet_but_its_reserve_and_a_second_tenant_fills_the_rest(fleet: Fleet) -> None:
    burst = [fleet.submit("burst", f"a{i}") for i in range(BURST)]
    fleet.until(f"{LIMIT} of the burst claimed", lambda: len(fleet.claimed(burst)) >= LIMIT)
    assert fleet.slots.usage("burst").running == LIMIT == RUNS - fleet_reserve(RUNS)  # all but the reserve
    assert RUNS - fleet.fleet_running() == fleet_reserve(RUNS)  # kept free

    second = [fleet.submit("second", f"b{i}") for i in range(3)]
    fleet.until("the second tenant's first task claimed", lambda: fleet.claimed(second))
    running = [t for t in fleet.tasks(burst + second) if t.status is TaskStatus.RUNNING]
    assert len(running) == RUNS and fleet.fleet_running() == RUNS  # the whole fleet runs: nothing idles
    assert [t.task_id for t in fleet.claimed(second)] == second[:1]

    # A freed slot goes to the tenant furthest below its share (the second: 1 running against 4),
    # ahead of the burst's own waiters.
    first_ended = fleet.claimed(burst)[0].task_id
    fleet.open(f"a{burst.index(first_ended)}")
    fleet.until("a freed slot taken", lambda: len(fleet.claimed(burst + second)) > RUNS)
    assert [t.task_id for t in fleet.claimed(second)] == second[:2]
    assert len(fleet.claimed(burst)) == LIMIT

    for i in range(BURST):
        fleet.open(f"a{i}")
    for i in range(3):
        fleet.open(f"b{i}")
    fleet.until("every task ended", lambda: all(t.status.terminal for t in fleet.tasks(burst + second)))
    assert {t.status for t in fleet.tasks(burst + second)} == {TaskStatus.SUCCEEDED}
    assert fleet.slots.usage("burst").running == fleet.slots.usage("second").running == 0


CDK_CONTEXT = json.loads((Path(__file__).resolve().parent.parent / "cdk.json").read_text())["context"]


def test_the_default_limit_keeps_a_reserve_of_five_percent_from_any_one_tenant_under_every_capacity() -> None:
    for capacity in range(1, 100_001):
        limit, reserve = fair_limit(capacity), fleet_reserve(capacity)
        assert limit + reserve == capacity and limit >= 1
        if capacity >= 2:  # a fleet of one has nothing to keep
            assert reserve >= 1 and capacity * 5 / 100 <= reserve < capacity * 5 / 100 + 1


@pytest.mark.parametrize("env_name", sorted(CDK_CONTEXT["environments"]))
def test_every_cdk_environment_ships_a_fleet_capacity_of_what_it_runs_and_a_tenant_limit_below_it(
    env_name: str,
) -> None:
    cfg = resolve(CDK_CONTEXT["environments"], CDK_CONTEXT.get("environment_defaults"), env_name)
    budget = cfg.budget_defaults
    assert budget.fleet_capacity is not None and budget.fleet_capacity <= (cfg.fleet_runs() or 0)
    assert budget.tenant_max_running == fair_limit(budget.fleet_capacity) < budget.fleet_capacity
    env = defaults_env(cfg)  # what the functions and the workers are handed
    assert env["AGENTQ_FLEET_CAPACITY"] == str(budget.fleet_capacity)
    assert env["AGENTQ_DEFAULT_TENANT_MAX_RUNNING"] == str(budget.tenant_max_running)


@pytest.mark.parametrize(
    ("stated", "capacity", "limit"),
    [
        ({}, 30, fair_limit(30)),  # both derived from what runs
        ({"fleet_capacity": 20}, 20, fair_limit(20)),  # the limit from the stated capacity
        ({"tenant_max_running": 30}, 30, 30),  # a stated limit stands, even the whole fleet
        ({"fleet_capacity": 12, "tenant_max_running": 3}, 12, 3),
    ],
)
def test_what_an_environment_states_stands_and_what_it_leaves_out_is_derived(
    stated: dict[str, int], capacity: int, limit: int
) -> None:
    envs = {"x": {"prefix": "agentq-x", "removal_policy": "destroy", "executor": {"reserved_concurrency": 30},
                  "budget_defaults": stated}}  # fmt: skip
    budget = resolve(envs, None, "x").budget_defaults
    assert (budget.fleet_capacity, budget.tenant_max_running) == (capacity, limit)
    local = Defaults.from_env({"AGENTQ_" + k: str(v) for k, v in {
        "FLEET_CAPACITY": stated.get("fleet_capacity"), "DEFAULT_TENANT_MAX_RUNNING": stated.get("tenant_max_running"),
    }.items() if v is not None}).fair_for(30)  # fmt: skip
    assert (local.fleet_capacity, local.tenant_max_running) == (capacity, limit)  # agentq dev: the same rule


def test_an_environment_without_reserved_concurrency_has_no_known_capacity_and_gets_no_derived_limit() -> None:
    envs = {"x": {"prefix": "agentq-x", "removal_policy": "destroy"}}
    budget = resolve(envs, None, "x").budget_defaults
    assert (budget.fleet_capacity, budget.tenant_max_running) == (None, None)
