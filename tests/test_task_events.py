"""``GET /tasks/{id}/events`` over HTTP on the local stack (auth on, real workers): the stream's
framing, resumption with ``Last-Event-ID`` or ``?after=``, JSON pages, the tree, and bad input
answered before any event."""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

import pytest

from agentq.api.client import Client, InvalidRequest, NotFound

from tests.api_support import SCRIPTED, ApiStack
from tests.helpers import call

TWO_TURNS = {
    **SCRIPTED,
    "constraints": {"tools": ["lookup"]},
    "script": {
        "turns": [{"text": "thinking", "tool_calls": [call("lookup", query="alpha", size=20)]}, {"text": "done"}]
    },
}


def _sse(api: ApiStack, path: str, *, last_id: str | None = None, key: str | None = None) -> tuple[int, str]:
    headers = {"Accept": "text/event-stream", "Authorization": f"Bearer {key or api.key}"}
    if last_id:
        headers["Last-Event-ID"] = last_id
    req = urllib.request.Request(api.url + path, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


def _frames(body: str) -> list[dict[str, str]]:
    out = []
    for block in body.split("\n\n"):
        fields: dict[str, str] = {}
        for line in block.splitlines():
            name, _, value = line.partition(": ")
            fields[name] = value
        if fields:
            out.append(fields)
    return out


def _finished(api: ApiStack, body: dict[str, Any] = TWO_TURNS) -> tuple[str, list[dict[str, Any]]]:
    task_id = api.submit(body)
    api.until(task_id, lambda v: v["status"] == "succeeded")
    client = Client(api.url, api.key)
    return task_id, [e.model_dump() for e in client.iter_events(task_id)]


def test_a_stream_sends_each_committed_event_with_its_id_in_commit_order_then_ends(api_stack: ApiStack) -> None:
    task_id = api_stack.submit(TWO_TURNS)
    events = list(Client(api_stack.url, api_stack.key).iter_events(task_id))  # follows it live until the end
    committed = [e for e in events if e.committed]
    assert [(e.type, e.data.get("status") or e.data.get("text")) for e in committed] == [
        ("task.created", "queued"),
        ("task.status", "running"),
        ("agent.message", "thinking"),
        ("agent.tool_results", None),
        ("agent.message", "done"),
        ("task.status", "succeeded"),
    ]
    tool_call = committed[3].data["tool_calls"][0]
    assert (tool_call["name"], tool_call["input"], tool_call["step"]) == ("lookup", {"query": "alpha", "size": 20}, 2)
    assert all(e.task_id == task_id and e.id and e.id.startswith(f"{task_id}:") for e in committed)
    assert len({e.id for e in committed}) == len(committed)
    status, body = _sse(api_stack, f"/tasks/{task_id}/events")
    frames = _frames(body)
    assert status == 200 and frames[0]["retry"] == "1000" and frames[-1] == {"event": "end", "data": "{}"}
    for frame, event in zip(frames[:-1], committed, strict=True):
        assert frame["id"] == event.id and frame["event"] == event.type
        assert json.loads(frame["data"])["id"] == event.id


def _blocks(body: str) -> list[dict[str, str]]:
    """The blocks of a stream as a generic SSE client reads them (httpx-sse, for one, hands on
    every block that has a field as an event): their fields, comments left out."""
    out = []
    for block in body.split("\n\n"):
        fields: dict[str, str] = {}
        for line in block.splitlines():
            if line and not line.startswith(":"):
                name, _, value = line.partition(":")
                fields[name] = value.removeprefix(" ")
        if fields:
            out.append(fields)
    return out


def test_no_block_of_a_stream_is_an_event_without_data_the_first_event_carries_retry(api_stack: ApiStack) -> None:
    from agentq.api.http_server import dispatch

    task_id = api_stack.submit(TWO_TURNS)
    server = api_stack.stack.api_server
    assert server is not None
    headers = {"Accept": "text/event-stream", "Authorization": f"Bearer {api_stack.key}"}
    live = urllib.request.urlopen(urllib.request.Request(f"{api_stack.url}/tasks/{task_id}/events", headers=headers))
    with live:  # the long-lived stream (api/event_hub.py), read as it comes
        head = b""
        while b"\n\n" not in head:
            head += live.read1(4096)
    first = _blocks(head.decode())[0]
    assert first["retry"] == "1000" and json.loads(first["data"])["type"] == "task.created"
    api_stack.until(task_id, lambda v: v["status"] == "succeeded")
    for path in (f"/tasks/{task_id}/events", f"/tasks/{task_id}/events?tree=true"):
        status, body = _sse(api_stack, path)  # the local server's stream
        _, _, finite = dispatch(server.handler, server.authorizer, "GET", path, headers, None)  # the API Lambda's
        assert status == 200
        for blocks in (_blocks(body), _blocks(finite.decode())):
            assert blocks[0]["retry"] == "1000" and "id" in blocks[0]
            assert all("data" in b for b in blocks) and sum("retry" in b for b in blocks) == 1, blocks


def test_reconnecting_after_any_event_gets_exactly_the_events_after_it(api_stack: ApiStack) -> None:
    task_id, events = _finished(api_stack)
    ids = [e["id"] for e in events]
    for i, last in enumerate(ids[:-1]):
        status, body = _sse(api_stack, f"/tasks/{task_id}/events", last_id=last)
        assert status == 200
        assert [f["id"] for f in _frames(body) if "id" in f] == ids[i + 1 :]
        page = Client(api_stack.url, api_stack.key).events(task_id, after=last)
        assert [e.id for e in page.events] == ids[i + 1 :] and page.done
    assert _sse(api_stack, f"/tasks/{task_id}/events", last_id=ids[-1])[0] == 204  # ended: nothing to resume


def test_json_pages_of_one_event_put_together_are_the_stream(api_stack: ApiStack) -> None:
    task_id, events = _finished(api_stack)
    client = Client(api_stack.url, api_stack.key)
    got, after = [], None
    while True:
        page = client.events(task_id, after=after, limit=1)
        got += [e.id for e in page.events]
        after = page.next_cursor
        if page.done:
            break
    assert got == [e["id"] for e in events]


def test_the_tree_streams_the_task_and_each_sub_agent_naming_its_task(api_stack: ApiStack) -> None:
    children = [{"goal": f"c{i}", "script": {"turns": [{"text": f"child {i}"}]}} for i in range(2)]
    body = {
        "goal": "fan out",
        "provider": "scripted",
        "constraints": {"tools": ["spawn_subagents"]},
        "script": {"turns": [{"text": "", "tool_calls": [call("spawn_subagents", subagents=children)]},
                             {"text": "summary"}]},
    }  # fmt: skip
    task_id = api_stack.submit(body)
    events = list(Client(api_stack.url, api_stack.key).iter_events(task_id, tree=True))
    spawned = next(e for e in events if e.type == "task.spawned")
    kids = spawned.data["children"]
    assert {e.task_id for e in events} == {task_id, *kids}
    for kid in kids:
        texts = [e.data.get("text") for e in events if e.task_id == kid and e.type == "agent.message"]
        assert texts and str(texts[0]).startswith("child")
        assert [e.data["status"] for e in events if e.task_id == kid and e.type == "task.status"][-1] == "succeeded"
    assert events[-1].task_id == task_id or all(e.committed for e in events)
    assert [e.data["status"] for e in events if e.task_id == task_id and e.type == "task.status"][-1] == "succeeded"
    last = [e.id for e in events if e.id][-1]
    assert last and last.startswith("tree:")
    assert _sse(api_stack, f"/tasks/{task_id}/events?tree=true", last_id=last)[0] == 204


def _cursor_of(other: str) -> str:
    return f"tree:{other}~1.0.0.0"


@pytest.mark.parametrize("accept", ["text/event-stream", "application/json"])
def test_bad_input_is_answered_before_any_event(api_stack: ApiStack, accept: str) -> None:
    task_id, _ = _finished(api_stack, SCRIPTED)
    other = api_stack.submit(SCRIPTED)

    def get(path: str, key: str | None = None, **headers: str) -> tuple[int, Any]:
        hdrs = {"Accept": accept, "Authorization": f"Bearer {key or api_stack.key}", **headers}
        req = urllib.request.Request(api_stack.url + path, headers=hdrs)
        try:
            with urllib.request.urlopen(req, timeout=30) as resp:
                return resp.status, resp.read()
        except urllib.error.HTTPError as err:
            return err.code, json.loads(err.read())

    assert get(f"/tasks/{'0' * 32}/events")[0] == 404
    status, body = get(f"/tasks/{task_id}/events", key=api_stack.other_key)  # another tenant's task
    assert status == 404 and body["error"]["code"] == "task_not_found"
    for cursor, field in [
        ("garbage", "after"),
        (f"{task_id}:1e400", "after"),
        (f"{task_id}:1.0.0.99999999999", "after"),
        (f"{other}:1.0.0.0", "after"),  # another task's
        (f"{task_id}:999999.0.0.0", "after"),  # past the end
        (_cursor_of(other), "after"),  # a tree's, without tree=true
    ]:
        status, body = get(f"/tasks/{task_id}/events?after={urllib.parse.quote(cursor)}")
        assert (status, body["error"]["code"], body["error"]["field"]) == (400, "invalid_cursor", field), cursor
    status, body = get(f"/tasks/{task_id}/events", **{"Last-Event-ID": "1e400"})
    assert (status, body["error"]["field"]) == (400, "Last-Event-ID")
    status, body = get(f"/tasks/{task_id}/events?tree=true&after={_cursor_of(other)}")
    assert status == 400 and body["error"]["code"] == "invalid_cursor"
    assert get(f"/tasks/{task_id}/events?limit=0")[0] == 422


def test_the_client_raises_the_api_errors_of_a_stream(api_stack: ApiStack) -> None:
    client = Client(api_stack.url, api_stack.key)
    with pytest.raises(NotFound):
        next(client.iter_events("0" * 32))
    with pytest.raises(InvalidRequest) as err:
        next(client.iter_events(api_stack.submit(SCRIPTED), after="nonsense"))
    assert err.value.field == "after"


def test_behind_the_web_adapter_the_tenant_is_the_authorizers_from_the_request_context() -> None:
    from agentq.api.http_server import context_tenant, dispatch

    assert context_tenant(json.dumps({"authorizer": {"tenant": "team-a"}, "stage": "prod"})) == {"tenant": "team-a"}
    got = context_tenant(json.dumps({"authorizer": {"tenant": "team-a", "user": "alice", "principalId": "x"}}))
    assert got == {"tenant": "team-a", "user": "alice"}  # a token's user reaches the stream too
    for header in (None, "{}", json.dumps({"authorizer": {}}), json.dumps({"authorizer": {"tenant": ""}})):
        with pytest.raises(PermissionError):
            context_tenant(header)
    # no request context: refused before the handler runs (it is never called)
    status, _, body = dispatch(None, context_tenant, "GET", f"/tasks/{'0' * 32}/events", {}, None)
    assert status == 401 and json.loads(body)["error"]["code"] == "unauthorized"


def test_the_event_stream_function_reads_the_table_only_in_the_watched_tasks_partition(
    moto_server: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The events function's role may read only ``TASK#`` partitions (``infra/events.py``): it is
    an internet-facing server, and the rest of the table holds tenants' webhook signing secrets,
    API key items, idempotency records and the vault. Its server, built here as
    ``functions/events/server.py`` builds it (the API's app, the hub, the tenant from the
    request context), answers a task's JSON page, its tree's and its stream with every table
    call naming that task's partition and no other."""
    from agentq.api.app import build_app
    from agentq.api.event_hub import EventHub
    from agentq.api.gateway_proxy import REQUEST_CONTEXT
    from agentq.api.http_server import ApiServer, context_tenant
    from agentq.control.submit import submit
    from agentq.core.engine import Engine, EngineConfig
    from agentq.runtime import build_fanout, build_mcp, build_queues, build_registry, build_store

    from tests.helpers import deployment, dynamodb_partitions, scripted

    settings = deployment(moto_server)
    store, registry, queues = build_store(settings), build_registry(settings), build_queues(settings)
    task = submit(store, registry, scripted([{"text": "done"}]), tenant="acme", queues=queues)
    Engine(store, worker_id="w:1", tools=registry, config=EngineConfig(lease_seconds=5)).run(task.task_id)
    app = build_app(store, registry, queues, build_fanout(settings), default_tenant=None,
                    defaults=settings.defaults, mcp=build_mcp())  # fmt: skip
    server = ApiServer(app.resolve, authorizer=context_tenant, hub=EventHub(store)).start()
    calls = dynamodb_partitions(monkeypatch, settings.names.table)
    context = json.dumps({"authorizer": {"tenant": "acme"}})
    try:
        for query, accept in (("", "application/json"), ("?tree=true", "application/json"), ("", "text/event-stream")):
            req = urllib.request.Request(f"{server.url}/tasks/{task.task_id}/events{query}",
                                         headers={"Accept": accept, REQUEST_CONTEXT: context})  # fmt: skip
            with urllib.request.urlopen(req, timeout=30) as resp:
                assert resp.status == 200 and resp.read()
    finally:
        server.stop()
    assert calls, "no table call recorded"
    assert all(pks and all(pk == f"TASK#{task.task_id}" for pk in pks) for _, pks in calls), calls
