"""A fork server for moto servers: one process that has imported moto_app and the backends a
local stack uses, and forks a new moto server from itself on request.

Why: a moto server started as a new process spends ~1.1 CPU-s before its first stack is
provisioned (the interpreter, moto_app's imports, the DynamoDB, SQS, S3 and Step Functions
backends, the first request to each); provisioning a second stack on a warm server costs
~0.04 CPU-s. The test suite starts ~45 servers, so it runs one fork server per test process
and every ``MotoServer`` started under it (in that process, or in a bench or ``agentq dev``
it starts: the socket's path is in the environment) is forked warm instead.

Each forked server is the same program as ``python -m agentq.local.moto_app``: a process of its
own (its own session, as ``MotoServer`` starts one), serving one port until it is terminated,
with the requester's environment. What it shares with its siblings is only what was imported
before the fork; the fork server itself never serves a request, so no backend holds state then.
The fork server has no thread when it forks (a thread's lock held at the fork would stay held in
the child), and it reaps its children, so a stopped server leaves no zombie.

Protocol, on a Unix socket: the client sends one JSON line ``{"port": P, "env": {...}}`` and
reads one JSON line back, ``{"pid": N}`` or ``{"error": "..."}``.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import signal
import socket
import sys
from typing import Any

ENV_VAR = "AGENTQ_MOTO_FORKSERVER"  # the socket's path, for MotoServer in this process and its children
# The services a local stack calls (or the tests do): their apps are built once here, so that
# what their first request imports is imported already (the apps themselves are built again
# by each server, in ~0.01 s).
WARM_APPS = ("dynamodb", "dynamodbstreams", "sqs", "s3", "stepfunctions", "secretsmanager", "moto_api")


def request_server(path: str, port: int, env: dict[str, str], timeout: float = 10.0) -> int:
    """Ask the fork server at ``path`` for a moto server on ``port``; its pid."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.settimeout(timeout)
        conn.connect(path)
        conn.sendall(json.dumps({"port": port, "env": env}).encode() + b"\n")
        answer = json.loads(conn.makefile("rb").readline() or b"{}")
    if "pid" not in answer:
        raise RuntimeError(f"moto fork server: {answer.get('error', 'no answer')}")
    return int(answer["pid"])


def _warm() -> None:
    """Everything a server would import or build before (or at) its first requests, in this
    process and without a thread: moto_app, its patches' modules, the stacks' backends."""
    from moto.moto_server.werkzeug_app import create_backend_app

    from agentq.local import moto_app

    for name in moto_app.WARM_UP_MODULES:
        with contextlib.suppress(Exception):
            importlib.import_module(name)
    for service in WARM_APPS:  # a service's first request builds its app: its url and response modules
        with contextlib.suppress(Exception):
            create_backend_app(service)  # type: ignore[arg-type]  # (a Literal of moto's service names)


def _serve_in_child(port: int, env: dict[str, str]) -> None:
    """In the forked child: become ``python -m agentq.local.moto_app -H 127.0.0.1 -p PORT``."""
    code = 0
    try:
        os.setsid()
        devnull = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(devnull, fd)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        os.environ.clear()
        os.environ.update(env)
        from moto.moto_api._internal import mock_random  # the same seed in every sibling otherwise

        mock_random.seed()
        from agentq.local import moto_app

        moto_app.main(["-H", "127.0.0.1", "-p", str(port)])
    except BaseException:  # the child must never return into the fork server's loop
        code = 1
    os._exit(code)


def _reap(*_: Any) -> None:
    with contextlib.suppress(ChildProcessError):
        while os.waitpid(-1, os.WNOHANG)[0] > 0:
            pass


def serve(path: str) -> None:
    """Listen on ``path`` until terminated, forking a server per request."""
    _warm()
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(64)
    signal.signal(signal.SIGCHLD, _reap)
    print("ready", flush=True)
    while True:
        try:
            conn, _ = listener.accept()
        except InterruptedError:  # a SIGCHLD during accept (PEP 475 retries, but be explicit)
            continue
        with conn:
            try:
                request = json.loads(conn.makefile("rb").readline())
                port, env = int(request["port"]), dict(request["env"])
            except (ValueError, KeyError, TypeError) as exc:
                conn.sendall(json.dumps({"error": f"bad request: {exc}"}).encode() + b"\n")
                continue
            sys.stdout.flush()
            pid = os.fork()
            if pid == 0:
                listener.close()
                conn.close()
                _serve_in_child(port, env)
            conn.sendall(json.dumps({"pid": pid}).encode() + b"\n")


if __name__ == "__main__":
    serve(sys.argv[1])
