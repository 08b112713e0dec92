"""Issue 40: the ledger at each point of a call where its worker can die (ARCHITECTURE 4).

A real worker process (``agentq run-task``) makes one streamed Anthropic call against the fake
Messages API and is SIGKILLed before the call is sent, in the middle of its stream, after the
reply's last byte, or before the step commits; a successor finishes the task once the dead
worker's hold can no longer be charged. At every point: ``used <= cap``, nothing stays reserved,
``known`` never exceeds what the provider delivered to a reader, everything the provider can have
billed is counted in ``used``, and ``unknown`` is at most the dead call's hold. In the middle of a
stream, the input tokens its first event reported ride on the heartbeat (``seen``): they are
known, and only the rest of the hold is unknown.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
from typing import Any

import pytest

from agentq.core.models import TaskStatus, TaskSubmission
from agentq.runtime import Settings, build_engine
from agentq.storage import keys
from agentq.storage.container import Storage

from tests.conftest import child_env
from tests.fake_messages_api import FakeMessagesAPI, anthropic_env, message_reply, usage_dict
from tests.helpers import agentq_process, wait_for
from tests.model_server import Gate

CAP, MAX_OUT = 20_000, 600
FIRST = {"input_tokens": 20, "output_tokens": 300}  # the dead worker's call, as the provider bills it
SECOND = {"input_tokens": 22, "output_tokens": 40}  # the successor's (inputs under the hold's estimate)
MAX_CALL = "3"  # the hold's deadline: reservation + 2 s slack + this, then the successor spends it


def _worker(settings: Settings, task_id: str, env: dict[str, str], *, wait: float) -> subprocess.Popen[str]:
    return agentq_process(
        ["run-task", task_id, "--lease", "1", "--wait", str(wait)],
        env=child_env(settings, **env),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _seen_on_meta(store: Storage, task_id: str) -> dict[str, Any] | None:
    item = store.table.get(keys.meta_key(task_id)) or {}
    seen = item.get("seen")
    return dict(seen) if isinstance(seen, dict) else None


@pytest.mark.parametrize("point", ["before_send", "mid_stream", "after_last_byte", "before_commit"])
def test_a_worker_killed_at_any_point_of_a_call_leaves_a_ledger_that_counts_the_billed_and_knows_only_the_reported(
    settings: Settings, store: Storage, point: str
) -> None:
    gate = Gate(limit=60)
    first = message_reply([{"type": "text", "text": "first " * 40}], usage=usage_dict(**FIRST))
    if point == "mid_stream":
        first = dataclasses.replace(first, gate=gate)  # half its events, then it waits
    second = message_reply([{"type": "text", "text": "done"}], usage=usage_dict(**SECOND))
    crash = {"before_send": "after_reserve", "after_last_byte": "after_llm_call", "before_commit": "after_step_put"}
    sub = {"goal": "answer", "provider": "anthropic",
           "constraints": {"max_tokens": CAP, "max_output_tokens": MAX_OUT, "tools": []}}  # fmt: skip
    with FakeMessagesAPI(within_max_tokens=False) as fake:
        task = store.tasks.create(TaskSubmission.model_validate(sub), tenant="t")
        env = {
            **anthropic_env(fake), "AGENTQ_MAX_CALL_SECONDS": MAX_CALL,
            "AGENTQ_STREAM_ABOVE_TOKENS": "1",  # every call streamed
        }  # fmt: skip
        told = 0
        if point in crash:
            fake.enqueue(first, second) if point != "before_send" else fake.enqueue(second)
            dead = _worker(settings, task.task_id, {**env, "AGENTQ_CRASH_AT": crash[point]}, wait=0)
            dead.communicate(timeout=60)
            assert dead.returncode == -signal.SIGKILL
        else:
            fake.enqueue(first, second)
            dead = _worker(settings, task.task_id, env, wait=0)
            # The stream's first half arrived and the heartbeat published what it billed so far.
            wait_for(lambda: _seen_on_meta(store, task.task_id) is not None, timeout=30, what="seen on META")
            seen = _seen_on_meta(store, task.task_id)
            assert seen is not None and int(seen["in"]) == FIRST["input_tokens"]
            told = int(seen["in"]) + int(seen["out"])  # what the stream's first event told its reader
            os.kill(dead.pid, signal.SIGKILL)
            dead.communicate(timeout=30)
        held = store.tasks.get(task.task_id).inflight
        assert held is not None  # the dead worker's hold, its outcome unknown
        successor = _worker(settings, task.task_id, env, wait=60)
        _, s_err = successor.communicate(timeout=120)
        gate.open()
        final = store.tasks.get(task.task_id)
        assert final.status is TaskStatus.SUCCEEDED, s_err[-3000:]
        read_whole = sum(u["input_tokens"] + u["output_tokens"] for u in fake.delivered_usage)
    # The successor reserved on top of the dead call's hold; once that call can no longer
    # complete, the hold is counted as spent (the dispatcher's release_holds message does this).
    sweeper = build_engine(settings, store, worker_id="sweeper")
    wait_for(lambda: sweeper.spend_lapsed_holds(store.tasks.get(task.task_id)) == 0.0, timeout=30, what="spent")
    budget = store.budgets.get(task.task_id)
    first_billed = 0 if point == "before_send" else sum(FIRST.values())
    billed = first_billed + sum(SECOND.values())
    assert budget.used <= budget.cap and budget.reserved == 0
    assert billed <= budget.used  # nothing the provider can have billed goes uncounted
    assert budget.known <= read_whole + told  # known is only what a reader was told
    assert budget.known >= sum(SECOND.values())  # the successor's call, reported whole
    assert 0 < budget.unknown <= held.amount
    if point == "mid_stream":  # the first event's input is known: only the rest of the hold is unknown
        assert budget.known == sum(SECOND.values()) + told
        assert budget.unknown == held.amount - told
    if point == "before_send":
        assert budget.known == sum(SECOND.values()) and budget.unknown == held.amount
