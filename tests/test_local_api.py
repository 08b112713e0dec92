"""The API handler: through API Gateway proxy events and over HTTP on the local stack."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from typing import Any

import pytest

from agentq.local.api_server import proxy_event
from agentq.local.stack import LocalStack

SCRIPTED = {"goal": "say hi", "provider": "scripted", "script": {"turns": [{"text": "hi"}]}}


def _http(method: str, url: str, body: Any = None, raw: bytes | None = None) -> tuple[int, dict[str, Any]]:
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    req = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


@pytest.fixture(scope="module")
def stack() -> Any:
    with LocalStack(prefix="api", workers=1) as s:
        yield s


def test_submit_over_http_returns_202_and_the_task_runs_to_its_result(stack: LocalStack) -> None:
    assert stack.api_server is not None
    status, body = _http("POST", f"{stack.api_server.url}/tasks", SCRIPTED)
    assert status == 202 and body["status"] == "queued" and body["links"]["self"] == f"/tasks/{body['task_id']}"
    deadline = time.monotonic() + 30
    while True:
        status, view = _http("GET", f"{stack.api_server.url}/tasks/{body['task_id']}")
        assert status == 200
        if view["status"] == "succeeded":
            break
        assert time.monotonic() < deadline
        time.sleep(0.1)
    assert view["result"] == "hi" and view["tokens"]["input"] > 0 and view["latency"]["pickup_seconds"] >= 0


@pytest.mark.parametrize(
    ("payload", "status", "field"),
    [
        ({**SCRIPTED, "constraints": {"max_tokens": 0}}, 400, "constraints.max_tokens"),
        ({**SCRIPTED, "priority": "urgent"}, 400, "priority"),
        ({**SCRIPTED, "constraints": {"tools": ["rm_rf"]}}, 400, "constraints.tools[0]"),
        ({"provider": "scripted", "script": "research"}, 400, "goal"),
    ],
)
def test_invalid_submissions_get_a_json_error_naming_the_field(stack: LocalStack, payload: Any, status: int, field: str) -> None:
    assert stack.api_server is not None
    before = stack.store().ddb.scan(TableName=stack.settings.table)["Count"]  # type: ignore[union-attr]
    code, body = _http("POST", f"{stack.api_server.url}/tasks", payload)
    assert code == status and body["error"]["field"] == field and body["error"]["code"] == "validation_error"
    assert stack.store().ddb.scan(TableName=stack.settings.table)["Count"] == before  # type: ignore[union-attr]


def test_a_body_that_is_not_json_is_a_400_naming_the_body(stack: LocalStack) -> None:
    assert stack.api_server is not None
    code, body = _http("POST", f"{stack.api_server.url}/tasks", raw=b"{nope")
    assert code == 400 and body["error"] == {"code": "invalid_json", "message": body["error"]["message"], "field": "body"}


def test_unknown_tasks_and_routes_are_json_404s(stack: LocalStack) -> None:
    assert stack.api_server is not None
    code, body = _http("GET", f"{stack.api_server.url}/tasks/does-not-exist")
    assert code == 404 and body["error"]["code"] == "task_not_found"
    code, body = _http("GET", f"{stack.api_server.url}/nowhere")
    assert code == 404 and body["error"]["code"] == "route_not_found"


def test_another_tenant_s_task_answers_404_not_403(stack: LocalStack) -> None:
    assert stack.api_server is not None
    _, created = _http("POST", f"{stack.api_server.url}/tasks", SCRIPTED)
    from agentq.http_api import build_app
    from agentq.runtime import build_queues, build_registry

    assert stack.settings is not None
    app = build_app(stack.store(), build_registry(stack.settings), build_queues(stack.settings))
    other = app.resolve(proxy_event("GET", f"/tasks/{created['task_id']}", {}, None, tenant="someone-else"), None)
    mine = app.resolve(proxy_event("GET", f"/tasks/{created['task_id']}", {}, None, tenant="local"), None)
    assert other["statusCode"] == 404 and mine["statusCode"] == 200


def test_health(stack: LocalStack) -> None:
    assert stack.api_server is not None
    assert _http("GET", f"{stack.api_server.url}/health") == (200, {"status": "ok"})


def test_control_routes_refuse_bad_input_and_foreign_tenants_precisely(stack: LocalStack) -> None:
    assert stack.api_server is not None
    api = stack.api_server.url
    _, created = _http("POST", f"{api}/tasks", SCRIPTED)
    task_id = created["task_id"]
    assert _http("POST", f"{api}/tasks/{task_id}/budget", {"add_tokens": "lots"})[1]["error"]["field"] == "add_tokens"
    assert _http("POST", f"{api}/tasks/{task_id}/fork", {})[1]["error"] == {"code": "validation_error", "message": "at_step is required", "field": "at_step"}
    code, body = _http("POST", f"{api}/tasks/{task_id}/approve", {"note": "ok"})
    assert code == 409 and body["error"]["code"] == "illegal_transition"
    code, body = _http("POST", f"{api}/tasks/nope/cancel")
    assert code == 404


def test_approve_and_budget_through_the_cli_as_a_person_would(stack: LocalStack) -> None:
    import subprocess
    import sys

    assert stack.api_server is not None
    api = stack.api_server.url
    turns = [{"text": "", "tool_calls": [{"name": "request_approval", "input": {"question": "ship it?"}}]}, {"text": "shipped"}]
    _, created = _http("POST", f"{api}/tasks", {**SCRIPTED, "script": {"turns": turns}, "constraints": {"tools": ["request_approval"]}})
    task_id = created["task_id"]
    deadline = time.monotonic() + 30
    while _http("GET", f"{api}/tasks/{task_id}")[1]["status"] != "paused":
        assert time.monotonic() < deadline
        time.sleep(0.1)

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "agentq", *args, "--url", api], capture_output=True, text=True, timeout=60)

    wrong = cli("reject", "no-such-task")
    assert wrong.returncode == 1 and "no task 'no-such-task'" in wrong.stderr
    done = cli("approve", task_id, "--note", "lgtm")
    assert done.returncode == 0, done.stderr
    while (view := _http("GET", f"{api}/tasks/{task_id}")[1])["status"] != "succeeded":
        assert time.monotonic() < deadline + 30
        time.sleep(0.1)
    assert view["result"] == "shipped"
    again = cli("approve", task_id)
    assert again.returncode == 1 and "not waiting for approval" in again.stderr
    bad = cli("budget", task_id, "--add-tokens", "-5")
    assert bad.returncode == 2 and "(add_tokens)" in bad.stderr
