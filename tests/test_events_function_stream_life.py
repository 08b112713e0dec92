"""The events function (``functions/events/server.py``: API Gateway REST response streaming into a
Lambda behind the Web Adapter) serves a stream for as long as the task runs. The function's and
the integration's timeout is 900 s (``infra/events.py``), so a stream of a task that runs (or
waits for a person) longer is ended by Lambda killing the invocation: a timeout, which Lambda
counts in the function's ``Errors`` (the ``EventStreamFailures`` alarm, whose description says
"a stream ending at 15 minutes is not an error"), mid-frame, with the environment's next
invocation a cold start. The A2A streams end themselves at ``LIVE_SECONDS`` (840 s) for this
reason; a task's event stream must too, letting the client resume with ``Last-Event-ID``.

Time runs 100 times faster here (the hub's monotonic clock, which times a stream's life)."""

from __future__ import annotations

import http.client
import importlib.util
import json
import threading
import time
import types
from pathlib import Path
from typing import Any

import pytest

from agentq.api import event_hub, http_server
from agentq.storage.container import memory_storage

from tests.storage_conformance._builders import claimed

ROOT = Path(__file__).resolve().parents[1]
STREAM_TIMEOUT_SECONDS = 900  # infra/events.py
# The hub's stream loop wakes every 50 ms of real time (its keep-alive below), and a loaded
# machine may add as much again: at this speed, some 10 s of the stream's clock, against the 60 s
# between its life (840 s) and the timeout. At 1,000 the same wake was 50-100 s and it flaked.
SPEED = 100.0


def _events_function_server(monkeypatch: pytest.MonkeyPatch, store: Any) -> Any:
    """The server ``functions/events/server.py`` builds, over ``store``, on a free port."""
    spec = importlib.util.spec_from_file_location("events_server", ROOT / "functions" / "events" / "server.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    made: list[Any] = []

    class Server(http_server.ApiServer):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            kwargs["port"] = 0
            super().__init__(*args, **kwargs)
            made.append(self)

        def start(self) -> Any:
            super().start()
            return types.SimpleNamespace(thread=types.SimpleNamespace(join=lambda: None))

    for name, value in {
        "ApiServer": Server,
        "build_store": lambda settings: store,
        "build_registry": lambda settings: None,
        "build_queues": lambda settings: None,
        "build_fanout": lambda settings: None,
        "build_mcp": lambda: None,
        "Settings": types.SimpleNamespace(from_env=lambda: types.SimpleNamespace(defaults=None)),
    }.items():
        monkeypatch.setattr(module, name, value)
    module.main()
    return made[0]


def test_an_event_stream_of_the_events_function_ends_before_its_lambda_times_out(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    store = memory_storage()
    lease = claimed(store, tenant="team-a")  # running, and it stays so: its stream has no end of its own
    server = _events_function_server(monkeypatch, store)
    start = time.monotonic()
    fast = types.SimpleNamespace(**{**vars(time), "monotonic": lambda: start + (time.monotonic() - start) * SPEED})
    monkeypatch.setattr(event_hub, "time", fast)
    assert server.hub is not None
    server.hub.interval = 3600.0  # the poller's own reads stay rare on the fast clock
    server.hub.keepalive = 0.05  # the stream's loop wakes every 50 ms here (5 s of its clock)
    ended = threading.Event()
    body: list[bytes] = []
    lived: list[float] = []  # seconds of the stream's clock when the hub ended it (what Lambda's timeout sees)
    stream = server.hub.stream

    def timed(*args: Any, **kwargs: Any) -> Any:
        yield from stream(*args, **kwargs)
        lived.append(fast.monotonic() - start)  # not when the client read the end: at this speed, a
        # loaded machine's few ms to deliver it would be seconds of this clock

    monkeypatch.setattr(server.hub, "stream", timed)

    def watch() -> None:
        conn = http.client.HTTPConnection("127.0.0.1", server.httpd.server_port, timeout=30)
        context = json.dumps({"authorizer": {"tenant": "team-a"}})
        conn.request("GET", f"/tasks/{lease.task_id}/events",
                     headers={"Accept": "text/event-stream", "x-amzn-request-context": context})  # fmt: skip
        resp = conn.getresponse()
        assert resp.status == 200
        while chunk := resp.read1(65536):
            body.append(chunk)
        ended.set()

    threading.Thread(target=watch, daemon=True).start()
    try:
        # 15 s here is 1,500 s of the stream's clock: far past the Lambda's 900 s timeout
        assert ended.wait(STREAM_TIMEOUT_SECONDS * 1.6 / SPEED), (
            f"the stream was still open after {STREAM_TIMEOUT_SECONDS * 1.6:.0f} s of its clock: "
            f"{len(body)} chunks sent, the last {body[-1][:40]!r}"
        )
        assert lived[0] < STREAM_TIMEOUT_SECONDS, f"the stream ended after {lived[0]:.0f} s: Lambda had timed it out"
        assert b"event: end" not in b"".join(body)  # the task runs on: the client resumes from its last id
    finally:
        server.stop()


def test_a_revoked_keys_stream_on_the_events_function_ends_within_the_authorizer_cache(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """API Gateway authorised the stream as it opened (its cached decision: the key's id in the
    request context); the function reads the key again every ``api.authorizer_cache_seconds``
    (``AGENTQ_AUTHORIZER_CACHE_SECONDS``, 2 s here) and ends the stream once it is revoked, not
    at its 840 s: a revoked key works no longer on a stream than on the API (docs/DEPLOY.md)."""
    monkeypatch.setenv("AGENTQ_AUTHORIZER_CACHE_SECONDS", "2")
    store = memory_storage()
    _, record = store.api_keys.create("team-a")
    lease = claimed(store, tenant="team-a")
    server = _events_function_server(monkeypatch, store)
    conn = http.client.HTTPConnection("127.0.0.1", server.httpd.server_port, timeout=30)
    context = json.dumps({"authorizer": {"tenant": "team-a", "key_id": record.key_id}})
    try:
        conn.request("GET", f"/tasks/{lease.task_id}/events",
                     headers={"Accept": "text/event-stream", "x-amzn-request-context": context})  # fmt: skip
        resp = conn.getresponse()
        assert resp.status == 200 and resp.read1(65536).startswith(b"retry:")  # open, its first events sent
        rest: list[bytes] = []
        ended = threading.Event()

        def read() -> None:
            rest.append(resp.read())  # until the server ends the stream
            ended.set()

        threading.Thread(target=read, daemon=True).start()
        store.api_keys.revoke(record.key_id)
        revoked = time.monotonic()
        assert ended.wait(2 + 3), "the stream went on 5 s after its key was revoked"
        lived = time.monotonic() - revoked
    finally:
        server.stop()
    assert lived < 2 + 1.5, f"the stream went on {lived:.1f} s after its key was revoked"
    assert b"event: end" not in rest[0]


def test_the_client_follows_a_task_across_streams_that_end_at_their_life_cap() -> None:
    """A stream that ends quietly (no ``event: end``: its life cap, its caller authorised again)
    is resumed by ``Client.iter_events`` from its last id, not taken for the task's end: every
    step once, in order, over several streams, until the task's own end."""
    from agentq.api.app import build_app
    from agentq.api.client import Client
    from agentq.api.event_hub import EventHub
    from agentq.core.models import TaskStatus
    from agentq.core.tools.builtin import default_registry

    from tests.storage_conformance._builders import llm_step

    store = memory_storage()
    lease = claimed(store, tenant=http_server.LOCAL_TENANT)
    streams: list[object] = []

    class Hub(EventHub):
        def stream(self, watch: Any, **kwargs: Any) -> Any:
            streams.append(watch)
            return super().stream(watch, **kwargs)

    hub = Hub(store, interval=0.05, max_seconds=0.5)
    app = build_app(store, default_registry(), None, default_tenant=http_server.LOCAL_TENANT)  # type: ignore[arg-type]
    server = http_server.ApiServer(app.resolve, hub=hub).start()
    texts: list[str] = []
    done = threading.Event()

    def follow() -> None:
        for event in Client(server.url).iter_events(lease.task_id):
            if event.type == "agent.message":
                texts.append(str(event.data["text"]))
        done.set()

    threading.Thread(target=follow, daemon=True).start()
    try:
        for n in range(1, 16):  # 1.5 s of steps: three streams' lives
            store.steps.commit(lease, n, llm_step(text=f"step {n}"), root_id=lease.task_id)
            time.sleep(0.1)
        store.steps.commit(lease, 16, llm_step(text="step 16"), root_id=lease.task_id, finish=TaskStatus.SUCCEEDED,
                           result="x")  # fmt: skip
        assert done.wait(10), f"the client stopped following after {texts[-1:]}"
    finally:
        server.stop()
    assert texts == [f"step {n}" for n in range(1, 17)]
    assert len(streams) >= 3  # each ended at its cap, and the client came back
