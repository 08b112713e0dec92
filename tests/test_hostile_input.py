"""Hostile JSON and query values over real HTTP (issue: bad input never gives a 500): each is a
4xx JSON error naming the field, and nothing is written."""

from __future__ import annotations

from typing import Any

from tests.api_support import SCRIPTED, ApiStack


def _tasks(api_stack: ApiStack) -> int:
    status, page, _ = api_stack.http("GET", "/tasks?limit=100")
    assert status == 200, page
    return len(page["tasks"])


def _refused(api_stack: ApiStack, raw: bytes, path: str = "/tasks") -> dict[str, Any]:
    before = _tasks(api_stack)
    status, body, _ = api_stack.http("POST", path, raw=raw)
    assert 400 <= status < 500, (status, body)
    assert isinstance(body, dict) and body["error"]["code"] and body["error"]["message"], body
    assert _tasks(api_stack) == before
    return dict(body["error"])


def test_json_nested_very_deep_is_refused_as_invalid_json(api_stack: ApiStack) -> None:
    raw = b'{"goal": "g", "provider": "scripted", "metadata": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    error = _refused(api_stack, raw)
    assert error.get("field") == "body"


def test_an_integer_of_thousands_of_digits_names_its_field(api_stack: ApiStack) -> None:
    raw = (
        b'{"goal": "g", "provider": "scripted", "script": {"turns": [{"text": "hi"}]}, "constraints": {"max_tokens": '
        + b"9" * 5000
        + b"}}"
    )
    error = _refused(api_stack, raw)
    assert error["field"] == "constraints.max_tokens" and "5000 digits" in error["message"], error


def test_a_lone_surrogate_in_a_script_turn_is_refused(api_stack: ApiStack) -> None:
    raw = b'{"goal": "g", "provider": "scripted", "script": {"turns": [{"text": "\\ud800"}]}}'
    error = _refused(api_stack, raw)
    assert error["field"] == "script.turns[0].text" and "surrogate" in error["message"], error


def test_a_lone_surrogate_in_a_tool_input_is_refused(api_stack: ApiStack) -> None:
    raw = (
        b'{"goal": "g", "provider": "scripted", "script": {"turns": [{"tool_calls": '
        b'[{"name": "lookup", "input": {"q": "\\udfff"}}]}, {"text": "done"}]}}'
    )
    error = _refused(api_stack, raw)
    assert error["field"] == "script.turns[0].tool_calls[0].input.q", error


def test_a_body_nested_past_the_limit_names_where(api_stack: ApiStack) -> None:
    raw = b'{"goal": "g", "provider": "scripted", "metadata": {"a": ' + b"[" * 80 + b"]" * 80 + b"}}"
    error = _refused(api_stack, raw)
    assert error["field"].startswith("metadata.a[0]") and "deeper than 64" in error["message"], error


def test_a_hostile_body_without_a_key_is_still_401(api_stack: ApiStack) -> None:
    status, body, _ = api_stack.http("POST", "/tasks", raw=b"[" * 100_000, key=None)
    assert status == 401 and body["error"]["code"] == "unauthorized", body


def test_a_trace_cursor_holding_1e400_is_a_400_naming_the_cursor(api_stack: ApiStack) -> None:
    import base64
    import json

    task_id = api_stack.submit(SCRIPTED)
    for cursor in ("1e400", base64.urlsafe_b64encode(b'{"after": 1e400}').decode(), json.dumps(1e400)):
        status, body, _ = api_stack.http("GET", f"/tasks/{task_id}/trace?cursor={cursor}")
        assert 400 <= status < 500 and body["error"]["field"] == "cursor", (cursor, status, body)
