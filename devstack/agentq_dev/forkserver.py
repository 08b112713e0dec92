"""A fork server for the local stack's processes: one process that has imported what a moto
server and an ``agentq`` worker import, and forks either from itself on request.

Why: a moto server started as a new program spends ~1.3 CPU-s before its first stack is
provisioned (the interpreter, moto_app's imports, the DynamoDB, SQS, S3 and Step Functions
backends, the first request to each), where a forked one spends ~0.2; an ``agentq worker``
spends ~0.4 CPU-s on imports before its first poll, ~1.5 when its tasks use the anthropic SDK
(whose import alone is ~1.1). The test suite starts ~45 moto servers and ~250 other Python
processes (workers, ``run-task``, CLI calls, bench scripts), so it runs one fork server for the
run (tests/conftest.py), and every ``MotoServer`` and ``LocalStack`` worker started under it (in
the tests, or in a bench or ``agentq dev`` they start: the socket's path is in the environment),
and what the tests start through ``tests/helpers.python_process``, is forked warm instead.

Each forked process is the program it stands for (``python -m agentq_dev.moto_app``,
``python -m agentq ARGS``, a bench script) with the requester's environment, working directory,
import path and standard streams (passed as file descriptors), in a session of its own:
signals, exit codes and output are as they would be. What it shares with its siblings is only
what was imported before the fork: the fork server itself never serves a request or runs a
command. It has no thread when
it forks (a lock held by a thread at the fork would stay held in the child), and it reaps its
children and keeps their exit codes, which ``ForkedProcess`` (a ``Popen`` for a process that is
not the caller's child) asks for.

Protocol, on a Unix socket: one JSON line each way.
- ``{"python": [ARGV], "env": {...}, "cwd": DIR}`` with three file descriptors (stdin, stdout,
  stderr) -> ``{"pid": N}``: ``python ARGV`` (``-m MODULE ...``, ``-c CODE ...`` or
  ``SCRIPT ...``).
- ``{"status": PID}`` -> ``{"returncode": CODE or null}`` (negative: the signal that ended it).
Anything else -> ``{"error": "..."}``.
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import io
import json
import os
import runpy
import select
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from typing import Any

ENV_VAR = "AGENTQ_FORKSERVER"  # the socket's path, for this process and the processes it starts
# The services a local stack calls (or the tests do): their apps are built once here, so that
# what their first request imports is imported already (each server builds its own in ~0.01 s).
WARM_APPS = ("dynamodb", "dynamodbstreams", "sqs", "s3", "stepfunctions", "secretsmanager", "moto_api")
# What a worker imports before its first poll, and the model SDKs its providers import on first use;
# the HTTP API and the local stack, which the tests' API processes, `agentq dev` and every bench
# import (~0.2 CPU-s each: powertools' event handler and every route's models).
WARM_MODULES = (
    "agentq.cli.main", "agentq.worker", "agentq.runtime", "anthropic", "openai", "agentq.api.app", "agentq_dev.stack",
)  # fmt: skip
# What a bench script imports to draw its PNG (bench/_plot.py): ~0.5 CPU-s once here rather than
# in each of the ~30 benches tests/test_bench_scripts.py forks; absent without the bench extra.
WARM_BENCH_MODULES = ("matplotlib.pyplot",)
# The clients a worker, the API and a test make: their botocore data parsed once, here.
WARM_CLIENTS = ("dynamodb", "s3", "sqs", "stepfunctions")
# An answer takes milliseconds, but the first may wait for the imports (seconds; more on a loaded
# machine): the limit is for a fork server that is gone or stuck.
ANSWER_TIMEOUT = 60.0


def _ask(
    path: str, request: dict[str, Any], fds: list[int] | None = None, timeout: float = ANSWER_TIMEOUT
) -> dict[str, Any]:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.settimeout(timeout)
        conn.connect(path)
        socket.send_fds(conn, [json.dumps(request).encode() + b"\n"], fds or [])
        answer: dict[str, Any] = json.loads(conn.makefile("rb").readline() or b"{}")
    return answer


def _pid(answer: dict[str, Any]) -> int:
    if "pid" not in answer:
        raise RuntimeError(f"fork server: {answer.get('error', 'no answer')}")
    return int(answer["pid"])


class ForkedProcess(subprocess.Popen[Any]):
    """``python ARGV`` forked by the fork server, as a ``Popen``: ``pid``, ``poll``,
    ``wait``, ``communicate``, ``returncode``, ``send_signal``/``terminate``/``kill`` behave as
    for a child of ours (the exit code comes from the fork server, which reaps it). Its
    standard streams are this process's unless ``stdin``/``stdout``/``stderr`` say otherwise
    (``subprocess.PIPE``, ``subprocess.DEVNULL``, a descriptor or a file), as for ``Popen``."""

    def __init__(
        self,
        path: str,
        argv: list[str],
        env: dict[str, str],
        *,
        stdin: Any = None,
        stdout: Any = None,
        stderr: Any = None,
        text: bool = False,
        cwd: str | os.PathLike[str] | None = None,
    ) -> None:
        # Popen.__init__ would start a program: only the state its other methods read is set.
        self.args = [sys.executable, *argv]
        self.returncode = None
        self.text_mode = text
        self.encoding = self.errors = None
        self._child_created = False  # nothing for Popen.__del__ to reap
        self._waitpid_lock = threading.Lock()
        self._sigint_wait_secs = 0.25
        self._communication_started = False
        self._input = None
        self._forkserver = path
        theirs: list[int] = []  # the descriptors the command gets as 0, 1, 2
        ours: list[Any] = []  # for each, our end of its pipe (or None)
        opened: list[int] = []  # what to close here once they are passed
        for fd, how, mode in ((0, stdin, "wb"), (1, stdout, "rb"), (2, stderr, "rb")):
            end: Any = None
            if how is None:
                theirs.append(fd)
            elif how == subprocess.STDOUT and fd == 2:  # stderr to wherever stdout goes
                theirs.append(theirs[1])
            elif how == subprocess.DEVNULL:
                theirs.append(os.open(os.devnull, os.O_RDWR))
                opened.append(theirs[-1])
            elif how == subprocess.PIPE:
                read, write = os.pipe()
                mine, given = (write, read) if fd == 0 else (read, write)
                theirs.append(given)
                opened.append(given)
                end = os.fdopen(mine, mode)
                if text:
                    end = io.TextIOWrapper(end, write_through=fd == 0)
            else:
                theirs.append(how if isinstance(how, int) else how.fileno())
            ours.append(end)
        self.stdin, self.stdout, self.stderr = ours
        request = {"python": argv, "env": env, "cwd": os.fspath(cwd) if cwd is not None else os.getcwd()}
        try:
            self.pid = _pid(_ask(path, request, fds=theirs))
        finally:
            for fd in opened:
                os.close(fd)

    def _internal_poll(self, *_: Any, **__: Any) -> int | None:
        if self.returncode is None:
            code = _ask(self._forkserver, {"status": self.pid}).get("returncode")
            if code is not None:
                self.returncode = int(code)
        return self.returncode

    def _wait(self, timeout: float | None) -> int:
        """Sleeps on the process's pidfd, which becomes readable when it ends, rather than
        asking the fork server every few milliseconds (a wait of minutes was thousands of
        requests); the exit code is then asked for until the fork server has reaped it. The
        pidfd is opened before the first ask: a process not yet reaped keeps its pid, so the
        pidfd is of this process whenever the ask finds it running."""
        deadline = None if timeout is None else time.monotonic() + timeout
        pidfd = None
        with contextlib.suppress(OSError, AttributeError):  # gone already (its code is at the fork server), no pidfds
            pidfd = os.pidfd_open(self.pid)
        try:
            ended = select.poll()
            if pidfd is not None:
                ended.register(pidfd, select.POLLIN)
            while self._internal_poll() is None:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise subprocess.TimeoutExpired(self.args, timeout or 0)
                if pidfd is None:
                    time.sleep(0.02)
                elif ended.poll(None if left is None else max(1, int(left * 1000))):
                    time.sleep(0.002)  # ended: the fork server reaps it in a moment
        finally:
            if pidfd is not None:
                os.close(pidfd)
        assert self.returncode is not None
        return self.returncode


# ---------------------------------------------------------------- the fork server


_exited: dict[int, int] = {}  # pid -> exit code, of every child reaped


def _reap(*_: Any) -> None:
    with contextlib.suppress(ChildProcessError):
        while True:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                return
            _exited[pid] = os.waitstatus_to_exitcode(status)


def _warm() -> None:
    """Everything a server or a worker would import or build before (or at) its first requests,
    in this process and without a thread."""
    from moto.core.routing import get_service_router
    from moto.moto_server.werkzeug_app import create_backend_app

    from agentq_dev import moto_app

    for name in (*moto_app.WARM_UP_MODULES, *WARM_MODULES, *WARM_BENCH_MODULES):
        with contextlib.suppress(Exception):
            importlib.import_module(name)
    for service in WARM_APPS:  # a service's first request builds its app: its url and response modules
        with contextlib.suppress(Exception):
            create_backend_app(service)  # type: ignore[arg-type]  # (a Literal of moto's service names)
        if service != "moto_api":  # and its operations' router, from botocore's model of it: ~30 ms each
            with contextlib.suppress(Exception):
                get_service_router(service)
    from agentq.runtime import warm_data_loader

    warm_data_loader(WARM_CLIENTS)


def _become(env: dict[str, str], fds: list[int]) -> None:
    """In the forked child: a session of its own, the requester's environment and streams."""
    os.setsid()
    for target, fd in zip((0, 1, 2), fds, strict=True):
        os.dup2(fd, target)
    for fd in set(fds) - {0, 1, 2}:  # the received copies: a process the child starts must not hold them
        os.close(fd)
    for sig in (signal.SIGTERM, signal.SIGCHLD):
        signal.signal(sig, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    # blocked by the fork server around the fork; unblocked once the fork server's reaper is not the handler
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGCHLD})
    os.environ.clear()
    os.environ.update(env)
    tempfile.tempdir = None  # as a new program would: from the requester's TMPDIR, not the fork server's
    from moto.moto_api._internal import mock_random  # moto's ids: the same in every sibling otherwise

    mock_random.seed()


def program_path(first: str, pythonpath: str, forked: list[str]) -> list[str]:
    """The import path of a program started anew whose own entry is ``first`` (the directory of
    ``python -m``, the script's directory, ``""`` for ``-c``) with ``pythonpath``, given the
    path the fork server was started with (``forked``: its own entry first, then the
    interpreter's and the installed packages')."""
    entries = [first, *(entry for entry in pythonpath.split(os.pathsep) if entry)]
    return [*dict.fromkeys(entries), *(entry for entry in forked[1:] if entry not in entries)]


def _run_python(argv: list[str], cwd: str) -> int:
    """``python ARGV`` started in ``cwd``, in this (forked) interpreter."""
    os.chdir(cwd)
    pythonpath = os.environ.get("PYTHONPATH", "")
    try:
        if argv[0] == "-m":
            sys.path[:] = program_path(cwd, pythonpath, sys.path)
            sys.argv = argv[1:]
            runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
        elif argv[0] == "-c":
            sys.path[:] = program_path("", pythonpath, sys.path)
            sys.argv = ["-c", *argv[2:]]
            # python -c CODE: compiled without this module's __future__ imports
            exec(compile(argv[1], "<string>", "exec", dont_inherit=True), {"__name__": "__main__"})
        else:
            script = os.path.abspath(argv[0])
            sys.path[:] = program_path(os.path.dirname(script), pythonpath, sys.path)
            sys.argv = argv
            runpy.run_path(script, run_name="__main__")
    except SystemExit as exit_:
        return exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 1)
    return 0


def _child(request: dict[str, Any], fds: list[int]) -> None:
    """The forked child's whole life: it never returns into the fork server's loop."""
    code = 1
    try:
        _become(dict(request["env"]), fds)
        code = _run_python([str(a) for a in request["python"]], str(request["cwd"]))
    except BaseException:  # the child must never return into the fork server's loop
        with contextlib.suppress(Exception):
            traceback.print_exc()
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
    os._exit(code)


def _read(conn: socket.socket) -> tuple[dict[str, Any], list[int]]:
    data, fds, _, _ = socket.recv_fds(conn, 1 << 20, 3)
    while not data.endswith(b"\n"):
        more = conn.recv(1 << 20)
        if not more:
            break
        data += more
    request = json.loads(data)
    if not isinstance(request, dict):
        raise ValueError("not an object")
    return request, list(fds)


def _answer(conn: socket.socket, request: dict[str, Any], fds: list[int], listener: socket.socket) -> dict[str, Any]:
    if "status" in request:
        pid = int(request["status"])
        return {"returncode": _exited.get(pid)}
    if "python" not in request:
        raise ValueError("neither python nor status")
    if not isinstance(request["python"], list) or not request["python"] or len(fds) != 3:
        raise ValueError("python wants a list of arguments and three file descriptors")
    str(request["cwd"])
    dict(request["env"])
    sys.stdout.flush()
    # SIGCHLD waits until the new pid's place in _exited is cleared: a pid the kernel hands out
    # again must not answer with the exit code of the process that had it before.
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGCHLD})
    try:
        pid = os.fork()
        if pid == 0:
            listener.close()
            conn.close()
            _child(request, fds)
        _exited.pop(pid, None)
        _note_fork(pid, request)
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGCHLD})
    return {"pid": pid}


FORK_LOG = "AGENTQ_FORK_LOG"  # a file: each fork's pid, argv and test appended (bench/suite_cpu.py)


def _note_fork(pid: int, request: dict[str, Any]) -> None:
    """With ``AGENTQ_FORK_LOG`` set (in the requester's environment, else in the fork server's),
    say which test asked for the process: every fork has the fork server's command line and
    environment in /proc, so nothing else there can tell a moto server from a worker, or the test
    that started it (what ``bench/suite_cpu.py`` attributes the suite's CPU by). The requester's
    first: a suite ``bench/suite_cpu.py`` runs under another suite forks from that one's server."""
    env = request["env"]
    path = env.get(FORK_LOG) or os.environ.get(FORK_LOG)
    if not path:
        return
    note = {"pid": pid, "argv": request["python"][:3], "test": env.get("PYTEST_CURRENT_TEST", "")}
    with contextlib.suppress(OSError), open(path, "a") as log_file:
        log_file.write(json.dumps(note) + "\n")


def serve(path: str) -> None:
    """Listen on ``path`` until terminated, forking a process per request.

    "ready" once the socket listens, before the imports: whoever started it need not wait for
    them (~3.5 s, the test suite's xdist workers start meanwhile); a request made before they
    are done waits in the socket's backlog until they are."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(64)
    print("ready", flush=True)
    try:
        _warm()
    except Exception:  # a fork then imports what it needs itself: slower, still right
        traceback.print_exc()
    # What the imports made lives as long as the children: out of the collector's sight, a
    # child's full collections do not walk it (nor write to its pages, which the fork shares).
    # Measured over `make test` (gc.callbacks in every child): the moto servers' collections
    # 4.7 -> 3.4 CPU-s, the workers' 2.4 -> 1.3, the run-task processes' 2.5 -> 1.1.
    gc.collect()
    gc.freeze()
    signal.signal(signal.SIGCHLD, _reap)
    while True:
        conn, _ = listener.accept()
        with conn:
            fds: list[int] = []
            try:
                request, fds = _read(conn)
                answer = _answer(conn, request, fds, listener)
            except (ValueError, KeyError, TypeError, OSError) as exc:
                answer = {"error": f"bad request: {exc}"}
            finally:
                for fd in fds:
                    os.close(fd)
            with contextlib.suppress(OSError):
                conn.sendall(json.dumps(answer).encode() + b"\n")


if __name__ == "__main__":
    serve(sys.argv[1])
