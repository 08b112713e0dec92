"""moto in server mode as a child process: the embedded AWS of the local stack and the tests.

Server mode, not in-process mocks, because only a server serialises requests the way
DynamoDB does: lease and budget races are meaningless against in-process moto.

Where the environment names a fork server (``forkserver.ENV_VAR``: the test suite runs one per
test process), the server is forked from it, warm, instead of started as a new program; the same
program either way, minus the ~1.3 CPU-s a cold one spends on imports.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field

from agentq_dev import forkserver, moto_version

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


BIND_ATTEMPTS = 3


class ExitedBeforeAnswering(Exception):
    def __init__(self, code: int | None) -> None:
        super().__init__(f"moto server exited with code {code}")
        self.code = code


@dataclass
class MotoServer:
    port: int = field(default_factory=free_port)
    process: subprocess.Popen[bytes] | None = None  # a forkserver.ForkedProcess under a fork server

    @property
    def endpoint_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int | None:
        """The server's process (None when stopped)."""
        return self.process.pid if self.process is not None else None

    def command(self) -> list[str]:
        """The server program; subclasses may run another moto app."""
        return [sys.executable, "-m", "agentq_dev.moto_app"]

    def start(self, timeout: float = 30.0) -> MotoServer:
        """Start the server and wait for it to answer. Raises ``moto_version.UnverifiedMoto``
        (before starting anything) when the installed moto is not the verified one.

        The port is chosen free (``free_port``) before the server binds it, so another process
        can take it in between (two test suites on one machine: the server exits 1, "Address
        already in use"): a server that exits 1 before it answers is started again on another
        port, up to ``BIND_ATTEMPTS`` times."""
        moto_version.require_verified()
        for attempt in range(1, BIND_ATTEMPTS + 1):
            try:
                return self._start_on_port(timeout)
            except ExitedBeforeAnswering as exc:
                if exc.code != 1 or attempt == BIND_ATTEMPTS:
                    raise RuntimeError(f"moto server exited with code {exc.code}") from None
                self.port = free_port()
        raise AssertionError("unreachable")

    def _start_on_port(self, timeout: float) -> MotoServer:
        env = {**os.environ, **LOCAL_CREDENTIALS, "MOTO_PORT": str(self.port)}
        command = [*self.command(), "-H", "127.0.0.1", "-p", str(self.port)]
        server = os.environ.get(forkserver.ENV_VAR)
        if server and command[0] == sys.executable:
            quiet = subprocess.DEVNULL
            self.process = forkserver.ForkedProcess(server, command[1:], env, stdin=quiet, stdout=quiet, stderr=quiet)
        else:
            self.process = subprocess.Popen(
                command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                code, self.process = self.process.returncode, None
                raise ExitedBeforeAnswering(code)
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
