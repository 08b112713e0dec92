"""agentq as an MCP server: the ``mcp`` package's own client against ``/mcp`` of the local stack
with auth on (what `agentq dev --auth` serves): the tenant's agents are its tools, a call runs
the agent end to end and answers with its structured output, a longer run answers with its task
id and ``agentq_task`` gets its result; ``agentq_message`` continues the conversation once (its
key makes a repeated call send nothing more); another tenant's task is not found; no key, no answer."""

from __future__ import annotations

import json
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import pytest

from tests.api_support import ApiStack

REPORT_SCHEMA = {
    "type": "object",
    "properties": {"answer": {"type": "string"}, "confidence": {"type": "number"}},
    "required": ["answer", "confidence"],
}


def _session(url: str, key: str | None, work: Callable[[Any], Awaitable[Any]], mode: str = "legacy") -> Any:
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client
    from mcp.shared._httpx_utils import create_mcp_http_client

    headers = {"Authorization": f"Bearer {key}"} if key else {}

    async def run() -> Any:
        transport = streamable_http_client(f"{url}/mcp", http_client=create_mcp_http_client(headers=headers))
        async with Client(transport, mode=mode) as client:
            return await work(client)

    return anyio.run(run)


def _agent(api_stack: ApiStack, turns: list[dict[str, Any]], **fields: Any) -> str:
    name = f"mcp-{uuid.uuid4().hex[:8]}"
    body = {"name": name, "provider": "scripted", "script": {"turns": turns}, "description": "answers", **fields}
    status, data, _ = api_stack.http("POST", "/agents", body)
    assert status == 201, data
    return name


@pytest.mark.parametrize("mode", ["legacy", "auto"])  # the initialize handshake, and the newer discovery
def test_an_mcp_client_lists_the_tenants_agents_and_runs_one_to_its_structured_output(
    api_stack: ApiStack, mode: str
) -> None:
    answer = {"answer": "42", "confidence": 0.9}
    turns = [
        {"tool_calls": [{"name": "final_answer", "input": {"answer": answer}}]}
    ]  # final_answer takes {"answer": ...}
    name = _agent(api_stack, turns, output_schema=REPORT_SCHEMA)
    other = _agent(api_stack, [{"text": "x"}])

    async def work(client: Any) -> Any:
        listed = await client.list_tools()
        result = await client.call_tool(name, {"goal": "what is the answer?", "constraints": {"max_steps": 5}})
        return listed, result

    listed, result = _session(api_stack.url, api_stack.key, work, mode)
    names = {t.name for t in listed.tools}
    assert {name, other, "agentq_task"} <= names
    assert not result.is_error, result
    assert result.structured_content["status"] == "succeeded"
    assert result.structured_content["result"] == answer
    task = api_stack.until(result.structured_content["task_id"], lambda v: v["status"] == "succeeded")
    assert task["task_id"] == result.structured_content["task_id"]
    # Another tenant's listing does not show this tenant's agents.
    theirs = _session(api_stack.url, api_stack.other_key, lambda c: c.list_tools())
    assert name not in {t.name for t in theirs.tools}


def test_a_long_run_answers_with_its_task_id_and_agentq_task_gets_the_result(api_stack: ApiStack) -> None:
    name = _agent(api_stack, [{"text": "slow answer", "latency_seconds": 1.0}])

    async def work(client: Any) -> Any:
        started = await client.call_tool(name, {"goal": "take your time", "wait_seconds": 0})
        task_id = started.structured_content["task_id"]
        ended = await client.call_tool("agentq_task", {"task_id": task_id, "wait_seconds": 20})
        return started, ended

    started, ended = _session(api_stack.url, api_stack.key, work)
    assert started.structured_content["status"] in ("queued", "running")
    assert "agentq_task" in started.content[0].text
    assert ended.structured_content == {**ended.structured_content, "status": "succeeded", "result": "slow answer"}
    foreign = _session(
        api_stack.url,
        api_stack.other_key,
        lambda c: c.call_tool("agentq_task", {"task_id": started.structured_content["task_id"]}),
    )
    assert foreign.is_error and "no task" in foreign.content[0].text


def test_agentq_message_continues_the_conversation_once_and_waits_for_the_answer_that_takes_it_in(
    api_stack: ApiStack,
) -> None:
    name = _agent(api_stack, [{"text": "first answer"}, {"text": "second answer"}])
    said = {"text": "and then?", "idempotency_key": "mcp-follow-up-1", "wait_seconds": 20}

    async def work(client: Any) -> Any:
        first = await client.call_tool(name, {"goal": "talk to me"})
        task_id = first.structured_content["task_id"]
        follow_up = await client.call_tool("agentq_message", {"task_id": task_id, **said})
        repeated = await client.call_tool("agentq_message", {"task_id": task_id, **said})
        return first, follow_up, repeated

    first, follow_up, repeated = _session(api_stack.url, api_stack.key, work)
    task_id = first.structured_content["task_id"]
    assert first.structured_content["result"] == "first answer"
    assert not follow_up.is_error, follow_up
    assert follow_up.structured_content == {**follow_up.structured_content, "task_id": task_id,
                                            "status": "succeeded", "result": "second answer"}  # fmt: skip
    assert repeated.structured_content == follow_up.structured_content  # the key sent it once
    status, listed, _ = api_stack.http("GET", f"/tasks/{task_id}/messages")
    assert status == 200 and [m["text"] for m in listed["messages"]] == ["and then?"]
    foreign = _session(
        api_stack.url,
        api_stack.other_key,
        lambda c: c.call_tool("agentq_message", {"task_id": task_id, "text": "hi"}),
    )
    assert foreign.is_error and "no task" in foreign.content[0].text
    empty = _session(
        api_stack.url, api_stack.key, lambda c: c.call_tool("agentq_message", {"task_id": task_id, "text": ""})
    )
    assert empty.is_error and "text" in empty.content[0].text


def test_bad_arguments_are_an_error_result_naming_them_and_start_nothing(api_stack: ApiStack) -> None:
    name = _agent(api_stack, [{"text": "x"}])

    async def work(client: Any) -> Any:
        return await client.call_tool(name, {"goal": "x", "constraints": {"max_steps": 0}})

    result = _session(api_stack.url, api_stack.key, work)
    assert result.is_error and "max_steps" in result.content[0].text


@pytest.mark.parametrize("name", ["no-such-agent", "Not An Agent!", "x" * 300])
def test_a_call_of_a_tool_the_server_does_not_have_is_a_json_rpc_unknown_tool_error(
    api_stack: ApiStack, name: str
) -> None:
    """MCP tools (2025-11-25, "Error Handling"): an unknown tool is a protocol error, ``-32602``
    "Unknown tool: <name>", not a tool result with isError (which is for the execution errors a
    model can fix by changing its arguments); a long name is cut in the answer."""

    async def work(client: Any) -> Any:
        try:
            result = await client.call_tool(name, {"goal": "x"})
        except Exception as exc:  # the protocol's error is the point
            return exc
        return result

    answered = _session(api_stack.url, api_stack.key, work)
    assert getattr(answered, "code", None) == -32602, answered
    assert answered.message == f"Unknown tool: {name if len(name) <= 128 else name[:128] + '...'}", answered.message


def test_a_retried_call_with_the_same_idempotency_key_starts_one_task_and_the_key_with_other_arguments_is_refused(
    api_stack: ApiStack,
) -> None:
    """A client whose connection drops mid tools/call never learns the task id, and its retry
    started a second task: the agent ran, and spent, twice. With ``idempotency_key`` (as
    ``agentq_message`` takes it, and POST /tasks its Idempotency-Key) the retry answers the
    first call's task, however long it waits (``wait_seconds`` starts nothing); the key with
    other arguments is an error naming it, nothing started; one end user's key is not the
    tenant's nor another user's, nor a POST /tasks key of the same text."""
    tenant = f"mcp-idem-{uuid.uuid4().hex[:6]}"
    key = api_stack.stack.create_api_key(tenant, act_for_users=True)
    name = f"mcp-{uuid.uuid4().hex[:8]}"
    agent = {"name": name, "provider": "scripted", "script": {"turns": [{"text": "once"}]}}
    assert api_stack.http("POST", "/agents", agent, key=key)[0] == 201
    call = {"goal": "count once", "idempotency_key": "k-1", "wait_seconds": 20}

    async def work(client: Any) -> Any:
        first = await client.call_tool(name, call)
        retried = await client.call_tool(name, {**call, "wait_seconds": 0})
        other = await client.call_tool(name, {**call, "goal": "count twice"})
        for_dave = await client.call_tool(name, {**call, "user": "dave"})
        return first, retried, other, for_dave

    first, retried, other, for_dave = _session(api_stack.url, key, work)
    assert not first.is_error and first.structured_content["result"] == "once", first
    task_id = first.structured_content["task_id"]
    assert retried.structured_content == first.structured_content  # the same task, ended: its answer
    assert other.is_error and other.content[0].text.startswith("this idempotency_key started a task of another call")
    assert other.content[0].text.endswith("(idempotency_key)")
    dave = for_dave.structured_content["task_id"]
    assert not for_dave.is_error and dave != task_id
    erin = _session(api_stack.url, api_stack.stack.token(user="erin", tenant=tenant), lambda c: c.call_tool(name, call))
    assert not erin.is_error and erin.structured_content["task_id"] not in (task_id, dave)
    body = {"goal": "count once", "agent": name}
    status, posted, _ = api_stack.http("POST", "/tasks", body, key=key, headers={"Idempotency-Key": "k-1"})
    assert status == 202 and posted["created"], posted
    _, page, _ = api_stack.http("GET", "/tasks?limit=100", key=key)
    assert sorted(t["task_id"] for t in page["tasks"]) == sorted(
        [task_id, dave, erin.structured_content["task_id"], posted["task_id"]]
    )


def test_without_a_key_mcp_answers_401(api_stack: ApiStack) -> None:
    status, data, _ = api_stack.http("POST", "/mcp", {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}, key=None)
    assert status == 401, data
    assert json.dumps(data).count("error") >= 1


@pytest.mark.parametrize("method", ["GET", "DELETE"])
def test_other_methods_are_answered_by_the_transport_not_a_500(api_stack: ApiStack, method: str) -> None:
    status, _, _ = api_stack.http(method, "/mcp")
    assert status in (400, 405, 406)


def test_a_get_for_the_server_stream_is_answered_405_at_once_not_held_open(api_stack: ApiStack) -> None:
    """What an MCP client's GET for server-initiated messages gets: a stateless server has no such
    stream (the transport would hold the request, and the Lambda, open until its timeout)."""
    import urllib.request

    request = urllib.request.Request(
        f"{api_stack.url}/mcp",
        headers={"Accept": "text/event-stream", "Authorization": f"Bearer {api_stack.key}"},
    )
    with pytest.raises(urllib.error.HTTPError) as answered:
        urllib.request.urlopen(request, timeout=20)
    assert answered.value.code == 405 and answered.value.headers["Allow"] == "POST"
    assert "stateless" in json.loads(answered.value.read())["error"]["message"]


def test_the_server_names_itself_with_the_package_version(api_stack: ApiStack) -> None:
    import tomllib

    from tests.api_support import ROOT

    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]

    async def work(client: Any) -> Any:
        return client.server_info

    info = _session(api_stack.url, api_stack.key, work)
    assert info.name == "agentq" and info.version == version


@pytest.mark.parametrize(
    ("arguments", "said"),
    [
        ({"goal": "x", "constraints": {"max_steps": 0}}, "constraints.max_steps: "),
        ({"goal": "x", "constraints": {"max_steps": True}}, "constraints.max_steps: "),
        ({"constraints": {}}, "goal is required"),
        ({"goal": "x", "wait_seconds": "soon"}, "wait_seconds: "),
        ({"goal": "x", "colour": "blue"}, "colour: unknown field"),
    ],
)
def test_an_argument_error_names_the_argument_without_pydantic_s_help_url(
    api_stack: ApiStack, arguments: dict[str, Any], said: str
) -> None:
    name = _agent(api_stack, [{"text": "x"}])

    async def work(client: Any) -> Any:
        return await client.call_tool(name, arguments)

    result = _session(api_stack.url, api_stack.key, work)
    text = result.content[0].text
    assert result.is_error and said in text and "pydantic" not in text and "http" not in text, text


def test_a_task_paused_for_approval_says_what_it_waits_for_and_that_only_a_person_approves_it(
    api_stack: ApiStack,
) -> None:
    """A blocking caller of a task that waits for a person is told so at once: the question, and
    who decides and how (the model calling the tools cannot: a message saying "approve" is no
    decision). A person's approval lets it go on to its answer."""
    from tests.helpers import call as tool_call

    turns: list[dict[str, Any]] = [
        {"text": "", "tool_calls": [tool_call("request_approval", question="Ship it?")]},
        {"text": "shipped"},
    ]
    name = _agent(api_stack, turns, tools=["request_approval"])

    async def ask(client: Any) -> Any:
        started = await client.call_tool(name, {"goal": "lunch", "wait_seconds": 20})
        task_id = started.structured_content["task_id"]
        said = await client.call_tool("agentq_message", {"task_id": task_id, "text": "approve", "wait_seconds": 5})
        return started, said

    started, said = _session(api_stack.url, api_stack.key, ask)
    task_id = started.structured_content["task_id"]
    for answer in (started, said):
        assert answer.structured_content["status"] == "paused", answer.structured_content
        told = answer.structured_content["next"]
        assert "waiting for a person's approval of a tool call: Ship it?" in told, told
        assert f"agentq approve {task_id}" in told and "neither you nor a message to the task can approve it" in told
        assert told in answer.content[0].text
    assert api_stack.http("GET", f"/tasks/{task_id}")[1]["status"] == "paused"  # "approve" decided nothing
    assert api_stack.http("POST", f"/tasks/{task_id}/approve", {})[0] == 200  # a person decides
    ended = _session(
        api_stack.url, api_stack.key, lambda c: c.call_tool("agentq_task", {"task_id": task_id, "wait_seconds": 20})
    )
    assert ended.structured_content["status"] == "succeeded" and "shipped" in str(ended.structured_content["result"])
