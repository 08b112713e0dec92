"""agentq as an A2A server: the official ``a2a-sdk`` client against ``/a2a/{agent}`` of the local
stack with auth on (what `agentq dev --auth` serves) and real workers. The Agent Card at the
well-known path; a message runs the agent to a completed task with its result as an artifact
and its usage in the metadata; a task that asks for approval is ``input-required`` with the
question, and a message with the decision resumes it; a stream ends at the pause and
``SubscribeToTask`` resumes it to the end; a running task is cancelled; another tenant's probes
of a task find nothing."""

from __future__ import annotations

import json
import urllib.request
import uuid
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import urlsplit

import anyio
import pytest

from tests.api_support import ApiStack
from tests.helpers import call as tool_call


def _agent(api_stack: ApiStack, turns: list[dict[str, Any]], key: str | None = "default", **fields: Any) -> str:
    name = f"a2a-{uuid.uuid4().hex[:8]}"
    body = {"name": name, "provider": "scripted", "script": {"turns": turns}, "description": "answers", **fields}
    status, data, _ = api_stack.http("POST", "/agents", body, key=key)
    assert status == 201, data
    return name


def _with_client(url: str, key: str | None, work: Callable[[Any], Awaitable[Any]], *, streaming: bool = False) -> Any:
    """``work(client)`` with the SDK's client for the agent at ``url`` (its card resolved first)."""
    import httpx
    from a2a.client import ClientConfig, create_client

    headers = {"Authorization": f"Bearer {key}"} if key else {}

    async def run() -> Any:
        async with httpx.AsyncClient(headers=headers, timeout=60) as http:
            client = await create_client(url, ClientConfig(httpx_client=http, streaming=streaming))
            async with client:
                return await work(client)

    return anyio.run(run)


def _message(text: str, task_id: str | None = None, context_id: str | None = None) -> Any:
    from a2a.types import Message, Part, Role, SendMessageRequest

    message = Message(message_id=uuid.uuid4().hex, role=Role.ROLE_USER, parts=[Part(text=text)])
    if task_id:
        message.task_id = task_id
    if context_id:
        message.context_id = context_id
    return SendMessageRequest(message=message)


async def _final(stream: Any) -> list[Any]:
    return [event async for event in stream]


def _state(task: Any) -> str:
    from a2a.types import TaskState

    return str(TaskState.Name(task.status.state))


APPROVAL_TURNS: list[dict[str, Any]] = [
    {"text": "", "tool_calls": [tool_call("request_approval", question="Ship it?")]},
    {"text": "shipped"},
]


def test_the_agent_card_is_served_at_the_well_known_path_with_the_apis_bearer_scheme(api_stack: ApiStack) -> None:
    name = _agent(api_stack, [{"text": "hi"}], tools=["request_approval"])
    status, card, _ = api_stack.http("GET", f"/a2a/{name}/.well-known/agent-card.json")
    assert status == 200, card
    assert card["name"] == name and card["version"] == "1"
    assert card["supportedInterfaces"][0]["url"] == f"{api_stack.url}/a2a/{name}"
    assert card["supportedInterfaces"][0]["protocolBinding"] == "JSONRPC"
    assert card["securitySchemes"]["bearer"]["httpAuthSecurityScheme"]["scheme"] == "bearer"
    assert card["capabilities"] == {"streaming": True, "pushNotifications": True, "extendedAgentCard": False}
    assert [s["id"] for s in card["skills"]] == [name]
    assert "request_approval" in card["skills"][0]["tags"]
    # The documentation the card points to is the agent's page of the console, which this API serves.
    docs = urlsplit(card["documentationUrl"])
    assert f"{docs.scheme}://{docs.netloc}" == api_stack.url and docs.fragment == f"/agents/{name}"
    with urllib.request.urlopen(card["documentationUrl"].split("#")[0], timeout=30) as page:
        assert page.status == 200 and page.headers["Content-Type"].startswith("text/html")
    # Pinned versions are agents too; an agent of another tenant, or none, is not found.
    assert api_stack.http("GET", f"/a2a/{name}@1/.well-known/agent-card.json")[0] == 200
    assert api_stack.http("GET", f"/a2a/{name}@2/.well-known/agent-card.json")[0] == 404
    assert api_stack.http("GET", f"/a2a/{name}/.well-known/agent-card.json", key=api_stack.other_key)[0] == 404
    assert api_stack.http("GET", f"/a2a/{name}/.well-known/agent-card.json", key=None)[0] == 401


def test_get_extended_agent_card_of_a_card_that_declares_none_is_unsupported_operation(api_stack: ApiStack) -> None:
    """A2A 1.0 3.3.4: an agent whose card says ``extendedAgentCard: false`` answers the method
    with UnsupportedOperationError (-32004); -32007 (not configured) is for one that declares it."""
    name = _agent(api_stack, [{"text": "x"}])
    card = api_stack.http("GET", f"/a2a/{name}/.well-known/agent-card.json")[1]
    assert card["capabilities"]["extendedAgentCard"] is False
    status, data = _rpc(api_stack, name, {"jsonrpc": "2.0", "id": 1, "method": "GetExtendedAgentCard", "params": {}})
    assert status == 200 and data["error"]["code"] == -32004, data


def test_the_card_says_how_long_to_keep_it_and_when_its_version_was_made(api_stack: ApiStack) -> None:
    name = _agent(api_stack, [{"text": "hi"}])
    status, _, headers = api_stack.http("GET", f"/a2a/{name}/.well-known/agent-card.json")
    assert status == 200
    assert "max-age=" in headers["Cache-Control"] and "private" in headers["Cache-Control"]
    assert headers["Last-Modified"].endswith("GMT") and headers["ETag"]
    again = api_stack.http(
        "GET", f"/a2a/{name}/.well-known/agent-card.json", headers={"If-None-Match": headers["ETag"]}
    )
    assert again[0] == 304


def test_a_retried_message_with_an_idempotency_key_starts_one_task_and_other_text_under_it_another(
    api_stack: ApiStack,
) -> None:
    name = _agent(api_stack, [{"text": "x"}])
    first = _send("hello")
    key = {"Idempotency-Key": uuid.uuid4().hex}
    a = _rpc(api_stack, name, first, headers=key)[1]["result"]["task"]["id"]
    b = _rpc(api_stack, name, first, headers=key)[1]["result"]["task"]["id"]  # the same request again: the same task
    other = _send("something else")
    other["params"]["message"]["messageId"] = first["params"]["message"]["messageId"]
    status, data = _rpc(api_stack, name, other, headers=key)
    assert status == 200 and "result" in data, data  # not refused as an idempotency conflict
    assert a == b and data["result"]["task"]["id"] != a
    assert len(_tasks_of(api_stack, name)) == 2
    status, data = _rpc(api_stack, name, first, headers={"Idempotency-Key": "no spaces allowed"})
    assert status == 200 and data["error"]["code"] == -32600, data


def test_without_an_idempotency_key_each_send_is_a_message_of_its_own_even_with_a_reused_message_id(
    api_stack: ApiStack,
) -> None:
    """A2A lets an agent dedupe by message id, but clients reuse ids (the TCK does, one id per
    kind of test): each send of the same message is a new task unless the caller asks for a retry."""
    name = _agent(api_stack, [{"text": "x"}])
    first = _send("hello")
    ids = {_rpc(api_stack, name, first)[1]["result"]["task"]["id"] for _ in range(3)}
    assert len(ids) == 3 and len(_tasks_of(api_stack, name)) == 3


def test_a_message_runs_the_agent_to_a_completed_task_with_its_result_and_usage(api_stack: ApiStack) -> None:
    name = _agent(api_stack, [{"text": "the answer is 42"}])

    async def work(client: Any) -> Any:
        events = await _final(client.send_message(_message("what is the answer?")))
        task = events[-1].task
        got = await client.get_task(_get(task.id))
        return task, got

    task, got = _with_client(f"{api_stack.url}/a2a/{name}", api_stack.key, work)
    assert _state(task) == "TASK_STATE_COMPLETED"
    assert task.artifacts[0].parts[0].text == "the answer is 42"
    usage = dict(task.metadata["agentq"])
    assert usage["status"] == "succeeded" and usage["agent"] == f"{name}@1"
    assert {"steps", "tokensIn", "tokensOut", "costUsd"} <= set(usage)
    assert got.id == task.id and _state(got) == "TASK_STATE_COMPLETED"
    assert got.history[0].parts[0].text == "what is the answer?"
    # The task is an agentq task like any other.
    assert api_stack.http("GET", f"/tasks/{task.id}")[1]["status"] == "succeeded"


def test_a_task_that_ended_takes_no_message_and_its_context_takes_the_next_task(api_stack: ApiStack) -> None:
    name = _agent(api_stack, [{"text": "done"}])
    status, data = _rpc(api_stack, name, _send("first"))
    task = data["result"]["task"]
    assert task["status"]["state"] == "TASK_STATE_COMPLETED"
    status, data = _rpc(api_stack, name, _send("more", taskId=task["id"]))
    assert status == 200 and data["error"]["code"] == -32004, data  # UnsupportedOperationError
    assert api_stack.http("GET", f"/tasks/{task['id']}/messages")[1]["messages"] == []  # nothing was sent
    status, data = _rpc(api_stack, name, _send("next", contextId=task["contextId"]))
    follow = data["result"]["task"]
    assert follow["id"] != task["id"] and follow["contextId"] == task["contextId"]
    listed = _rpc(api_stack, name, {"jsonrpc": "2.0", "id": 5, "method": "ListTasks",
                                    "params": {"contextId": task["contextId"]}})[1]["result"]["tasks"]  # fmt: skip
    assert {t["id"] for t in listed} == {task["id"], follow["id"]}


def _get(task_id: str) -> Any:
    from a2a.types import GetTaskRequest

    return GetTaskRequest(id=task_id)


def test_an_approval_is_input_required_with_its_question_and_a_message_with_the_decision_resumes_it(
    api_stack: ApiStack,
) -> None:
    name = _agent(api_stack, APPROVAL_TURNS, tools=["request_approval"])

    async def work(client: Any) -> Any:
        first = (await _final(client.send_message(_message("ship the release"))))[-1].task
        second = (await _final(client.send_message(_message("approve looks good", task_id=first.id))))[-1].task
        return first, second

    first, second = _with_client(f"{api_stack.url}/a2a/{name}", api_stack.key, work)
    assert _state(first) == "TASK_STATE_INPUT_REQUIRED"
    assert "Ship it?" in first.status.message.parts[0].text
    asked = dict(first.status.message.parts[1].data.struct_value)["agentq"]
    assert asked["kind"] == "approval" and asked["question"] == "Ship it?" and asked["toolUseId"]
    assert _state(second) == "TASK_STATE_COMPLETED"
    assert second.artifacts[0].parts[0].text == "shipped"
    assert _approval(api_stack, first.id) == ("approved", "looks good")


def test_a_task_waiting_for_a_vault_credential_is_auth_required_naming_it(api_stack: ApiStack) -> None:
    """A missing credential is a pause (issue 43 item 4); over A2A it is ``auth-required`` (not
    ``input-required``), its status message naming the credential and the host it is for."""
    ask = {"name": "request_credential", "input": {"name": "jira", "host": "jira.example.com", "reason": "to file it"}}
    name = _agent(api_stack, [{"text": "", "tool_calls": [ask]}, {"text": "filed"}], tools=["request_credential"])

    async def work(client: Any) -> Any:
        return (await _final(client.send_message(_message("file the ticket"))))[-1].task

    task = _with_client(f"{api_stack.url}/a2a/{name}", api_stack.key, work)
    assert _state(task) == "TASK_STATE_AUTH_REQUIRED"
    assert "'jira'" in task.status.message.parts[0].text and "jira.example.com" in task.status.message.parts[0].text
    asked = dict(task.status.message.parts[1].data.struct_value)["agentq"]
    assert asked["kind"] == "credential" and dict(asked["credential"])["name"] == "jira"


def _approval(api_stack: ApiStack, task_id: str) -> tuple[str, str]:
    status, page, _ = api_stack.http("GET", f"/tasks/{task_id}/events?limit=200")
    assert status == 200, page
    (decided,) = [e for e in page["events"] if e["type"] == "approval.decided"]
    return ("approved" if decided["data"]["approved"] else "rejected"), decided["data"].get("note", "")


@pytest.mark.parametrize("text", ["maybe later", "no, use the staging branch", "Approval? what approval"])
def test_any_other_answer_to_an_approval_rejects_it_with_the_message_as_its_note(
    api_stack: ApiStack, text: str
) -> None:
    name = _agent(api_stack, APPROVAL_TURNS, tools=["request_approval"])
    status, data = _rpc(api_stack, name, _send("ship the release"))
    task_id = data["result"]["task"]["id"]
    status, data = _rpc(api_stack, name, _send(text, taskId=task_id))
    assert status == 200 and data["result"]["task"]["status"]["state"] == "TASK_STATE_COMPLETED", data
    verdict, note = _approval(api_stack, task_id)
    assert verdict == "rejected" and note in (text, text.partition(" ")[2])


def test_a_stream_ends_at_the_pause_and_subscribe_resumes_it_to_the_end(api_stack: ApiStack) -> None:
    from a2a.types import SubscribeToTaskRequest

    name = _agent(api_stack, APPROVAL_TURNS, tools=["request_approval"])

    async def work(client: Any) -> Any:
        streamed = await _final(client.send_message(_message("ship it")))
        task_id = streamed[0].task.id
        resumed = []
        async for event in client.subscribe(SubscribeToTaskRequest(id=task_id)):
            resumed.append(event)
            if len(resumed) == 1:  # subscribed to the paused task: now let it go on (approved sooner,
                # it could end before the subscription, which an ended task refuses)
                decided = await anyio.to_thread.run_sync(
                    lambda: api_stack.http("POST", f"/tasks/{task_id}/approve", {})
                )
                assert decided[0] == 200, decided
        return streamed, resumed

    streamed, resumed = _with_client(f"{api_stack.url}/a2a/{name}", api_stack.key, work, streaming=True)
    assert streamed[0].HasField("task")
    assert _state(streamed[-1].status_update) == "TASK_STATE_INPUT_REQUIRED"
    assert resumed[0].HasField("task") and _state(resumed[0].task) == "TASK_STATE_INPUT_REQUIRED"
    assert _state(resumed[-1].status_update) == "TASK_STATE_COMPLETED"
    artifacts = [e.artifact_update.artifact for e in resumed if e.HasField("artifact_update")]
    assert artifacts and artifacts[0].parts[0].text == "shipped"


def test_cancel_ends_a_running_task_and_an_ended_one_is_not_cancelable(api_stack: ApiStack) -> None:
    from a2a.types import CancelTaskRequest, SendMessageConfiguration

    name = _agent(api_stack, [{"text": "slow", "latency_seconds": 30}])

    async def work(client: Any) -> Any:
        request = _message("take your time")
        request.configuration.CopyFrom(SendMessageConfiguration(return_immediately=True))
        started = (await _final(client.send_message(request)))[-1].task
        cancelled = await client.cancel_task(CancelTaskRequest(id=started.id))
        again: Exception | None = None
        try:
            await client.cancel_task(CancelTaskRequest(id=started.id))
        except Exception as exc:
            again = exc
        return started, cancelled, again

    started, cancelled, again = _with_client(f"{api_stack.url}/a2a/{name}", api_stack.key, work)
    assert _state(started) in ("TASK_STATE_SUBMITTED", "TASK_STATE_WORKING")
    assert _state(cancelled) == "TASK_STATE_CANCELED"
    assert api_stack.http("GET", f"/tasks/{started.id}")[1]["status"] == "cancelled"
    assert again is not None and "cancel" in str(again).lower()


def _rpc(api_stack: ApiStack, name: str, body: Any, *, key: str | None = "default", raw: bytes | None = None,
         headers: dict[str, str] | None = None) -> tuple[int, Any]:  # fmt: skip
    status, data, _ = api_stack.http("POST", f"/a2a/{name}", body, key=key, raw=raw,
                                     headers={"A2A-Version": "1.0", **(headers or {})})  # fmt: skip
    return status, data


def _send(text: str, **message: Any) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": {"message": {
        "messageId": uuid.uuid4().hex, "role": "ROLE_USER", "parts": [{"text": text}], **message}}}  # fmt: skip


def _tasks_of(api_stack: ApiStack, name: str) -> list[Any]:
    status, data = _rpc(api_stack, name, {"jsonrpc": "2.0", "id": 9, "method": "ListTasks", "params": {}})
    assert status == 200 and "result" in data, data
    return list(data["result"].get("tasks", []))


def test_a_task_started_over_a2a_carries_the_callers_key_so_the_keys_stop_covers_it(api_stack: ApiStack) -> None:
    """As POST /tasks does: the task records the key it came with (META's ``key_id``), so
    ``agentq stop --key`` cancels it and refuses the key's next message, the key's caps hold its
    calls and a rule reads it as ``context.api_key``. A tenant of its own: a stop refuses a scope."""
    tenant = f"a2a-key-{uuid.uuid4().hex[:8]}"
    key, other = api_stack.stack.create_api_key(tenant), api_stack.stack.create_api_key(tenant)
    key_id = api_stack.stack.keys().lookup(key).key_id  # type: ignore[union-attr]
    name = _agent(api_stack, [{"text": "zzz", "latency_seconds": 20}], key=key)
    send = _send("take your time")
    send["params"]["configuration"] = {"returnImmediately": True}
    status, data = _rpc(api_stack, name, send, key=key)
    assert status == 200 and "result" in data, data
    task_id = data["result"]["task"]["id"]
    assert api_stack.stack.store().tasks.get(task_id).key_id == key_id

    status, stopped, _ = api_stack.http("POST", "/stops", {"key": key_id}, key=other)
    assert status == 200 and stopped["cancelled"] == [task_id], stopped
    status, refused = _rpc(api_stack, name, _send("again"), key=key)
    assert status == 200 and "stopped" in refused["error"]["message"], refused
    assert _rpc(api_stack, name, send, key=other)[1]["result"]["task"]["id"] != task_id  # another key goes on
    api_stack.http("POST", "/stops", {"tenant": tenant}, key=other)  # leave nothing running behind


def test_another_tenants_probes_of_a_task_find_nothing_and_change_nothing(api_stack: ApiStack) -> None:
    name = _agent(api_stack, APPROVAL_TURNS, tools=["request_approval"])
    status, data = _rpc(api_stack, name, _send("ship it"))
    assert status == 200, data
    task_id = data["result"]["task"]["id"]
    assert data["result"]["task"]["status"]["state"] == "TASK_STATE_INPUT_REQUIRED"
    other = api_stack.other_key
    # Another tenant has no agent of that name: the endpoint itself is not found.
    assert api_stack.http("POST", f"/a2a/{name}", _send("x"), key=other)[0] == 404
    # Through an agent of its own, another tenant's task id is the protocol's TaskNotFound, whatever the method.
    mine = f"a2a-{uuid.uuid4().hex[:8]}"
    body = {"name": mine, "provider": "scripted", "script": {"turns": [{"text": "x"}]}}
    assert api_stack.http("POST", "/agents", body, key=other)[0] == 201
    probes = [
        {"method": "GetTask", "params": {"id": task_id}},
        {"method": "CancelTask", "params": {"id": task_id}},
        {"method": "SubscribeToTask", "params": {"id": task_id}},
        _send("approve", taskId=task_id),
    ]
    for probe in probes:
        status, data = _rpc(api_stack, mine, {"jsonrpc": "2.0", "id": 2, **probe}, key=other)
        if isinstance(data, str):  # a stream: its one event is the error
            data = json.loads(data.split("data:", 1)[1])
        assert status == 200 and data["error"]["code"] == -32001, (probe["method"], data)
        assert not _tasks_of_key(api_stack, mine, other)
    # The same agent's endpoint, same tenant, another agent's task: not found either.
    status, data = _rpc(api_stack, mine, {"jsonrpc": "2.0", "id": 3, "method": "GetTask", "params": {"id": task_id}})
    assert status == 404 or data["error"]["code"] == -32001
    assert api_stack.http("GET", f"/tasks/{task_id}")[1]["status"] == "paused"


def _tasks_of_key(api_stack: ApiStack, name: str, key: str) -> list[Any]:
    status, data = _rpc(api_stack, name, {"jsonrpc": "2.0", "id": 9, "method": "ListTasks", "params": {}}, key=key)
    assert status == 200 and "result" in data, data
    return list(data["result"].get("tasks", []))


@pytest.mark.parametrize(
    ("body", "raw", "code"),
    [
        (None, b'{"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": {', -32700),  # not JSON
        (None, b"[1, 2", -32700),
        ({"id": 1, "method": "SendMessage", "params": {}}, None, -32600),  # no jsonrpc
        ([{"jsonrpc": "2.0", "id": 1, "method": "GetTask", "params": {"id": "x"}}], None, -32600),  # a batch
        ({"jsonrpc": "2.0", "id": 1, "method": "message/teleport", "params": {}}, None, -32601),  # unknown method
        (
            {"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": "hello"},
            None,
            -32600,
        ),  # params not structured: not a request
        (
            {"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": {"message": {"role": "ROLE_USER"}}},
            None,
            -32602,
        ),  # no parts, no message id
        (_send(""), None, -32602),  # no text
        (_send("x" * 20_001), None, -32602),  # a first message longer than a goal may be
        (None, json.dumps(_send("x" * 300_000)).encode(), -32600),  # over the API's body limit
        (
            None,
            b'{"jsonrpc": "2.0", "id": 1, "method": "GetTask", "params": ' + b"[" * 100 + b"]" * 100 + b"}",
            -32700,
        ),  # nested deeper than the API parses
        (
            None,
            b'{"jsonrpc": "2.0", "id": 1, "method": "GetTask", "params": {"id": "\\ud800"}}',
            -32700,
        ),  # a lone surrogate
        (
            None,
            b'{"jsonrpc": "2.0", "id": 1, "method": "GetTask", "method": "SendMessage", "params": {"id": "x"}}',
            -32600,
        ),  # a member named twice: which one is meant is not said (api/body_guard.py)
        (
            {
                "jsonrpc": "2.0",
                "id": 1,
                "method": "SendMessage",
                "params": {
                    "message": {"messageId": "m", "role": "ROLE_USER", "parts": [{"url": "file:///etc/passwd"}]}
                },
            },
            None,
            -32005,
        ),
        (
            {
                **_send("hi"),
                "params": {
                    **_send("hi")["params"],
                    "configuration": {"taskPushNotificationConfig": {"url": "https://10.0.0.1/hook"}},
                },
            },
            None,
            -32602,
        ),  # a push URL on a private address: invalid params, no task started
        (
            {
                "jsonrpc": "2.0",
                "id": 1,
                "method": "CreateTaskPushNotificationConfig",
                "params": {"taskId": "t", "url": "https://169.254.169.254/latest"},
            },
            None,
            -32001,
        ),  # a push config on a task that is not the caller's: not found
        ({"jsonrpc": "2.0", "id": 1, "method": "GetTask", "params": {"id": "no-such-task"}}, None, -32001),
        ({"jsonrpc": "2.0", "id": 1, "method": "ListTasks", "params": {"pageSize": 0}}, None, -32602),
        ({"jsonrpc": "2.0", "id": 1, "method": "ListTasks", "params": {"pageToken": "bm90IG1pbmU"}}, None, -32602),
    ],
)
def test_bad_input_is_the_protocols_error_and_stores_nothing(
    api_stack: ApiStack, body: Any, raw: bytes | None, code: int
) -> None:
    name = _agent(api_stack, [{"text": "x"}])
    status, data = _rpc(api_stack, name, body, raw=raw)
    assert status == 200, (status, data)  # a JSON-RPC error, never a 4xx page an A2A client cannot read, nor a 5xx
    assert data["jsonrpc"] == "2.0" and data["error"]["code"] == code, data
    assert not _tasks_of(api_stack, name)


def test_a_body_not_sent_as_json_is_the_protocols_content_type_not_supported(api_stack: ApiStack) -> None:
    name = _agent(api_stack, [{"text": "x"}])
    status, data = _rpc(api_stack, name, _send("hi"), headers={"Content-Type": "text/plain"})
    assert status == 200 and data["error"]["code"] == -32005, data
    assert not _tasks_of(api_stack, name)


def test_no_key_no_answer(api_stack: ApiStack) -> None:
    name = _agent(api_stack, [{"text": "x"}])
    assert _rpc(api_stack, name, _send("hi"), key=None)[0] == 401
    assert not _tasks_of(api_stack, name)
