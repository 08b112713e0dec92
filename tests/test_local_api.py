"""The API over HTTP on the local stack (moto, worker processes, the local API server with
auth on as in AWS): each route as a client sees it, with tasks run by real workers."""

from __future__ import annotations

import json
import logging
import socket
import struct
import threading
from typing import Any

import pytest

from agentq.api.http_server import LOCAL_TENANT, ApiServer, dispatch, proxy_event
from agentq.api.models import MAX_BODY_BYTES

from tests.api_support import SCRIPTED, ApiStack
from tests.helpers import call, dynamo, wait_for

APPROVAL = {
    **SCRIPTED,
    "script": {
        "turns": [{"text": "", "tool_calls": [call("request_approval", question="ship it?")]}, {"text": "shipped"}]
    },
    "constraints": {"tools": ["request_approval"]},
}


def test_submit_over_http_returns_202_and_the_task_runs_to_its_result(api_stack: ApiStack) -> None:
    status, body, headers = api_stack.http("POST", "/tasks", SCRIPTED)
    assert status == 202 and body["status"] == "queued" and body["links"]["self"] == f"/tasks/{body['task_id']}"
    assert headers["Location"] == f"/tasks/{body['task_id']}"
    view = api_stack.until(body["task_id"], lambda v: v["status"] == "succeeded")
    assert view["result"] == "hi" and view["tokens"]["input"] > 0 and view["latency"]["pickup_seconds"] >= 0
    assert view["budget"]["used"] == view["tokens"]["total"] and view["activity"] is None
    status, result, _ = api_stack.http("GET", f"/tasks/{body['task_id']}/result")
    assert status == 200 and result["complete"] is True and result["result"] == "hi"


@pytest.mark.parametrize(
    ("payload", "field"),
    [
        ({**SCRIPTED, "constraints": {"max_tokens": 0}}, "constraints.max_tokens"),
        ({**SCRIPTED, "priority": "urgent"}, "priority"),
        ({**SCRIPTED, "constraints": {"tools": ["rm_rf"]}}, "constraints.tools[0]"),
        ({"provider": "scripted", "script": "research"}, "goal"),
    ],
)
def test_invalid_submissions_get_a_422_naming_the_field_and_write_nothing(
    api_stack: ApiStack, payload: Any, field: str
) -> None:
    table = api_stack.stack.settings.table  # type: ignore[union-attr]
    ddb = dynamo(api_stack.stack.store()).client

    def records() -> int:
        """Tasks, submissions and idempotency records: what a submission writes. (Not every item:
        the shared stack's earlier tasks may still be committing steps and events meanwhile.)"""
        count = ddb.scan(TableName=table, Select="COUNT", FilterExpression="sk IN (:m, :s)",
                         ExpressionAttributeValues={":m": {"S": "META"}, ":s": {"S": "META#SUBMISSION"}})  # fmt: skip
        return int(count["Count"])

    before = records()
    code, body, _ = api_stack.http("POST", "/tasks", payload)
    assert code == 422 and body["error"]["field"] == field and body["error"]["code"] == "validation_error"
    assert records() == before


def test_a_body_that_is_not_json_is_a_400_and_an_oversized_one_a_413(api_stack: ApiStack) -> None:
    code, body, _ = api_stack.http("POST", "/tasks", raw=b"{nope")
    assert code == 400 and body["error"] == {
        "code": "invalid_json",
        "message": body["error"]["message"],
        "field": "body",
    }
    code, body, _ = api_stack.http(
        "POST", "/tasks", raw=json.dumps({**SCRIPTED, "goal": "g" * MAX_BODY_BYTES}).encode()
    )
    assert code == 413 and body["error"]["code"] == "body_too_large"


def test_unknown_tasks_and_routes_are_json_404s(api_stack: ApiStack) -> None:
    code, body, _ = api_stack.http("GET", "/tasks/does-not-exist")
    assert code == 404 and body["error"]["code"] == "task_not_found"
    code, body, _ = api_stack.http("GET", "/nowhere")
    assert code == 404 and body["error"]["code"] == "route_not_found"


def test_health_and_the_openapi_document_need_no_key(api_stack: ApiStack) -> None:
    assert api_stack.http("GET", "/health", key=None)[:2] == (200, {"status": "ok", "version": "1.0.0", "live": None})
    code, doc, _ = api_stack.http("GET", "/openapi.json", key=None)
    assert code == 200 and doc["openapi"].startswith("3.1") and doc["security"] == [{"bearer": []}]


def test_requests_without_a_valid_key_are_401(api_stack: ApiStack) -> None:
    for key in (None, "aq_" + "x" * 43, "not-a-key"):
        code, body, headers = api_stack.http("GET", "/tasks", key=key)
        assert code == 401 and body["error"]["code"] == "unauthorized" and headers["WWW-Authenticate"] == "Bearer"
    code, _, _ = api_stack.http(
        "POST", "/tasks", SCRIPTED, headers={"Authorization": f"Basic {api_stack.key}"}, key=None
    )
    assert code == 401


def test_tenant_b_cannot_read_list_cancel_approve_or_fork_tenant_a_s_task(api_stack: ApiStack) -> None:
    task_id = api_stack.submit(APPROVAL)
    api_stack.until(task_id, lambda v: v["status"] == "paused")
    other = api_stack.other_key
    for method, path, body in [
        ("GET", f"/tasks/{task_id}", None),
        ("GET", f"/tasks/{task_id}/result", None),
        ("GET", f"/tasks/{task_id}/trace", None),
        ("POST", f"/tasks/{task_id}/cancel", None),
        ("POST", f"/tasks/{task_id}/approve", {"note": "not yours"}),
        ("POST", f"/tasks/{task_id}/reject", {}),
        ("POST", f"/tasks/{task_id}/budget", {"add_tokens": 10}),
        ("POST", f"/tasks/{task_id}/fork", {"at_step": 1}),
    ]:
        code, data, _ = api_stack.http(method, path, body, key=other)
        assert code == 404 and data["error"]["code"] == "task_not_found", path
    listed = api_stack.http("GET", "/tasks?limit=100&include_children=true", key=other)[1]["tasks"]
    assert task_id not in [t["task_id"] for t in listed]
    assert api_stack.http("GET", f"/tasks/{task_id}")[1]["status"] == "paused"  # untouched
    assert task_id in [t["task_id"] for t in api_stack.http("GET", "/tasks?status=paused&limit=100")[1]["tasks"]]
    assert api_stack.http("POST", f"/tasks/{task_id}/cancel")[0] == 200


def test_control_routes_refuse_bad_input_precisely(api_stack: ApiStack) -> None:
    task_id = api_stack.submit()
    code, body, _ = api_stack.http("POST", f"/tasks/{task_id}/budget", {"add_tokens": "lots"})
    assert code == 422 and body["error"]["field"] == "add_tokens"
    code, body, _ = api_stack.http("POST", f"/tasks/{task_id}/fork", {})
    assert code == 422 and body["error"] == {
        "code": "validation_error",
        "message": "at_step is required",
        "field": "at_step",
    }
    api_stack.until(task_id, lambda v: v["status"] == "succeeded")
    code, body, _ = api_stack.http("POST", f"/tasks/{task_id}/approve", {"note": "ok"})
    assert code == 409 and body["error"]["code"] == "illegal_transition"
    assert api_stack.http("POST", "/tasks/nope/cancel")[0] == 404


def test_an_idempotent_submit_over_http_makes_one_task(api_stack: ApiStack) -> None:
    headers = {"Idempotency-Key": "retry-me-1"}
    first = api_stack.http("POST", "/tasks", SCRIPTED, headers=headers)
    second = api_stack.http("POST", "/tasks", SCRIPTED, headers=headers)
    assert first[0] == second[0] == 202 and first[1]["task_id"] == second[1]["task_id"]
    assert second[2]["Idempotent-Replayed"] == "true"
    assert api_stack.http("POST", "/tasks", {**SCRIPTED, "goal": "other"}, headers=headers)[0] == 409
    assert (
        api_stack.http("POST", "/tasks", SCRIPTED, headers=headers, key=api_stack.other_key)[1]["task_id"]
        != first[1]["task_id"]
    )


def test_trace_and_list_over_http_after_real_workers_ran_the_task(api_stack: ApiStack) -> None:
    script = {
        "turns": [
            {"text": "charging", "tool_calls": [call("charge_card", amount_cents=250, memo="http")]},
            {"text": "paid"},
        ]
    }
    task_id = api_stack.submit({**SCRIPTED, "script": script, "constraints": {"tools": ["charge_card"]}})
    api_stack.until(task_id, lambda v: v["status"] == "succeeded")
    code, trace, _ = api_stack.http("GET", f"/tasks/{task_id}/trace?limit=3")
    assert code == 200 and len(trace["events"]) == 3 and trace["next_cursor"]
    rest = api_stack.http("GET", f"/tasks/{task_id}/trace?cursor={trace['next_cursor']}")[1]
    events = trace["events"] + rest["events"]
    assert [e["type"] for e in events] == [
        "transition",
        "transition",
        "llm_call",
        "tool_call",
        "llm_call",
        "transition",
    ]
    tool = events[3]
    assert (
        tool["name"] == "charge_card"
        and tool["input"] == {"amount_cents": 250, "memo": "http"}
        and tool["side_effects"] is True
    )
    assert tool["output"].startswith("charged 250 cents") and events[1]["worker"].count(":") == 1
    # A second task of this tenant, whatever ran before in this process: a page of one has more after it.
    api_stack.submit({**SCRIPTED, "script": {"turns": [{"text": "another"}]}})
    newest = api_stack.http("GET", "/tasks?limit=1")[1]
    assert len(newest["tasks"]) == 1 and newest["next_cursor"]


def test_a_fan_out_parent_shows_its_children(api_stack: ApiStack) -> None:
    children = [{"goal": f"child {i}", "script": {"turns": [{"text": f"child {i} done"}]}} for i in range(2)]
    script = {
        "turns": [
            {"text": "fan out", "tool_calls": [call("spawn_subagents", subagents=children)]},
            {"text": "all done"},
        ]
    }
    task_id = api_stack.submit(
        {**SCRIPTED, "script": script, "constraints": {"tools": ["spawn_subagents"], "max_tokens": 50_000}}
    )
    view = api_stack.until(task_id, lambda v: v["status"] == "succeeded", timeout=90)
    assert view["children"]["total"] == 2 and view["children"]["by_status"] == {"succeeded": 2}
    child_id = view["children"]["task_ids"][0]
    child = api_stack.http("GET", f"/tasks/{child_id}")[1]
    assert child["parent_id"] == task_id and child["depth"] == 1 and child["root_id"] == task_id
    assert child_id not in [t["task_id"] for t in api_stack.http("GET", "/tasks?limit=100")[1]["tasks"]]
    assert child_id in [
        t["task_id"] for t in api_stack.http("GET", "/tasks?limit=100&include_children=true")[1]["tasks"]
    ]
    spawned = [e for e in api_stack.http("GET", f"/tasks/{task_id}/trace")[1]["events"] if e.get("event") == "spawned"]
    assert len(spawned) == 1 and sorted(spawned[0]["detail"]["children"]) == sorted(view["children"]["task_ids"])


def test_without_an_authorizer_every_request_is_the_local_tenant_and_an_operator() -> None:
    seen: list[Any] = []

    def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
        seen.append(event["requestContext"]["authorizer"])
        return {"statusCode": 200, "headers": {"Content-Type": "application/json"}, "body": "{}"}

    assert dispatch(handler, None, "GET", "/tasks?status=", {}, None)[0] == 200
    # the one local user owns the deployment, and may act for any end user
    assert seen == [{"tenant": LOCAL_TENANT, "operator": True, "act_for_users": True}]
    assert proxy_event("GET", "/tasks?status=", {}, None)["queryStringParameters"] == {"status": ""}


def test_a_client_that_hangs_up_before_its_answer_is_one_log_line_not_a_traceback(
    caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]
) -> None:
    entered, gone = threading.Event(), threading.Event()

    def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
        entered.set()
        gone.wait(10)  # answer only once the client has reset the connection
        return {"statusCode": 200, "headers": {"Content-Type": "text/plain"}, "body": "x" * 1_000_000}

    caplog.set_level(logging.INFO, logger="agentq.local")
    server = ApiServer(handler).start()
    try:
        client = socket.create_connection((server.host, server.httpd.server_port))
        client.sendall(b"GET /health HTTP/1.1\r\nHost: localhost\r\n\r\n")
        assert entered.wait(10)
        client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        client.close()  # a reset: the answer's write fails
        gone.set()
        wait_for(lambda: [r for r in caplog.records if "went away before its answer" in r.getMessage()],
                 timeout=10, what="the log line")  # fmt: skip
    finally:
        server.stop()
    assert "Traceback" not in capsys.readouterr().err


def _body_routes() -> list[tuple[str, str]]:
    from agentq.api.app import build_app, openapi_document

    doc = openapi_document(build_app(None, None, None))  # type: ignore[arg-type]
    return sorted(
        (method.upper(), path.replace("{task_id}", "t-1").replace("{name}", "n").replace("{tier}", "normal")
         .replace("{version}", "1"))
        for path, ops in doc["paths"].items()
        for method, op in ops.items()
        if "requestBody" in op
    )  # fmt: skip


@pytest.mark.parametrize(
    "content_type", [None, "text/plain", "application/x-www-form-urlencoded", "multipart/form-data"]
)
def test_a_body_not_sent_as_json_is_a_415_on_every_route_that_takes_one(
    api_stack: ApiStack, content_type: str | None
) -> None:
    """What a web page can post cross-site without a preflight (a form, text/plain), and a body
    with no Content-Type at all: refused before any route reads it, nothing created."""
    import http.client

    before = len(api_stack.http("GET", "/tasks?limit=100")[1]["tasks"])
    host, port = api_stack.url.removeprefix("http://").split(":")
    for method, path in _body_routes():
        conn = http.client.HTTPConnection(host, int(port), timeout=30)
        headers = {"Authorization": f"Bearer {api_stack.key}"}
        if content_type:
            headers["Content-Type"] = content_type
        conn.request(method, path + ("?path=/a.md" if path.endswith("/document") else ""),
                     body=json.dumps({**SCRIPTED, "name": "n", "text": "t"}).encode(), headers=headers)  # fmt: skip
        response = conn.getresponse()
        body = json.loads(response.read())
        conn.close()
        assert response.status == 415, (method, path, response.status, body)
        assert body["error"]["code"] == "unsupported_media_type" and body["error"]["field"] == "Content-Type"
    assert len(api_stack.http("GET", "/tasks?limit=100")[1]["tasks"]) == before


def test_a_json_body_with_a_charset_is_accepted(api_stack: ApiStack) -> None:
    for content_type in ("application/json", "application/json; charset=utf-8"):
        status, body, _ = api_stack.http("POST", "/tasks", SCRIPTED, headers={"Content-Type": content_type})
        assert status == 202, (content_type, body)


def test_the_console_answers_from_each_app_a_process_builds_not_only_the_last() -> None:
    """A process may build more than one app (a second API in the same process, a test's own):
    each serves the console's pages. The pages' router was one per process, so it read the
    request from the app it was last included in, and the others answered ``/console`` 500
    (``'NoneType' object has no attribute 'path'``)."""
    from agentq.api.app import build_app

    from tests.lambda_support import FakeLambdaContext

    first, second = (build_app(None, None, None) for _ in range(2))  # type: ignore[arg-type]
    for app in (first, second, first):
        for path, status in (("/console", 302), ("/console/", 200), ("/console/console.css", 200)):
            answer = app.resolve(proxy_event("GET", path, {}, None, tenant=None), FakeLambdaContext(30))
            assert answer["statusCode"] == status, (path, answer.get("body", "")[:300])
