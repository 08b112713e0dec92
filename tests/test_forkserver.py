"""The fork server (devstack/agentq_dev/forkserver.py): a moto server forked from it is moto_app as a
program of its own would be, shares no state with its siblings, and is gone when stopped; a
``MotoServer`` whose subclass runs another app is still started as its own program; an
``agentq`` command forked from it writes to the caller's streams and its exit code (a signal's
too) comes back as a child's would."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import boto3
import pytest

from agentq_dev import forkserver
from agentq_dev.moto_server import LOCAL_CREDENTIALS, MotoServer
from agentq_dev.stack import LocalStack


def _dynamodb(server: MotoServer) -> Any:
    return boto3.client(
        "dynamodb",
        endpoint_url=server.endpoint_url,
        region_name="us-east-1",
        aws_access_key_id=LOCAL_CREDENTIALS["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=LOCAL_CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
    )


def _table(client: Any, name: str) -> None:
    client.create_table(
        TableName=name,
        KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}],
        AttributeDefinitions=[{"AttributeName": "pk", "AttributeType": "S"}],
        BillingMode="PAY_PER_REQUEST",
    )


def test_servers_forked_from_the_fork_server_serve_apart_and_are_gone_when_stopped() -> None:
    assert os.environ.get(forkserver.ENV_VAR), "tests/conftest.py runs a fork server per test process"
    with MotoServer() as one, MotoServer() as two:
        assert isinstance(one.process, forkserver.ForkedProcess)  # forked, not started as a program
        assert one.pid is not None and two.pid is not None and one.pid != two.pid
        _table(_dynamodb(one), "only-in-one")
        assert _dynamodb(one).list_tables()["TableNames"] == ["only-in-one"]
        assert _dynamodb(two).list_tables()["TableNames"] == []
        # Its own process, in a session of its own, as MotoServer starts one.
        assert os.getsid(one.pid) == one.pid
        pids = (one.pid, two.pid)
    for pid in pids:
        assert not Path(f"/proc/{pid}").exists()  # terminated and reaped: no zombie left


def test_a_request_the_fork_server_cannot_read_gets_an_error_and_starts_nothing() -> None:
    for request in (b'{"python": "not a list"}\n', b"[1, 2]\n", b'{"pyth'):
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
            conn.connect(os.environ[forkserver.ENV_VAR])
            conn.sendall(request)
            conn.shutdown(socket.SHUT_WR)
            answer = json.loads(conn.makefile("rb").readline())
        assert answer["error"].startswith("bad request"), request


class _OwnApp(MotoServer):
    """moto_app as a bench runs it with one of its changes off: a ``-c`` program of its own."""

    marker: str = ""

    def command(self) -> list[str]:
        program = (
            "import os, sys; from agentq_dev.moto_app import main; open(sys.argv[1], 'w').close(); main(sys.argv[2:])"
        )
        return [sys.executable, "-c", program, self.marker]


def test_a_subclasss_own_program_is_what_the_forked_server_runs(tmp_path: Path) -> None:
    server = _OwnApp()
    server.marker = str(tmp_path / "ran")
    with server:
        assert isinstance(server.process, forkserver.ForkedProcess)
        assert (tmp_path / "ran").exists()
        assert _dynamodb(server).list_tables()["TableNames"] == []


def test_an_agentq_command_forked_writes_to_our_streams_and_its_exit_code_comes_back(
    capfd: pytest.CaptureFixture[str],
) -> None:
    env = dict(os.environ)
    ok = forkserver.ForkedProcess(os.environ[forkserver.ENV_VAR], ["-m", "agentq", "--help"], env)
    assert ok.wait(timeout=30) == 0 and ok.poll() == 0
    bad = forkserver.ForkedProcess(os.environ[forkserver.ENV_VAR], ["-m", "agentq", "no-such-command"], env)
    assert bad.wait(timeout=30) == 2
    out, err = capfd.readouterr()
    assert "usage: agentq" in out and "invalid choice: 'no-such-command'" in err


def test_a_local_stacks_worker_is_forked_and_a_sigkill_is_its_exit_code() -> None:
    with LocalStack(prefix=f"fork{uuid.uuid4().hex[:6]}", workers=1, api=False, sweep_every=None) as stack:
        [worker] = stack.processes
        assert isinstance(worker, forkserver.ForkedProcess) and worker.poll() is None
        assert os.getsid(worker.pid) == worker.pid  # a session of its own, as Popen(start_new_session=True)
        worker.send_signal(signal.SIGKILL)
        assert worker.wait(timeout=30) == -signal.SIGKILL


def test_a_forked_command_imports_first_from_its_own_directory_then_its_pythonpath() -> None:
    """As ``python -m agentq`` started there would: the fork server's own directory (where the
    tests started it) is not on the command's path unless its PYTHONPATH names it."""
    forked = ["/repo", "/py/lib", "/venv/site-packages"]
    assert forkserver.program_path("/work/here", "/there:/also", forked) == [
        "/work/here",
        "/there",
        "/also",
        "/py/lib",
        "/venv/site-packages",
    ]
    assert forkserver.program_path("/work/here", "/repo", forked) == [
        "/work/here",
        "/repo",
        "/py/lib",
        "/venv/site-packages",
    ]
    assert forkserver.program_path("/repo", "", forked) == ["/repo", "/py/lib", "/venv/site-packages"]


def test_a_forked_commands_output_can_be_piped_back_as_with_popen() -> None:
    env = dict(os.environ)
    proc = forkserver.ForkedProcess(
        os.environ[forkserver.ENV_VAR],
        ["-m", "agentq", "no-such-command"],
        env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 2 and out == "" and "invalid choice: 'no-such-command'" in err
    quiet = forkserver.ForkedProcess(
        os.environ[forkserver.ENV_VAR],
        ["-m", "agentq", "--help"],
        env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    out_bytes, _ = quiet.communicate(timeout=30)
    assert quiet.returncode == 0 and out_bytes.startswith(b"usage: agentq")
    merged = forkserver.ForkedProcess(
        os.environ[forkserver.ENV_VAR],
        ["-c", "import sys; print('out', flush=True); print('err', file=sys.stderr, flush=True)"],
        env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    both, none = merged.communicate(timeout=30)
    assert merged.returncode == 0 and both == "out\nerr\n" and none is None
