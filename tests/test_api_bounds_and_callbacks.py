"""What a first user meets through the HTTP API and the client when they ask for too much or
name a callback no deployment will call: a 422 naming the field and the rule (the page size's
maximum, the schemes a callback may use), and nothing written."""

from __future__ import annotations

import pytest

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
    assert after["tasks"] == before["tasks"]  # nothing submitted
