"""A workspace command that reached the network is a side effect like any other (issue 42, item 1):
at most once, and an unknown outcome reported after a crash; one that stayed in the workspace
is replay-safe and runs again on the restored workspace (tests/test_workspace_kill.py kills one).

The egress proxy records the call's effect (``EFFECT#<tool_use_id>``, fenced) before it opens
its first connection to an allowed host (``core.tools.egress.ContactMark``), so what decides is
whether the command contacted a host, not only whether the task allows hosts. Everything is
real: bubblewrap, the egress proxy, a counting HTTP server on loopback, moto server, and in the
last test worker processes, one SIGKILLed while its command holds the answer it fetched.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from agentq.control.submit import submit
from agentq.core.engine import Engine, EngineConfig
from agentq.core.models import TaskStatus, TaskSubmission, ToolOutcome, ToolsStep
from agentq.core.tools import default_registry
from agentq.core.tools.egress import egress_factory
from agentq.core.tools.fetch import FetchPolicy, HostRule
from agentq.runtime import build_registry
from agentq.storage.container import Storage
from agentq_dev.stack import LocalStack

from tests.helpers import call, wait_for

pytestmark = pytest.mark.skipif(not os.path.exists("/usr/bin/bwrap"), reason="the workspace tools need bubblewrap")
LOOPBACK = FetchPolicy(allow=(HostRule("127.0.0.1"),))  # the deployment lets the test's loopback server through


class Counter:
    """A loopback HTTP server that counts the requests for /hit and answers each with its number."""

    def __init__(self) -> None:
        self.hits = 0
        self.lock = threading.Lock()


@contextlib.contextmanager
def counting_server() -> Iterator[tuple[str, Counter]]:
    counter = Counter()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            with counter.lock:
                counter.hits += 1
                body = f"hit {counter.hits}\n".encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}", counter
    finally:
        server.shutdown()
        server.server_close()


def submission(host: str, turns: list[Any]) -> TaskSubmission:
    return TaskSubmission.model_validate(
        {
            "goal": "use the network from the workspace",
            "provider": "scripted",
            "script": {"turns": turns},
            "constraints": {"tools": ["shell"], "timeout_seconds": 600},
            "workspace": {"allow_hosts": [host]},
        }
    )


def results(store: Storage, task_id: str) -> list[ToolOutcome]:
    return [r for s in store.steps.load(task_id) if isinstance(s.body, ToolsStep) for r in s.body.results]


def test_a_shell_call_that_reached_an_allowed_host_is_recorded_once_and_one_that_did_not_leaves_no_record(
    store: Storage, tmp_path: Path
) -> None:
    with counting_server() as (host, counter):
        turns = [
            {"tool_calls": [call("shell", command=f"curl -sS http://{host}/hit > got.txt && cat got.txt")]},
            {"tool_calls": [call("shell", command="echo local > local.txt && cat got.txt")]},
            {"tool_calls": [call("shell", command=f"curl -sS http://{host}/hit; curl -sS http://{host}/hit")]},
            {"text": "done"},
        ]
        task = store.tasks.create(submission(host, turns), tenant="t")
        engine = Engine(
            store, worker_id="w1", tools=default_registry(),
            config=EngineConfig(lease_seconds=10, workspace_root=str(tmp_path / "root")),
            egress=egress_factory(LOOPBACK),
        )  # fmt: skip
        engine.run(task.task_id)
        assert store.tasks.get(task.task_id).status is TaskStatus.SUCCEEDED
        assert counter.hits == 3  # each command ran once

    fetched, local, twice = results(store, task.task_id)
    assert "hit 1" in fetched.content and fetched.side_effects and fetched.status == "ok"
    assert "hit 1" in local.content and not local.side_effects  # no contact: replay-safe
    assert "hit 2" in twice.content and "hit 3" in twice.content and twice.side_effects  # one record per call
    effects = {
        u: store.effects.get(task.task_id, u) for u in (fetched.tool_use_id, local.tool_use_id, twice.tool_use_id)
    }
    assert effects[local.tool_use_id] is None
    for use_id in (fetched.tool_use_id, twice.tool_use_id):
        record = effects[use_id]
        assert (
            record is not None and record.state == "done" and record.content == results_by(store, task.task_id)[use_id]
        )


def results_by(store: Storage, task_id: str) -> dict[str, str]:
    return {r.tool_use_id: r.content for r in results(store, task_id)}


def test_a_networked_call_a_crashed_worker_started_is_reported_unknown_and_not_run_again(tmp_path: Path) -> None:
    """A real worker process is SIGKILLed while its shell command, which has fetched from the
    allowed host, still runs (before its step commits). The task resumes on the other worker:
    the command is not run again (the server counted one request), the model reads
    ``unknown_outcome``, and the workspace is the last committed step's (the file the command
    wrote is gone). Checked to fail (two requests, the call replayed) without NetworkedCall."""
    root = tmp_path / "workspaces"
    with counting_server() as (host, counter), LocalStack(
        prefix="wsnet", workers=2, api=False, sweep_every=None,
        extra_env={"AGENTQ_HTTP_FETCH_ALLOW": host, "AGENTQ_WORKSPACE_ROOT": str(root)},
    ) as stack:  # fmt: skip
        assert stack.settings is not None
        store, registry, queues = stack.store(), build_registry(stack.settings), stack.queues()
        # The first request is answered "hit 1": that run waits (60 s) after writing reached.txt;
        # a run that fetched again would get "hit 2" and not wait.
        command = f'r=$(curl -sS http://{host}/hit); echo "$r" > reached.txt; [ "$r" = "hit 1" ] && sleep 60; echo "$r"'
        turns = [
            {"tool_calls": [call("shell", command="echo before > before.txt")]},
            {"tool_calls": [call("shell", command=command, timeout_seconds=90)]},
            {"tool_calls": [call("shell", command="ls")]},
            {"text": "done"},
        ]
        task = submit(store, registry, submission(host, turns), tenant="t", queues=queues)

        # Observable event: the command fetched and wrote reached.txt in its worker's directory.
        wait_for(lambda: next(iter(root.glob(f"*/{task.task_id}.*/reached.txt")), None), 120, "the fetch")
        assert counter.hits == 1
        owner = store.tasks.get(task.task_id).lease_owner or ""
        victim = stack.worker_by_id(owner)
        assert victim is not None
        os.kill(victim.pid, signal.SIGKILL)

        wait_for(lambda: store.tasks.get(task.task_id).status.terminal, 180, "the resumed run")
        meta = store.tasks.get(task.task_id)
        assert meta.status is TaskStatus.SUCCEEDED and meta.claim_count == 2
        assert counter.hits == 1  # not run again

        before, fetched, listing = results(store, task.task_id)
        assert fetched.status == "unknown_outcome" and fetched.is_error and fetched.side_effects
        assert "NOT run again" in fetched.content and "files the command wrote are not there" in fetched.content
        assert "before.txt" in listing.content and "reached.txt" not in listing.content
        assert not before.side_effects
