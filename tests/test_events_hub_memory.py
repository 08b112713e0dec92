"""What the hub holds for a stream whose client reads slowly (or not at all for a while) while it
catches up from the start of a long task: docs/ARCHITECTURE.md (invariant 10) says memory follows
the subscribers' lag up to ``BUFFER_BYTES`` (128 KB) a stream ("5,000 streams each lagging past
the cap hold 640 MB"); a stream catching up reads its own way and must be bounded the same way."""

from __future__ import annotations

import gc
import socket
import time
import tracemalloc

from agentq.api.app import build_app
from agentq.api.event_hub import BUFFER_BYTES, EventHub
from agentq.api.http_server import LOCAL_TENANT, ApiServer
from agentq.api.stream_caps import StreamCaps
from agentq.core.tools.builtin import default_registry
from agentq.storage.container import memory_storage

from tests.storage_conformance._builders import claimed, llm_step

STREAMS = 8


def test_a_slow_stream_catching_up_on_a_long_task_holds_about_the_buffer_cap_not_a_page_of_events() -> None:
    store = memory_storage()
    lease = claimed(store, tenant=LOCAL_TENANT)
    for n in range(1, 301):  # 300 turns of 15 KB of text: 4.5 MB of history, each frame ~15 KB
        store.steps.commit(lease, n, llm_step(text=f"{n}" + "x" * 15_000), root_id=lease.task_id)
    caps = StreamCaps(per_tenant=100, per_user=100)
    hub = EventHub(store, interval=0.05, keepalive=15.0, caps=caps)
    app = build_app(store, default_registry(), None, default_tenant=LOCAL_TENANT)  # type: ignore[arg-type]  # reads only
    server = ApiServer(app.resolve, hub=hub).start()
    port = server.httpd.server_port
    slow: list[socket.socket] = []
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for _ in range(STREAMS):  # clients that read nothing yet (their receive window small and full)
            s = socket.socket()
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            s.connect(("127.0.0.1", port))
            s.sendall(f"GET /tasks/{lease.task_id}/events HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
                      "Accept: text/event-stream\r\n\r\n".encode())  # fmt: skip
            slow.append(s)
        deadline = time.monotonic() + 30
        while caps.open_streams(LOCAL_TENANT) < STREAMS and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(2)  # each stream has read its first page and is blocked writing it
        gc.collect()
        per_stream = (tracemalloc.get_traced_memory()[0] - before) / STREAMS
    finally:
        tracemalloc.stop()
        for s in slow:
            s.close()
        server.stop()
    assert per_stream < 4 * BUFFER_BYTES, f"a slow stream holds {per_stream / 1e6:.1f} MB"


def test_a_stream_whose_client_hung_up_frees_its_slot_before_the_next_keep_alive() -> None:
    """A client that closes an idle stream (a console page left, a CLI stopped) kept its slot until
    the hub's next write to it, the keep-alive 15 s later: a user who opens pages faster than that
    reaches the per-user cap (20) with streams nobody reads and is refused 429 (the console then
    polls for the rest of the page's life). The hub may notice the hang-up while it waits."""
    store = memory_storage()
    tasks = [claimed(store, tenant=LOCAL_TENANT).task_id for _ in range(3)]
    caps = StreamCaps(per_tenant=2, per_user=2)
    hub = EventHub(store, interval=0.05, keepalive=15.0, caps=caps)
    app = build_app(store, default_registry(), None, default_tenant=LOCAL_TENANT)  # type: ignore[arg-type]  # reads only
    server = ApiServer(app.resolve, hub=hub).start()
    port = server.httpd.server_port

    def open_stream(task_id: str) -> socket.socket:
        s = socket.create_connection(("127.0.0.1", port))
        s.sendall(f"GET /tasks/{task_id}/events HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
                  "Accept: text/event-stream\r\n\r\n".encode())  # fmt: skip
        return s

    try:
        for task_id in tasks[:2]:
            s = open_stream(task_id)
            assert s.recv(12) == b"HTTP/1.1 200"
            s.recv(65536)  # its first events: the stream is now idle, waiting for the task
            s.close()  # the page navigates away
        time.sleep(2)  # well within the keep-alive period
        third = open_stream(tasks[2])
        status = third.recv(12)
        third.close()
    finally:
        server.stop()
    assert status == b"HTTP/1.1 200", f"streams closed 2 s ago still hold the cap: {status!r}"
