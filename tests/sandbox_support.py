"""The sandbox Lambda function's execution environment, modelled locally with bubblewrap.

What the escape suite needs from "Lambda" is what the function's code can rely on there and
nothing more: one process that serves invocations one after another (a warm environment),
with the role's credentials in its environment (fake ones here, with a marker to look for),
a read-only root filesystem with the code under /var/task and the layer under /opt, /tmp as
the only writable place, its own process space and no network to speak of. bubblewrap builds
exactly that around ``functions/sandbox/handler.py``; the handler then adds nothing but what
it adds in Lambda (no namespaces of its own: Lambda would not let it). The differences from
the real thing are listed in docs/SANDBOX.md.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import shutil
import subprocess
from pathlib import Path
from typing import Any

from agentq.sandbox.bwrap import filesystem_args, interpreter

ROOT = Path(__file__).resolve().parent.parent
LAYER = ROOT / "layers" / "agentq" / "python"
FUNCTIONS = ROOT / "functions"
CREDENTIAL_MARKER = "FAKESECRETMARKER7f3a"
CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "ASIAFAKEKEYID000000",
    "AWS_SECRET_ACCESS_KEY": f"{CREDENTIAL_MARKER}/secret",
    "AWS_SESSION_TOKEN": f"{CREDENTIAL_MARKER}-token",
}
PLAIN_ENV = {
    "AWS_LAMBDA_FUNCTION_NAME": "agentq-test-sandbox",
    "AWS_LAMBDA_RUNTIME_API": "127.0.0.1:9001",
    "AWS_REGION": "eu-west-1",
    "PATH": "/usr/local/bin:/usr/bin:/bin",
    "LANG": "C.UTF-8",
}
TMP_BYTES = 256 * 1024 * 1024  # Lambda's /tmp is 512 MB at least; the sandbox's own limit is 64 MB
SANDBOX_USER = 993  # Lambda runs functions as an unprivileged user (sbx_user1051)

# The runtime's loop: read an event, call the handler, write the answer. The handler module
# is imported once, as a warm Lambda environment does. Like Lambda's runtime process, it has
# the role's credentials in its initial environment: it reads them from the first line of
# stdin and re-executes itself with them, so they are in no command line and not in the
# environment of bwrap (this model's PID 1, which Lambda's init would be).
LOOP = """
import json, os, sys
if "AWS_SECRET_ACCESS_KEY" not in os.environ:
    line = b""
    while not line.endswith(b"\\n"):
        line += os.read(0, 1)
    os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]], {**os.environ, **json.loads(line)})
sys.path[:0] = ["/var/task", "/opt/python"]
from sandbox.handler import lambda_handler
for line in sys.stdin:
    answer = lambda_handler(json.loads(line), None)
    sys.stdout.write(json.dumps(answer) + "\\n")
    sys.stdout.flush()
"""


class LambdaEnvironment:
    """A warm sandbox-function environment; ``invoke`` is what RemoteSandbox calls."""

    def __init__(self, extra_env: dict[str, str] | None = None) -> None:
        self.extra_env = extra_env or {}
        self.bwrap = shutil.which("bwrap")
        if self.bwrap is None:
            raise RuntimeError("bubblewrap (bwrap) is needed to model the Lambda environment: install bubblewrap")
        self.proc: subprocess.Popen[str] | None = None
        self.starts = 0

    def command(self) -> list[str]:
        python = interpreter()
        env: list[str] = []
        for key, value in {**PLAIN_ENV, **self.extra_env}.items():
            env += ["--setenv", key, value]
        return [
            # No --die-with-parent: it fires when the *thread* that started bwrap ends, and a tool
            # call runs in a thread of its own. The loop ends when its stdin closes instead.
            str(self.bwrap), "--unshare-all", "--unshare-user", "--disable-userns",
            "--uid", str(SANDBOX_USER), "--gid", str(SANDBOX_USER), "--clearenv", *env,
            *filesystem_args(python),
            "--ro-bind", str(LAYER), "/opt/python",
            "--ro-bind", str(FUNCTIONS), "/var/task",
            "--proc", "/proc", "--dev", "/dev", "--remount-ro", "/dev",
            "--size", str(TMP_BYTES), "--tmpfs", "/tmp",
            "--remount-ro", "/", "--chdir", "/var/task",
            "--", python, "-I", "-S", "-B", "-u", "-c", LOOP,
        ]  # fmt: skip

    def _start(self) -> subprocess.Popen[str]:
        if self.proc is None or self.proc.poll() is not None:
            self.proc = subprocess.Popen(
                self.command(),
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                env={"PATH": "/usr/bin:/bin"},
            )
            assert self.proc.stdin is not None
            self.proc.stdin.write(json.dumps(CREDENTIALS) + "\n")
            self.proc.stdin.flush()
            self.starts += 1
        return self.proc

    def invoke(self, event: dict[str, Any]) -> dict[str, Any]:
        proc = self._start()
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write(json.dumps(event) + "\n")
        proc.stdin.flush()
        wait = float(event.get("timeout_seconds", 10)) + 30
        ready, _, _ = select.select([proc.stdout], [], [], wait)
        line = proc.stdout.readline() if ready else ""
        if not line:
            log = self.close()
            raise RuntimeError(
                f"the sandbox function's environment exited without answering (Runtime.ExitError): {log}"
            )
        answer: dict[str, Any] = json.loads(line)
        return answer

    def close(self) -> str:
        """Stop the environment; returns the tail of what it logged."""
        log = ""
        proc, self.proc = self.proc, None
        if proc is None:
            return log
        assert proc.stdin is not None and proc.stderr is not None and proc.stdout is not None
        with contextlib.suppress(OSError):
            proc.stdin.close()  # the loop ends at end of input, and the namespace with it
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if select.select([proc.stderr], [], [], 2)[0]:
            log = proc.stderr.read()[-2000:]
        proc.stdout.close()
        proc.stderr.close()
        return log


def host_processes_in_namespace(pid_ns: str) -> list[int]:
    """Live host pids whose PID namespace is ``pid_ns`` ('pid:[N]', as /proc/<pid>/ns/pid
    reads). A zombie is dead already, waiting only for its parent to collect its status."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if os.readlink(f"/proc/{entry}/ns/pid") != pid_ns:
                    continue
                with open(f"/proc/{entry}/stat", "rb") as f:
                    state = f.read().rsplit(b")", 1)[1].split()[0]
            except (OSError, IndexError):
                continue
            if state not in (b"Z", b"X"):
                found.append(int(entry))
    return found


def processes_with(tag: str) -> list[int]:
    """Live host pids whose command line holds ``tag`` (a sandbox's processes are seen from here:
    their PID namespace is a child of this one; a zombie's command line reads empty)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                if tag.encode() in f.read():
                    found.append(int(entry))
        except OSError:
            continue  # gone meanwhile
    return found
