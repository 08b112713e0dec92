"""`agentq status` of a task that succeeded after its first worker was killed mid-call: the
killed worker's hold stays reserved until its call can no longer complete (invariant 4), and
status says so, with until when, instead of an unexplained "reserved"."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import uuid
from collections.abc import Callable

from agentq.cli.views import when
from agentq.core.reservation import Reservation

from tests import test_cli
from tests.api_support import ROOT, ApiStack
from tests.helpers import call, run_agentq, scripted
from tests.test_cli import Ran

cli = test_cli.cli  # the fixture: `agentq ...` in this process, against the local API


def held_usd(held: Reservation) -> str:
    return f"{held.micros / 1_000_000:.6f}"


def _run_task(api_stack: ApiStack, task_id: str, **env: str) -> subprocess.CompletedProcess[str]:
    return run_agentq(["run-task", task_id, "--lease", "1", "--wait", "20"], cwd=ROOT, env=api_stack.stack.env(**env),
                      timeout=120)  # fmt: skip


def test_a_lost_workers_hold_on_a_succeeded_task_is_said_as_such_with_until_when(
    api_stack: ApiStack, cli: Callable[..., Ran]
) -> None:
    store = api_stack.stack.store()
    task_id = uuid.uuid4().hex
    turns = [{"text": "noting", "tool_calls": [call("note_write", key="k", value="v")]}, {"text": "done"}]
    # Created, not enqueued: no worker of the stack takes it; the two below run it in turn.
    store.tasks.create(scripted(turns, tools=["note_write"]), tenant="team-a", task_id=task_id)
    # Killed with its hold taken and its call not made; the hold's deadline is 10 minutes on (the
    # longest a call may take), so it is still live however slowly the resume below runs.
    killed = _run_task(api_stack, task_id, AGENTQ_CRASH_AT="after_reserve:2", AGENTQ_MAX_CALL_SECONDS="600")
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    resumed = _run_task(api_stack, task_id)
    assert resumed.returncode == 0 and json.loads(resumed.stdout)["status"] == "succeeded", resumed.stderr[-2000:]

    task = store.tasks.get(task_id)
    (held,) = task.lapsed_holds.values()  # the killed worker's, set aside by the one that resumed
    tokens, until = held.amount, held.until or 0.0
    assert store.budgets.get(task_id).reserved == tokens > 0

    status = cli("status", task_id)
    assert status.returncode == 0, status.stderr
    line = next(s for s in status.stdout.splitlines() if s.startswith("tokens"))
    assert line.endswith(f", {tokens:,} held for a call a lost worker may still complete, until {when(until)}"), line
    assert not re.search(r"[\d,]+ reserved", line)  # nothing else is reserved: no bare, unexplained figure
    view = json.loads(cli("status", task_id, "--json").stdout)
    assert view["status"] == "succeeded"
    assert view["lapsed_holds"] == [{"tokens": tokens, "usd": held_usd(held), "step": 3, "epoch": 1, "until": until}]
