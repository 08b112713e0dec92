"""A submission answered with an error made nothing, and a keyed retry finds what the first
request made (docs/TASKS.md, docs/API.md POST /tasks): through the real Lambda handler on moto,
as tests/test_api_routes.py does, with a module fixture of our own on the shared moto server."""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from agentq_dev.moto_server import MotoServer

from tests.test_api_routes import SUB, A, Api, lambda_api


@pytest.fixture(scope="module")
def api(moto_server: MotoServer) -> Iterator[Api]:
    yield from lambda_api(moto_server, "s")


def _tasks(api: Api) -> int:
    from tests.helpers import dynamo

    count = dynamo(api.store).client.scan(
        TableName=api.settings.table, Select="COUNT", FilterExpression="sk = :m",
        ExpressionAttributeValues={":m": {"S": "META"}, }, )  # fmt: skip
    return int(count["Count"])


def test_a_submission_whose_admission_raises_is_answered_with_an_error_and_leaves_no_task(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The admission (FairShare.admit: reads and writes of the running slots, a throttled
    DynamoDB call) is undone as a failed enqueue is: else the 500 left a queued task with no
    message, which the sweeper runs later, and a retry without a key made a second one."""
    from agentq.queueing.fairness import FairShare

    def throttled(self: FairShare, *args: Any, **kwargs: Any) -> Any:
        raise ConnectionError("DynamoDB throttled the slots' read")

    before = _tasks(api)
    key = f"admit-{uuid.uuid4().hex}"
    with monkeypatch.context() as m:
        m.setattr(FairShare, "admit", throttled)
        status, data, _ = api.call("POST", "/tasks", SUB, headers={"Idempotency-Key": key})
    assert status == 500, data
    assert _tasks(api) == before  # no task (and no key record: the retry below creates it)
    status, data, _ = api.call("POST", "/tasks", SUB, headers={"Idempotency-Key": key})
    assert status == 202 and data["created"] is True, data


@pytest.mark.parametrize(
    ("first", "again"),
    [
        ({"metadata": {"a": "1", "b": "2"}}, {"metadata": {"b": "2", "a": "1"}}),  # JSON objects are unordered
        ({"constraints": {"max_cost_usd": 1}}, {"constraints": {"max_cost_usd": 1.0}}),  # one JSON number
    ],
)
def test_the_same_key_with_the_same_body_written_otherwise_returns_the_same_task(
    api: Api, first: dict[str, Any], again: dict[str, Any]
) -> None:
    """A retry of the same request serialised by another encoder (a dict field's keys in another
    order, 1.0 for 1) is the same request: before, request_hash kept both as parsed, a 409."""
    key = {"Idempotency-Key": f"k-{uuid.uuid4().hex}"}
    status, made, _ = api.call("POST", "/tasks", {**SUB, **first}, headers=key)
    assert status == 202
    status, data, _ = api.call("POST", "/tasks", {**SUB, **again}, headers=key)
    assert status == 202 and data["task_id"] == made["task_id"] and data["created"] is False, data


def test_a_key_bound_by_the_release_before_the_canonical_hash_still_finds_its_task(api: Api) -> None:
    """A record the older release wrote (its hash of the dump as parsed) lives 24 hours: a
    retry across the upgrade finds its task, not a 409."""
    from agentq.control.submit import legacy_request_hash, parse_submission

    body = {**SUB, "metadata": {"b": "2", "a": "1"}}
    key = f"k-{uuid.uuid4().hex}"
    submission = parse_submission(body)
    task, _ = api.store.tasks.create_idempotent(
        submission, tenant=A, key=key, request_hash=legacy_request_hash(submission)
    )
    status, data, _ = api.call("POST", "/tasks", body, headers={"Idempotency-Key": key})
    assert status == 202 and data["task_id"] == task.task_id and data["created"] is False, data


def test_a_keyed_retry_of_a_submission_that_was_created_returns_its_task_even_if_its_alias_is_gone_since(
    api: Api,
) -> None:
    """The key is looked up before the request is resolved and checked again: before, a retry
    whose agent alias was deleted meanwhile was a 422 "no alias" for a task that exists and
    runs, and a client whose first answer was lost concluded nothing was made."""
    tenant = f"t-{uuid.uuid4().hex[:8]}"
    made = {"name": "greeter", "provider": "scripted", "script": {"turns": [{"text": "hi"}]}}
    assert api.call("POST", "/agents", made, tenant=tenant)[0] == 201
    alias = {"versions": [{"version": 1, "weight": 100}]}
    assert api.call("PUT", "/agents/greeter/aliases/prod", alias, tenant=tenant)[0] == 200
    body = {"goal": "say hi", "agent": "greeter@prod"}
    key = {"Idempotency-Key": f"k-{uuid.uuid4().hex}"}
    status, first, _ = api.call("POST", "/tasks", body, tenant=tenant, headers=key)
    assert status == 202 and first["created"] is True
    assert api.call("DELETE", "/agents/greeter/aliases/prod", tenant=tenant)[0] == 200
    status, again, _ = api.call("POST", "/tasks", body, tenant=tenant, headers=key)
    assert status == 202, again
    assert again["task_id"] == first["task_id"] and again["created"] is False
    status, data, _ = api.call("POST", "/tasks", {**body, "goal": "other"}, tenant=tenant, headers=key)
    assert status == 409 and data["error"]["code"] == "idempotency_conflict", data  # looked up first too


def test_a_keyed_retry_racing_a_first_request_whose_enqueue_fails_never_answers_202_for_a_deleted_task(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A client that timed out retries with its Idempotency-Key while the first request is still
    sending to SQS; the retry finds the task, sends its message again and answers 202. Then the
    first request's send fails: before, it deleted the task and the key's record, and the retry's
    caller held an id answering 404. Now the retry's mark keeps the task (it has the retry's
    message), and the first request answers it too."""
    from agentq.queueing.queues import TaskQueues

    original = TaskQueues.send
    first_in_send = threading.Event()
    retry_answered = threading.Event()

    def send(self: TaskQueues, *args: Any, **kwargs: Any) -> Any:
        if threading.current_thread().name == "first":
            first_in_send.set()
            assert retry_answered.wait(30)
            raise ConnectionError("SQS is down")
        return original(self, *args, **kwargs)

    key = f"race-{uuid.uuid4().hex}"
    answers: dict[str, Any] = {}

    def first() -> None:
        answers["first"] = api.call("POST", "/tasks", SUB, headers={"Idempotency-Key": key})

    with monkeypatch.context() as m:
        m.setattr(TaskQueues, "send", send)
        thread = threading.Thread(target=first, name="first")
        thread.start()
        assert first_in_send.wait(30)
        answers["retry"] = api.call("POST", "/tasks", SUB, headers={"Idempotency-Key": key})
        retry_answered.set()
        thread.join(30)
    status, data, _ = answers["retry"]
    assert status == 202 and data["created"] is False, data
    code, view, _ = api.call("GET", f"/tasks/{data['task_id']}")
    assert code == 200, f"the retry answered 202 for task {data['task_id']}, which is gone: {view}"
    assert answers["first"][0] == 202 and answers["first"][1]["task_id"] == data["task_id"], answers["first"]


def _as_user(api: Api, tenant: str, user: str, body: dict[str, Any], key: str) -> tuple[int, Any]:
    from agentq.api.http_server import proxy_event

    from tests.lambda_support import FakeLambdaContext

    event = proxy_event("POST", "/tasks", {"Content-Type": "application/json", "Idempotency-Key": key},
                        json.dumps(body), context={"tenant": tenant, "user": user})  # fmt: skip
    answer = api.handler.lambda_handler(event, FakeLambdaContext(30))
    return answer["statusCode"], json.loads(answer["body"])


def test_a_tenant_key_s_idempotency_key_never_collides_with_an_end_user_s(api: Api) -> None:
    """A user's key is scoped by its user with a character the key's pattern excludes (a space):
    before, "#", and a key may hold "#", so the tenant's own "alice#k" and alice's "k" were one
    record, and alice's first use of "k" was a 409 for a key she never sent."""
    tenant = f"t-{uuid.uuid4().hex[:8]}"
    made = {"name": "greeter", "provider": "scripted", "script": {"turns": [{"text": "hi"}]}}
    assert api.call("POST", "/agents", made, tenant=tenant)[0] == 201
    body = {"goal": "say hi", "agent": "greeter"}  # what a token may submit
    key = uuid.uuid4().hex
    status, _, _ = api.call("POST", "/tasks", body, tenant=tenant, headers={"Idempotency-Key": f"alice#{key}"})
    assert status == 202
    status, data = _as_user(api, tenant, "alice", body, key)
    assert status == 202 and data["created"] is True, data


def test_a_user_s_retry_of_a_request_keyed_by_the_previous_release_finds_its_task(api: Api) -> None:
    """A record the previous release wrote under "{user}#{key}" lives 24 hours: the user's retry
    across the upgrade finds its task (its request and user match), not a second one."""
    from agentq.control.submit import parse_submission, request_hash

    tenant = f"t-{uuid.uuid4().hex[:8]}"
    made = {"name": "greeter", "provider": "scripted", "script": {"turns": [{"text": "hi"}]}}
    assert api.call("POST", "/agents", made, tenant=tenant)[0] == 201
    body = {"goal": "say hi", "agent": "greeter"}
    key = uuid.uuid4().hex
    sent = parse_submission({**body, "user": "alice"})  # as the route hashes it: with its user
    resolved = parse_submission(
        {"goal": "say hi", "provider": "scripted", "script": made["script"], "user": "alice"}
    )  # the task as it was made
    task, _ = api.store.tasks.create_idempotent(
        resolved, tenant=tenant, key=f"alice#{key}", request_hash=request_hash(sent)
    )
    status, data = _as_user(api, tenant, "alice", body, key)
    assert status == 202 and data["task_id"] == task.task_id and data["created"] is False, data
