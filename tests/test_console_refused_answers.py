"""What the console says when the API's answer is not what a page can draw, in a real browser
(the stack and the tab of tests/test_console.py): a 200 whose body is not JSON is named as such,
and a link opened without a key asks for the key, whatever page it opens."""

from __future__ import annotations

from typing import Any

import pytest

from tests.test_console import TIMEOUT_MS, Console, Page, console, no_errors, scripted, tab

__all__ = ["console", "tab"]  # the fixtures, shared with tests/test_console.py


def test_an_answer_that_is_not_json_is_named_not_a_null_dereference(console: Console, tab: Page) -> None:
    """A 200 with a web page for body (a proxy's, a sign-in portal's): the console said "Cannot
    read properties of null (reading 'agents')"."""
    page = tab.page
    api = console.url + "/"

    def web_page(route: Any) -> None:
        path = route.request.url[len(api) :]
        if path.startswith(("console", "health")):
            route.continue_()
        else:
            route.fulfill(status=200, content_type="text/html", body="<html><body>Sign in</body></html>")

    page.route("**/*", web_page)
    try:
        page.goto(f"{console.url}/console/#/agents")
        page.wait_for_selector("#alert:not([hidden])")
        said = page.inner_text("#alert")
        assert said == "200 not_json: the API answered with text/html, not JSON", said
    finally:
        page.unroute_all(behavior="ignoreErrors")
    no_errors(tab)


@pytest.fixture(scope="module")
def linked(console: Console) -> dict[str, str]:
    """What the links open: a finished task, an agent, a memory store."""
    task_id = console.submit(scripted("linked", [{"text": "x"}]))
    console.until(task_id, lambda v: v["status"] == "succeeded")
    agent = {"name": "linked-agent", "provider": "scripted", "script": {"turns": [{"text": "x"}]}}
    assert console.http("POST", "/agents", agent)[0] == 201
    assert console.http("POST", "/memory-stores", {"name": "linked-store"})[0] == 201
    return {"task": task_id, "agent": "linked-agent", "store": "linked-store"}


# Each page's link, and what its page draws once opened (an error page draws none of these).
LINKS = {
    "tasks/{task}": "h1 .badge.s-succeeded",
    "agents/{agent}": "#agent-name",
    "memory/{store}": "#store-name",
    "compare/{task}/{task}": "#diverged",
}


@pytest.mark.parametrize("where", list(LINKS))
def test_a_link_opened_without_a_key_asks_for_the_key_then_opens_its_page(
    console: Console, linked: dict[str, str], where: str
) -> None:
    """The link a colleague sends (…/console/#/tasks/ID), opened in a new tab: /console asked for
    the key, but a task's, an agent's, a memory store's or a comparison's page showed "401
    unauthorized" and no dialog."""
    context = console.browser.new_context()
    context.set_default_timeout(TIMEOUT_MS)
    try:
        page = context.new_page()
        page.goto(f"{console.url}/console/#/{where.format(**linked)}")
        page.wait_for_selector("#key-dialog[open]", timeout=10_000)  # at once, not after a page of errors
        page.fill("#key-input", console.key)
        page.press("#key-input", "Enter")
        page.wait_for_selector(LINKS[where])
        assert page.is_hidden("#alert"), page.inner_text("#alert")
    finally:
        context.close()
