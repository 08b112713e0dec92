"""Fair by default per tier (issue 44; storage/tier_slots.py): where a tier's capacity is known
(AWS: each tier's event source maximum concurrency, ``executor.tier_max_concurrency``), a
tenant's running tasks of that tier stay under ``fair_limit`` of it, so one tenant's burst in a
tier never holds all of that tier's invocations, and a quiet tenant's task of the same tier is
claimed while the burst's turns are still held; and the tier stays work-conserving: a lone
tenant runs all of it but the reserve, a second tenant takes the reserve.

Real worker processes on the local stack (moto server), with cdk.json's dev numbers: a tier's
runners run 2 at once (here one worker of concurrency 2, every task in ``normal``, as dev's
``normal`` event source), a tenant may run 5 (dev's derived ``tenant_max_running``). The burst's
tasks call ``hold`` (tests/gate_tools.py) and run until the test opens their gate: nothing here is
timed, and a deadline bounds each wait for an event (without the tier's reserve the quiet task's
claim never comes: both runners hold the burst's turns, and its message waits behind the
burst's). Also: every cdk.json environment's tier capacities and what the functions are handed."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from agentq.control.defaults import Defaults, fair_limit
from agentq.core.models import TaskStatus
from infra.settings import resolve
from infra.task_runners import defaults_env

from tests.helpers import tier_running
from tests.test_fair_by_default import Fleet, gated_fleet

TIER_RUNS = 2  # dev's executor.tier_max_concurrency, each tier
TIER_LIMIT = fair_limit(TIER_RUNS)  # 1: the tier's reserve is the other slot
TENANT_LIMIT = 5  # dev's tenant_max_running (fair_limit of its fleet of 6): above the tier's capacity
BURST = 6


@pytest.fixture
def tier(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Fleet]:
    # The stack's defaults (its submissions' and its workers') are read from the environment, as
    # the functions read what cdk.json hands them.
    monkeypatch.setenv("AGENTQ_TIER_CAPACITY", ",".join(f"{t}={TIER_RUNS}" for t in ("high", "normal", "low")))
    monkeypatch.setenv("AGENTQ_DEFAULT_TENANT_MAX_RUNNING", str(TENANT_LIMIT))
    monkeypatch.setenv("AGENTQ_FLEET_CAPACITY", "6")
    with gated_fleet(tmp_path, "tier", 1, TIER_RUNS) as fleet:
        yield fleet


def test_a_quiet_tenants_task_is_claimed_while_another_tenants_burst_still_holds_its_turns_in_the_same_tier(
    tier: Fleet,
) -> None:
    assert tier.defaults.tier_limits() == {"high": TIER_LIMIT, "normal": TIER_LIMIT, "low": TIER_LIMIT}
    burst = [tier.submit("burst", f"a{i}") for i in range(BURST)]
    tier.until(f"{TIER_LIMIT} of the burst claimed", lambda: len(tier.claimed(burst)) >= TIER_LIMIT)

    quiet = tier.submit("quiet", None)
    # No task of the burst ends before its gate opens, and none is opened before the quiet task
    # is claimed. Without the tier's reserve the burst, under its tenant limit of 5, holds both
    # of the tier's runners, and this claim never comes.
    tier.until("the quiet task claimed", lambda: tier.store.tasks.get(quiet).first_claimed_at)
    assert [t for t in tier.tasks(burst) if t.finished_at is not None] == []
    assert len(tier.claimed(burst)) == TIER_LIMIT == tier_running(tier.store, "burst")
    usage = tier.slots.usage("burst")  # under its tenant limit, held by its tier's: the rest waits parked
    assert usage.running == TIER_LIMIT < TENANT_LIMIT and usage.waiting == BURST - TIER_LIMIT
    tier.until("the quiet task done", lambda: tier.store.tasks.get(quiet).status.terminal)
    assert tier.store.tasks.get(quiet).status is TaskStatus.SUCCEEDED
    assert tier_running(tier.store, "quiet") == 0  # its ending gave its tier slot back


def test_a_lone_tenant_runs_its_tier_but_the_reserve_a_second_tenant_takes_it_and_a_release_wakes_its_own_tenant(
    tier: Fleet,
) -> None:
    burst = [tier.submit("burst", f"a{i}") for i in range(BURST)]
    tier.until(f"{TIER_LIMIT} of the burst claimed", lambda: len(tier.claimed(burst)) >= TIER_LIMIT)
    assert tier.slots.usage("burst").waiting == BURST - TIER_LIMIT  # the rest parked, not in the queue

    second = [tier.submit("second", f"b{i}") for i in range(2)]
    tier.until("the second tenant's first task claimed", lambda: tier.claimed(second))
    running = [t for t in tier.tasks(burst + second) if t.status is TaskStatus.RUNNING]
    assert len(running) == TIER_RUNS  # the whole tier runs: the reserve is not idle
    assert [t.task_id for t in tier.claimed(second)] == second[:1]  # its second waits for its own tier slot
    assert (tier_running(tier.store, "burst"), tier_running(tier.store, "second")) == (TIER_LIMIT, TIER_LIMIT)

    # The burst's turn ends: its tier slot goes to its own next waiter (the second tenant is at
    # its own tier limit), so the tier runs full again.
    first = tier.claimed(burst)[0].task_id
    tier.open(f"a{burst.index(first)}")
    tier.until("the burst's next task claimed", lambda: len(tier.claimed(burst)) == TIER_LIMIT + 1)
    assert len(tier.claimed(second)) == 1

    for i in range(BURST):
        tier.open(f"a{i}")
    for i in range(2):
        tier.open(f"b{i}")
    tier.until("every task ended", lambda: all(t.status.terminal for t in tier.tasks(burst + second)))
    assert {t.status for t in tier.tasks(burst + second)} == {TaskStatus.SUCCEEDED}
    assert tier_running(tier.store, "burst") == tier_running(tier.store, "second") == 0


# Each tier's limit per tenant as shipped (cdk.json's tier_max_concurrency less 5 %, rounded up, at least 1).
SHIPPED = {
    "dev": {"high": 1, "normal": 1, "low": 1},  # of 2 each
    "staging": {"high": 11, "normal": 9, "low": 7},  # of 12, 10, 8
    "prod": {"high": 95, "normal": 57, "low": 38},  # of 100, 60, 40
}
CDK_CONTEXT = json.loads((Path(__file__).resolve().parent.parent / "cdk.json").read_text())["context"]


@pytest.mark.parametrize("env_name", sorted(CDK_CONTEXT["environments"]))
def test_every_cdk_environment_hands_its_functions_each_tiers_capacity_and_a_tenant_runs_all_of_it_but_its_reserve(
    env_name: str,
) -> None:
    cfg = resolve(CDK_CONTEXT["environments"], CDK_CONTEXT.get("environment_defaults"), env_name)
    capacity = cfg.executor.tier_max_concurrency
    assert not cfg.worker.enabled and cfg.budget_defaults.tier_capacity == capacity
    limits = Defaults.from_env(defaults_env(cfg)).tier_limits()  # what the API, the executor and the sweeper read
    assert limits == {tier: fair_limit(n) for tier, n in capacity.items()}
    assert all(1 <= limits[tier] < n for tier, n in capacity.items())  # a reserve in every tier, never all of it
    assert limits == SHIPPED[env_name]


@pytest.mark.parametrize(
    ("stated", "worker", "expected"),
    [
        (None, False, {"high": 3, "normal": 4, "low": 2}),  # derived: the event sources' maximum concurrency
        ({"normal": 8}, False, {"normal": 8}),  # stated: stands
        ({}, False, {}),  # stated empty: no tier slot (a single-tenant deployment that wants whole tiers)
        (None, True, None),  # the Fargate workers take every tier's messages: no tier has a capacity of its own
    ],
)
def test_a_stated_tier_capacity_stands_a_missing_one_is_the_event_sources_unless_the_workers_are_on(
    stated: dict[str, int] | None, worker: bool, expected: dict[str, int] | None
) -> None:
    env = {"prefix": "agentq-x", "removal_policy": "destroy", "worker": {"enabled": worker},
           "executor": {"reserved_concurrency": 30, "tier_max_concurrency": {"high": 3, "normal": 4, "low": 2}}}  # fmt: skip
    if stated is not None:
        env["budget_defaults"] = {"tier_capacity": stated}
    assert resolve({"x": env}, None, "x").budget_defaults.tier_capacity == expected


def test_a_tier_capacity_naming_an_unknown_tier_or_below_one_is_refused_naming_the_field() -> None:
    for bad in ({"urgent": 2}, {"normal": 0}):
        env = {"prefix": "agentq-x", "removal_policy": "destroy", "budget_defaults": {"tier_capacity": bad}}
        with pytest.raises(ValueError, match=r"budget_defaults\.tier_capacity"):
            resolve({"x": env}, None, "x")
    with pytest.raises(Exception, match="AGENTQ_TIER_CAPACITY"):
        Defaults.from_env({"AGENTQ_TIER_CAPACITY": "normal=0"})
