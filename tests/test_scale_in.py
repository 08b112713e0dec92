"""Scale-in of the EC2 workspace tier (``agentq.scale_in``), with real processes on moto server.

A worker whose instance metadata says the instance is being terminated (IMDSv2's
``autoscaling/target-lifecycle-state`` turning ``Terminated``, as the group's termination hook
holds it in ``Terminating:Wait``) stops claiming, ends its task at the step boundary with every
committed step kept, hands the task back at once, tries to complete the hook's lifecycle action
naming its instance, and exits ``TERMINATING_EXIT`` (which the unit does not restart); another
worker resumes the task with no step lost or repeated: each side effect of the run exactly once.
A worker whose instance stays ``InService`` (or that has no IMDS: the local stack) runs on.

The instance metadata here is a loopback HTTP server answering IMDSv2's two requests as the
service documents them (a PUT for a session token, GETs that must carry it): there is no local
IMDS, and the worker reaches it through the SDKs' own ``AWS_EC2_METADATA_SERVICE_ENDPOINT``.
moto 5.2.6 does not implement ``CompleteLifecycleAction``, so the completion's call is seen
attempted (its log line), not answered; the hook's timeout ends the wait in that case
(tests/test_cdk_workspace_tier.py pins the hook and the grant).
"""

from __future__ import annotations

import json
import signal
import subprocess
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from agentq.control.submit import submit
from agentq.core.models import TaskStatus, TaskSubmission
from agentq.runtime import Settings, build_queues, build_registry, build_store
from agentq.scale_in import (
    ENDPOINT_VARIABLE,
    GROUP_VARIABLE,
    HOOK_VARIABLE,
    INSTANCE_ID_PATH,
    POLL_VARIABLE,
    STATE_PATH,
    TERMINATING_EXIT,
    TOKEN_PATH,
    InstanceMetadata,
)
from agentq_dev.moto_server import MotoServer

from tests.conftest import child_env
from tests.helpers import agentq_process, call, deployment, scripted, wait_for

TIER = "high"
TURNS = 6
INSTANCE = "i-0123456789abcdef0"


class _Metadata(ThreadingHTTPServer):
    state = "InService"
    token = "imds-session-token"
    polls = 0  # state reads answered


class _Handler(BaseHTTPRequestHandler):
    server: _Metadata

    def log_message(self, *args: Any) -> None:
        pass

    def _send(self, status: int, body: str) -> None:
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body.encode())

    def do_PUT(self) -> None:
        ok = self.path == f"/{TOKEN_PATH}" and self.headers.get("X-aws-ec2-metadata-token-ttl-seconds")
        self._send(200, self.server.token) if ok else self._send(400, "")

    def do_GET(self) -> None:
        if self.headers.get("X-aws-ec2-metadata-token") != self.server.token:
            self._send(401, "")  # IMDSv2 required, as the launch template sets it
        elif self.path == f"/{STATE_PATH}":
            self.server.polls += 1
            self._send(200, self.server.state)
        elif self.path == f"/{INSTANCE_ID_PATH}":
            self._send(200, INSTANCE)
        else:
            self._send(404, "")


@pytest.fixture
def metadata() -> Iterator[_Metadata]:
    server = _Metadata(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def _endpoint(server: _Metadata) -> str:
    return f"http://127.0.0.1:{server.server_address[1]}/"


def _task() -> TaskSubmission:
    script = [
        {"text": f"turn {i}", "latency_seconds": 1.0,  # a run the notice lands in, also on a busy machine
         "tool_calls": [call("lookup", query=str(i)), call("charge_card", amount_cents=i + 1, memo=str(i))]}
        for i in range(TURNS)
    ]  # fmt: skip
    script.append({"text": "finished"})
    return scripted(script, tools=["lookup", "charge_card"]).model_copy(update={"priority": TIER})


def _worker(settings: Settings, ledger: Path, **extra: str) -> subprocess.Popen[str]:
    return agentq_process(
        ["worker", "--concurrency", "4", "--lease", "3", "--heartbeat", "1", "--visibility", "30"],
        child_env(settings, AGENTQ_TEST_LEDGER=str(ledger), **extra),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def _stop(proc: subprocess.Popen[str]) -> tuple[str, str]:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        return proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.communicate()


def test_instance_metadata_is_read_with_an_imdsv2_token_and_none_when_there_is_no_imds(metadata: _Metadata) -> None:
    assert InstanceMetadata(_endpoint(metadata)).get(STATE_PATH) == "InService"
    assert InstanceMetadata(_endpoint(metadata)).get(INSTANCE_ID_PATH) == INSTANCE
    closed = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    port = closed.server_address[1]
    closed.server_close()
    assert InstanceMetadata(f"http://127.0.0.1:{port}/", timeout=1).get(STATE_PATH) is None


def test_a_termination_notice_drains_the_worker_and_its_task_resumes_elsewhere_with_no_step_lost(
    moto_server: MotoServer, tmp_path: Path, metadata: _Metadata
) -> None:
    settings: Settings = deployment(moto_server, visibility_timeout=30)
    store, queues = build_store(settings), build_queues(settings)
    ledger = tmp_path / "ledger.jsonl"
    task = submit(store, build_registry(settings), _task(), tenant="t", queues=queues).task_id
    scale_in = {HOOK_VARIABLE: "agentq-workspace-drain", GROUP_VARIABLE: "agentq-workspace",
                ENDPOINT_VARIABLE: _endpoint(metadata), POLL_VARIABLE: "0.2"}  # fmt: skip
    first = _worker(settings, ledger, **scale_in)
    second: subprocess.Popen[str] | None = None
    try:
        wait_for(lambda: store.tasks.get(task).step >= 2, 30, "the task two steps in on the first worker")
        polls = metadata.polls
        wait_for(lambda: metadata.polls >= polls + 3, 10, "three more notice polls answered InService")
        assert first.poll() is None  # ... and the worker runs on
        before = store.steps.load(task)
        metadata.state = "Terminated"  # the group scales this instance in; the hook holds it
        try:
            _out, first_err = first.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            pytest.fail("the worker did not drain and exit within 20 s of the termination notice")
        assert first.returncode == TERMINATING_EXIT, first_err[-3000:]
        assert "termination notice" in first_err and "Traceback" not in first_err, first_err[-3000:]
        assert INSTANCE in first_err and "lifecycle action" in first_err  # the completion, for this instance
        stopped = store.tasks.get(task)
        assert not stopped.status.terminal, "the task finished before the notice: nothing was tested"
        steps = store.steps.load(task)
        assert steps[: len(before)] == before and stopped.step == len(steps)  # committed steps kept, none half-done
        assert stopped.lease_expires == 0 and stopped.claim_count == 1  # handed back, claimable now

        second = _worker(settings, ledger)  # another instance's worker, no notice
        wait_for(lambda: store.tasks.get(task).status.terminal, 30, "the task finished on the second worker")
    finally:
        if first.poll() is None:
            _stop(first)
        if second is not None:
            _stop(second)
    final = store.tasks.get(task)
    assert final.status is TaskStatus.SUCCEEDED and final.result == "finished"
    claims = store.tasks.claims(task)
    assert [c.worker.rsplit(":", 1)[1] for c in claims] == [str(first.pid), str(second.pid)]
    steps = store.steps.load(task)
    assert steps[: len(before)] == before and [s.number for s in steps] == list(range(1, len(steps) + 1))
    keys = [json.loads(line)["key"] for line in ledger.read_text().splitlines()]
    assert len(keys) == len(set(keys)) == TURNS  # every charge exactly once across the handover
