"""moto's server application as the local stack and the tests run it: ``python -m agentq_dev.moto_app``.

It differs from ``moto_server`` in these ways, none of which changes what a request returns:

1. DynamoDB requests are serialised (``SerialisedDynamoDB``). moto's server runs each request
   on its own thread with no lock around a DynamoDB operation, so two concurrent conditional
   writes (or TransactWriteItems) can both pass their condition: a lost update DynamoDB itself
   never allows (measured: 34 grants of 700 tokens against a 20,000-token cap with 20 racing
   processes). Serialising DynamoDB requests gives a linearisable table, the guarantee the real
   service makes per item, so races in tests are races against DynamoDB's semantics, not
   moto's. Other services (SQS long polls, S3, Step Functions) stay concurrent.
2. A transaction rolls back from copies of the items it names instead of whole-table copies
   (``moto_rollback``; exact only because of 1): a step commit no longer costs time in
   proportion to the table (10 ms at 100,000 items, not 10 s).
3. A Query by partition key reads that partition instead of sorting the whole table
   (``moto_query``).
4. The backend serving a host is looked up once per host (``Dispatcher``), not per request.
5. An SQS queue remembers the receipt handles of its last 100,000 deleted messages, not of
   every message it ever deleted (``moto_sqs``): the server's memory no longer grows with
   every message it carries. A message made visible again wakes the queue's waiting long
   polls, as SQS does (moto woke them only for a new message). And a long poll whose client has
   gone (a worker ended or killed during its idle tier's 20 s wait) ends at its next wake,
   where moto took the next message for no one.
6. A DynamoDB stream shard keeps its newest 10,000 records, not every record of every write
   (``moto_streams``).
7. moto's dashboard list of every model object it ever created (every item copy, stream record
   and message, deleted or not) is not kept (``moto_models``): it was the server's main growth,
   ~210 KB per task.
8. The backends every stack provisions are imported by a thread as the server starts
   (``warm_up``), while its client is still busy starting up, instead of by the first request
   to each: Step Functions' state-machine interpreter alone takes 2-3 s to import, which every
   local stack (and every test that starts one) used to wait for in ``provision``.
9. DynamoDB requests cost the server 40-45 % less CPU (``moto_speed``: responses serialised
   without asking for each of an AttributeValue's ten members, update expressions parsed once
   per distinct string, expression trees copied and walked by node type, no request log):
   held tasks wait in this one process, so its CPU per call bounds how many a worker holds
   (``bench/moto_throughput.py``).
10. The server's listen backlog is ``LISTEN_BACKLOG`` connections, not werkzeug's 128. werkzeug
   closed every connection after its response (until 11), so every call of every client opened a
   new one, and two workers of 1,100 task threads each can have far more than 128 waiting to be accepted
   while the server is busy. A connection the kernel completed but had no room to queue is
   dropped, and its client reads a reset: ``ConnectionResetError`` in 700 runs of one two-worker
   ``bench/concurrency.py`` at 2,000 tasks (each retried, none in the next run).
11. Connections are kept open (HTTP/1.1 keep-alive, ``moto_http``): werkzeug answered every
   request with ``Connection: close``, so every call of every client paid a TCP connect and the
   server a new thread. A client's pool now reuses its connections; a request whose body length
   is not known up front still gets its connection closed. Request headers are parsed without
   the email package's generic parser, and the request log line is no longer formatted only to
   be dropped: 15-20 % less server CPU per call of a turn (3.6 -> 3.0 ms), 12-15 % less client
   CPU per call (``bench/moto_throughput.py --apps agentq,close``).
12. The server raises its soft limit of open files to the hard limit: a kept connection holds a
   socket (and a thread) until its client closes it, and two workers' pools (concurrency + 32
   per client) can keep thousands open, past the 1,024 (256 on macOS) a shell often starts
   with; over the limit ``accept`` fails and clients stall until their connect timeout.
13. An UpdateItem's checks that read only its expression (one clause of each kind, no overlapping
   paths, no key attribute updated) run once per parsed expression, names and table keys, not at
   every node of its tree on every request (``moto_updates``): half of the validation of a
   27-action claim, 6-11 % less server CPU per call (claims 2.41 -> 2.15 ms, turns 2.85 -> 2.69).
14. A condition expression (or filter) is parsed once per expression and names, and each request's
   operations are built from that parse with its own values (``moto_conditions``): moto parsed it
   on every request, twice for most writes.
15. An item's size check (on every attribute set) sums the sizes of its string and number
   attributes inline (``moto_sizes``), not through a method call each: the same total.
16. The methods of a service's response class, which moto lists on every request to check the
   action is one, are listed once per class (``moto_dispatch``).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import resource
import threading
from collections.abc import Callable, Iterable
from typing import Any

from moto.moto_server.werkzeug_app import DomainDispatcherApplication, create_backend_app
from werkzeug.serving import BaseWSGIServer, WSGIRequestHandler, run_simple

from agentq_dev import (
    moto_conditions,
    moto_dispatch,
    moto_http,
    moto_models,
    moto_query,
    moto_rollback,
    moto_sizes,
    moto_speed,
    moto_sqs,
    moto_streams,
    moto_updates,
    moto_version,
)

LISTEN_BACKLOG = 4096  # waiting connections (Linux caps it at net.core.somaxconn)


def raise_open_files_limit() -> None:
    """Raise this process's soft limit of open files to its hard limit (12 in the list above)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def _moto_request_handler() -> Any:
    """The request handler moto's own server uses (keeps its header handling); None before moto 5.2."""
    from moto.moto_server import threaded_moto_server

    return getattr(threaded_moto_server, "MotoRequestHandler", None)


class SerialisedDynamoDB:
    """WSGI middleware: one DynamoDB request at a time, everything else untouched."""

    def __init__(self, app: Callable[..., Iterable[bytes]]) -> None:
        self.app = app
        self.lock = threading.Lock()

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        if environ.get("HTTP_X_AMZ_TARGET", "").startswith("DynamoDB_"):
            with self.lock:
                # Materialise the body inside the lock: the operation runs while iterating.
                return list(self.app(environ, start_response))
        return self.app(environ, start_response)


class Dispatcher(DomainDispatcherApplication):
    """moto's dispatcher, remembering which backend serves each host.

    Why: for every request moto finds the backend by listing its own package directory (an
    ``os.listdir`` and an ``isdir`` for each of its ~200 service folders) and matching the host
    against every service's URL patterns: about 1 ms of CPU per request, more than a DynamoDB
    GetItem itself, on every request of every test. The answer depends only on the host
    (moto's folders and patterns do not change while it runs). ``get_application`` calls this
    under its own lock, which also guards the cache.
    """

    def __init__(self, create_app: Callable[..., Any]) -> None:
        super().__init__(create_app)
        self._backends: dict[str | None, Any] = {}

    def get_backend_for_host(self, host: str | None) -> Any:
        if host not in self._backends:
            self._backends[host] = super().get_backend_for_host(host)
        return self._backends[host]


# What a local stack's provisioning touches first, slowest last (an import holds its module's
# lock, so a request that needs a module still being imported waits for it, then finds it done).
WARM_UP_MODULES = (
    "moto.dynamodb.models",
    "moto.sqs.models",
    "moto.s3.models",
    "moto.stepfunctions.models",
    "moto.stepfunctions.parser.models",
)


def warm_up() -> threading.Thread:
    """Import the backends the stacks use in the background (8 above); a module that fails to
    import is left to the first request, which reports it as moto always did."""

    def run() -> None:
        for name in WARM_UP_MODULES:
            with contextlib.suppress(Exception):
                importlib.import_module(name)

    thread = threading.Thread(target=run, name="moto-warm-up", daemon=True)
    thread.start()
    return thread


def main(
    argv: list[str] | None = None, *, patch_moto: bool = True, fast_paths: bool = True, keep_alive: bool = True
) -> None:
    """Serve until killed. ``patch_moto=False`` leaves moto's DynamoDB as it is (2 and 3 above
    off), for ``bench/local_commit.py``, which measures the difference; ``fast_paths=False``
    leaves out 9 and 13-16, ``keep_alive=False`` 11 (``bench/moto_throughput.py``'s befores)."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("-H", "--host", default="127.0.0.1")
    parser.add_argument("-p", "--port", type=int, default=5000)
    args = parser.parse_args(argv)
    try:
        moto_version.require_verified()
    except moto_version.UnverifiedMoto as unverified:
        parser.exit(2, f"agentq moto server: {unverified}\n")
    if patch_moto:
        moto_rollback.install()
        moto_query.install()
    if fast_paths:
        moto_speed.install()
        moto_updates.install()
        moto_conditions.install()
        moto_sizes.install()
        moto_dispatch.install()
    moto_sqs.install()
    moto_streams.install()
    moto_models.install()
    os.environ.setdefault("MOTO_PORT", str(args.port))
    BaseWSGIServer.request_queue_size = LISTEN_BACKLOG  # what run_simple's server listens with (10 above)
    raise_open_files_limit()  # 12 above
    warm_up()
    app = Dispatcher(create_backend_app)
    if keep_alive:
        moto_http.install()
    handler = _moto_request_handler() or WSGIRequestHandler
    if keep_alive:
        handler = moto_http.keep_alive_handler(handler)
    run_simple(args.host, args.port, SerialisedDynamoDB(app), threaded=True, request_handler=handler)


if __name__ == "__main__":
    main()
