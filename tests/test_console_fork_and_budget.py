"""The task page's fork form and budget gauge where they used to offer or show what was not so:
the fork's default step for a task paused on an approval, and the whole tree's spend while a
parent waits on its sub-agents (the stack, browser and tab of tests/test_console.py)."""

from __future__ import annotations

import re
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


def test_the_whole_trees_budget_counts_a_sub_agent_that_has_finished_while_its_parent_waits(
    console: Console, tab: Page
) -> None:
    """ "Budget (the whole tree)" and "tree $" showed the parent's own spend until it woke: a
    sub-agent's tokens were folded in only then, so a parent waiting on a slow sibling showed
    the tree as having spent less than its finished sub-agents had."""
    quick = {"turns": [{"text": "A grew 2x, and here is a longer answer so that it costs tokens"}]}
    slow = {"turns": [{"text": "thinking", "latency_seconds": 20}, {"text": "done"}]}
    children = [{"goal": "quick part", "script": quick}, {"goal": "slow part", "script": slow}]
    task_id = console.submit(
        scripted(
            "split the work",
            [{"text": "splitting", "tool_calls": [call("spawn_subagents", subagents=children)]}, {"text": "merged"}],
            tools=["spawn_subagents"],
        )
    )
    view = console.until(
        task_id, lambda v: v["status"] == "waiting" and v["children"]["by_status"].get("succeeded") == 1
    )
    store = console.stack.store()
    own = store.budgets.get(task_id)  # the parent's ledger: no child folded in yet
    shares = store.budgets.many(view["children"]["task_ids"])
    assert not any(s.settled for s in shares.values())
    spent = own.used + sum(s.used for s in shares.values())
    assert spent > own.used  # the quick child spent tokens the parent's ledger does not hold yet
    budget = view["budget"]
    assert budget["used"] == spent and budget["used"] + budget["reserved"] + budget["available"] == budget["cap"]
    assert budget["cost_usd"] == str(own.cost_usd + sum(s.cost_usd for s in shares.values()))
    for child_id in view["children"]["task_ids"]:  # a sub-agent is not forked: no step offered
        assert console.http("GET", f"/tasks/{child_id}")[1]["fork_at_step"] is None
    page = tab.page
    page.goto(f"{console.url}/console/#/tasks/{task_id}")
    page.wait_for_selector("svg.gauge text.gauge-label")
    label = page.text_content("svg.gauge text.gauge-label") or ""  # "1,068 / 200,000"
    shown = int(re.sub(r"[^0-9]", "", label.split("/")[0]))
    assert shown == spent, f"the whole tree shows {shown} tokens; it has spent {spent}"
    # Once the children are folded in (here: by the cancel), each is counted once, not twice.
    assert console.http("POST", f"/tasks/{task_id}/cancel")[0] == 200
    view = console.until(task_id, lambda v: v["status"] == "cancelled")
    assert all(s.settled for s in store.budgets.many(view["children"]["task_ids"]).values())
    assert view["budget"]["used"] == store.budgets.get(task_id).used
    no_errors(tab)
