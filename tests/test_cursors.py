"""Cursors the API did not issue are refused alike, 400 ``invalid_cursor`` naming the field the
client used (issue 39, item 9): a trace cursor of another task, or naming a place the trace
cannot hold, was read as a valid place (200, an empty page or the trace again) where ``/events``
refused the same with 400; a long one was a 422; an event id with Unicode digits was taken; and
a ``Last-Event-ID`` error named ``after``."""

from __future__ import annotations

import time
from typing import Any
from urllib.parse import quote

import pytest

from agentq.api.models import MAX_CURSOR_CHARS
from agentq.api.views import encode_cursor

from tests.api_support import SCRIPTED, ApiStack
from tests.helpers import call

TWO_TOOL_TURNS = {
    **SCRIPTED,
    "script": {"turns": [{"text": "a", "tool_calls": [call("lookup", q="a")]},
                         {"text": "b", "tool_calls": [call("lookup", q="b")]}, {"text": "done"}]},
    "constraints": {"tools": ["lookup"]},
}  # fmt: skip


@pytest.fixture(scope="module")
def finished(api_stack: ApiStack) -> tuple[str, str]:
    """Two finished tasks with a few trace events each."""
    ids = [api_stack.submit(TWO_TOOL_TURNS) for _ in range(2)]
    for task_id in ids:
        api_stack.until(task_id, lambda v: v["status"] == "succeeded")
    return ids[0], ids[1]


def _trace(api_stack: ApiStack, task_id: str, cursor: str, limit: int = 100) -> tuple[int, Any]:
    status, body, _ = api_stack.http("GET", f"/tasks/{task_id}/trace?limit={limit}&cursor={quote(cursor)}")
    return status, body


def _refused(status: int, body: Any, field: str = "cursor") -> None:
    assert status == 400 and body["error"]["code"] == "invalid_cursor" and body["error"]["field"] == field, body


def test_following_trace_cursors_page_by_page_gives_the_whole_trace_once(
    api_stack: ApiStack, finished: tuple[str, str]
) -> None:
    task_id = finished[0]
    whole = api_stack.http("GET", f"/tasks/{task_id}/trace?limit=200")[1]["events"]
    paged: list[Any] = []
    status, page, _ = api_stack.http("GET", f"/tasks/{task_id}/trace?limit=1")
    while True:
        assert status == 200, page
        paged += page["events"]
        if page["next_cursor"] is None:
            break
        status, page = _trace(api_stack, task_id, page["next_cursor"], limit=1)
    assert paged == whole and len(whole) > 4


def test_another_task_s_trace_cursor_is_a_400(api_stack: ApiStack, finished: tuple[str, str]) -> None:
    mine, other = finished
    cursor = api_stack.http("GET", f"/tasks/{other}/trace?limit=1")[1]["next_cursor"]
    assert cursor is not None
    _refused(*_trace(api_stack, mine, cursor))
    assert _trace(api_stack, other, cursor)[0] == 200


def _place(task_id: str, **change: Any) -> str:
    value = {"task": task_id, "after": [time.time() - 60, 1, 1, 0], "step": 1}
    for name, v in change.items():
        if name in ("at", "rank", "number", "index"):
            value["after"][("at", "rank", "number", "index").index(name)] = v  # type: ignore[index]
        else:
            value[name] = v
    return encode_cursor("trace", value)


@pytest.mark.parametrize(
    "change",
    [
        {"at": -1.0}, {"at": 1e300}, {"rank": -1}, {"rank": 4}, {"number": -1}, {"number": 10**9},
        {"index": -2}, {"index": 10**12}, {"step": 0}, {"step": -5}, {"step": 10**12}, {"step": True},
        {"rank": True}, {"number": 1.0}, {"at": "1"}, {"after": [1.0, 1, 1]}, {"extra": 1},
    ],
    ids=str,
)  # fmt: skip
def test_a_trace_cursor_naming_a_place_the_trace_cannot_hold_is_a_400(
    api_stack: ApiStack, finished: tuple[str, str], change: dict[str, Any]
) -> None:
    task_id = finished[0]
    assert _trace(api_stack, task_id, _place(task_id))[0] == 200  # the unchanged place is one
    _refused(*_trace(api_stack, task_id, _place(task_id, **change)))


@pytest.mark.parametrize("route", ["/tasks?cursor={c}", "/tasks/{t}/trace?cursor={c}"])
@pytest.mark.parametrize(
    "cursor", ["A" * (MAX_CURSOR_CHARS + 1), "A" * 100_00, "eyJrIjoidHJhY2UifQ!!", "e30=", "%00"], ids=len
)
def test_a_page_cursor_too_long_or_not_base64url_is_a_400_not_a_422(
    api_stack: ApiStack, finished: tuple[str, str], route: str, cursor: str
) -> None:
    status, body, _ = api_stack.http("GET", route.format(t=finished[0], c=quote(cursor, safe="%")))
    _refused(status, body)


def test_an_event_id_with_unicode_digits_is_a_400_naming_where_it_was_sent(
    api_stack: ApiStack, finished: tuple[str, str]
) -> None:
    task_id = finished[0]
    ids = [e["id"] for e in api_stack.http("GET", f"/tasks/{task_id}/events?limit=200")[1]["events"]]
    assert ids and all(i.startswith(f"{task_id}:") for i in ids)
    for real in ids:
        status, _, _ = api_stack.http("GET", f"/tasks/{task_id}/events?after={quote(real)}")
        assert status == 200
        foreign = real.translate(
            str.maketrans("0123456789", "\u0660\u0661\u0662\u0663\u0664\u0665\u0666\u0667\u0668\u0669")
        )
        status, body, _ = api_stack.http("GET", f"/tasks/{task_id}/events?after={quote(foreign)}")
        _refused(status, body, "after")


def test_a_cursor_error_names_last_event_id_when_the_client_sent_that(
    api_stack: ApiStack, finished: tuple[str, str]
) -> None:
    task_id = finished[0]
    past_end = f"{task_id}:999.0.0.0"  # well-formed, past the task's last event
    status, body, _ = api_stack.http("GET", f"/tasks/{task_id}/events?after={past_end}")
    _refused(status, body, "after")
    for headers in ({"Last-Event-ID": past_end}, {"Last-Event-ID": past_end, "Accept": "text/event-stream"}):
        status, body, _ = api_stack.http("GET", f"/tasks/{task_id}/events", headers=headers)
        _refused(status, body, "Last-Event-ID")
        assert "Last-Event-ID" in body["error"]["message"] and "after" not in body["error"]["message"]
