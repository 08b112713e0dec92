"""The chaos suite's small seeded run (``make chaos`` is the large one): 12 root tasks with
their sub-agents through the HTTP API (four of them conversations that people message and
interrupt while the workers die), 3 worker processes SIGKILLed and SIGSTOPped every
1-3 s for 20 s, model servers faulting one request in ten, the tasks spread over the
``anthropic``, ``openai`` and ``bedrock-converse`` providers (a mixed fleet, each on its own
wire). Every invariant ``bench/chaos.py`` checks must hold; its table is printed when one does
not, with the items of any task that did not end.

The drain waits for every task to end, giving up only when none progressed for 150 s: how long
the tasks take is the machine's load (a drain of 33 s at load 16, up to 202 s at load 45-50),
so the bounds below are for a hang, not a speed."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.helpers import run_python

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.timeout(960)
def test_the_seeded_chaos_run_keeps_every_invariant(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    env["TMPDIR"] = str(tmp_path)  # where the run keeps its workers' logs: pytest's to clean up, not /tmp
    args = ["--tasks", "12", "--workers", "3", "--chaos-seconds", "20", "--seed", "6", "--drain-seconds", "150"]
    args.append("--no-plot")  # the test checks the invariants; the picture is the bench's
    # (the exit code is asserted below, with the invariants that explain it)
    proc = run_python([str(ROOT / "bench" / "chaos.py"), *args, "--json"], env, timeout=900, cwd=tmp_path)
    result = json.loads(proc.stdout)
    broken = {name: where for name, (ok, where) in result["invariants"].items() if not ok}
    assert broken == {} and proc.returncode == 0, (broken, result["figures"], proc.stderr[-3000:])
    figures = result["figures"]
    assert figures["kills"] + figures["stops"] >= 5 and sum(figures["model faults"].values()) >= 1
    assert set(figures["plans by kind"]) == {"tools", "budget", "fanout", "child", "talk"}  # every shape was run
    assert set(figures["plans by provider"]) == {"anthropic", "openai", "bedrock-converse"}  # on every wire
    assert figures["messages delivered"] == figures["messages sent (accepted)"] >= 5
    assert figures["interrupts recorded"] >= 1
