"""What the console says when the API's answer is not what a page can draw, in a real browser
(the stack and the tab of tests/test_console.py): a 200 whose body is not JSON is named as such."""

from __future__ import annotations

from typing import Any

from tests.test_console import Console, Page, console, no_errors, tab

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
