"""A fork at the model's answer ends with that answer (``core.engine._loop._end_on_copied_answer``)
unless a person's message waits: invariant 11, "no turn ends over a message that waits". Here the
message is sent once a real worker process has claimed the fork, while it restores the fork's
workspace (a large one, so the restore lasts), on moto server."""

from __future__ import annotations

import os
import subprocess
from typing import Any

import pytest

from agentq.control.conversations import send_message
from agentq.control.operations import fork
from agentq.core.models import MessageStep, TaskStatus, TaskSubmission
from agentq.runtime import build_queues, build_registry, build_store
from agentq.worker import run_task

from tests.conftest import child_env
from tests.helpers import agentq_process, call, deployment, scripted, wait_for

pytestmark = pytest.mark.skipif(not os.path.exists("/usr/bin/bwrap"), reason="the workspace tools need bubblewrap")


def test_a_message_sent_to_a_fork_at_an_answer_after_its_claim_is_answered_not_stranded(
    moto_server: Any, tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = deployment(moto_server)  # with queues: a fork is enqueued
    store = build_store(settings)
    big = "head -c 96000000 /dev/urandom > big.bin"  # a restore of seconds, not milliseconds
    turns = [{"text": "making", "tool_calls": [call("shell", command=big)]}, {"text": "the answer"},
             {"text": "the answer to the message"}]  # fmt: skip
    sub = scripted(turns, tools=["shell"])
    sub = TaskSubmission.model_validate({**sub.model_dump(mode="json", exclude_none=True), "workspace": {}})
    source = store.tasks.create(sub, tenant="t")
    env = {"AGENTQ_WORKSPACE_ROOT": str(tmp_path / "ws")}
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert run_task(source.task_id, settings=settings, lease_seconds=30, wait_seconds=60).status is TaskStatus.SUCCEEDED
    queues = build_queues(settings)  # the real queues on moto server: the fork's run message waits there
    forked = fork(store, build_registry(settings), queues, source.task_id, at_step=3, tenant="t")  # at the answer

    worker = agentq_process(["run-task", forked.task_id, "--lease", "30"], env=child_env(settings, **env),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        wait_for(lambda: store.tasks.get(forked.task_id).status is TaskStatus.RUNNING, timeout=60, what="the claim")
        sent = send_message(store, queues, forked.task_id, "and what about C?", tenant="t")
        assert sent.status is TaskStatus.RUNNING and not sent.reopened  # taken by the running fork: no run queued
        _, err = worker.communicate(timeout=120)
        assert worker.returncode == 0, err[-2000:]
    finally:
        if worker.poll() is None:
            worker.kill()

    done = store.tasks.get(forked.task_id)
    held = [m.seq for s in store.steps.load(forked.task_id) if isinstance(s.body, MessageStep) for m in s.body.messages]
    assert (done.messages_received, done.messages_delivered) == (1, 1), (done.status, done.result)
    assert held == [1] and done.status is TaskStatus.SUCCEEDED and done.result == "the answer to the message"
