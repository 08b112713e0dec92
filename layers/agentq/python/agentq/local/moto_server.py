"""moto in server mode as a child process: the embedded AWS of the local stack and the tests.

Server mode, not in-process mocks, because only a server serialises requests the way
DynamoDB does: lease and budget races are meaningless against in-process moto.

Where the environment names a moto fork server (``forkserver.ENV_VAR``: the test suite runs
one per test process), the server is forked from it, warm, instead of started as a new program;
the same program either way, minus the ~1.1 CPU-s a cold one spends on imports.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field

from agentq.local import forkserver

LOCAL_CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_SESSION_TOKEN": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class MotoServer:
    port: int = field(default_factory=free_port)
    process: subprocess.Popen[bytes] | None = None
    forked_pid: int | None = None  # a server forked by the fork server (not this process's child)

    @property
    def endpoint_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int | None:
        """The server's process, however it was started (None when stopped)."""
        return self.process.pid if self.process is not None else self.forked_pid

    def command(self) -> list[str]:
        """The server program; subclasses may run another moto app."""
        return [sys.executable, "-m", "agentq.local.moto_app"]

    def start(self, timeout: float = 30.0) -> MotoServer:
        env = {**os.environ, **LOCAL_CREDENTIALS, "MOTO_PORT": str(self.port)}
        server = os.environ.get(forkserver.ENV_VAR)
        if server and self.command() == MotoServer.command(self):  # a subclass's own app starts as its own program
            self.forked_pid = forkserver.request_server(server, self.port, env)
        else:
            self.process = subprocess.Popen(
                [*self.command(), "-H", "127.0.0.1", "-p", str(self.port)],
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process is not None and self.process.poll() is not None:
                raise RuntimeError(f"moto server exited with code {self.process.returncode}")
            if self.forked_pid is not None and not _alive(self.forked_pid):
                raise RuntimeError(f"moto server {self.forked_pid} (forked) exited")
            try:
                urllib.request.urlopen(f"{self.endpoint_url}/moto-api/", timeout=1).read()
                break
            except OSError:
                time.sleep(0.1)
        else:
            self.stop()
            raise RuntimeError(f"moto server did not answer on port {self.port} within {timeout}s")
        self._configure()
        return self

    def _configure(self) -> None:
        """Switch on real Step Functions execution (used by fan-out)."""
        req = urllib.request.Request(
            f"{self.endpoint_url}/moto-api/config",
            data=json.dumps({"stepfunctions": {"execute_state_machine": True}}).encode(),
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        urllib.request.urlopen(req, timeout=5).read()

    def stop(self) -> None:
        if self.forked_pid is not None:
            _stop_forked(self.forked_pid)
            self.forked_pid = None
        if self.process and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.process.kill()
        self.process = None

    def __enter__(self) -> MotoServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _alive(pid: int) -> bool:
    """Whether a forked server's process is still there (the fork server reaps it once it exits)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _stop_forked(pid: int, timeout: float = 5.0) -> None:
    """Terminate a server the fork server started, and wait until the fork server has reaped
    it (its pid is gone), as ``Popen.wait`` would for a child of ours."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not _alive(pid):
                return
            time.sleep(0.02)
