"""A live A2A stream (``SubscribeToTask``, ``SendStreamingMessage``) is authorised again while it
is open, as ``GET /tasks/{id}/events`` is (``api/a2a_stream.py``, ``LiveStream.allowed``): served by
the A2A function's server (``functions/events/server.py``, the events function's), a key revoked
mid-stream stops receiving the task's changes within ``AGENTQ_AUTHORIZER_CACHE_SECONDS``, where
the stream lived its whole 840 s (tests/test_events_function_stream_life.py is the events
stream's own)."""

from __future__ import annotations

import http.client
import json
import threading
import uuid
from typing import Any

import pytest

from agentq.core.agents import AgentSpec
from agentq.storage.container import memory_storage

from tests.helpers import scripted
from tests.test_events_function_stream_life import _events_function_server

CACHE_SECONDS = 2


def _running_task_of_agent(store: Any, tenant: str, name: str) -> str:
    """A task of agent ``name`` that is running and stays so (claimed by a worker that never
    commits): its stream would go on to the stream's end."""
    store.agents.create(tenant, AgentSpec(name=name, provider="scripted", script="research"))
    submission = scripted([{"text": "x"}]).model_copy(update={"agent": f"{name}@1"})
    task_id = store.tasks.create(submission, tenant=tenant).task_id
    assert store.tasks.claim(task_id, "w1", 30) is not None
    return str(task_id)


def _params(method: str, task_id: str) -> dict[str, Any]:
    if method == "SubscribeToTask":
        return {"id": task_id}
    return {"message": {"messageId": uuid.uuid4().hex, "role": "ROLE_USER", "taskId": task_id,
                        "parts": [{"text": "and one more thing"}]}}  # fmt: skip


@pytest.mark.parametrize("method", ["SubscribeToTask", "SendStreamingMessage"])
def test_a_revoked_keys_a2a_stream_ends_within_the_authorizer_cache(
    monkeypatch: pytest.MonkeyPatch, method: str
) -> None:
    monkeypatch.setenv("AGENTQ_AUTHORIZER_CACHE_SECONDS", str(CACHE_SECONDS))
    store = memory_storage()
    _, record = store.api_keys.create("team-a")
    task_id = _running_task_of_agent(store, "team-a", "bot")
    server = _events_function_server(monkeypatch, store)
    conn = http.client.HTTPConnection("127.0.0.1", server.httpd.server_port, timeout=30)
    context = json.dumps({"authorizer": {"tenant": "team-a", "key_id": record.key_id}})
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": method, "params": _params(method, task_id)})
    try:
        conn.request("POST", "/a2a/bot", body=body, headers={
            "Content-Type": "application/json", "A2A-Version": "1.0", "x-amzn-request-context": context})  # fmt: skip
        resp = conn.getresponse()
        assert resp.status == 200 and resp.getheader("Content-Type", "").startswith("text/event-stream")
        first = resp.read1(65536)
        assert b'"task"' in first, first  # open: the task is its first event
        ended = threading.Event()

        def read() -> None:
            resp.read()  # until the server ends the stream
            ended.set()

        threading.Thread(target=read, daemon=True).start()
        assert not ended.wait(CACHE_SECONDS + 1), "the stream ended with its key still live"
        store.api_keys.revoke(record.key_id)
        assert ended.wait(CACHE_SECONDS + 3), "the stream went on after its key was revoked (it lives 840 s)"
    finally:
        server.stop()
