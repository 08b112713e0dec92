"""The dead-letter page's Redrive button, in a real browser (the stack and the tab of
tests/test_console.py): it moves the dead letters the page shows, not whatever the tier holds
when it is pressed, and a redrive still running cannot be sent a second time by a press on the
button the page's poll drew meanwhile."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable
from typing import Any

from tests.test_console import Console, Page, console, no_errors, scripted, tab

__all__ = ["console", "tab"]  # the fixtures, shared with tests/test_console.py


def letters_shown(page: Any, tier: str) -> list[str]:
    return list(page.eval_on_selector_all(f"section[aria-labelledby='dlq-{tier}'] tr[data-task]",
                                          "rows => rows.map(r => r.dataset.task)"))  # fmt: skip


def finished_tasks(console: Console, n: int) -> list[str]:
    ids = [console.submit(scripted(f"finished {i}", [{"text": "x"}])) for i in range(n)]
    for task_id in ids:
        console.until(task_id, lambda v: v["status"] == "succeeded")
    return ids


def hold(held: list[Any]) -> Callable[[Any], None]:
    """A route handler that keeps each request unanswered in ``held`` until the test lets it go
    (Playwright marks its handler, so a bound method such as ``held.append`` cannot be one)."""

    def handler(route: Any) -> None:
        held.append(route)

    return handler


def release(page: Any, held: list[Any]) -> None:
    """Let the requests a test held go on, and stop holding more."""
    page.unroute_all(behavior="ignoreErrors")
    for route in held:
        with contextlib.suppress(Exception):  # the page moved on (or closed): nothing waits for it
            route.continue_()


def test_redrive_moves_only_the_dead_letters_the_page_shows(console: Console, tab: Page) -> None:
    """The button says "Redrive low" under the rows it shows. Before, it moved every letter of
    the tier at the click, one that came after the page's last poll (every 5 s) too: the page
    showed one, the notice said "Redrove 2"."""
    shown, unseen = finished_tasks(console, 2)
    queues = console.stack.queues()
    queues.dead_letter("low", json.dumps({"task_id": shown, "kind": "run"}), "on the page")
    page = tab.page
    page.click("a[data-nav='dead-letters']")
    page.wait_for_selector(f"tr[data-task='{shown}']:has(td.reason)")
    held: list[Any] = []
    page.route("**/dead-letters", hold(held))  # the page's next polls: what it shows stays as drawn
    try:
        queues.dead_letter("low", json.dumps({"task_id": unseen, "kind": "run"}), "came after the page drew")
        assert letters_shown(page, "low") == [shown]
        page.click("#redrive-low")
        page.wait_for_selector(".notice:not([hidden])")
        moved = page.inner_text(".notice")
        assert "Redrove 1 " in moved and shown in moved and unseen not in moved, moved
        status, listing = console.http("GET", "/dead-letters?tier=low")
        assert status == 200 and [d["task_id"] for d in listing["dead_letters"]] == [unseen], listing
    finally:
        release(page, held)
    page.wait_for_selector(f"tr[data-task='{unseen}']:has(td.reason)")  # the next poll shows it
    no_errors(tab)


def test_the_redrive_button_stays_disabled_while_its_redrive_runs(console: Console, tab: Page) -> None:
    """A double click sent one redrive (the button was disabled at once), but the page's poll drew
    a new, enabled button while the redrive was still running (a slow one: a tier holding many
    other tenants' messages), and a press on it sent a second redrive."""
    first, second = finished_tasks(console, 2)
    queues = console.stack.queues()
    queues.dead_letter("high", json.dumps({"task_id": first, "kind": "run"}), "first")
    page = tab.page
    held: list[Any] = []
    page.route("**/dead-letters/high/redrive", hold(held))  # the redrive reaches the API when let go
    try:
        page.click("a[data-nav='dead-letters']")
        page.wait_for_selector(f"tr[data-task='{first}']:has(td.reason)")
        page.dblclick("#redrive-high")
        queues.dead_letter("high", json.dumps({"task_id": second, "kind": "run"}), "second")
        # The page's poll meanwhile: the listing changed, so it draws the tier anew.
        page.wait_for_selector(f"tr[data-task='{second}']:has(td.reason)")
        assert page.is_disabled("#redrive-high")
        page.evaluate("() => document.getElementById('redrive-high').click()")  # pressed again: nothing
        assert len(held) == 1, [r.request.post_data for r in held]
        held.pop().continue_()
        page.wait_for_selector(".notice:not([hidden])")
        assert first in page.inner_text(".notice")
        page.wait_for_selector("#redrive-high:not([disabled])")  # done: the second letter may be redriven
        assert held == [], [r.request.post_data for r in held]
        assert letters_shown(page, "high") == [second]
    finally:
        release(page, held)
    no_errors(tab)
