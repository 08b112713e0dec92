"""What the console's live pages read again, in a real browser (the stack and the tab of
tests/test_console.py): a task's page does not read its finished dependencies again on every
redraw."""

from __future__ import annotations

from typing import Any

from tests.helpers import call
from tests.test_console import Console, Page, console, no_errors, scripted, tab

__all__ = ["console", "tab"]  # the fixtures, shared with tests/test_console.py


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
