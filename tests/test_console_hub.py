"""The console follows a task from the events hub when the deployment names one (``GET /health``),
and from the API's own route when the hub is gone, in a real browser (Debian's chromium via
playwright, as tests/test_console.py) against ``agentq dev``'s stack with its hub and auth."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from agentq.api.client import Client
from agentq_dev.stack import LocalStack

from tests.helpers import call
from tests.test_console import CHROMIUM, CHROMIUM_ARGS, ROOT, TIMEOUT_MS, pytestmark  # noqa: F401

# The task waits for approval until its page follows it (the page opens a stream only for a task
# not yet ended, however slowly the browser loads it), then runs to its end.
BODY = {
    "goal": "look three things up",
    "provider": "scripted",
    "script": {"turns": [
        {"text": "", "tool_calls": [call("request_approval", question="Follow me?")]},
        *({"text": f"step {i}", "tool_calls": [call("lookup", query=f"q{i}", size=20)], "latency_seconds": 0.4}
          for i in range(3)),
        {"text": "streamed to the end"},
    ]},
    "constraints": {"tools": ["lookup", "request_approval"]},
}  # fmt: skip


@pytest.fixture(scope="module")
def stack() -> Iterator[LocalStack]:
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH", "")]))
    with LocalStack(prefix="conhub", workers=2, auth=True, events_hub=True, tool_modules=("tests.effect_tools",),
                    extra_env={"PYTHONPATH": path}) as running:  # fmt: skip
        yield running


def test_the_console_follows_the_hub_and_the_apis_route_when_the_hub_is_gone(stack: LocalStack) -> None:
    from playwright.sync_api import sync_playwright

    assert stack.api_server is not None and stack.hub_server is not None
    key = stack.create_api_key("team-a")
    client = Client(stack.api_server.url, key)
    hub = stack.hub_server.url
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_context().new_page()
            page.set_default_timeout(TIMEOUT_MS)
            responses: list[tuple[int, str]] = []
            page.on("response", lambda r: responses.append((r.status, r.url)))
            errors: list[str] = []
            page.on("console", lambda m: errors.append(m.text))
            page.goto(stack.api_server.url + "/console")
            page.wait_for_selector("#key-dialog[open]")
            page.fill("#key-input", key)
            page.press("#key-input", "Enter")
            page.wait_for_selector("table.tasks")

            for hub_up in (True, False):
                if not hub_up:
                    stack.stop_hub()  # the page was loaded with the hub named: it must fall back
                task_id = client.submit(BODY).task_id
                client.wait_for(task_id, lambda v: v.status == "paused", timeout=60)
                page.evaluate("window.agentqStream = null")  # the last task's, until this one's page replaces it
                page.goto(f"{stack.api_server.url}/console/#/tasks/{task_id}")
                page.wait_for_function("() => window.agentqStream && window.agentqStream.streaming === true",
                                       timeout=60_000)  # fmt: skip
                client.approve(task_id)
                page.wait_for_function("() => window.agentqStream && window.agentqStream.ended === 'ended'",
                                       timeout=60_000)  # fmt: skip
                assert page.evaluate("window.agentqStream.via") == ("hub" if hub_up else "api"), (errors, responses)
                assert page.evaluate("window.agentqStream.events") >= 6  # its steps and its end, from a stream
                page.wait_for_selector("h1 .badge.s-succeeded")
                from_hub = any(s == 200 and u == f"{hub}/tasks/{task_id}/events" for s, u in responses)
                from_api = any(s == 200 and u == f"{stack.api_server.url}/tasks/{task_id}/events" for s, u in responses)
                assert (from_hub, from_api) == ((True, False) if hub_up else (False, True))
        finally:
            browser.close()


def test_the_console_follows_a_task_from_the_apis_route_while_the_hub_is_full() -> None:
    """The hub at its cap of open streams answers 429: the console takes that as it takes a 5xx
    (the API's route from the last id, the hub again 30 s later). Before, a 429 was "not
    streaming" and the page polled every 1.5 s for the rest of its life. Servers in-process, on
    the in-memory store, without keys."""
    import socket

    from playwright.sync_api import sync_playwright

    from agentq.api.app import build_app
    from agentq.api.event_hub import EventHub
    from agentq.api.http_server import LOCAL_TENANT, ApiServer
    from agentq.api.stream_caps import StreamCaps
    from agentq.core.tools.builtin import default_registry
    from agentq.storage.container import memory_storage

    from tests.storage_conformance._builders import claimed, llm_step

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
        assert full.recv(12) == b"HTTP/1.1 200"
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            try:
                page = browser.new_context().new_page()
                page.set_default_timeout(TIMEOUT_MS)
                responses: list[tuple[int, str]] = []
                page.on("response", lambda r: responses.append((r.status, r.url)))
                page.goto(f"{api.url}/console/#/tasks/{lease.task_id}")
                page.wait_for_function("() => window.agentqStream && window.agentqStream.streaming === true",
                                       timeout=20_000)  # fmt: skip
                assert page.evaluate("window.agentqStream.via") == "api"
                store.steps.commit(lease, 1, llm_step(text="from the api"), root_id=lease.task_id)
                page.wait_for_function("() => (window.agentqStream.events || 0) >= 3", timeout=20_000)  # its step too
                assert page.evaluate("window.agentqStream.fallback") is None
            finally:
                browser.close()
    finally:
        full.close()
        api.stop()
        hub.stop()
    assert (429, f"{hub.url}/tasks/{lease.task_id}/events") in responses
