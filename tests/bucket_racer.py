"""A process that races for a fleet rate bucket (run by test_outage through tests/racers.py):
``attempts`` admissions of ``amount`` output tokens each, all at the same instant ``now`` (so the
bucket refills nothing between them, and every racer's refill time is the same)."""

from __future__ import annotations

import json
import sys

from agentq.runtime import Settings, build_store


def main(key: str, amount: int, attempts: int, now: float) -> None:
    store = build_store(Settings.from_env())  # AGENTQ_RATE_LIMITS comes from the environment
    print("ready", flush=True)
    sys.stdin.readline()
    granted = sum(store.flow.admit(key, 0, amount, now=now).ok for _ in range(attempts))
    print(json.dumps({"granted": granted}))


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]))
