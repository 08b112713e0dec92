"""What agentq refuses on ``/mcp`` before the ``mcp`` package's server sees the request (the key,
the body's size and media type, JSON no parser takes whole) reaches an MCP client in JSON-RPC's
words (``api.routes.mcp.in_rpc_words``): the ``mcp`` package's own client, against the local
stack with auth on, raises an ``MCPError`` carrying the guard's message, where it read only
"Server returned an error response" from the REST API's ``{"error": {...}}``. The HTTP status
and headers stay (401 with ``WWW-Authenticate: Bearer``, as MCP's auth asks), and a refused
request whose id can be read is answered with that id; so is the API Lambda's resolver, which
answers what API Gateway hands it."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import pytest

from tests.api_support import ApiStack

PARSE_ERROR, INVALID_REQUEST = -32700, -32600


def _refused(url: str, key: str | None, work: Callable[[Any], Awaitable[Any]]) -> Any:
    """The ``MCPError`` a session of the ``mcp`` package's client raises doing ``work``."""
    from mcp import Client, MCPError
    from mcp.client.streamable_http import streamable_http_client
    from mcp.shared._httpx_utils import create_mcp_http_client

    headers = {"Authorization": f"Bearer {key}"} if key else {}

    async def run() -> Any:
        transport = streamable_http_client(f"{url}/mcp", http_client=create_mcp_http_client(headers=headers))
        async with Client(transport, mode="legacy") as client:
            return await work(client)

    with pytest.raises(BaseException) as raised:  # the session's task group wraps it
        anyio.run(run)
    error: BaseException = raised.value
    while isinstance(error, BaseExceptionGroup) and len(error.exceptions) == 1:
        error = error.exceptions[0]
    assert isinstance(error, MCPError), repr(raised.value)
    return error.error


def _post(url: str, key: str | None, body: bytes, content_type: str = "application/json") -> tuple[int, Any, Any]:
    headers = {"Content-Type": content_type, "Accept": "application/json, text/event-stream"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    request = urllib.request.Request(f"{url}/mcp", data=body, method="POST", headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.status, json.loads(answer.read()), answer.headers
    except urllib.error.HTTPError as refused:
        return refused.code, json.loads(refused.read()), refused.headers


@pytest.mark.parametrize("key", [None, "aq_not-a-key"])
def test_an_mcp_client_without_a_usable_key_reads_why_in_an_mcp_error_and_the_answer_stays_401(
    api_stack: ApiStack, key: str | None
) -> None:
    error = _refused(api_stack.url, key, lambda c: c.list_tools())
    assert error.message == "missing, unknown or revoked API key", error
    assert error.code == INVALID_REQUEST and error.data == {"code": "unauthorized"}
    # MCP's auth: 401 with WWW-Authenticate, the body JSON-RPC's error (no id: the body is unread)
    status, body, headers = _post(api_stack.url, key, b'{"jsonrpc": "2.0", "id": 1, "method": "tools/list"}')
    assert status == 401 and headers["WWW-Authenticate"] == "Bearer", (status, body)
    assert body == {"jsonrpc": "2.0", "id": None, "error": {"code": INVALID_REQUEST, "message": error.message,
                                                            "data": {"code": "unauthorized"}}}  # fmt: skip


def test_an_mcp_call_over_the_api_s_body_limit_is_an_mcp_error_naming_the_limit(api_stack: ApiStack) -> None:
    error = _refused(api_stack.url, api_stack.key,
                     lambda c: c.call_tool("agentq_task", {"task_id": "t", "note": "x" * 300_000}))  # fmt: skip
    assert error.message.startswith("request body of ") and error.message.endswith(" bytes; the limit is 262144")
    assert error.code == INVALID_REQUEST and error.data == {"code": "body_too_large", "field": "body"}


def test_mcp_arguments_nested_past_the_api_s_depth_are_an_mcp_error_naming_where(api_stack: ApiStack) -> None:
    deep: dict[str, Any] = {}
    inner = deep
    for _ in range(80):
        inner["a"] = {}
        inner = inner["a"]
    error = _refused(api_stack.url, api_stack.key, lambda c: c.call_tool("agentq_task", {"task_id": "t", "x": deep}))
    assert error.message == "body nests deeper than 64 levels" and error.code == PARSE_ERROR, error
    assert error.data["code"] == "invalid_body" and error.data["field"].startswith("params.arguments.x.a.a.")


@pytest.mark.parametrize(
    ("body", "content_type", "status", "rpc", "said"),
    [
        (b'{"jsonrpc": "2.0", "id": 7, "method": "tools/list", "params": {}, "params": {}}', "application/json",
         422, {"id": 7, "code": INVALID_REQUEST}, {"code": "duplicate_field", "field": "params"}),
        (b'{"jsonrpc": "2.0", "id": "r-8", "method": "tools/call", "params": {"arguments": {"v": NaN}}}',
         "application/json", 400, {"id": "r-8", "code": PARSE_ERROR},
         {"code": "invalid_body", "field": "params.arguments.v"}),
        (b'{"jsonrpc": "2.0", "id": 9, "method": "tools/list"}', "text/plain", 415,
         {"id": 9, "code": INVALID_REQUEST}, {"code": "unsupported_media_type", "field": "Content-Type"}),
        (b'{"jsonrpc": "2.0", "method": "notifications/initialized", "x": NaN}', "application/json", 400,
         {"id": None, "code": PARSE_ERROR}, {"code": "invalid_body", "field": "x"}),  # a notification: no id
    ],
)  # fmt: skip
def test_a_json_rpc_message_the_api_refuses_is_answered_as_a_json_rpc_error_with_its_request_s_id(
    api_stack: ApiStack, body: bytes, content_type: str, status: int, rpc: dict[str, Any], said: dict[str, str]
) -> None:
    answered, answer, _ = _post(api_stack.url, api_stack.key, body, content_type)
    assert answered == status, answer
    assert answer["jsonrpc"] == "2.0" and answer["id"] == rpc["id"], answer
    assert answer["error"]["code"] == rpc["code"] and answer["error"]["data"] == said, answer
    assert answer["error"]["message"], answer


def test_the_api_lambda_answers_its_refusals_on_mcp_in_json_rpc_s_words() -> None:
    """What API Gateway hands the API Lambda (no local server in front): the resolver's own
    refusals (413, and 401 for a request no authorizer vouched for) on ``/mcp``."""
    from agentq.api.app import build_app
    from agentq.api.gateway_proxy import proxy_event

    app = build_app(None, None, None)  # type: ignore[arg-type]  # refused before any store is read
    headers = {"Content-Type": "application/json"}
    request = {"jsonrpc": "2.0", "id": "x-1", "method": "tools/call", "params": {"arguments": {"v": "y" * 300_000}}}
    for body, status, rpc_id, code in [
        (json.dumps(request), 413, None, "body_too_large"),  # over the limit: not parsed for its id
        (json.dumps({"jsonrpc": "2.0", "id": "x-2", "method": "tools/list"}), 401, "x-2", "unauthorized"),
    ]:
        answer = app.resolve(proxy_event("POST", "/mcp", headers, body, tenant=None), None)
        said = json.loads(answer["body"])
        assert answer["statusCode"] == status and said["jsonrpc"] == "2.0" and said["id"] == rpc_id, answer
        assert said["error"]["code"] == INVALID_REQUEST and said["error"]["data"]["code"] == code, said
        if status == 401:
            assert answer["multiValueHeaders"]["WWW-Authenticate"] == ["Bearer"], answer
    # The rest of the API keeps its own words.
    answer = app.resolve(proxy_event("POST", "/tasks", headers, json.dumps({"goal": "x"}), tenant=None), None)
    assert json.loads(answer["body"])["error"]["code"] == "unauthorized"


@pytest.mark.parametrize(
    ("body", "said"),
    [
        ({"hello": 1}, '"jsonrpc" must be "2.0"'),
        ([{"jsonrpc": "2.0", "id": 1, "method": "tools/list"}], "a batch (a JSON array) is not taken"),
        ("tools/list", "the body is a JSON str, not a JSON-RPC message"),
        ({"jsonrpc": "2.0", "id": 2}, 'has a "method"'),
        ({"jsonrpc": "2.0", "id": 3, "method": 7}, '"method" must be a string'),
        ({"jsonrpc": "2.0", "id": 4, "method": "tools/list", "params": [1]}, '"params" must be an object'),
        ({"jsonrpc": "2.0", "id": None, "method": "tools/list"}, '"id" must be a string or an integer'),
        ({"jsonrpc": "2.0", "id": True, "method": "tools/list"}, '"id" must be a string or an integer'),
    ],
    ids=["no-jsonrpc", "batch", "string", "neither", "method-number", "params-list", "id-null", "id-bool"],
)
def test_json_that_is_no_json_rpc_message_is_invalid_request_saying_why_without_the_parser_s_report(
    api_stack: ApiStack, body: Any, said: str
) -> None:
    """JSON-RPC 2.0: JSON that is no Request object is -32600 Invalid Request (a batch too: MCP
    dropped batching in 2025-06-18), with the request's id when it has a usable one. The ``mcp``
    package answered -32602 with pydantic's whole report: its type names, help URLs, the input."""
    status, data, _ = _post(api_stack.url, api_stack.key, json.dumps(body).encode())
    assert status == 400 and data["error"]["code"] == INVALID_REQUEST, data
    message = data["error"]["message"]
    assert said in message and "pydantic" not in message and "input_value" not in message, message
    request = isinstance(body, dict) and "method" in body  # a request's id; none of what is not one
    expected_id = body["id"] if request and type(body.get("id")) in (int, str) else None
    assert data["id"] == expected_id and data["jsonrpc"] == "2.0"


def test_a_well_formed_request_and_a_response_still_reach_the_mcp_server(api_stack: ApiStack) -> None:
    """The check refuses only what is no message: a request is answered by the server, and a
    response (a client answering a server's request) is taken with no answer."""
    status, data, _ = _post(api_stack.url, api_stack.key, b'{"jsonrpc": "2.0", "id": "a", "method": "ping"}')
    assert status == 200 and data == {"jsonrpc": "2.0", "id": "a", "result": {}}, data
    request = urllib.request.Request(
        f"{api_stack.url}/mcp", data=b'{"jsonrpc": "2.0", "id": 9, "result": {}}', method="POST",
        headers={"Content-Type": "application/json", "Accept": "application/json, text/event-stream",
                 "Authorization": f"Bearer {api_stack.key}"},
    )  # fmt: skip
    with urllib.request.urlopen(request, timeout=30) as answer:
        assert answer.status == 202
