"""What the console's live pages read again, in a real browser (the stack and the tab of
tests/test_console.py): the task list, once older pages are loaded, takes in newer tasks without
losing the ones they push off the first page; a task's page does not read its finished
dependencies again on every redraw."""

from __future__ import annotations

from typing import Any

from tests.helpers import call
from tests.helpers import scripted as scripted_submission
from tests.test_console import Console, Page, console, no_errors, scripted, tab

__all__ = ["console", "tab"]  # the fixtures, shared with tests/test_console.py


ROWS = "() => [...document.querySelectorAll('tr[data-task]')].map(r => r.dataset.task)"


def every_task(console: Console) -> list[str]:
    """The tenant's tasks, newest first, as the API lists them (every page)."""
    out: list[str] = []
    cursor = ""
    while True:
        status, listing = console.http("GET", f"/tasks?limit=100{cursor}")
        assert status == 200, listing
        out += [t["task_id"] for t in listing["tasks"]]
        if not listing["next_cursor"]:
            return out
        cursor = f"&cursor={listing['next_cursor']}"


def test_loading_older_tasks_then_newer_ones_arriving_leaves_no_task_out(console: Console, tab: Page) -> None:
    """Before, the first page was read again every 3 s and the older pages kept as loaded: the
    tasks newer ones pushed off the first page were in neither, and vanished."""
    store = console.stack.store()
    for _ in range(110):  # straight into the table: never run, listed all the same
        store.tasks.create(scripted_submission([{"text": "x"}]), tenant="team-a")
    page = tab.page
    page.reload()
    page.wait_for_selector("text=Load older tasks")
    page.click("text=Load older tasks")
    page.wait_for_function("() => document.querySelectorAll('tr[data-task]').length > 100")
    before = page.evaluate(ROWS)
    newer = [store.tasks.create(scripted_submission([{"text": "x"}]), tenant="team-a").task_id for _ in range(5)]
    page.wait_for_selector(f"tr[data-task='{newer[-1]}']")  # the poll that drew it read all five
    shown = page.evaluate(ROWS)
    assert len(shown) == len(set(shown)), "a task shown twice"
    assert sorted(shown[:5]) == sorted(newer) and shown[5:] == before, (len(shown), len(before))
    assert shown == every_task(console)[: len(shown)]
    no_errors(tab)


def test_a_running_tasks_page_reads_its_finished_dependencies_once(console: Console, tab: Page) -> None:
    """Each redraw of the facts (each committed event) read GET /tasks/{dependency} again for every
    dependency: three finished ones cost more requests a minute than the task itself."""
    deps = [console.submit(scripted(f"finished {i}", [{"text": "x"}])) for i in range(3)]
    for dep in deps:
        console.until(dep, lambda v: v["status"] == "succeeded")
    turns: list[dict[str, Any]] = [
        {"text": f"step {i}", "tool_calls": [call("lookup", query=f"q{i}", size=5)], "latency_seconds": 0.4}
        for i in range(8)
    ]
    task_id = console.submit(scripted("after three others", [*turns, {"text": "done"}], tools=["lookup"],
                                      depends_on=deps))  # fmt: skip
    page = tab.page
    page.goto(f"{console.url}/console/#/tasks/{task_id}")
    page.wait_for_selector("#depends-on")
    page.wait_for_selector("h1 .badge.s-succeeded", timeout=60_000)
    for dep in deps:  # each drawn with its status
        page.wait_for_selector(f"li[data-dependency='{dep}'] .badge.s-succeeded")
    reads = {d: sum(1 for _, url in tab.responses if url.endswith(f"/tasks/{d}")) for d in deps}
    # Once drawn, and once more at most: a redraw that came while that read was in flight.
    assert max(reads.values()) <= 2, reads
    no_errors(tab)
