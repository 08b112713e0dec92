"""A worker-like process racing its peers for the fleet's slots (test_fair_share_race; the
racer harness of tests/racers.py): it admits its tasks (``FairShare.admit``, the dispatcher's
gate), ends and releases half of those it admitted (each release wakes a waiter, as a
finished run does), then admits its parked tasks again, as their woken messages would. The
report names the tasks it saw admitted and not ended, and the tasks its releases woke: a peer's
release may hand one of this racer's parked tasks a slot after this racer has reported."""

from __future__ import annotations

import json
import sys

from agentq.core.models import TaskStatus
from agentq.queueing.fairness import FairShare
from agentq.runtime import Settings, build_store


def main(capacity: int, fleet: str, task_ids: list[str]) -> None:
    settings = Settings.from_env()
    store = build_store(settings)
    woken = _Woken()  # the wakes' messages, counted (the racers' table has no tier queues)
    fair = FairShare(store, woken, fleet_capacity=capacity, fleet_name=fleet)  # type: ignore[arg-type]
    tasks = [store.tasks.get(t) for t in task_ids]
    print("ready", flush=True)  # then wait for the starting gun: a line on stdin, sent to all at once
    sys.stdin.readline()
    admitted = [t for t in tasks if _runs(fair.admit(t, "normal"))]
    ended = admitted[::2]
    for task in ended:
        store.tasks.claim(task.task_id, "racer", 30)
        store.tasks.transition(task.task_id, TaskStatus.SUCCEEDED)
        fair.release(task.task_id)
    again = [t for t in tasks if t not in admitted]
    readmitted = [t for t in again if _runs(fair.admit(store.tasks.get(t.task_id), "normal"))]
    holding = [t.task_id for t in admitted + readmitted if t not in ended]
    print(json.dumps({"holding": holding, "ended": len(ended), "woken": woken.sent}))


class _Woken:
    def __init__(self) -> None:
        self.sent: list[str] = []

    def send(self, task_id: str, tier: str, **_: object) -> None:
        self.sent.append(task_id)


def _runs(gate: object) -> bool:
    return getattr(gate, "waits", None) is None and getattr(gate, "keep", None) is None


if __name__ == "__main__":
    main(int(sys.argv[1]), sys.argv[2], sys.argv[3:])
