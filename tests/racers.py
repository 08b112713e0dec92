"""Start many racer processes at once: each prints ``ready`` when it is set (store built, lease
held), waits for a starting line sent to all together, races, and prints one JSON report as its
last line. The racers are forked from one pool process (tests/racer_pool.py). Used by the budget,
money, rate-bucket and fair-share races (tests/*_racer.py): real processes against moto server,
as DynamoDB would see them."""

from __future__ import annotations

import json
import subprocess
from typing import Any

from agentq.runtime import Settings


def race(settings: Settings, module: str, argvs: list[list[str]], **env: str) -> list[dict[str, Any]]:
    """One racer process per argv (``python -m module *argv``, forked by tests/racer_pool.py
    from one process that has imported ``module``); returns each one's report, in order."""
    from tests.conftest import child_env
    from tests.helpers import python_process

    pool = python_process(  # forked warm too: the pool's own start and imports were ~0.6 CPU-s a race
        ["-m", "tests.racer_pool", module, json.dumps(argvs)],
        child_env(settings, **env),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert pool.stdout is not None and pool.stdin is not None
    ready = pool.stdout.readline().strip()  # every racer is up and set before the gun
    if ready == "ready":
        pool.stdin.write("go\n")
        pool.stdin.flush()
    out, err = pool.communicate(timeout=120)
    assert ready == "ready" and pool.returncode == 0, f"{ready} {out[-1000:]} {err[-2000:]}"
    reports: list[dict[str, Any]] = json.loads(out.strip().splitlines()[-1])["reports"]
    assert len(reports) == len(argvs)
    return reports
