"""The conversation routes through the real Lambda handler: send, list, interrupt, close; each
refusal with its status, code and field; tenant isolation."""

from __future__ import annotations

from agentq.core.models import TaskStatus

from tests.test_api_routes import SUB, Api, api, error

__all__ = ["api"]  # the module-scoped deployment of tests/test_api_routes.py

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
