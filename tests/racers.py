"""Start many racer processes at once: each prints ``ready`` when it is set (store built, lease
held), waits for a starting line sent to all together, races, and prints one JSON report as its
last line. Used by the budget, money and rate-bucket races (tests/budget_racer.py,
tests/bucket_racer.py): real processes against moto server, as DynamoDB would see them."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

from agentq.runtime import Settings


def race(settings: Settings, module: str, argvs: list[list[str]], **env: str) -> list[dict[str, Any]]:
    """One ``python -m module *argv`` per argv; returns each one's report, in order."""
    from tests.conftest import child_env

    procs = [
        subprocess.Popen(
            [sys.executable, "-m", module, *argv],
            env=child_env(settings, **env),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for argv in argvs
    ]
    for proc in procs:  # every process is up and set before the gun
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready", proc.communicate()[1][-2000:]
    for proc in procs:
        assert proc.stdin is not None
        proc.stdin.write("go\n")
        proc.stdin.flush()
    reports = []
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err[-2000:]
        reports.append(json.loads(out.strip().splitlines()[-1]))
    return reports
