"""A worker-like process that admits its tasks to their tenant's running slots at once with its
peers (test_fair_share_race; the racer harness of tests/racers.py): each task is admitted
(``FairShare.admit``, the dispatcher's gate), parked, or kept (neither: its message would come
back); the report says how many of each."""

from __future__ import annotations

import json
import sys

from agentq.queueing.fairness import FairShare
from agentq.runtime import Settings, build_queues, build_store


def main(limit: int, task_ids: list[str]) -> None:
    settings = Settings.from_env()
    store = build_store(settings)
    fair = FairShare(store, build_queues(settings), default_limit=limit)
    tasks = [store.tasks.get(t) for t in task_ids]
    print("ready", flush=True)  # then wait for the starting gun: a line on stdin, sent to all at once
    sys.stdin.readline()
    gates = [(t.task_id, fair.admit(t, "normal")) for t in tasks]
    admitted = [t for t, gate in gates if gate.waits is None and gate.keep is None]
    parked = sum(1 for _, gate in gates if gate.waits is not None)
    print(json.dumps({"admitted": admitted, "parked": parked, "kept": len(tasks) - len(admitted) - parked}))


if __name__ == "__main__":
    main(int(sys.argv[1]), sys.argv[2:])
