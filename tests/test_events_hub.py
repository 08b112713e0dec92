"""The events hub (``agentq.hub``) as ``agentq dev`` runs it: its own server, fed by moto's
DynamoDB Streams, named by the API's ``GET /health``, read by the Python client; real worker
processes. Ordering and resumption through the hub, the pollers reading only when the stream
says so, tenancy with two tenants' keys and users' tokens, the caps on open streams (the excess
refused, the agents' steps unaffected, a client that stops reading let go), and the fall back to
the API's route when the hub dies.
"""

from __future__ import annotations

import http.client
import json
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import urlsplit

import pytest

from agentq.api.app import build_app
from agentq.api.client import Client
from agentq.api.event_hub import EventHub
from agentq.api.http_server import LOCAL_TENANT, ApiServer
from agentq.api.stream_caps import StreamCaps
from agentq.core.models import TaskStatus
from agentq.core.tools.builtin import default_registry
from agentq.storage.container import memory_storage
from agentq_dev.stack import LocalStack

from tests.helpers import call
from tests.storage_conformance._builders import claimed, llm_step

PYTHONPATH = {"PYTHONPATH": os.pathsep.join(filter(None, [os.getcwd(), os.environ.get("PYTHONPATH", "")]))}


def body(turns: int, latency: float = 0.2, user: str | None = None) -> dict[str, Any]:
    script = [
        {"text": f"turn {i}", "latency_seconds": latency, "tool_calls": [call("lookup", query=str(i), size=20)]}
        for i in range(turns)
    ] + [{"text": "finished"}]
    out: dict[str, Any] = {"goal": "look things up", "provider": "scripted", "script": {"turns": script},
                           "constraints": {"tools": ["lookup"]}}  # fmt: skip
    if user:
        out["user"] = user
    return out


def hub_of(stack: LocalStack) -> EventHub:
    assert stack.hub_server is not None and stack.hub_server.hub is not None
    return stack.hub_server.hub


def hub_stack(**kw: Any) -> LocalStack:
    return LocalStack(events_hub=True, tool_modules=("tests.effect_tools",), extra_env=dict(PYTHONPATH), **kw)


def open_stream(
    base: str, task_id: str, key: str | None
) -> tuple[int, dict[str, Any] | None, http.client.HTTPResponse]:
    """A stream request held open: its status, its JSON body if refused, and the response, which
    holds the socket: the stream stays open while the caller keeps it (``close()`` ends it).

    Why the response and not the connection: a response read with ``Connection: close`` owns the
    socket, and dropping it closes the socket; the hub then frees that stream's slot at its next
    write, so a caller holding only the connection would hold no stream at all."""
    parts = urlsplit(base)
    conn = http.client.HTTPConnection(str(parts.hostname), parts.port, timeout=30)
    headers = {"Accept": "text/event-stream"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    conn.request("GET", f"/tasks/{task_id}/events", headers=headers)
    resp = conn.getresponse()
    if resp.status != 200:
        return resp.status, json.loads(resp.read() or b"null"), resp
    return 200, None, resp


@pytest.fixture(scope="module")
def stack() -> Iterator[LocalStack]:
    with hub_stack(prefix="hubev", workers=2) as running:
        yield running


def test_the_api_names_the_hub_and_the_client_follows_it_in_commit_order(stack: LocalStack) -> None:
    assert stack.api_server is not None and stack.hub_server is not None
    client = Client(stack.api_server.url)
    live = client.health().live
    assert live is not None and live.url == stack.hub_server.url
    served_before = hub_of(stack).reads
    task_id = client.submit(body(5)).task_id
    streamed: list[Any] = []
    lags: list[float] = []
    for event in client.iter_events(task_id):
        if event.committed:
            lags.append(time.time() - event.at)  # its stamp is taken just before its write
        streamed.append(event)
    assert hub_of(stack).reads > served_before  # the hub served it, not the API's route
    lags.sort()
    print(
        f"\ncommit -> client through the hub: p50 {lags[len(lags) // 2]:.3f} s, max {lags[-1]:.3f} s, {len(lags)} events"
    )
    committed = [e.id for e in streamed if e.committed]
    assert committed == [e.id for e in client.iter_events(task_id, stream=False)]  # all, once, in order
    assert streamed[-1].type == "task.status" and streamed[-1].data["status"] == "succeeded"


def test_every_event_id_resumes_exactly_what_follows_it_on_the_hub(stack: LocalStack) -> None:
    assert stack.api_server is not None
    client = Client(stack.api_server.url)
    task_id = client.submit(body(3, latency=0.05)).task_id
    whole = [e.id for e in client.iter_events(task_id) if e.committed]
    assert len(whole) >= 8
    for i, event_id in enumerate(whole):
        assert [e.id for e in client.iter_events(task_id, after=event_id) if e.committed] == whole[i + 1 :]


def test_the_hubs_pollers_read_a_task_only_when_its_stream_records_say_it_changed(stack: LocalStack) -> None:
    """A fed poller reads when nudged (its idle read is 30 s away): a task waiting for an
    approval for seconds costs the hub no read, where a 300 ms poller would read ~10 times."""
    assert stack.api_server is not None and stack.hub_server is not None and stack.hub_feed is not None
    client = Client(stack.api_server.url)
    submission = body(1, latency=0.05)
    submission["constraints"]["tool_policies"] = {"lookup": "ask"}
    task_id = client.submit(submission).task_id
    events = client.iter_events(task_id)
    for event in events:
        if event.type == "approval.requested":
            break
    poller = hub_of(stack).pollers[task_id]
    reads, nudges = poller.reads, stack.hub_feed.nudges
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline:  # a read per META read and log page, only after a nudge
        # (+2: a nudge counted just before the snapshot whose read lands just after it)
        assert poller.reads - reads <= 2 * (stack.hub_feed.nudges - nudges) + 2, "a fed poller read unasked"
        time.sleep(0.05)
    assert poller.reads - reads < 3 / 0.3  # what a 300 ms poller would have read meanwhile
    client.approve(task_id)
    rest = list(events)
    assert rest[-1].data["status"] == "succeeded" and stack.hub_feed.nudges > nudges and poller.reads > reads


def test_a_flood_of_watchers_past_the_cap_is_refused_and_the_agents_steps_are_unaffected() -> None:
    cap, flood, turns = 8, 80, 6
    with hub_stack(prefix="hubcap", workers=2, hub_caps=StreamCaps(per_tenant=cap, per_user=2)) as stack:
        assert stack.api_server is not None and stack.hub_server is not None
        hub = stack.hub_server.url
        hub_of(stack).keepalive = 1.0  # a closed stream's slot frees at its next keep-alive
        client = Client(stack.api_server.url)
        assert client.wait(client.submit(body(turns)).task_id, timeout=60).status == "succeeded"  # alone

        waiting = body(1)
        waiting["constraints"]["tool_policies"] = {"lookup": "ask"}  # watched while it waits for a person
        watched = client.submit(waiting).task_id
        client.wait_for(watched, lambda v: v.status == "paused", timeout=30)
        answers: list[tuple[int, dict[str, Any] | None, http.client.HTTPResponse]] = []
        lock = threading.Lock()

        def watch() -> None:
            answer = open_stream(hub, watched, None)
            with lock:
                answers.append(answer)

        threads = [threading.Thread(target=watch) for _ in range(flood)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        held = [stream for status, _, stream in answers if status == 200]
        refused = [page for status, page, _ in answers if status == 429]
        assert len(answers) == flood and len(held) == cap and len(refused) == flood - cap
        assert all(p is not None and p["error"]["code"] == "too_many_streams" and f"{cap} open event streams"
                   in p["error"]["message"] for p in refused)  # fmt: skip

        # With the hub full, an agent runs as it did alone: all its steps, the same outcome, within
        # the same wait (how fast is for bench/, not a timed assertion here).
        task_id = client.submit(body(turns)).task_id
        assert client.wait(task_id, timeout=60).status == "succeeded"
        steps = [e for e in client.iter_events(task_id, stream=False) if e.type == "agent.message"]
        assert len(steps) == turns + 1
        # The slots come back once those streams close.
        for stream in held:
            stream.close()
        deadline = time.monotonic() + 10
        caps = hub_of(stack).caps
        assert caps is not None
        while caps.open_streams("local") and time.monotonic() < deadline:
            time.sleep(0.05)
        status, _, stream = open_stream(hub, watched, None)
        stream.close()
        assert status == 200


def test_a_stream_whose_client_stops_reading_is_closed_and_frees_its_slot() -> None:
    """A client alive but reading nothing (its receive window shut) once blocked the hub's write
    for good: its thread and its stream slot were never given back. Here a real socket with a
    tiny receive buffer never reads while ~6 MB of frames are due to it."""
    store = memory_storage()
    lease = claimed(store, tenant=LOCAL_TENANT)
    caps = StreamCaps(per_tenant=1, per_user=1)
    hub = EventHub(store, interval=0.02, keepalive=0.2, caps=caps)
    app = build_app(store, default_registry(), None, default_tenant=LOCAL_TENANT)  # type: ignore[arg-type]  # reads only
    server = ApiServer(app.resolve, hub=hub).start()
    stalled = socket.socket()
    try:
        stalled.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        port = server.httpd.server_port
        stalled.connect(("127.0.0.1", port))
        stalled.sendall(f"GET /tasks/{lease.task_id}/events HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
                        "Accept: text/event-stream\r\n\r\n".encode())  # fmt: skip
        _until(lambda: caps.open_streams(LOCAL_TENANT) == 1, "the stream to open")
        for n in range(1, 400):  # ~6 MB of frames: more than every buffer between the two holds
            store.steps.commit(lease, n, llm_step(text=f"{n}" + "x" * 15_000), root_id=lease.task_id)
        # the slot is given back as the stream's handler returns: its thread is free too
        _until(lambda: caps.open_streams(LOCAL_TENANT) == 0, "the stalled client's slot to be freed")
    finally:
        stalled.close()
        server.stop()


def test_a_client_the_full_hub_refuses_follows_the_task_from_the_apis_route() -> None:
    """The hub at its cap answers 429 ``too_many_streams``: ``Client.iter_events`` (``agentq
    events``, ``agentq watch``) takes that as it takes a 5xx, and follows the task from the API's
    own route from its last id (the hub again 30 s later). Before, the 429 was raised to the
    caller, and the console polled for the rest of the page's life (``console_assets/api.js``)."""
    store = memory_storage()
    lease = claimed(store, tenant=LOCAL_TENANT)
    caps = StreamCaps(per_tenant=1, per_user=1)
    reads = build_app(store, default_registry(), None, default_tenant=LOCAL_TENANT)  # type: ignore[arg-type]
    hub = ApiServer(reads.resolve, hub=EventHub(store, interval=0.05, caps=caps), hub_only=True).start()
    app = build_app(store, default_registry(), None, default_tenant=LOCAL_TENANT, hub_url=hub.url)  # type: ignore[arg-type]
    api = ApiServer(app.resolve, hub=EventHub(store, interval=0.05)).start()
    full = socket.create_connection(("127.0.0.1", hub.httpd.server_port))  # the one stream the cap allows
    try:
        full.sendall(f"GET /tasks/{lease.task_id}/events HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                     "Accept: text/event-stream\r\n\r\n".encode())  # fmt: skip
        _until(lambda: caps.open_streams(LOCAL_TENANT) == 1, "the stream that fills the cap")
        store.steps.commit(lease, 1, llm_step(text="one"), root_id=lease.task_id)
        got = []
        for event in Client(api.url).iter_events(lease.task_id):  # the hub is full while the task runs
            if event.type == "agent.message":
                got.append(event.data.get("text"))
                if len(got) == 1:
                    store.steps.commit(lease, 2, llm_step(text="two"), root_id=lease.task_id,
                                       finish=TaskStatus.SUCCEEDED, result="x")  # fmt: skip
    finally:
        full.close()
        api.stop()
        hub.stop()
    assert got == ["one", "two"]


def _until(check: Callable[[], bool], what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"waited {timeout:.0f} s for {what}"
        time.sleep(0.05)


def test_two_tenants_and_two_users_on_the_hub_see_only_their_own_tasks() -> None:
    with hub_stack(prefix="hubauth", workers=1, auth=True,
                   hub_caps=StreamCaps(per_tenant=50, per_user=1)) as stack:  # fmt: skip
        assert stack.api_server is not None and stack.hub_server is not None
        hub = stack.hub_server.url
        key_a, key_b = stack.create_api_key("alpha", act_for_users=True), stack.create_api_key("beta")
        held = body(1, latency=0.1, user="ann")
        held["constraints"]["tool_policies"] = {"lookup": "ask"}  # open until approved: its streams stay up
        a_client = Client(stack.api_server.url, key_a)
        a_task = a_client.submit(held).task_id
        b_task = Client(stack.api_server.url, key_b).submit(body(1)).task_id
        ann, bob = stack.token(user="ann", tenant="alpha"), stack.token(user="bob", tenant="alpha")

        for key, task, expected in ((key_b, a_task, 404), (key_a, b_task, 404), (bob, a_task, 404),
                                    (stack.token(user="ann", tenant="beta"), a_task, 404),
                                    (None, a_task, 401), ("aq_" + "x" * 40, a_task, 401),
                                    (stack.token(user="ann", tenant="alpha", ttl=-60), a_task, 401),
                                    (ann[:-4] + "AAAA", a_task, 401)):  # fmt: skip
            status, page, stream = open_stream(hub, task, key)
            stream.close()
            assert (
                status == expected and page is not None and page["error"]["code"] in ("task_not_found", "unauthorized")
            )
        # A user's cap (1 here) is apart from the tenant's: ann's second stream is refused, the key's is not.
        status, _, first = open_stream(hub, a_task, ann)
        assert status == 200
        caps = hub_of(stack).caps
        holding = dict(caps.users) if caps is not None else None  # what a failure needs read
        status, page, second = open_stream(hub, a_task, ann)
        task = stack.store().tasks.get(a_task)
        assert status == 429 and page is not None and "user ann" in page["error"]["message"], (
            f"open streams by user before the second: {holding}; the task {task.status.value} at step {task.step}"
        )
        status, _, by_key = open_stream(hub, a_task, key_a)
        assert status == 200
        for stream in (first, second, by_key):
            stream.close()
        a_client.wait_for(a_task, lambda v: v.status == "paused", timeout=30)
        a_client.approve(a_task)  # its one lookup: then it finishes
        # Followed to the end through the hub, each sees its own task's events only.
        for key, task in ((key_a, a_task), (ann, a_task), (key_b, b_task)):
            events = list(Client(stack.api_server.url, key).iter_events(task))
            assert {e.task_id for e in events} == {task} and events[-1].data["status"] == "succeeded"


def test_when_the_hub_dies_the_client_goes_on_from_the_apis_route_with_nothing_lost_or_twice(stack: LocalStack) -> None:
    assert stack.api_server is not None
    client = Client(stack.api_server.url)
    task_id = client.submit(body(8, latency=0.3)).task_id
    received = []
    for event in client.iter_events(task_id):
        received.append(event)
        if len(received) == 4 and stack.hub_server is not None:
            stack.stop_hub()  # mid-stream: its connections drop, its port closes
    stack.start_hub()
    committed = [e.id for e in received if e.committed]
    assert len(committed) == len(set(committed))
    assert committed == [e.id for e in client.iter_events(task_id, stream=False)]
