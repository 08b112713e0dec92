"""DynamoDB's own faults on the wire (botocore's ``Endpoint._send``), for a real worker process,
loaded as a tool module (``AGENTQ_TOOL_MODULES``; it has no tools): patched in at import, before
the worker starts, its retries' waits cut short (``quick_retries``). ``install`` does the same
in the test's own process.

``AGENTQ_TEST_DYNAMODB_FAULT``: ``<Operation>|<substring>|<first>|<count>[|<mode>]``: of the
requests of ``<Operation>`` (``UpdateItem``, ``TransactWriteItems``, ...) whose body contains
``<substring>``, the ``<first>``-th and the ``<count> - 1`` after it (botocore's retries of it
included) are answered ``ProvisionedThroughputExceededException`` (HTTP 400) and never reach
the table, as a throttled table answers. ``count`` = 6 spends botocore's retries
(``agentq.aws``: max_attempts 5 retries, so 6 attempts): the write fails with the
``ClientError`` a worker sees when a partition stays hot. ``<mode>``:

- ``lost``: the request does reach the table (and is applied), and its answer is a 500
  ``InternalServerError`` (a response lost after DynamoDB applied the write): botocore sends it
  again, as it does for any 5xx or a connection reset.
- ``down``: from the ``<first>``-th on, every DynamoDB request of the process, of any operation,
  is throttled: an outage that begins at that request and outlasts the run.
"""

from __future__ import annotations

import json
import os
import threading
from typing import Any

TOOLS: list[Any] = []

faulted: list[str] = []  # the operations answered with a fault, in order


class _Raw:
    def __init__(self, body: bytes) -> None:
        self._body = body

    def stream(self, **_: Any) -> Any:
        yield self._body

    def read(self, *_: Any) -> bytes:
        return self._body


def install(op: str, needle: str, first: int, count: int, mode: str = "throttle") -> None:
    from botocore.awsrequest import AWSResponse, HTTPHeaders
    from botocore.endpoint import Endpoint

    window = range(first, first + count)
    seen = [0]
    down = [False]
    lock = threading.Lock()
    send = vars(Endpoint)["_send"]  # private to botocore: its typing stubs do not name it

    def faulty(self: Endpoint, request: Any) -> Any:
        target = request.headers.get("X-Amz-Target") or ""
        target = target.decode() if isinstance(target, bytes) else str(target)
        body = request.body if isinstance(request.body, bytes | str) else b""
        body = body.encode() if isinstance(body, str) else body
        matches = target.endswith("." + op) and needle.encode() in body
        with lock:
            if matches:
                seen[0] += 1
            hit = (down[0] and target.startswith("DynamoDB_")) or (matches and seen[0] in window)
            down[0] = down[0] or (hit and mode == "down")
        if not hit:
            return send(self, request)
        faulted.append(target.rsplit(".", 1)[-1])
        if mode == "lost":
            send(self, request)  # applied by the table; its answer never reaches the client
            error, status = "InternalServerError", 500
        else:
            error, status = "ProvisionedThroughputExceededException", 400
        payload = json.dumps({"__type": f"com.amazonaws.dynamodb.v20120810#{error}", "message": error}).encode()
        headers = HTTPHeaders()
        headers["Content-Type"] = "application/x-amz-json-1.0"
        headers["x-amzn-RequestId"] = "faulted"
        return AWSResponse(request.url, status, headers, _Raw(payload))

    setattr(Endpoint, "_send", faulty)  # noqa: B010


def quick_retries() -> None:
    """botocore's retries as they are, each after 10 ms rather than its backoff (up to 20 s a
    throttled attempt): the worker meets the same faults in seconds, not a minute."""
    from botocore.retries.standard import ExponentialBackoff

    ExponentialBackoff.delay_amount = lambda self, context: 0.01  # type: ignore[method-assign]


_spec = os.environ.get("AGENTQ_TEST_DYNAMODB_FAULT", "")
if _spec:
    _parts = _spec.split("|")
    quick_retries()
    install(_parts[0], _parts[1], int(_parts[2]), int(_parts[3]), *(_parts[4:5] or []))
