"""What a first user meets through the HTTP API and the client when they ask for too much or
name a callback no deployment will call: a 422 naming the field and the rule (the page size's
maximum, the schemes a callback may use), and nothing written."""

from __future__ import annotations

import pytest

import agentq
from agentq.api.client import InvalidRequest
from agentq.api.models import MAX_PAGE_SIZE

from tests.api_support import SCRIPTED, ApiStack

CALLBACK_URLS = ["ftp://hooks.example.com/agentq", "file:///etc/passwd", "hooks.example.com/agentq"]


@pytest.mark.parametrize("url", CALLBACK_URLS)
def test_a_callback_url_of_another_scheme_is_a_422_naming_notify_url_and_the_schemes_allowed(
    api_stack: ApiStack, url: str
) -> None:
    _, before, _ = api_stack.http("GET", "/tasks?limit=100")
    status, data, _ = api_stack.http("POST", "/tasks", {**SCRIPTED, "notify": {"url": url}})
    assert status == 422, data
    error = data["error"]
    assert error["code"] == "validation_error" and error["field"] == "notify.url"
    assert "https://" in error["message"] and url in error["message"], error
    assert "http_fetch" not in error["message"]  # the tool's words, not the callback's
    _, after, _ = api_stack.http("GET", "/tasks?limit=100")
    # Nothing submitted (the ids; an earlier test's task of this tenant may still be running on).
    assert [t["task_id"] for t in after["tasks"]] == [t["task_id"] for t in before["tasks"]]


@pytest.mark.parametrize(("limit", "says"), [(1000, f"at most {MAX_PAGE_SIZE}, not 1000"), (0, "at least 1, not 0")])
def test_a_page_size_out_of_range_is_a_422_that_says_the_bound(api_stack: ApiStack, limit: int, says: str) -> None:
    status, data, _ = api_stack.http("GET", f"/tasks?limit={limit}")
    assert status == 422 and data["error"]["field"] == "limit" and data["error"]["message"] == f"limit: {says}", data


def test_the_page_size_bound_is_the_same_in_the_openapi_document_the_api_and_the_client(api_stack: ApiStack) -> None:
    status, document, _ = api_stack.http("GET", "/openapi.json")
    assert status == 200
    (limit,) = [p for p in document["paths"]["/tasks"]["get"]["parameters"] if p["name"] == "limit"]
    assert limit["schema"]["maximum"] == MAX_PAGE_SIZE and f"at most {MAX_PAGE_SIZE}" in limit["description"]
    newest = api_stack.submit()
    status, page, _ = api_stack.http("GET", f"/tasks?limit={MAX_PAGE_SIZE}")
    assert status == 200 and newest in [t["task_id"] for t in page["tasks"]]

    client = agentq.Client(api_stack.url, api_stack.key)
    assert client.list_tasks(limit=MAX_PAGE_SIZE).tasks
    with pytest.raises(InvalidRequest) as refused:
        client.list_tasks(limit=MAX_PAGE_SIZE * 10)
    assert refused.value.field == "limit" and f"at most {MAX_PAGE_SIZE}" in str(refused.value)
    assert any(t.task_id == newest for t in client.iter_tasks())  # pages of the maximum, cursors followed
