"""The task page's fork form and budget gauge where they used to offer or show what was not so:
the fork's default step for a task paused on an approval, and the whole tree's spend while a
parent waits on its sub-agents (the stack, browser and tab of tests/test_console.py)."""

from __future__ import annotations

from typing import Any

from tests.helpers import call
from tests.test_console import Console, Page, console, no_errors, scripted, tab

__all__ = ["console", "tab"]  # the fixtures, shared with tests/test_console.py


def test_the_fork_form_of_a_task_paused_for_approval_offers_a_step_the_api_forks_at(
    console: Console, tab: Page
) -> None:
    """The form was filled with the last committed step, which for a task paused on an `ask` is
    the model's turn asking for the held call: the API refuses it (422 naming at_step), so Fork
    pressed as offered always failed. The view says the step (fork_at_step), the form offers it."""
    body: dict[str, Any] = scripted(
        "note it, asking first",
        [{"text": "noting", "tool_calls": [call("note_write", key="k", value="v")]}, {"text": "done"}],
        tools=["note_write"],
    )
    body["constraints"]["tool_policies"] = {"note_write": "ask"}
    task_id = console.submit(body)
    view = console.until(task_id, lambda v: v["status"] == "paused")
    assert (view["step"], view["fork_at_step"]) == (1, 0), view
    page = tab.page
    page.goto(f"{console.url}/console/#/tasks/{task_id}")
    page.wait_for_selector("#fork")
    assert page.input_value("#fork-step") == "0"
    page.click("#fork")
    page.wait_for_selector(".notice:has-text('Forked as'), #alert:not([hidden])")
    alert = page.locator("#alert")
    assert not alert.is_visible(), alert.inner_text()
    no_errors(tab)
