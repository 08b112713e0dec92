"""Input the API must read exactly or refuse precisely, over real HTTP (the local stack's server,
auth on, as in AWS): a path's segments, a body's bytes, a header's form, a query's parameters.
Each refusal is a 4xx naming the field, and nothing reaches another route or is stored altered."""

from __future__ import annotations

import io
import json
import time
from collections.abc import Callable

import pytest

from agentq.api.client import Client
from agentq.api.http_server import wsgi_app
from agentq.core.errors import ValidationError

from tests import test_cli
from tests.api_support import SCRIPTED, ApiStack
from tests.test_cli import Ran

cli = test_cli.cli

NOWHERE = "http://127.0.0.1:9"  # a request sent here would fail "cannot reach" (exit 1)


# ------------------------------------------------------------------ path segments


def test_an_encoded_slash_stays_inside_the_task_id_and_never_reaches_another_route(api_stack: ApiStack) -> None:
    task_id = api_stack.until(api_stack.submit(SCRIPTED), lambda v: v["status"] == "succeeded")["task_id"]
    status, body, _ = api_stack.http("GET", f"/tasks/{task_id}%2Fresult")
    assert status == 422 and body["error"]["field"] == "task_id", (status, body)
    status, body, _ = api_stack.http("POST", f"/tasks/{task_id}%2Fcancel")
    assert status in (404, 405, 422) and body["error"]["code"] != "illegal_transition", (status, body)
    # an escape that is no separator is still decoded, once the path is split
    assert api_stack.http("GET", "/policies/agent%3Ashop")[:2] == api_stack.http("GET", "/policies/agent:shop")[:2]


def test_a_task_id_that_cannot_be_one_is_a_422_naming_task_id_not_a_missing_route(api_stack: ApiStack) -> None:
    for path in ("/tasks/%00", "/tasks/a%20b", "/tasks/%2F", "/tasks/x%3Fy/result"):
        status, body, _ = api_stack.http("GET", path)
        assert status == 422 and body["error"]["field"] == "task_id", (path, status, body)


def test_a_path_segment_whose_escapes_are_not_utf8_is_a_400_naming_the_path(api_stack: ApiStack) -> None:
    status, body, _ = api_stack.http("GET", "/tasks/caf%E9")
    assert status == 400 and body["error"] == {
        "code": "invalid_path",
        "message": "path segment 'caf%E9' is not percent-encoded UTF-8",
        "field": "path",
    }, body


def test_the_client_refuses_an_empty_task_id_before_sending_anything() -> None:
    client = Client(NOWHERE, "aq_" + "x" * 30, retries=0)
    for call in (client.get, client.cancel, client.result):
        with pytest.raises(ValidationError) as err:
            call("")
        assert err.value.field == "task_id" and err.value.message == "task_id must not be empty"


@pytest.mark.parametrize("command", ["status", "cancel", "result"])
def test_the_cli_names_an_empty_task_id_and_exits_2_sending_nothing(cli: Callable[..., Ran], command: str) -> None:
    ran = cli(command, "", "--url", NOWHERE)
    assert ran.returncode == 2 and "task_id must not be empty (task_id)" in ran.stderr, ran
    assert "Traceback" not in ran.stderr and "no route" not in ran.stderr


def test_the_cli_refuses_a_metadata_key_given_twice_and_exits_2_sending_nothing(cli: Callable[..., Ran]) -> None:
    """One value a key: `--metadata team=blue --metadata team=red` kept red without a word."""
    ran = cli("submit", "g", "--metadata", "team=blue", "--metadata", "team=red", "--url", NOWHERE)
    assert ran.returncode == 2 and "--metadata: key 'team' given twice" in ran.stderr, ran


# ------------------------------------------------------------------ body bytes

NOT_UTF8 = b'{"goal": "caf\xe9", "provider": "scripted", "script": "first_task"}'


def _task_count(api_stack: ApiStack) -> int:
    status, page, _ = api_stack.http("GET", "/tasks?limit=100")
    assert status == 200, page
    return len(page["tasks"])


def test_a_body_that_is_not_utf8_is_a_400_naming_the_body_and_stores_nothing(api_stack: ApiStack) -> None:
    before = _task_count(api_stack)
    status, body, _ = api_stack.http("POST", "/tasks", raw=NOT_UTF8)
    assert status == 400 and body["error"]["code"] == "invalid_body" and body["error"]["field"] == "body", body
    assert "not UTF-8" in body["error"]["message"] and "0xe9" in body["error"]["message"], body
    assert _task_count(api_stack) == before


def test_the_wsgi_app_refuses_a_body_that_is_not_utf8_as_the_server_does(api_stack: ApiStack) -> None:
    server = api_stack.stack.api_server
    assert server is not None
    app = wsgi_app(server.handler, server.authorizer)
    before = _task_count(api_stack)
    answered: list[str] = []
    environ = {
        "REQUEST_METHOD": "POST", "PATH_INFO": "/tasks", "CONTENT_LENGTH": str(len(NOT_UTF8)),
        "CONTENT_TYPE": "application/json", "HTTP_AUTHORIZATION": f"Bearer {api_stack.key}",
        "wsgi.input": io.BytesIO(NOT_UTF8),
    }  # fmt: skip
    page = json.loads(b"".join(app(environ, lambda status, headers: answered.append(status))))
    assert answered[0].startswith("400 ") and page["error"]["field"] == "body", (answered, page)
    assert _task_count(api_stack) == before


# ------------------------------------------------------------------ conditional GETs


def test_an_unchanged_usage_answer_is_a_304(api_stack: ApiStack) -> None:
    for _ in range(3):  # the window moves on the minute: two calls either side of one differ, rightly
        minute = time.time() // 60
        status, usage, headers = api_stack.http("GET", "/usage")
        assert status == 200 and headers["ETag"] and usage["users_since"] % 60 == 0, usage
        again, body, again_headers = api_stack.http("GET", "/usage", headers={"If-None-Match": headers["ETag"]})
        if time.time() // 60 == minute:
            assert again == 304 and body is None and again_headers["ETag"] == headers["ETag"], (again, body)
            return
    raise AssertionError("three minute boundaries in a row")


# ------------------------------------------------------------------ the Authorization header


def _refused(api_stack: ApiStack, authorization: str | None) -> tuple[int, dict[str, str]]:
    headers = {"Authorization": authorization} if authorization is not None else {}
    status, body, _ = api_stack.http("GET", "/tasks", key=None, headers=headers)
    return status, body["error"]


@pytest.mark.parametrize(
    ("header", "why"),
    [
        ("{key}", "no 'Bearer ' before the key"),
        ("Basic dXNlcjpwYXNz", "not a Basic credential"),
        ("Bearer", "no key after 'Bearer'"),
        ("Bearer    ", "no key after 'Bearer'"),
        ("{key} trailing", "no 'Bearer ' before the key"),
    ],
)
def test_an_authorization_header_of_the_wrong_form_is_a_401_naming_it(
    api_stack: ApiStack, header: str, why: str
) -> None:
    status, error = _refused(api_stack, header.format(key=api_stack.key))
    assert status == 401 and error == {
        "code": "unauthorized",
        "message": f"expected 'Bearer <key>': {why}",
        "field": "Authorization",
    }, error
    assert api_stack.key not in error["message"]


def test_an_unknown_or_malformed_key_in_the_right_form_is_refused_in_the_same_words_as_before(
    api_stack: ApiStack,
) -> None:
    unknown = _refused(api_stack, "Bearer aq_" + "z" * 40)
    malformed = _refused(api_stack, "Bearer not-a-key")
    assert unknown == malformed == (401, {"code": "unauthorized", "message": "missing, unknown or revoked API key"})


# ------------------------------------------------------------------ queries and bodies a route does not take


@pytest.mark.parametrize(
    ("path", "field", "words"),
    [
        ("/tasks?limit=5&limit=6", "limit", "limit: given 2 times; give it once"),
        ("/tasks?status=running&status=queued", "status", "status: given 2 times; give it once"),
    ],
)
def test_a_single_valued_query_parameter_given_twice_is_a_422_naming_it(
    api_stack: ApiStack, path: str, field: str, words: str
) -> None:
    status, body, _ = api_stack.http("GET", path)
    assert status == 422 and body["error"]["field"] == field and body["error"]["message"].startswith(words), body


def test_the_local_server_answers_head_as_its_get_without_a_body_or_a_wrong_length(api_stack: ApiStack) -> None:
    """RFC 9110 8.6: a HEAD's Content-Length, if sent, is its GET's; the body the resolver drops
    must not be announced as 0 bytes. Two requests on one connection: the HEAD's answer ends where
    its headers do."""
    import http.client
    from urllib.parse import urlsplit

    url = urlsplit(api_stack.url)
    conn = http.client.HTTPConnection(url.hostname or "", url.port, timeout=30)
    auth = {"Authorization": f"Bearer {api_stack.key}"} if api_stack.key else {}
    try:
        conn.request("GET", "/tasks?limit=1", headers=auth)
        got = conn.getresponse()
        got.read()
        conn.request("HEAD", "/tasks?limit=1", headers=auth)
        head = conn.getresponse()
        assert head.status == 200 and head.read() == b""
        assert head.getheader("ETag") == got.getheader("ETag") and head.getheader("Content-Length") in (
            None,
            got.getheader("Content-Length"),
        )
        conn.request("GET", "/tasks?limit=1", headers=auth)  # the same connection still reads answers
        assert conn.getresponse().status == 200
    finally:
        conn.close()


def test_a_list_parameter_still_repeats(api_stack: ApiStack) -> None:
    status, page, _ = api_stack.http("GET", "/tasks?metadata=a=1&metadata=b=2&limit=5")
    assert status == 200 and page["tasks"] == [], page


def test_a_route_that_takes_no_body_refuses_one_with_fields(api_stack: ApiStack) -> None:
    status, body, _ = api_stack.http("POST", "/tasks/no-such-task/cancel", {"max": -1})
    assert status == 422 and body["error"] == {
        "code": "validation_error",
        "message": "max: unknown field (this route takes no body)",
        "field": "max",
    }, body
    status, body, _ = api_stack.http("POST", "/tasks/no-such-task/cancel", [1])
    assert status == 422 and body["error"]["field"] == "body", body
    nothing: list[dict[str, object] | None] = [None, {}]  # none, or the console's {}
    for sent in nothing:  # the route runs
        status, body, _ = api_stack.http("POST", "/tasks/no-such-task/cancel", sent)
        assert status == 404 and body["error"]["code"] == "task_not_found", body


@pytest.mark.parametrize(
    ("sent", "field", "message"),
    [
        ({"max": -1}, "max", "max: unknown field"),
        ([1], "body", "the body must be a JSON object"),
        (
            {"message_ids": []},
            "message_ids",
            "message_ids: name at least one dead letter, or leave message_ids out to redrive every one",
        ),
        ({"message_ids": "m-1"}, "message_ids", "message_ids: Input should be a valid list"),
        ({"message_ids": ["m-1", ""]}, "message_ids[1]", "message_ids[1]: String should have at least 1 character"),
        (
            {"message_ids": ["m/1"]},
            "message_ids[0]",
            "message_ids[0]: a dead letter's message_id as GET /dead-letters lists it, not 'm/1'",
        ),
        (
            {"message_ids": ["m"] * 1001},
            "message_ids",
            "message_ids: List should have at most 1000 items after validation, not 1001",
        ),
    ],
)
def test_a_redrive_names_what_is_wrong_with_its_message_ids(
    api_stack: ApiStack, sent: object, field: str, message: str
) -> None:
    status, body, _ = api_stack.http("POST", "/dead-letters/normal/redrive", sent)
    assert status == 422 and body["error"] == {"code": "validation_error", "message": message, "field": field}, body


def test_a_redrive_without_message_ids_still_takes_no_body_or_an_empty_one(api_stack: ApiStack) -> None:
    nothing: list[dict[str, object] | None] = [None, {}, {"message_ids": None}]  # none, the console's {}, null
    for sent in nothing:
        status, body, _ = api_stack.http("POST", "/dead-letters/normal/redrive", sent)
        assert status == 200 and body["tier"] == "normal", body


@pytest.mark.parametrize("sent", [{}, {"call": {}}, {"call": {"kind": "mcp", "tool": " "}}])
def test_a_policy_test_names_the_calls_tool(api_stack: ApiStack, sent: dict[str, object]) -> None:
    status, body, _ = api_stack.http("POST", "/policies/test", sent)
    field = "call" if not sent else "call.tool"
    assert status == 422 and body["error"]["field"] == field, body
    status, body, _ = api_stack.http("POST", "/policies/test", {"call": {"tool": "lookup"}})
    assert status == 200 and body["decision"] == "allow", body


@pytest.mark.parametrize("path", ["/dead-letters/normal/redrive", "/tasks/no-such-task/approve", "/tasks"])
def test_a_null_body_is_a_422_naming_the_body_where_a_route_takes_an_object(api_stack: ApiStack, path: str) -> None:
    status, body, _ = api_stack.http("POST", path, raw=b"null")
    assert status == 422 and body["error"] == {
        "code": "validation_error",
        "message": "the body must be a JSON object",
        "field": "body",
    }, body
