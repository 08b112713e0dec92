"""Policy rules and two runs compared in the web console, in a real browser (Debian's Chromium
through Playwright, the stack and the tab of tests/test_console.py).

The Policies page shows the tenant's rules per scope with their effect and mode, a scope's
versions with their text, and a sample call tested against the stored rules with what each
log_only rule would have decided beside the decision; a task's trace shows, on each tool call,
what the rules decided and what a log_only rule would have (issue 44: "the console shows rules").
The compare page shows two tasks side by side with the first differing step highlighted, reached
from a task's "Compare with…" and from a fork to its original (issue 46, item 4)."""

from __future__ import annotations

import time
import uuid
from typing import Any

from tests.helpers import call
from tests.test_console import Console, Page, console, no_errors, scripted, shot, tab

__all__ = ["console", "tab"]  # the fixtures, shared with tests/test_console.py

TENANT_RULES = """\
@id("no-forbidden-lookups")
@message("that query is off limits")
forbid(principal, action == Action::"tool", resource == Tool::"lookup")
when { context.args has query && context.args.query == "forbidden" };

@id("ask-for-big-lookups")
@description("shadowed until the counts look right")
@message("lookups above size 10 need a person")
@effect("ask")
@mode("log_only")
forbid(principal, action == Action::"tool", resource == Tool::"lookup")
when { context.args has size && context.args.size > 10 };
"""
AGENT_RULES = ['@id("no-spawns")\nforbid(principal, action == Action::"spawn", resource);\n',
               '@id("no-spawns") @message("this agent works alone")\nforbid(principal, action == Action::"spawn", resource);\n']  # fmt: skip


def _put(console: Console, scope: str, text: str) -> dict[str, Any]:
    status, body = console.http("PUT", f"/policies/{scope}", {"policies": text})
    assert status in (200, 201), body
    return dict(body)


def _lookups(goal: str, *queries: str, answer: str = "done") -> dict[str, Any]:
    turns = [{"text": f"looking up {q}", "tool_calls": [call("lookup", query=q, size=20)]} for q in queries]
    return scripted(goal, [*turns, {"text": answer}], tools=["lookup"])


def _traced_policies(console: Console, task_id: str) -> list[dict[str, Any] | None]:
    status, page = console.http("GET", f"/tasks/{task_id}/trace?limit=200")
    assert status == 200, page
    return [e.get("policy") for e in page["events"] if e["type"] == "tool_call"]


def test_the_policies_page_shows_each_rule_its_mode_its_versions_and_what_log_only_rules_would_decide(
    console: Console, tab: Page
) -> None:
    _put(console, "tenant", TENANT_RULES)
    for text in AGENT_RULES:
        _put(console, "agent:payments", text)
    page = tab.page
    page.goto(f"{console.url}/console/#/policies")
    page.wait_for_selector("section[data-scope='tenant'] tr[data-rule='tenant/ask-for-big-lookups']")
    enforced = page.locator("tr[data-rule='tenant/no-forbidden-lookups']")
    shadowed = page.locator("tr[data-rule='tenant/ask-for-big-lookups']")
    assert enforced.get_attribute("data-mode") == "enforce" and shadowed.get_attribute("data-mode") == "log_only"
    assert "deny" in enforced.inner_text() and "that query is off limits" in enforced.inner_text()
    shadow_text = shadowed.inner_text()
    assert "ask" in shadow_text and "log_only" in shadow_text and "shadowed until the counts look right" in shadow_text
    assert "version 2" in page.inner_text("section[data-scope='agent:payments'] h2")
    assert "this agent works alone" in page.inner_text("tr[data-rule='agent:payments/no-spawns']")

    # A scope's versions, newest first, each one's text shown on demand.
    page.click("[id='history-agent:payments']")
    page.wait_for_selector("#policy-history tr[data-version='1']")
    assert page.locator("#policy-history tr[data-version]").evaluate_all("rs => rs.map(r => r.dataset.version)") == [
        "2", "1"
    ]  # fmt: skip
    assert "this agent works alone" in page.inner_text("#policy-version-text")
    page.click("#policy-v1")
    page.wait_for_function("() => !document.getElementById('policy-version-text').textContent.includes('alone')")
    assert page.inner_text("#policy-version-text").strip() == AGENT_RULES[0].strip()

    # A sample call: allowed, and beside it what the log_only rule would have decided.
    page.fill("#test-tool", "lookup")
    page.fill("#test-args", '{"query": "invoices", "size": 20}')
    page.click("#policy-test button[type=submit]")
    page.wait_for_selector("#test-decision[data-decision='allow']")
    assert "tenant/ask-for-big-lookups v1 would ask" in page.inner_text("#test-log-only")
    shot(console, tab, "policies")
    page.fill("#test-args", '{"query": "forbidden", "size": 5}')
    page.click("#policy-test button[type=submit]")
    page.wait_for_selector("#test-decision[data-decision='deny']")
    assert "tenant/no-forbidden-lookups" in page.inner_text("#test-decision")
    assert "No log_only rule" in page.inner_text("#test-result")
    page.fill("#test-args", "{not json")
    page.click("#policy-test button[type=submit]")
    page.wait_for_selector("#alert:has-text('arguments: not JSON')")

    # A task's trace: what happened to each call beside what the log_only rule would have done.
    # Workers read the rules through a 5 s cache: a task submitted before they see them runs
    # without; each try waits for its task to end and reads its trace (an observable event).
    deadline = time.monotonic() + 60
    while True:
        task_id = console.submit(_lookups("two lookups under rules", "invoices", "forbidden"))
        console.until(task_id, lambda v: v["status"] == "succeeded")
        decided = _traced_policies(console, task_id)
        if all(decided):
            break
        assert time.monotonic() < deadline, decided
    page.goto(f"{console.url}/console/#/tasks/{task_id}")
    page.wait_for_selector("h1 .badge.s-succeeded")
    page.click("ul.trace details.llm >> nth=0 >> summary")
    page.wait_for_selector("ul.trace details.tool [data-policy='allow']")
    first = page.inner_text("ul.trace details.tool >> nth=0 >> summary")
    assert "policy: allow" in first and "log_only tenant/ask-for-big-lookups would ask" in first, first
    page.click("ul.trace details.llm >> nth=1 >> summary")
    second = page.locator("ul.trace details.tool >> nth=1 >> summary")
    second.locator("[data-policy='deny']").wait_for()
    assert "policy: deny by tenant/no-forbidden-lookups" in second.inner_text()
    _put(console, "tenant", "")  # the other tests of this stack run without rules
    no_errors(tab)


def test_two_runs_are_compared_side_by_side_with_the_first_difference_highlighted(console: Console, tab: Page) -> None:
    first = console.submit(_lookups("which invoice is largest", "invoices", answer="invoice 7"))
    second = console.submit(_lookups("which invoice is largest", "invoices", answer="invoice 9, I think"))
    for task_id in (first, second):
        console.until(task_id, lambda v: v["status"] == "succeeded")
    page = tab.page
    page.goto(f"{console.url}/console/#/tasks/{first}")
    page.wait_for_selector("h1 .badge.s-succeeded")
    page.fill("#compare-with", second)
    page.press("#compare-with", "Enter")
    page.wait_for_selector("#first-diff")
    assert page.evaluate("location.hash") == f"#/compare/{first}/{second}"
    # Steps 1 and 2 (the call and its result) are the same; step 3, the answer, is the first difference.
    rows = page.locator("table.compare-steps tbody tr")
    assert rows.evaluate_all("rs => rs.map(r => [r.dataset.step, r.dataset.same])") == [
        ["1", "true"], ["2", "true"], ["3", "false"]
    ]  # fmt: skip
    assert page.get_attribute("#first-diff", "data-step") == "3"
    assert "differs first" in (page.get_attribute("#first-diff", "class") or "")
    assert "First difference at step 3" in page.inner_text("#diverged")
    assert "invoice 7" in page.inner_text("#first-diff") and "invoice 9, I think" in page.inner_text("#first-diff")
    assert page.locator("tr[data-fact='tool_calls'] td").all_inner_texts()[:2] == ["1", "1"]
    shot(console, tab, "compare")

    # From a fork to its original: the same steps up to where it was forked (and, scripted, after).
    status, forked = console.http("POST", f"/tasks/{first}/fork", {"at_step": 2, "model": "claude-haiku-4-5"})
    assert status in (200, 201, 202), forked
    fork = forked["task_id"]
    console.until(fork, lambda v: v["status"] == "succeeded")
    page.goto(f"{console.url}/console/#/tasks/{fork}")
    page.click("#compare-original")
    page.wait_for_selector("#diverged.notice")
    assert page.evaluate("location.hash") == f"#/compare/{first}/{fork}"
    assert "The same steps" in page.inner_text("#diverged") and "forked from A at step 2" in page.inner_text("main")
    assert page.locator("#first-diff").count() == 0
    assert page.locator("tr[data-fact='model']").get_attribute("class") == "differs"
    no_errors(tab)


def test_comparing_with_another_tenants_task_shows_the_apis_404_naming_the_field(console: Console, tab: Page) -> None:
    mine = console.submit(scripted("mine", [{"text": "x"}]))
    theirs = console.submit(scripted("not yours", [{"text": "x"}]), key=console.other_key)
    page = tab.page
    page.goto(f"{console.url}/console/#/compare/{mine}/{theirs}")
    page.wait_for_selector(f".error-page:has-text(\"no task '{theirs}'\")")
    assert "404 task_not_found" in page.inner_text(".error-page")
    assert [e for e in tab.errors if "status of 404" not in e] == []


def test_a_held_call_only_the_tenant_decides_says_so_on_an_end_users_task(console: Console, tab: Page) -> None:
    """An end user's task held on an ``ask_tenant`` tool (a rule's ask the same): the approval box
    says only the tenant decides it and the user's token may not; the console's key approves."""
    backend = console.stack.create_api_key("team-a", act_for_users=True)
    turns: list[dict[str, Any]] = [
        {"text": "", "tool_calls": [call("charge_card", amount_cents=1250, memo="refund")]},
        {"text": "refunded"},
    ]
    body = scripted("refund ann", turns, tools=["charge_card"], user="ann")
    body["constraints"]["tool_policies"] = {"charge_card": "ask_tenant"}
    task_id = console.submit(body, key=backend)
    console.until(task_id, lambda v: v["status"] == "paused")
    page = tab.page
    page.goto(f"{console.url}/console/#/tasks/{task_id}")
    page.wait_for_selector("#approver")
    assert "Only the tenant decides this one" in page.inner_text("#approver")
    assert "ann's token may not" in page.inner_text("#approver")
    assert "waiting for approval by the tenant" in page.inner_text(".activity")
    page.click("#approve")
    page.wait_for_selector("h1 .badge.s-succeeded", timeout=60_000)
    no_errors(tab)


def test_a_caps_soft_threshold_pause_shows_its_approve_though_no_tool_call_is_held(console: Console, tab: Page) -> None:
    """A cap's soft threshold pauses a task before a model call: no tool call is held, and the
    page once showed no approve for it at all. The approval box shows the cap's question and
    the console's key (the tenant's, who decides a cap) approves it by its id."""
    user = f"cara-{uuid.uuid4().hex[:6]}"
    soft = {"daily_tokens": 100_000_000, "soft_daily_tokens": 1}
    assert console.http("PUT", f"/caps/user/{user}", soft)[0] == 200
    backend = console.stack.create_api_key("team-a", act_for_users=True)
    task_id = console.submit(scripted("answer", [{"text": "answered"}], user=user), key=backend)
    view = console.until(task_id, lambda v: v["status"] == "paused")
    assert view["pending_calls"] == [] and view["pending_tool_use_id"].startswith("agentq-cap-user-day-"), view
    page = tab.page
    page.goto(f"{console.url}/console/#/tasks/{task_id}")
    page.wait_for_selector("#approve")
    assert "soft" in page.inner_text(".approval")
    page.click("#approve")
    page.wait_for_selector("h1 .badge.s-succeeded", timeout=60_000)
    no_errors(tab)
