"""``tree`` means the same on a stream as on a JSON page. The handler reads ``?tree=`` as a
boolean the way the API's every boolean query is read (``yes``, ``on``, ``t``, ``1``, ``true``,
any case), and checks the request (a tree's cursor included) on that reading; the stream the
server then sends (``api/http_server.py``: the events hub, ``agentq dev``) read only ``true``
and ``1``: ``?tree=yes`` was checked as a tree and streamed as the root alone, and with a tree's
id to resume from, refused 400 after the check had passed it."""

from __future__ import annotations

import http.client

import pytest

from agentq.api.app import build_app
from agentq.api.event_hub import EventHub
from agentq.api.http_server import LOCAL_TENANT, ApiServer
from agentq.core.tools.builtin import default_registry
from agentq.storage.container import memory_storage

from tests.storage_conformance._builders import claimed


@pytest.mark.parametrize("value", ["yes", "on", "t", "True"])
def test_a_stream_reads_tree_as_the_json_pages_do(value: str) -> None:
    store = memory_storage()
    lease = claimed(store, tenant=LOCAL_TENANT)
    app = build_app(store, default_registry(), None, default_tenant=LOCAL_TENANT)  # type: ignore[arg-type]  # reads only
    server = ApiServer(app.resolve, hub=EventHub(store, interval=0.05)).start()
    try:
        port = server.httpd.server_port
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        conn.request("GET", f"/tasks/{lease.task_id}/events?tree={value}", headers={"Accept": "application/json"})
        page = conn.getresponse()
        assert page.status == 200 and b'"id":"tree:' in page.read().replace(b" ", b"")  # a tree, as a page
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        conn.request("GET", f"/tasks/{lease.task_id}/events?tree={value}", headers={"Accept": "text/event-stream"})
        stream = conn.getresponse()
        first = stream.read1(4096).decode()
        conn.close()
    finally:
        server.stop()
    assert stream.status == 200 and "\nid: tree:" in first, f"tree={value} streamed as one task: {first[:80]!r}"
