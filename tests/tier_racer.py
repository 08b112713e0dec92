"""A worker-like process racing its peers for two tenants' slots of one tier
(test_fair_share_tier_race; the racer harness of tests/racers.py): it admits its tasks
(``FairShare.admit``, the dispatcher's gate, with a tier limit and no tenant limit). With
``churn`` it then ends and releases half of those it admitted (each release wakes a waiter, as a
finished run does) and admits its refused tasks again, as their woken messages would. The report
names the tasks it saw admitted and not ended, and counts the parked and the kept."""

from __future__ import annotations

import json
import sys

from agentq.core.models import TaskStatus
from agentq.queueing.fairness import FairShare
from agentq.runtime import Settings, build_store


def main(limit: int, churn: bool, task_ids: list[str]) -> None:
    settings = Settings.from_env()
    store = build_store(settings)
    woken = _Woken()  # the wakes' messages, counted (the racers' table has no tier queues)
    fair = FairShare(store, woken, tier_limits={"normal": limit})  # type: ignore[arg-type]
    tasks = [store.tasks.get(t) for t in task_ids]
    print("ready", flush=True)  # then wait for the starting gun: a line on stdin, sent to all at once
    sys.stdin.readline()
    gates = [(t, fair.admit(t, "normal")) for t in tasks]
    admitted = [t for t, gate in gates if gate.waits is None and gate.keep is None]
    parked = sum(1 for _, gate in gates if gate.waits is not None)
    ended = admitted[::2] if churn else []
    for task in ended:
        store.tasks.claim(task.task_id, "racer", 30)
        store.tasks.transition(task.task_id, TaskStatus.SUCCEEDED)
        fair.release(task.task_id)
    again = [t for t in tasks if t not in admitted] if churn else []
    readmitted = [t for t in again if _runs(fair.admit(store.tasks.get(t.task_id), "normal"))]
    holding = [t.task_id for t in admitted + readmitted if t not in ended]
    kept = len(tasks) - len(admitted) - parked
    print(json.dumps({"holding": holding, "admitted": len(admitted), "parked": parked, "kept": kept,
                      "ended": len(ended), "woken": woken.sent}))  # fmt: skip


class _Woken:
    def __init__(self) -> None:
        self.sent: list[str] = []

    def send(self, task_id: str, tier: str, **_: object) -> None:
        self.sent.append(task_id)

    def pool_for(self, submission: object) -> None:
        return None  # every task runs on its tier's runners


def _runs(gate: object) -> bool:
    return getattr(gate, "waits", None) is None and getattr(gate, "keep", None) is None


if __name__ == "__main__":
    main(int(sys.argv[1]), sys.argv[2] == "churn", sys.argv[3:])
