"""Outcomes in the web console, in a real browser (Debian's Chromium through Playwright, the
stack and the tab of tests/test_console.py): a graded task shows its grade in its facts (score,
bar, attempt, what grading cost), each grade as a step and in the trace, and a task whose answer
stayed below the bar shows failed_outcome with its last feedback and the answer kept."""

from __future__ import annotations

from typing import Any

from tests.test_console import Console, Page, console, no_errors, scripted, shot, tab

__all__ = ["console", "tab"]  # the fixtures, shared with tests/test_console.py


def graded(goal: str, turns: list[str], **outcome: Any) -> dict[str, Any]:
    return {**scripted(goal, [{"text": t} for t in turns]), "outcome": {"grader": "says_done", **outcome}}


def test_a_graded_task_shows_each_grade_as_a_step_and_its_latest_in_its_facts(console: Console, tab: Page) -> None:
    task_id = console.submit(graded("say when it is done", ["not yet", "DONE"], max_attempts=2))
    console.until(task_id, lambda v: v["status"] == "succeeded")
    page = tab.page
    page.goto(f"{console.url}/console/#/tasks/{task_id}")
    page.wait_for_selector("h1 .badge.s-succeeded")
    page.wait_for_selector("#grade[data-passed='true']")
    facts = page.inner_text("#grade")
    assert "passed" in facts and "score 1.00 · bar 0.80 · attempt 2 of 2" in facts, facts
    page.wait_for_selector("tr[data-kind='grade'] >> nth=1")
    rows = page.locator("tr[data-kind='grade']").all_inner_texts()
    assert len(rows) == 2 and "below the bar: The answer must say DONE." in rows[0] and "passed" in rows[1], rows
    assert page.locator("li.grade").count() == 2
    shot(console, tab, "outcome-graded")
    no_errors(tab)


def test_an_answer_below_the_bar_ends_failed_outcome_with_its_feedback_and_the_answer_kept(
    console: Console, tab: Page
) -> None:
    task_id = console.submit(graded("say when it is done", ["not yet"], max_attempts=1))
    console.until(task_id, lambda v: v["status"] == "failed_outcome")
    page = tab.page
    page.goto(f"{console.url}/console/#/tasks/{task_id}")
    page.wait_for_selector("h1 .badge.s-failed_outcome")
    page.wait_for_selector("#grade[data-passed='false']")
    assert "The answer must say DONE." in page.inner_text("#grade")
    assert "outcome_failed" in page.inner_text(".error-box")
    assert page.inner_text("#result-h") == "Answer (below its outcome's bar)"
    assert page.inner_text("#result-h + pre") == "not yet"
    shot(console, tab, "outcome-failed")
    no_errors(tab)
