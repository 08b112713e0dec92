"""What the running slots cost in AWS calls: per admission and per release, with and without a fleet.

    python bench/slot_calls.py                            # every scenario, 1/10/100/300 waiting tenants
    python bench/slot_calls.py --waiting-tenants 1,10 --json

Each scenario runs the dispatcher's gate (``queueing.fairness.FairShare``: ``admit`` as a
message's delivery or a submission does, ``release`` as a task's end does) against DynamoDB on
moto server and real SQS queues, and counts every DynamoDB and SQS call it makes (botocore's
``before-call`` events on the store's and the queues' clients): the figures the README and
docs/ARCHITECTURE.md quote (invariant 12). A count, not a timing: it does not depend on the
machine.

Scenarios:
- a limited tenant (limit 4) and an unlimited one, without a fleet and with one (capacity 8),
  nobody waiting: one admission, one release;
- a refused admission (the fleet full): it parks;
- with a tier limit (``--tier``'s scenarios, issue 44's per-tier reserve: ``AGENTQ_TIER_CAPACITY``,
  a tier of 2, a tenant's limit in it 1): the shipped configuration's admission and release (a
  limited tenant, a fleet, a tier), an unlimited tenant's without a fleet, and an admission its
  tier refuses (it parks);
- a release that frees a fleet slot while ``N`` tenants wait on the fleet's lists (one task
  each): the wake (by weight), its hand-off and its message. The wake reads every waiting
  tenant's slot item (a BatchGetItem per 100), so it grows with ``N``.
"""

from __future__ import annotations

import argparse
import collections
import os
import sys
import uuid
from typing import Any

from _benchlib import JsonOut, log, machine, table
from _plot import Panel, add_plot_args, plot_from_args
from agentq.core.models import Task, TaskStatus, TaskSubmission
from agentq.queueing.fairness import FairShare
from agentq.resources import QueueSettings, provision
from agentq.runtime import Settings, build_queues, build_store, session
from agentq.storage.container import Storage
from agentq_dev.moto_server import LOCAL_CREDENTIALS, MotoServer

CAPACITY = 8
LIMIT = 4
TIER_LIMITS = {"normal": 1}  # a tier of 2 (dev's tier_max_concurrency): fair_limit(2)
SUBMISSION = TaskSubmission.model_validate(
    {"goal": "count the calls", "provider": "scripted", "script": {"turns": [{"text": "x"}]}}
)


class Calls:
    """Every AWS call of the clients it is attached to, by ``service:Operation``."""

    def __init__(self) -> None:
        self.counts: collections.Counter[str] = collections.Counter()
        self.transact_items = 0  # the items of the TransactWriteItems calls (2 WCU each, up to 1 KB)

    def attach(self, client: Any) -> None:
        client.meta.events.register("before-call.*.*", self._count, unique_id=f"slot-calls-{id(client)}")
        client.meta.events.register("before-parameter-build.dynamodb.TransactWriteItems", self._items,
                                    unique_id=f"slot-items-{id(client)}")  # fmt: skip

    def _count(self, model: Any, **_: Any) -> None:
        self.counts[f"{model.service_model.service_id.hyphenize()}:{model.name}"] += 1

    def _items(self, params: dict[str, Any], **_: Any) -> None:
        self.transact_items += len(params.get("TransactItems", []))

    def take(self) -> dict[str, int]:
        taken = dict(sorted(self.counts.items()))
        if self.transact_items:
            taken["items:transacted"] = self.transact_items
        self.counts.clear()
        self.transact_items = 0
        return taken


class Bench:
    def __init__(self, settings: Settings) -> None:
        self.store: Storage = build_store(settings)
        self.queues = build_queues(settings)
        self.queues.url("normal")  # its URL looked up once, before anything is counted
        self.calls = Calls()
        self.calls.attach(self.store.table.client)  # type: ignore[attr-defined]
        self.calls.attach(self.queues.sqs)

    def gate(self, fleet: bool, tier: bool = False) -> FairShare:
        name = f"FLEET-{uuid.uuid4().hex[:8]}"  # a fleet of the scenario's own
        return FairShare(self.store, self.queues, fleet_capacity=CAPACITY if fleet else None, fleet_name=name,
                         tier_limits=TIER_LIMITS if tier else None)  # fmt: skip

    def task(self, tenant: str) -> Task:
        return self.store.tasks.create(SUBMISSION, tenant=tenant)

    def end(self, task: Task) -> None:
        assert self.store.tasks.claim(task.task_id, "bench", 30) is not None
        self.store.tasks.transition(task.task_id, TaskStatus.SUCCEEDED)

    def admitted(self, fair: FairShare, tenant: str) -> Task:
        task = self.task(tenant)
        assert fair.admit(task, "normal").waits is None
        return task


def measure_nobody_waiting(bench: Bench, *, fleet: bool, limited: bool, tier: bool = False) -> dict[str, Any]:
    fair = bench.gate(fleet, tier)
    tenant = f"t-{uuid.uuid4().hex[:8]}"
    if limited:
        bench.store.slots.set_limit(tenant, LIMIT)
    task = bench.task(tenant)
    bench.calls.take()
    gate = fair.admit(task, "normal")
    admit = bench.calls.take()
    assert gate.waits is None
    bench.end(task)
    bench.calls.take()
    fair.release(task.task_id)
    release = bench.calls.take()
    name = (
        f"{'limited' if limited else 'unlimited'} tenant, {'fleet' if fleet else 'no fleet'}{', tier' if tier else ''}"
    )
    label = f"{'limited' if limited else 'unlimited'}{' + fleet' if fleet else ''}{' + tier' if tier else ''}"
    return {"scenario": name, "label": label, "admit": admit, "release": release}


def measure_parked(bench: Bench) -> dict[str, Any]:
    fair = bench.gate(True)
    for _ in range(CAPACITY):
        bench.admitted(fair, "holder")
    task = bench.task(f"t-{uuid.uuid4().hex[:8]}")
    bench.calls.take()
    gate = fair.admit(task, "normal")
    parked = bench.calls.take()
    assert gate.waits is not None and "fleet is full" in gate.waits
    return {"scenario": "admission refused by the full fleet (parks)", "label": "parked", "admit": parked,
            "release": {}}  # fmt: skip


def measure_tier_parked(bench: Bench) -> dict[str, Any]:
    fair = bench.gate(True, tier=True)
    tenant = f"t-{uuid.uuid4().hex[:8]}"
    bench.store.slots.set_limit(tenant, LIMIT)
    bench.admitted(fair, tenant)  # its one slot of the tier
    task = bench.task(tenant)
    bench.calls.take()
    gate = fair.admit(task, "normal")
    parked = bench.calls.take()
    assert gate.waits is not None and "tier" in gate.waits, gate
    return {"scenario": "admission refused by its tier (parks)", "label": "tier parked", "admit": parked,
            "release": {}}  # fmt: skip


def measure_wake(bench: Bench, waiting_tenants: int) -> dict[str, Any]:
    fair = bench.gate(True)
    running = [bench.admitted(fair, "holder") for _ in range(CAPACITY)]
    for i in range(waiting_tenants):
        waits = fair.admit(bench.task(f"w{i}-{uuid.uuid4().hex[:6]}"), "normal").waits
        assert waits is not None and "fleet is full" in waits
    bench.end(running[0])
    bench.calls.take()
    fair.release(running[0].task_id)
    release = bench.calls.take()
    assert release.get("sqs:SendMessage") == 1, release  # one waiter woken, handed off, sent
    return {"scenario": f"release waking the fleet, {waiting_tenants} tenant(s) waiting", "admit": {},
            "release": release, "waiting_tenants": waiting_tenants}  # fmt: skip


def total(calls: dict[str, int]) -> int:
    return sum(n for op, n in calls.items() if not op.startswith("items:"))


def short(calls: dict[str, int]) -> str:
    return ", ".join(f"{op.split(':')[1]} {n}" for op, n in calls.items() if not op.startswith("items:")) or "-"


def transacted(calls: dict[str, int]) -> str:
    """The items the call's transactions wrote (2 WCU each: slot items are well under 1 KB; META's
    size, the same with and without a tier, sets its own)."""
    return str(calls.get("items:transacted", "-"))


def render(result: dict[str, Any]) -> str:
    m = result["machine"]
    cells = [[r["scenario"], total(r["admit"]) or "-", short(r["admit"]), transacted(r["admit"]),
              total(r["release"]) or "-", short(r["release"]), transacted(r["release"])]
             for r in result["rows"]]  # fmt: skip
    return "\n".join(
        [
            f"agentq running slots: AWS calls per admission and per release (fleet capacity {CAPACITY}, "
            f"tenant limit {LIMIT}, a tier's limit {TIER_LIMITS['normal']}); DynamoDB and SQS on moto server",
            f"code: git {m['git_head']} + {m['core_uncommitted_files']} uncommitted file(s) under layers/",
            "",
            table(["scenario", "admit calls", "admit", "items", "release calls", "release", "items"], cells),
            "(calls counted at the AWS clients; a count, not a timing)",
        ]
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--waiting-tenants", default="1,10,100,300", help="waiting tenants per wake scenario")
    parser.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    add_plot_args(parser, "slot_calls")
    args = parser.parse_args()
    waiting = [int(n) for n in args.waiting_tenants.split(",")]
    for key, value in LOCAL_CREDENTIALS.items():
        os.environ.setdefault(key, value)
    with JsonOut(args.json) as out, MotoServer() as server:
        settings = Settings.for_prefix(f"bslots{uuid.uuid4().hex[:8]}", server.endpoint_url)
        provision(session(settings), settings.names, endpoint_url=settings.endpoint_url, queues=QueueSettings())
        bench = Bench(settings)
        rows = [
            measure_nobody_waiting(bench, fleet=fleet, limited=limited)
            for fleet in (False, True)
            for limited in (True, False)
        ]
        rows.append(measure_parked(bench))
        rows += [measure_nobody_waiting(bench, fleet=True, limited=True, tier=True),
                 measure_nobody_waiting(bench, fleet=False, limited=False, tier=True)]  # fmt: skip
        rows.append(measure_tier_parked(bench))
        for n in waiting:
            log(f"[wake with {n} waiting tenant(s)] ...")
            rows.append(measure_wake(bench, n))
        result = {"machine": machine(), "capacity": CAPACITY, "limit": LIMIT, "rows": rows}
        wakes = [r for r in rows if "waiting_tenants" in r]
        counted = [r for r in rows if "waiting_tenants" not in r]
        by_size = Panel(
            "line",
            "a release's fleet wake by waiting tenants",
            "calls",
            [r["waiting_tenants"] for r in wakes],
            {"release calls": [float(total(r["release"])) for r in wakes]},
            xlabel="waiting tenants",
            logx=True,
        )
        per_call = Panel(
            "bar",
            "calls per admission and release",
            "calls",
            [r["label"] for r in counted],
            {
                "admit": [float(total(r["admit"])) for r in counted],
                "release": [float(total(r["release"])) for r in counted],
            },
        )
        plot_from_args(args, "agentq running slots: AWS calls", [per_call, by_size])
        if args.json:
            out.emit(result)
        else:
            print(render(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
