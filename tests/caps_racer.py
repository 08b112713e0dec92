"""A process that races for a scope's cap windows (``storage.scope_caps``): it holds ``amount``
tokens and ``micros`` on the tenant's caps of one user, agent and key ``attempts`` times, then
settles every grant below its hold, as a call's answer would (tests/test_scope_caps_race.py).
Every hold is taken at the clock time ``at`` (the race's start): the racers contend for one
hour's and one day's window, even when the race runs across the end of an hour or a day (a
fresh window then, which would rightly grant more than the cap's share of one)."""

from __future__ import annotations

import contextlib
import json
import sys

from agentq.core.caps import CapReached, SoftCapReached
from agentq.runtime import Settings, build_store


def main(tenant: str, amount: int, attempts: int, micros: int, at: float) -> None:
    store = build_store(Settings.from_env())
    caps = store.caps.applicable(tenant, {"user": "u", "agent": "a", "key": "k"})
    assert len(caps) == 3
    print("ready", flush=True)  # then wait for the starting gun: a line on stdin, sent to all at once
    sys.stdin.readline()
    holds = []
    for _ in range(attempts):
        with contextlib.suppress(CapReached, SoftCapReached):
            holds.append(store.caps.hold(caps, amount, micros=micros, now=at))
    used = used_micros = 0
    for hold in holds:  # the provider reported a little less than each hold
        store.caps.settle(hold, amount - 7, micros - 7)
        used, used_micros = used + amount - 7, used_micros + micros - 7
    print(json.dumps({"granted": len(holds), "used": used, "used_micros": used_micros}))


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5]))
