"""Hostile JSON and query values over real HTTP (issue: bad input never gives a 500): each is a
4xx JSON error naming the field, and nothing is written."""

from __future__ import annotations

import json
from typing import Any

import pytest

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


@pytest.mark.parametrize("literal", ["Infinity", "-Infinity", "NaN", "1e400"])
def test_a_non_finite_number_in_a_submission_is_a_400_naming_where_and_nothing_is_stored(
    api_stack: ApiStack, literal: str
) -> None:
    """``NaN``, ``Infinity`` and a literal past a float's range are not JSON numbers (RFC 8259),
    yet Python's parser takes them; stored, pydantic wrote them as ``null``, so the task read
    back was not the one validated: its worker dead-lettered it, and every read of it, the
    tenant's whole listing and ``GET /usage`` answered 500. Now a 400 naming where, and the
    tenant's listing still reads with nothing in it."""
    key = api_stack.stack.create_api_key(f"nonfinite-{literal.strip('-').lower()}")
    raw = (
        '{"goal": "hi", "provider": "scripted", "script": {"turns": [{"text": "done"}]}, '
        f'"output_schema": {{"type": "number", "maximum": {literal}}}}}'
    ).encode()
    status, body, _ = api_stack.http("POST", "/tasks", raw=raw, key=key)
    assert (status, body["error"]["field"]) == (400, "output_schema.maximum"), body
    assert literal in body["error"]["message"]
    listed, page, _ = api_stack.http("GET", "/tasks", key=key)
    assert listed == 200 and page["tasks"] == [], page


def test_an_agent_whose_output_schema_holds_infinity_is_refused_and_its_name_stays_free(api_stack: ApiStack) -> None:
    """Stored, the agent's schema read back with ``null`` and its every submission was a 500."""
    key = api_stack.stack.create_api_key("nonfinite-agent")
    raw = json.dumps({"name": "inf", "provider": "scripted", "script": SCRIPTED["script"]}).encode()[:-1]
    raw += b', "output_schema": {"type": "number", "maximum": Infinity}}'
    status, body, _ = api_stack.http("POST", "/agents", raw=raw, key=key)
    assert (status, body["error"]["field"]) == (400, "output_schema.maximum"), body
    assert api_stack.http("GET", "/agents/inf", key=key)[0] == 404


def test_a_nan_in_a_tool_input_is_refused_not_stored_as_null(api_stack: ApiStack) -> None:
    raw = (
        b'{"goal": "hi", "provider": "scripted", "script": {"turns": ['
        b'{"tool_calls": [{"name": "note_write", "input": {"text": NaN}}]}, {"text": "done"}]}}'
    )
    status, body, _ = api_stack.http("POST", "/tasks", raw=raw)
    assert (status, body["error"]["field"]) == (400, "script.turns[0].tool_calls[0].input.text"), body
