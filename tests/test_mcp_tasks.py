"""MCP's tasks extension on ``/mcp``, with the official ``mcp`` client against the local stack
with auth on: a client declaring the extension gets a task handle that is the agentq task's id,
``tasks/get`` follows it to the result, an approval is ``input_required`` answered with
``tasks/update``, ``tasks/cancel`` cancels; a client that does not declare it gets the blocking
answer; bad ids and params are the protocol's errors, never a 5xx. The handle's survival of a
killed API process and a killed worker: tests/test_mcp_tasks_processes.py."""

from __future__ import annotations

import json
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import pytest

from tests.api_support import ApiStack
from tests.helpers import call as tool_call
from tests.mcp_tasks_client import TERMINAL, AgentqTasks, cancel_task, get_task, until, update_task

MESSAGE_TOOL = "agentq_message"
APPROVAL_TURNS: list[dict[str, Any]] = [
    {"text": "", "tool_calls": [tool_call("request_approval", question="Ship it?")]},
    {"text": "shipped"},
]


def _session(url: str, key: str | None, work: Callable[[Any], Awaitable[Any]], *, tasks: bool = True,
             mode: str = "auto") -> Any:  # fmt: skip
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client
    from mcp.shared._httpx_utils import create_mcp_http_client

    headers = {"Authorization": f"Bearer {key}"} if key else {}

    async def run() -> Any:
        transport = streamable_http_client(f"{url}/mcp", http_client=create_mcp_http_client(headers=headers))
        async with Client(transport, mode=mode, extensions=[AgentqTasks()] if tasks else None) as client:
            return await work(client)

    return anyio.run(run)


def _agent(api_stack: ApiStack, turns: list[dict[str, Any]], **fields: Any) -> str:
    name = f"mcpt-{uuid.uuid4().hex[:8]}"
    body = {"name": name, "provider": "scripted", "script": {"turns": turns}, "description": "answers", **fields}
    status, data, _ = api_stack.http("POST", "/agents", body)
    assert status == 201, data
    return name


async def _handle(client: Any, name: str, arguments: dict[str, Any]) -> Any:
    await client.list_tools()
    return await client.session.call_tool(name, arguments, allow_claimed=True)


def test_a_declaring_client_gets_the_agentq_task_id_as_its_handle_and_tasks_get_gives_the_result(
    api_stack: ApiStack,
) -> None:
    name = _agent(api_stack, [{"text": "slow answer", "latency_seconds": 5.0}])  # still working when first read

    async def work(client: Any) -> Any:
        handle = await _handle(client, name, {"goal": "take your time"})
        first = await get_task(client.session, handle.task_id)  # at once: durable before it was returned
        ended = await until(client.session, handle.task_id, TERMINAL)
        again = await get_task(client.session, handle.task_id)
        return client.server_capabilities, handle, first, ended, again

    capabilities, handle, first, ended, again = _session(api_stack.url, api_stack.key, work)
    assert capabilities.extensions == {**(capabilities.extensions or {}), "io.modelcontextprotocol/tasks": {}}
    assert handle.result_type == "task" and handle.status == "working" and handle.ttl_ms is None
    view = api_stack.until(handle.task_id, lambda v: True)  # the handle is the agentq task id
    assert view["task_id"] == handle.task_id and view["metadata"]["via"] == "mcp"
    assert first.status == "working" and first.result is None
    assert ended.status == "completed" and ended.result is not None
    assert ended.result["structuredContent"]["result"] == "slow answer"
    assert ended.result["content"][0]["text"] == "slow answer" and ended.result.get("isError") is False
    assert again.result == ended.result  # read again, the same result


@pytest.mark.parametrize("how", ["agentq_message", "POST /tasks/{id}/messages"])
def test_a_completed_mcp_task_stays_completed_with_its_result_after_a_follow_up(api_stack: ApiStack, how: str) -> None:
    """SEP-2663: completed, failed and cancelled are terminal (the state machine has no edge out
    of them) and ``result`` is what the original tools/call would have returned. A follow-up
    reopens the agentq task (its conversation goes on), and tasks/get on the handle went back to
    ``working`` and then answered the follow-up's answer. Now the handle keeps its first end,
    and a tasks/cancel of it, acknowledged as for any ended task, does not cancel the follow-up."""
    name = _agent(api_stack, [{"text": "first"}, {"text": "second", "latency_seconds": 3.0}])

    async def work(client: Any) -> Any:
        handle = await _handle(client, name, {"goal": "talk"})
        ended = await until(client.session, handle.task_id, TERMINAL)
        if how == "agentq_message":
            await client.call_tool(MESSAGE_TOOL, {"task_id": handle.task_id, "text": "and then?", "wait_seconds": 0})
        else:
            assert api_stack.http("POST", f"/tasks/{handle.task_id}/messages", {"text": "and then?"})[0] == 202
        during = await get_task(client.session, handle.task_id)
        await cancel_task(client.session, handle.task_id)
        followed = api_stack.until(handle.task_id, lambda v: v["status"] in ("succeeded", "failed", "cancelled"))
        return ended, during, followed, await get_task(client.session, handle.task_id)

    ended, during, followed, later = _session(api_stack.url, api_stack.key, work)
    assert ended.status == "completed" and ended.result["structuredContent"]["result"] == "first", ended
    assert followed["status"] == "succeeded", followed  # the follow-up ran on, not cancelled
    status, answer, _ = api_stack.http("GET", f"/tasks/{ended.task_id}/result")
    assert status == 200 and answer["result"] == "second"
    for state in (during, later):
        assert (state.status, state.result) == ("completed", ended.result), (state.status, state.status_message)


def test_a_cost_exceeded_mcp_task_keeps_its_end_after_a_raised_budget_resumes_it(api_stack: ApiStack) -> None:
    """The other ways out of an end (a raised budget here; a redrive goes the same way): the
    handle's result stays the error the tools/call ended with, while the task runs on to its
    answer."""
    turns = [{"text": f"turn {i}", "tool_calls": [tool_call("lookup", query=str(i), size=1500)]} for i in range(4)]
    name = _agent(api_stack, [*turns, {"text": "end"}], tools=["lookup"], constraints={"max_output_tokens": 200})

    async def work(client: Any) -> Any:
        handle = await _handle(client, name, {"goal": "look", "constraints": {"max_tokens": 3000}})
        ended = await until(client.session, handle.task_id, TERMINAL)
        raised = api_stack.http("POST", f"/tasks/{handle.task_id}/budget", {"add_tokens": 100_000, "add_steps": 5})
        assert raised[0] == 200, raised
        followed = api_stack.until(handle.task_id, lambda v: v["status"] in ("succeeded", "failed", "cost_exceeded"))
        return ended, followed, await get_task(client.session, handle.task_id)

    ended, followed, later = _session(api_stack.url, api_stack.key, work)
    assert ended.status == "completed" and ended.result["isError"], ended
    assert ended.result["structuredContent"]["status"] == "cost_exceeded", ended.result
    assert followed["status"] == "succeeded", followed
    assert (later.status, later.result) == ("completed", ended.result), later


def test_a_finished_task_reports_the_ttl_after_which_its_retention_deletes_it(api_stack: ApiStack) -> None:
    """SEP-2663 ``ttlMs``: "from creation ... null for unlimited", and it may change. A running
    task is kept: null; an ended one is deleted at META's ``expires_at`` (the table's TTL, the
    deployment's retention), so ``tasks/get`` says when, not null (unlimited) as it did."""
    name = _agent(api_stack, [{"text": "done"}])

    async def work(client: Any) -> Any:
        handle = await _handle(client, name, {"goal": "now"})
        return handle, await until(client.session, handle.task_id, TERMINAL)

    handle, ended = _session(api_stack.url, api_stack.key, work)
    assert handle.ttl_ms is None  # running: kept while it runs
    task = api_stack.stack.store().tasks.get(ended.task_id)
    assert task.expires_at is not None
    assert ended.ttl_ms == int((task.expires_at - task.created_at) * 1000) and ended.ttl_ms > 0


def test_the_official_clients_call_tool_follows_the_task_to_its_structured_result(api_stack: ApiStack) -> None:
    schema = {"type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"]}
    turns = [{"tool_calls": [{"name": "final_answer", "input": {"answer": {"answer": "42"}}}]}]
    name = _agent(api_stack, turns, output_schema=schema)

    async def work(client: Any) -> Any:
        await client.list_tools()
        return await client.call_tool(name, {"goal": "what is it?"})

    result = _session(api_stack.url, api_stack.key, work)
    assert not result.is_error and result.structured_content["result"] == {"answer": "42"}
    api_stack.until(result.structured_content["task_id"], lambda v: v["status"] == "succeeded")


def test_a_retried_call_with_the_same_idempotency_key_answers_the_handle_of_the_first(api_stack: ApiStack) -> None:
    """A declaring client's retry of a tools/call whose answer it never got (the handle is the
    only way to the task: there is no tasks/list) gets the first call's handle, not a second task."""
    name = _agent(api_stack, [{"text": "once", "latency_seconds": 2.0}])
    call = {"goal": f"retry-{uuid.uuid4().hex[:6]}", "idempotency_key": f"k-{uuid.uuid4().hex}"}

    async def work(client: Any) -> Any:
        first = await _handle(client, name, call)
        retried = await client.session.call_tool(name, call, allow_claimed=True)
        return first, retried, await until(client.session, first.task_id, TERMINAL)

    first, retried, ended = _session(api_stack.url, api_stack.key, work)
    assert retried.task_id == first.task_id and ended.result["structuredContent"]["result"] == "once"
    _, page, _ = api_stack.http("GET", "/tasks?limit=100")
    assert [t["task_id"] for t in page["tasks"] if t["goal"] == call["goal"]] == [first.task_id]


@pytest.mark.parametrize("mode", ["legacy", "auto"])
def test_a_client_that_does_not_declare_tasks_gets_the_blocking_answer_and_no_tasks_methods(
    api_stack: ApiStack, mode: str
) -> None:
    """On the 2025-11-25 handshake the extension is not defined: not offered, never used."""
    name = _agent(api_stack, [{"text": "at once"}])

    async def work(client: Any) -> Any:
        await client.list_tools()
        result = await client.session.call_tool(name, {"goal": "now"})
        try:
            await get_task(client.session, result.structured_content["task_id"])
        except Exception as exc:  # the protocol's error is the point
            return client.server_capabilities, result, exc
        return client.server_capabilities, result, None

    capabilities, result, refused = _session(api_stack.url, api_stack.key, work, tasks=False, mode=mode)
    assert not result.is_error and result.structured_content["result"] == "at once"
    assert getattr(refused, "code", None) == -32021, refused
    if mode == "legacy":
        assert capabilities.extensions is None and capabilities.tasks is None


def test_an_approval_is_input_required_and_tasks_update_decides_it_once(api_stack: ApiStack) -> None:
    name = _agent(api_stack, APPROVAL_TURNS, tools=["request_approval"])

    async def work(client: Any) -> Any:
        handle = await _handle(client, name, {"goal": "ship the release"})
        asked = await until(client.session, handle.task_id, ("input_required", *TERMINAL))
        ((key, request),) = (asked.input_requests or {}).items()
        answer = {key: {"action": "accept", "content": {"approved": True, "note": "looks good"}}}
        acked = await update_task(client.session, handle.task_id, answer)
        await update_task(client.session, handle.task_id, answer)  # answered already: ignored
        ignored = await update_task(client.session, handle.task_id, {"approval-nobody": {"action": "accept"}})
        ended = await until(client.session, handle.task_id, TERMINAL)
        return handle, asked, key, request, acked, ignored, ended

    handle, asked, key, request, acked, ignored, ended = _session(api_stack.url, api_stack.key, work)
    assert asked.status == "input_required" and key.startswith("approval-")
    assert request["method"] == "elicitation/create" and "Ship it?" in request["params"]["message"]
    assert request["params"]["requestedSchema"]["required"] == ["approved"]
    assert acked.result_type == "complete" and ignored.result_type == "complete"
    assert ended.status == "completed" and ended.result is not None
    assert ended.result["structuredContent"]["result"] == "shipped"
    status, page, _ = api_stack.http("GET", f"/tasks/{handle.task_id}/events?limit=200")
    assert status == 200
    decided = [e["data"] for e in page["events"] if e["type"] == "approval.decided"]
    assert [(d["approved"], d.get("note")) for d in decided] == [(True, "looks good")]


def _asking(question: str, *, spawns: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """A sub-agent that asks a person ``question`` (after spawning ``spawns`` and waiting for them)."""
    turns: list[dict[str, Any]] = [{"text": "", "tool_calls": [tool_call("request_approval", question=question)]},
                                   {"text": f"done: {question}"}]  # fmt: skip
    if spawns:
        turns.insert(0, {"text": "", "tool_calls": [tool_call("spawn_subagents", subagents=spawns)]})
    tools = ["request_approval", "spawn_subagents"] if spawns else ["request_approval"]
    return {"goal": question, "tools": tools, "script": {"turns": turns}}


def _fanning_out(api_stack: ApiStack, children: list[dict[str, Any]]) -> str:
    turns: list[dict[str, Any]] = [
        {"text": "splitting", "tool_calls": [tool_call("spawn_subagents", subagents=children)]},
        {"text": "merged"},
    ]
    return _agent(api_stack, turns, tools=["spawn_subagents", "request_approval"])


def test_a_sub_agent_waiting_for_approval_makes_the_task_input_required_and_tasks_update_decides_it_on_the_sub_agent(
    api_stack: ApiStack,
) -> None:
    """SEP-2663: ``inputRequests`` MUST hold every outstanding request the task needs before it
    can go on. A parent waiting on a sub-agent paused for a person's approval stayed ``working``
    ("agentq task waiting", no inputRequests) for as long as the approval waited, and the
    blocking ``agentq_task`` said "still waiting". Now the approval is asked under a key naming
    the sub-agent and the call, the blocking tool says what waits and who decides, and the
    answer decides on the sub-agent, whose "yes" lets the parent end."""
    name = _fanning_out(api_stack, [_asking("Child ship it?")])

    async def work(client: Any) -> Any:
        handle = await _handle(client, name, {"goal": "fan out"})
        api_stack.until(handle.task_id, lambda v: (v.get("children") or {}).get("by_status") == {"paused": 1})
        blocking = await client.call_tool("agentq_task", {"task_id": handle.task_id, "wait_seconds": 20})
        asked = await get_task(client.session, handle.task_id)
        assert asked.status == "input_required" and len(asked.input_requests or {}) == 1, asked
        (key,) = asked.input_requests or {}
        await update_task(client.session, handle.task_id, {key: {"action": "accept",
                                                                  "content": {"approved": True, "note": "go"}}})  # fmt: skip
        return handle, blocking, asked, key, await until(client.session, handle.task_id, TERMINAL)

    handle, blocking, asked, key, ended = _session(api_stack.url, api_stack.key, work)
    child = api_stack.until(handle.task_id, lambda v: True)["children"]["task_ids"][0]
    assert key.startswith(f"approval-{child}.") and "Child ship it?" in asked.input_requests[key]["params"]["message"]
    told = blocking.structured_content["next"] or ""
    assert blocking.structured_content["status"] == "waiting" and not blocking.is_error, blocking.structured_content
    assert (
        f"waiting for its sub-agent {child}" in told and "Child ship it?" in told and f"agentq approve {child}" in told
    )
    assert ended.status == "completed" and ended.result["structuredContent"]["result"] == "merged", ended
    status, page, _ = api_stack.http("GET", f"/tasks/{child}/events?limit=200")
    assert status == 200
    decided = [e["data"] for e in page["events"] if e["type"] == "approval.decided"]
    assert [(d["approved"], d.get("note")) for d in decided] == [(True, "go")], decided


def test_the_walk_for_sub_agents_approvals_goes_down_waiting_sub_agents_and_is_bounded(
    api_stack: ApiStack, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A grandchild's approval (below a child waiting for it) is the root's to ask too. The walk
    of a tree is bounded (``api.mcp_asks``: reads, and approvals asked at once): what it stopped
    before is said in the status message and asked once what it found is decided."""
    from agentq.api import mcp_asks

    monkeypatch.setattr(mcp_asks, "MAX_ASKED", 1)
    name = _fanning_out(api_stack, [_asking("First?"), _asking("Middle?", spawns=[_asking("Deep?")])])

    async def asked_other_than(client: Any, task_id: str, seen: set[str]) -> Any:
        with anyio.fail_after(60):
            while True:
                state = await get_task(client.session, task_id)
                if state.status != "working" and set(state.input_requests or {}) - seen:
                    return state
                await anyio.sleep(0.5)

    async def work(client: Any) -> Any:
        handle = await _handle(client, name, {"goal": "fan out deep"})
        # The first child paused, the middle one waiting for its own (asking) child.
        api_stack.until(handle.task_id, lambda v: (v.get("children") or {}).get("by_status") == {"paused": 1,
                                                                                                   "waiting": 1})  # fmt: skip
        asked: list[tuple[str, str, str | None]] = []
        seen: set[str] = set()
        for _ in range(3):
            state = await asked_other_than(client, handle.task_id, seen)
            (key,) = state.input_requests or {}
            seen.add(key)
            asked.append((key, state.input_requests[key]["params"]["message"], state.status_message))
            await update_task(
                client.session, handle.task_id, {key: {"action": "accept", "content": {"approved": True}}}
            )
        return asked, await until(client.session, handle.task_id, TERMINAL)

    asked, ended = _session(api_stack.url, api_stack.key, work)
    questions = [message.split("\n")[0] for _, message, _ in asked]
    assert sorted(questions) == ["Deep?", "First?", "Middle?"], asked
    assert all(len(key.split(".")) == 2 for key, _, _ in asked)  # approval-<task id>.<tool use id>
    assert "not read whole" in (asked[0][2] or ""), asked[0]
    assert ended.status == "completed" and ended.result["structuredContent"]["result"] == "merged", ended


def test_an_interrupted_task_is_input_required_and_tasks_update_sends_its_message_once(api_stack: ApiStack) -> None:
    # The first turn outlasts the interrupt sent once the task is seen running, also on a loaded machine.
    name = _agent(api_stack, [{"text": "first", "latency_seconds": 10.0}, {"text": "after the message"}])

    async def work(client: Any) -> Any:
        handle = await _handle(client, name, {"goal": "talk to me"})
        api_stack.until(handle.task_id, lambda v: v["status"] == "running")
        status, _, _ = api_stack.http("POST", f"/tasks/{handle.task_id}/interrupt", {})
        assert status == 202
        asked = await until(client.session, handle.task_id, ("input_required", *TERMINAL))
        (key,) = asked.input_requests or {}
        answer = {key: {"action": "accept", "content": {"text": "go on please"}}}
        await update_task(client.session, handle.task_id, answer)
        await update_task(client.session, handle.task_id, answer)  # repeated: sent once
        return handle, asked, key, await until(client.session, handle.task_id, TERMINAL)

    handle, asked, key, ended = _session(api_stack.url, api_stack.key, work)
    assert asked.status == "input_required" and key == "message-0"
    assert asked.input_requests[key]["params"]["requestedSchema"]["required"] == ["text"]
    assert ended.status == "completed" and ended.result is not None and not ended.result.get("isError")
    status, listed, _ = api_stack.http("GET", f"/tasks/{handle.task_id}/messages")
    assert status == 200 and [m["text"] for m in listed["messages"]] == ["go on please"]


@pytest.mark.parametrize("action", ["decline", "accept"])
def test_declining_or_not_approving_rejects_the_request(api_stack: ApiStack, action: str) -> None:
    name = _agent(api_stack, APPROVAL_TURNS, tools=["request_approval"])

    async def work(client: Any) -> Any:
        handle = await _handle(client, name, {"goal": "ship the release"})
        asked = await until(client.session, handle.task_id, ("input_required", *TERMINAL))
        (key,) = asked.input_requests or {}
        await update_task(client.session, handle.task_id, {key: {"action": action, "content": {"approved": False}}})
        return handle, await until(client.session, handle.task_id, TERMINAL)

    handle, _ = _session(api_stack.url, api_stack.key, work)
    status, page, _ = api_stack.http("GET", f"/tasks/{handle.task_id}/events?limit=200")
    assert status == 200
    assert [e["data"]["approved"] for e in page["events"] if e["type"] == "approval.decided"] == [False]


def test_tasks_cancel_cancels_the_running_task(api_stack: ApiStack) -> None:
    name = _agent(api_stack, [{"text": "never", "latency_seconds": 30.0}])

    async def work(client: Any) -> Any:
        handle = await _handle(client, name, {"goal": "take forever"})
        acked = await cancel_task(client.session, handle.task_id)
        ended = await until(client.session, handle.task_id, TERMINAL)
        again = await cancel_task(client.session, handle.task_id)  # ended: acknowledged as it is
        return handle, acked, ended, again

    handle, acked, ended, again = _session(api_stack.url, api_stack.key, work)
    assert acked.result_type == "complete" and again.result_type == "complete"
    assert ended.status == "cancelled" and ended.result is None
    assert api_stack.until(handle.task_id, lambda v: True)["status"] == "cancelled"


MIRROR = "(params.taskId)"  # _rpc's default Mcp-Name: what a client sends


def _rpc(api_stack: ApiStack, method: str, params: Any, key: str | None = "default",
         mcp_name: str | None = MIRROR) -> tuple[int, Any]:  # fmt: skip
    """A raw JSON-RPC request of the 2026-07-28 wire, declaring the extension, as a client sends it
    (its transport answers an error with the HTTP status the JSON-RPC code maps to: 400, 404).
    ``mcp_name``: the ``Mcp-Name`` header, by default the params' ``taskId`` (or ``name``); None: none."""
    meta = {"io.modelcontextprotocol/protocolVersion": "2026-07-28",
            "io.modelcontextprotocol/clientInfo": {"name": "raw", "version": "0"},
            "io.modelcontextprotocol/clientCapabilities": {"extensions": {"io.modelcontextprotocol/tasks": {}}}}  # fmt: skip
    if isinstance(params, dict):
        params = {**params, "_meta": meta}
    body = {"jsonrpc": "2.0", "id": 7, "method": method, "params": params}
    headers = {"Accept": "application/json, text/event-stream", "MCP-Protocol-Version": "2026-07-28",
               "Mcp-Method": method}  # fmt: skip
    if mcp_name != MIRROR:
        if mcp_name is not None:
            headers["Mcp-Name"] = mcp_name
    elif isinstance(params, dict) and isinstance(named := params.get("taskId", params.get("name")), str):
        headers["Mcp-Name"] = named
    status, data, _ = api_stack.http("POST", "/mcp", body, key=key, headers=headers)
    return status, data


def test_a_task_of_nobody_or_of_another_tenant_is_not_found_for_every_method(api_stack: ApiStack) -> None:
    theirs = api_stack.submit(key=api_stack.other_key)
    for method in ("tasks/get", "tasks/update", "tasks/cancel"):
        for task_id in ("no-such-task", theirs):
            params: dict[str, Any] = {"taskId": task_id}
            if method == "tasks/update":
                params["inputResponses"] = {}
            status, data = _rpc(api_stack, method, params)
            assert status < 500 and data["error"]["code"] == -32602, (method, task_id, data)
            assert "not found" in data["error"]["message"]
    status, view, _ = api_stack.http("GET", f"/tasks/{theirs}", key=api_stack.other_key)
    assert status == 200 and view["status"] != "cancelled"  # the foreign cancel did nothing


@pytest.mark.parametrize("method", ["tasks/get", "tasks/update", "tasks/cancel"])
@pytest.mark.parametrize("mcp_name", ["another-task-id", None])
def test_a_tasks_request_whose_mcp_name_header_is_missing_or_disagrees_with_its_task_id_is_refused(
    api_stack: ApiStack, method: str, mcp_name: str | None
) -> None:
    """SEP-2663: a client sets ``Mcp-Name`` to ``params.taskId`` on ``tasks/get``, ``tasks/update``
    and ``tasks/cancel``, so intermediaries route by it; the 2026-07-28 transport refuses a request
    whose routing headers are missing or disagree with its body (-32020, HTTP 400), as the ``mcp``
    SDK does for ``tools/call`` (compared here). Nothing is read or done for the task."""
    name = _agent(api_stack, [{"text": "never", "latency_seconds": 30.0}])
    status, created = _rpc(api_stack, "tools/call", {"name": name, "arguments": {"goal": "x"}})
    assert status == 200 and created["result"]["resultType"] == "task", created
    task_id = created["result"]["taskId"]
    status, sdk = _rpc(api_stack, "tools/call", {"name": name, "arguments": {"goal": "x"}}, mcp_name="other-tool")
    assert status == 400 and sdk["error"]["code"] == -32020, sdk  # the SDK's own check
    params: dict[str, Any] = {"taskId": task_id}
    if method == "tasks/update":
        params["inputResponses"] = {}
    status, refused = _rpc(api_stack, method, params, mcp_name=mcp_name)
    assert status == 400 and refused["error"]["code"] == -32020, (status, refused)
    assert refused["error"]["message"] == "mcp-name header does not match the request body's 'taskId' parameter"
    status, read = _rpc(api_stack, "tasks/get", {"taskId": task_id})  # with the header: answered
    assert status == 200 and read["result"]["status"] == "working", read  # the cancel did nothing


@pytest.mark.parametrize(
    ("method", "params"),
    [
        ("tasks/get", {}),
        ("tasks/get", {"taskId": 12}),
        ("tasks/get", {"taskId": "../../etc"}),
        ("tasks/get", {"taskId": "x" * 200}),
        ("tasks/cancel", {"taskId": None}),
        ("tasks/update", {"taskId": "abc"}),
        ("tasks/update", {"taskId": "abc", "inputResponses": "yes"}),
        ("tasks/update", {"taskId": "abc", "inputResponses": {"k": 1}}),
        ("tasks/get", ["abc"]),
    ],
)
def test_malformed_task_params_are_invalid_params_not_a_5xx(api_stack: ApiStack, method: str, params: Any) -> None:
    status, data = _rpc(api_stack, method, params)
    assert status < 500 and data["error"]["code"] in (-32602, -32600), data


@pytest.mark.parametrize("method", ["tasks/result", "tasks/list"])
def test_the_methods_the_extension_removed_are_method_not_found(api_stack: ApiStack, method: str) -> None:
    status, data = _rpc(api_stack, method, {"taskId": "abc"})
    assert status < 500 and data["error"]["code"] == -32601, data


def test_a_bad_answer_to_what_the_task_asks_names_the_field_and_decides_nothing(api_stack: ApiStack) -> None:
    name = _agent(api_stack, APPROVAL_TURNS, tools=["request_approval"])

    async def work(client: Any) -> Any:
        handle = await _handle(client, name, {"goal": "ship the release"})
        asked = await until(client.session, handle.task_id, ("input_required", *TERMINAL))
        (key,) = asked.input_requests or {}
        bad = {key: {"action": "accept", "content": {"approved": True, "note": "x" * 5000}}}
        try:
            await update_task(client.session, handle.task_id, bad)
        except Exception as exc:  # the protocol's error is the point
            return handle, key, exc, await get_task(client.session, handle.task_id)
        raise AssertionError("an over-long note was taken")

    handle, key, refused, after = _session(api_stack.url, api_stack.key, work)
    assert refused.code == -32602 and f"inputResponses.{key}.content.note" in refused.message
    assert after.status == "input_required"  # nothing was decided
    status, page, _ = api_stack.http("GET", f"/tasks/{handle.task_id}/events?limit=200")
    assert status == 200
    assert not [e for e in page["events"] if e["type"] == "approval.decided"], json.dumps(page)[:500]


LEGACY_HEADERS = {"Accept": "application/json, text/event-stream", "MCP-Protocol-Version": "2025-11-25"}


@pytest.mark.parametrize("corrupt", ["unparseable submission", "missing submission"])
def test_a_server_side_fault_is_an_internal_error_never_the_callers_bad_arguments_nor_the_exceptions_text(
    api_stack: ApiStack, corrupt: str
) -> None:
    """A fault of the server (here a task stored as this release cannot read; in AWS a throttle,
    an AccessDenied, a bug) is JSON-RPC -32603 with no internals, as GET /tasks/{id} answers 500
    "internal error; see the service logs". It was "invalid arguments: ..." to the model (a
    pydantic error raised by the store, caught as the arguments'), -32602 "Invalid request
    parameters" from tasks/*, and to a 2025-11-25 client ``{"code": 0, "message": str(exc)}``:
    no JSON-RPC code, and the exception's own text."""
    from agentq.storage import keys
    from agentq.storage.table import Update

    tenant_key = api_stack.stack.create_api_key(f"mcp-fault-{uuid.uuid4().hex[:6]}")  # its own tenant
    task_id = api_stack.submit(key=tenant_key)
    api_stack.until(task_id, lambda v: v["status"] == "succeeded", key=tenant_key)
    broken = Update(set={"submission": "{not json"}) if corrupt == "unparseable submission" else Update(
        remove=["submission"])  # fmt: skip
    api_stack.stack.store().tasks.table.update(keys.submission_key(task_id), broken)
    assert api_stack.http("GET", f"/tasks/{task_id}", key=tenant_key)[0] == 500  # the REST API's answer

    answers = []
    for tool, arguments in (("agentq_task", {}), ("agentq_message", {"text": "and then?"})):
        body = {"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                "params": {"name": tool, "arguments": {"task_id": task_id, **arguments}}}  # fmt: skip
        answers.append(api_stack.http("POST", "/mcp", body, key=tenant_key, headers=LEGACY_HEADERS)[1])
    methods: list[tuple[str, dict[str, Any]]] = [("tasks/get", {}), ("tasks/update", {"inputResponses": {}}),
                                                ("tasks/cancel", {})]  # fmt: skip
    for method, params in methods:
        answers.append(_rpc(api_stack, method, {"taskId": task_id, **params}, key=tenant_key)[1])
    for answer in answers:
        error = answer.get("error") or {}
        assert error == {"code": -32603, "message": "internal error; see the service logs"}, answer
