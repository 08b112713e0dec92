"""Online evaluation in the web console, in a real browser (Debian's Chromium through Playwright,
the stack and the tab of tests/test_console.py): an agent's page shows which of its aliases grade
a share of their tasks, and each version's pass rate and cost per task over time, as a chart and
the table it is drawn from (a task that never answered counted apart, as a fail), read from GET
/agents/{name}/quality."""

from __future__ import annotations

import time
import uuid
from decimal import Decimal

from agentq.core.quality import GradeTally, hour_of

from tests.test_console import Console, Page, console, no_errors, shot, tab

__all__ = ["console", "tab"]  # the fixtures, shared with tests/test_console.py


def test_an_agents_page_shows_each_versions_pass_rate_and_cost_over_time(console: Console, tab: Page) -> None:
    name = f"graded-{uuid.uuid4().hex[:6]}"
    for text in ("DONE, as asked", "not yet"):
        agent = {"name": name, "provider": "scripted", "script": {"turns": [{"text": text}]}}
        assert console.http("POST", "/agents", agent)[0] == 201
    alias = {"versions": [{"version": 1, "weight": 50}, {"version": 2, "weight": 50}],
             "online": {"rate": 1, "grade": {"grader": "says_done"}}}  # fmt: skip
    assert console.http("PUT", f"/agents/{name}/aliases/prod", alias)[0] == 200
    # Earlier hours, counted as a worker counts a grade (storage.quality), so there is a history
    # to draw: v1 steady, v2 (the canary) slipping.
    store = console.stack.store()
    now = hour_of(time.time())
    for back in range(1, 7):
        for version, passes in ((1, 4), (2, max(0, back - 3))):
            for i in range(4):
                store.quality.count(GradeTally(
                    tenant="team-a", agent=name, version=version, task_id=f"{name}-{version}-{back}-{i}", step=2,
                    hour=now - 2 * back, passed=i < passes, score=1.0 if i < passes else 0.2,
                    task_cost_usd=Decimal("0.0001") * (version + 1), grade_cost_usd=Decimal(0), grade_tokens=0,
                ))  # fmt: skip
    # and a task of the canary's that ended without an answer: unanswered, a fail of its pass rate
    store.quality.count(GradeTally(
        tenant="team-a", agent=name, version=2, task_id=f"{name}-2-unanswered", step=None, hour=now - 12,
        passed=False, score=None, task_cost_usd=Decimal("0.0003"), grade_cost_usd=Decimal(0), grade_tokens=0,
    ))  # fmt: skip
    ran = {1: 0, 2: 0}
    for _ in range(6):
        task_id = console.submit({"goal": "say DONE when done", "agent": f"{name}@prod"})
        view = console.until(task_id, lambda v: v["status"] == "succeeded" and v.get("grade") is not None)
        assert view["grade"]["online"] == "prod"  # graded, and succeeded whatever the grade
        ran[int(view["agent"].split("@")[1])] += 1
    page = tab.page
    page.goto(f"{console.url}/console/#/agents/{name}")
    page.wait_for_selector("#quality-chart")
    assert "100% of tasks · grader says_done · bar 0.8" in page.inner_text("#aliases tr[data-alias='prod']")
    rows = {
        (int(r.get_attribute("data-hour") or 0), r.get_attribute("data-version")): r.inner_text()
        for r in page.locator("#quality tbody tr").all()
    }
    for version, count in ran.items():
        if count:
            row = rows[(now, str(version))]
            assert f"\t{count}\t{count if version == 1 else 0}\t0\t0\t{100 if version == 1 else 0}%" in row, row
    assert "\t4\t3\t0\t1\t60%" in rows[(now - 12, "2")]  # 3 of 4 answers passed, and one task never answered
    assert "\t50%" in rows[(now - 10, "2")] and "\t0%" in rows[(now - 2, "2")]  # the canary slipping, hour by hour
    assert page.locator("#quality-chart circle[data-version='2']").count() >= 6
    shot(console, tab, "agent-quality")
    no_errors(tab)
