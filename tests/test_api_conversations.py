"""The conversation routes through the real Lambda handler: send, list, interrupt, close; each
refusal with its status, code and field; tenant isolation."""

from __future__ import annotations

import json

from agentq.api.http_server import proxy_event
from agentq.core.models import MAX_MESSAGE_CHARS, TaskStatus

from tests.lambda_support import FakeLambdaContext
from tests.test_api_routes import SUB, A, Api, api, error

__all__ = ["api"]  # the module-scoped deployment of tests/test_api_routes.py

LAMBDA_RESPONSE_BYTES = 6 * 1024 * 1024  # a synchronous invocation's answer; API Gateway answers 502 past it
TWO_TURNS = {"goal": "say hi", "provider": "scripted", "script": {"turns": [{"text": "hi"}, {"text": "hello again"}]}}


def test_a_follow_up_is_accepted_and_the_agent_answers_it_in_the_same_task(api: Api) -> None:
    task_id = api.submit(TWO_TURNS)
    api.run(task_id)
    status, data, _ = api.call("POST", f"/tasks/{task_id}/messages", {"text": "and again?"})
    assert status == 202, data
    assert data["status"] == "queued" and data["reopened"] is True and data["seq"] == 1 and not data["replayed"]
    api.run(task_id)
    status, task, _ = api.call("GET", f"/tasks/{task_id}")
    assert task["status"] == "succeeded" and task["result"] == "hello again"
    status, listed, _ = api.call("GET", f"/tasks/{task_id}/messages")
    assert status == 200
    assert [(m["seq"], m["text"], m["delivered"]) for m in listed["messages"]] == [(1, "and again?", True)]


def test_a_retried_send_with_the_same_idempotency_key_sends_nothing_twice(api: Api) -> None:
    task_id = api.submit()
    first = api.call("POST", f"/tasks/{task_id}/messages", {"text": "once"}, headers={"Idempotency-Key": "m-1"})
    again = api.call("POST", f"/tasks/{task_id}/messages", {"text": "once"}, headers={"Idempotency-Key": "m-1"})
    assert first[0] == again[0] == 202
    assert again[1]["message_id"] == first[1]["message_id"] and again[1]["replayed"] is True
    assert again[2].get("Idempotent-Replayed") == "true"
    other = api.call("POST", f"/tasks/{task_id}/messages", {"text": "other"}, headers={"Idempotency-Key": "m-1"})
    assert other[0] == 409 and error(other[1])["code"] == "idempotency_conflict"
    assert len(api.call("GET", f"/tasks/{task_id}/messages")[1]["messages"]) == 1


def test_a_retried_send_that_raises_the_budget_raises_it_once_and_a_refused_one_raises_nothing(api: Api) -> None:
    task_id = api.submit(TWO_TURNS)
    lease, _ = api.store.tasks.claim(task_id, "w", 5)  # type: ignore[misc]
    api.store.tasks.transition(task_id, TaskStatus.COST_EXCEEDED, lease=lease)
    cap = api.store.budgets.get(task_id).cap
    raising = {"text": "more", "add_tokens": 1000}
    first = api.call("POST", f"/tasks/{task_id}/messages", raising, headers={"Idempotency-Key": "once"})
    again = api.call("POST", f"/tasks/{task_id}/messages", raising, headers={"Idempotency-Key": "once"})
    assert first[0] == again[0] == 202 and first[1]["reopened"] is True and again[1]["replayed"] is True
    more = {"text": "more", "add_tokens": 2000}
    other = api.call("POST", f"/tasks/{task_id}/messages", more, headers={"Idempotency-Key": "once"})
    assert other[0] == 409 and error(other[1])["code"] == "idempotency_conflict"
    assert api.call("POST", f"/tasks/{task_id}/close")[0] == 200
    refused = api.call("POST", f"/tasks/{task_id}/messages", raising)
    assert refused[0] == 409 and error(refused[1])["code"] == "message_refused"
    assert api.store.budgets.get(task_id).cap == cap + 1000  # once, by the message that was taken


def test_bad_messages_are_refused_with_the_field_named_and_change_nothing(api: Api) -> None:
    task_id = api.submit()
    for body, field in (({}, "text"), ({"text": ""}, "text"), ({"text": "x" * 32_001}, "text"),
                        ({"text": "hi", "add_tokens": -1}, "add_tokens")):  # fmt: skip
        status, data, _ = api.call("POST", f"/tasks/{task_id}/messages", body)
        assert status == 422, (body, data)
        assert field in error(data).get("field", "") + error(data)["message"], data
    assert api.call("GET", f"/tasks/{task_id}/messages")[1]["messages"] == []


def test_a_message_to_a_cancelled_task_is_a_409_with_the_reason(api: Api) -> None:
    task_id = api.submit()
    assert api.call("POST", f"/tasks/{task_id}/cancel")[0] == 200
    status, data, _ = api.call("POST", f"/tasks/{task_id}/messages", {"text": "hello?"})
    assert status == 409 and "was cancelled" in error(data)["message"]


def test_another_tenants_task_is_not_found_for_every_conversation_route(api: Api) -> None:
    task_id = api.submit(SUB, tenant="tenant-b")
    for method, path, body in (
        ("POST", f"/tasks/{task_id}/messages", {"text": "hi"}),
        ("GET", f"/tasks/{task_id}/messages", None),
        ("POST", f"/tasks/{task_id}/interrupt", None),
        ("POST", f"/tasks/{task_id}/close", None),
    ):
        status, data, _ = api.call(method, path, body)
        assert status == 404, (path, data)
    assert api.store.messages.listed(task_id) == []


def test_an_interrupted_task_answers_idle_and_a_closed_conversation_refuses_messages(api: Api) -> None:
    task_id = api.submit(TWO_TURNS)
    status, data, _ = api.call("POST", f"/tasks/{task_id}/interrupt")
    assert (status, data["status"]) == (202, "queued")
    api.run(task_id)  # the claim sees the interrupt before any call
    status, task, _ = api.call("GET", f"/tasks/{task_id}")
    assert task["status"] == "idle" and "waiting for your next message" in task["activity"]
    assert api.call("POST", f"/tasks/{task_id}/interrupt")[1]["status"] == "idle"  # already stopped: as it is
    assert api.call("POST", f"/tasks/{task_id}/close")[0] == 200
    status, data, _ = api.call("POST", f"/tasks/{task_id}/messages", {"text": "hi"})
    assert status == 409 and error(data)["code"] == "message_refused" and "closed" in error(data)["message"]


def test_long_messages_are_listed_in_pages_that_each_fit_one_lambda_answer(api: Api) -> None:
    task_id = api.submit()
    text = "\u00e9" * MAX_MESSAGE_CHARS  # 6 bytes a character in the JSON answer (\u00e9): 192 KB a message
    for _ in range(40):  # 7.7 MB in one answer, unpaginated
        status, data, _ = api.call("POST", f"/tasks/{task_id}/messages", {"text": text})
        assert status == 202, data
    seqs: list[int] = []
    cursor = ""
    for _ in range(40):
        path = f"/tasks/{task_id}/messages" + (f"?cursor={cursor}" if cursor else "")
        answer = api.handler.lambda_handler(proxy_event("GET", path, {}, None, tenant=A), FakeLambdaContext(30))
        assert answer["statusCode"] == 200
        assert len(json.dumps(answer).encode()) < LAMBDA_RESPONSE_BYTES  # the payload, its body escaped again
        page = json.loads(answer["body"])
        assert page["messages"]
        seqs += [m["seq"] for m in page["messages"]]
        cursor = page["next_cursor"]
        if not cursor:
            break
    assert seqs == list(range(1, 41))  # every message once, in order


def test_a_page_of_messages_takes_a_limit_and_refuses_a_cursor_it_did_not_issue(api: Api) -> None:
    task_id, other = api.submit(), api.submit()
    for text in ("one", "two", "three"):
        assert api.call("POST", f"/tasks/{task_id}/messages", {"text": text})[0] == 202
    status, first, _ = api.call("GET", f"/tasks/{task_id}/messages?limit=2")
    assert status == 200 and [m["text"] for m in first["messages"]] == ["one", "two"] and first["next_cursor"]
    status, rest, _ = api.call("GET", f"/tasks/{task_id}/messages?limit=2&cursor={first['next_cursor']}")
    assert [m["text"] for m in rest["messages"]] == ["three"] and rest["next_cursor"] is None
    for query, code, field in (
        (f"cursor={first['next_cursor']}", 400, "cursor"),  # another task's cursor (issued for task_id)
        ("cursor=bm90LW91cnM", 400, "cursor"),  # base64url, not one of ours
        ("limit=0", 422, "limit"),
        ("limit=101", 422, "limit"),
    ):
        status, data, _ = api.call("GET", f"/tasks/{other}/messages?{query}")
        assert (status, error(data).get("field")) == (code, field), (query, data)
    assert status == 422
    assert (
        api.call("GET", f"/tasks/{other}/messages?cursor={first['next_cursor']}")[1]["error"]["code"]
        == "invalid_cursor"
    )
