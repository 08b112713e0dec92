"""The web console in a real browser: Debian's Chromium driven by Playwright against a local
stack as `agentq dev --auth` runs it (moto server, worker processes, the API on localhost with
API keys), with the Anthropic provider pointed at the local Messages API server for the task
that has to fail into a dead-letter queue.

One stack and one browser for the module; each test gets a fresh browser context (so a fresh
sessionStorage: the key is typed into the console's dialog every time) and fails on any console
error or uncaught page error. Screenshots go to $AGENTQ_CONSOLE_SCREENSHOTS when it is set
(``make console-screenshots`` writes docs/console/), else to the test's tmp_path.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from agentq.resources import QueueSettings
from agentq_dev.stack import LocalStack

from tests.fake_messages_api import FakeMessagesAPI, anthropic_env, overloaded, text_reply, tool_use_reply
from tests.helpers import agentq_process, call
from tests.helpers import scripted as scripted_submission
from tests.model_server import Gate

# Debian's headless shell (`make chromium`), else its full browser, else the tests are skipped.
BROWSERS = ("/usr/bin/chromium-headless-shell", "/usr/bin/chromium")
CHROMIUM = os.environ.get("AGENTQ_CHROMIUM") or next((b for b in BROWSERS if Path(b).exists()), BROWSERS[0])
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
ROOT = Path(__file__).resolve().parent.parent
MAX_RECEIVES = 2  # the stack's queues: a retryable failure dead-letters on the second receive
# The trace's first LLM call that was committed (not an orphan: a call a worker that lost its task
# mid-call paid for and never committed, drawn in the trace with no tool calls under it).
FIRST_COMMITTED_CALL = "ul.trace details.llm:not(.orphan) >> nth=0"
PROVIDER_ATTEMPTS = 5  # the stack's AGENTQ_PROVIDER_RETRY: each receive tries the provider this often
TIMEOUT_MS = 30_000

pytestmark = pytest.mark.skipif(
    not Path(CHROMIUM).exists(), reason=f"no Chromium at {CHROMIUM} (make chromium installs Debian's)"
)


@dataclass
class Console:
    stack: LocalStack
    fake: FakeMessagesAPI
    url: str
    key: str  # tenant team-a
    other_key: str  # tenant team-b
    browser: Any
    shots: Path

    def http(self, method: str, path: str, body: Any = None, key: str | None = None) -> tuple[int, Any]:
        data = json.dumps(body).encode() if body is not None else None
        headers = {"Content-Type": "application/json", "Authorization": f"Bearer {key or self.key}"}
        req = urllib.request.Request(self.url + path, data=data, method=method, headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=30) as resp:
                return resp.status, json.loads(resp.read() or b"null")
        except urllib.error.HTTPError as err:
            return err.code, json.loads(err.read() or b"null")

    def submit(self, body: dict[str, Any], key: str | None = None) -> str:
        status, data = self.http("POST", "/tasks", body, key=key)
        assert status == 202, data
        return str(data["task_id"])

    def paused(self, goal: str, question: str, answer: str) -> str:
        """A task that asks for approval (and answers ``answer`` after the decision), once paused."""
        turns: list[dict[str, Any]] = [
            {"text": "", "tool_calls": [call("request_approval", question=question)]},
            {"text": answer},
        ]
        task_id = self.submit(scripted(goal, turns, tools=["request_approval"]))
        self.until(task_id, lambda v: v["status"] == "paused")
        return task_id

    def until(
        self, task_id: str, pred: Callable[[dict[str, Any]], bool], timeout: float = 60, key: str | None = None
    ) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            status, view = self.http("GET", f"/tasks/{task_id}", key=key)
            assert status == 200, view
            if pred(view):
                return dict(view)
            assert time.monotonic() < deadline, f"task {task_id} stuck: {view['status']} at step {view['step']}"
            time.sleep(0.1)


@dataclass
class Page:
    """A browser tab with the console open, and what it logged."""

    page: Any
    errors: list[str] = field(default_factory=list)
    responses: list[tuple[int, str]] = field(default_factory=list)
    foreign: list[str] = field(default_factory=list)  # requests to any other origin (there must be none)
    refused: list[str | None] = field(default_factory=list)  # the Authorization header of each 401


def scripted(goal: str, turns: list[dict[str, Any]], tools: list[str] | None = None, **extra: Any) -> dict[str, Any]:
    return {
        "goal": goal,
        "provider": "scripted",
        "script": {"turns": turns},
        "constraints": {"tools": tools or []},
        **extra,
    }


@pytest.fixture(scope="module")
def console(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Console]:
    from playwright.sync_api import sync_playwright

    fake = FakeMessagesAPI().start()
    stack = LocalStack(
        prefix=f"console{uuid.uuid4().hex[:8]}",
        workers=2,
        auth=True,
        queue_settings=QueueSettings(visibility_timeout=4, max_receive_count=MAX_RECEIVES),
        tool_modules=("agentq.core.tools.examples", "tests.effect_tools"),
        extra_env={
            **anthropic_env(fake),
            # The dead-letter test's provider is overloaded on all PROVIDER_ATTEMPTS of both
            # receives: retried every 0.05-0.2 s, not the default 0.5 s doubling (~7 s a receive).
            "AGENTQ_PROVIDER_RETRY": json.dumps(
                {"max_attempts": PROVIDER_ATTEMPTS, "base_delay": 0.05, "max_delay": 0.2}
            ),
            "AGENTQ_TEST_LEDGER": str(tmp_path_factory.mktemp("ledger") / "ledger.jsonl"),
            "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH", "")])),
        },
    )
    shots = Path(os.environ.get("AGENTQ_CONSOLE_SCREENSHOTS") or tmp_path_factory.mktemp("screenshots"))
    shots.mkdir(parents=True, exist_ok=True)
    try:
        stack.start()
        assert stack.api_server is not None
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            try:
                yield Console(
                    stack=stack,
                    fake=fake,
                    url=stack.api_server.url,
                    key=stack.create_api_key("team-a"),
                    other_key=stack.create_api_key("team-b"),
                    browser=browser,
                    shots=shots,
                )
            finally:
                browser.close()
    finally:
        stack.stop()
        fake.stop()


@pytest.fixture
def tab(console: Console) -> Iterator[Page]:
    """A fresh context (empty sessionStorage) at the console; the key typed into its dialog."""
    context = console.browser.new_context(viewport={"width": 1280, "height": 900})
    context.set_default_timeout(TIMEOUT_MS)
    page = context.new_page()
    opened = Page(page)

    def on_console(message: Any) -> None:
        # Chromium logs every refused fetch as a console error; the one 401 expected (the
        # console's first call, made before it has a key) is checked on the responses instead.
        if message.type == "error" and "status of 401" not in message.text:
            opened.errors.append(message.text)

    def on_response(response: Any) -> None:
        opened.responses.append((response.status, response.url))
        if response.status == 401:
            opened.refused.append(response.request.headers.get("authorization"))

    def on_request(request: Any) -> None:
        if request.url.startswith(("http", "ws")) and not request.url.startswith(console.url):
            opened.foreign.append(request.url)

    page.on("console", on_console)
    page.on("pageerror", lambda e: opened.errors.append(f"pageerror: {e}"))
    page.on("response", on_response)
    page.on("request", on_request)
    page.goto(console.url + "/console")
    # No key yet: the first API call answers 401 and the console asks for one.
    page.wait_for_selector("#key-dialog[open]")
    assert opened.refused == [None]
    page.fill("#key-input", console.key)
    page.press("#key-input", "Enter")
    page.wait_for_selector("table.tasks")
    yield opened
    context.close()
    assert opened.foreign == []
    assert opened.refused == [None]  # no call made with the key was refused


def no_errors(tab: Page) -> None:
    assert tab.errors == [], tab.errors


def shot(console: Console, tab: Page, name: str, *, full_page: bool = True) -> None:
    tab.page.screenshot(path=str(console.shots / f"{name}.png"), full_page=full_page)


def tab_to(tab: Page, element_id: str, presses: int = 80) -> None:
    """Press Tab until the element has focus: it is reachable by keyboard alone."""
    for _ in range(presses):
        if tab.page.evaluate("document.activeElement && document.activeElement.id") == element_id:
            return
        tab.page.keyboard.press("Tab")
    raise AssertionError(f"#{element_id} not reached with {presses} Tab presses")


# ------------------------------------------------------------------------------------------ tests


def test_an_operator_key_sees_every_tenants_running_and_waiting_counts_and_a_tenant_key_sees_no_table(
    console: Console, tab: Page
) -> None:
    store = console.stack.store()
    busy, idle = f"busy-{uuid.uuid4().hex[:6]}", f"idle-{uuid.uuid4().hex[:6]}"
    store.slots.set_limit(busy, 1)
    store.slots.set_limit(idle, 4)
    store.slots.set_weight(idle, 3)  # its share of a full fleet, shown beside its limit
    # Straight into the table, never enqueued: one task holds busy's one slot, one waits for it.
    holder, waiter = (store.tasks.create(scripted_submission([{"text": "x"}]), tenant=busy) for _ in range(2))
    assert store.slots.admit(holder, store.slots.slots_for(holder)).outcome == "admitted"
    refused = store.slots.admit(waiter, store.slots.slots_for(waiter))
    assert refused.outcome == "refused" and refused.slot is not None
    store.slots.park(waiter, refused.slot, "normal")

    page = tab.page  # signed in with team-a's key: a tenant's
    page.wait_for_selector("#tenant-usage:has-text('waiting for a slot')")
    assert page.locator("#tenants-usage").is_hidden()
    assert not [url for _, url in tab.responses if "/usage/tenants" in url]  # not even asked

    operator = console.stack.create_api_key("ops", operator=True)
    page.evaluate("key => window.sessionStorage.setItem('agentq.apiKey', key)", operator)
    page.reload()
    page.wait_for_selector(f"#tenants-usage tr[data-tenant='{idle}']")
    cells = "tr => Array.from(tr.querySelectorAll('td')).map(td => td.textContent)"
    assert page.eval_on_selector(f"#tenants-usage tr[data-tenant='{busy}']", cells) == [busy, "1", "1", "1", "1"]
    assert page.eval_on_selector(f"#tenants-usage tr[data-tenant='{idle}']", cells) == [idle, "0", "0", "4", "3"]
    # Each header stands over its column: a column of numbers is right-aligned, its header too.
    aligned = "t => Array.from(t.querySelectorAll('th')).map(th => getComputedStyle(th).textAlign)"
    assert page.eval_on_selector("#tenants-usage table", aligned) == ["left", "right", "right", "right", "right"]
    shot(console, tab, "tenants-usage")
    no_errors(tab)


def test_the_list_shows_this_tenants_tasks_newest_first_with_live_counts_and_search(
    console: Console, tab: Page
) -> None:
    older = console.submit(scripted("older task", [{"text": "one"}], metadata={"team": "blue"}))
    newer = console.submit(scripted("newer task", [{"text": "two"}], metadata={"team": "green"}))
    foreign = console.submit(scripted("someone else's", [{"text": "no"}]), key=console.other_key)
    for task_id in (older, newer):
        console.until(task_id, lambda v: v["status"] == "succeeded")
    page = tab.page
    page.wait_for_selector(f"tr[data-task='{newer}'] .badge.s-succeeded")
    ids = page.eval_on_selector_all("tr[data-task]", "rows => rows.map(r => r.dataset.task)")
    assert ids.index(newer) < ids.index(older) and foreign not in ids
    # This tenant's running slots, from GET /usage (no limit on the test stack).
    page.wait_for_selector("#tenant-usage:has-text('waiting for a slot (no running limit)')")
    succeeded = page.locator("button[data-status='succeeded'] .count")
    before = int(succeeded.inner_text().replace(",", ""))

    # Live: a task submitted now shows up, and the count moves, without a reload.
    live = console.submit(scripted("live task", [{"text": "three"}]))
    page.wait_for_selector(f"tr[data-task='{live}'] .badge.s-succeeded")
    page.wait_for_function(
        "n => Number(document.querySelector(\"button[data-status='succeeded'] .count\").textContent) > n", arg=before
    )

    # key=value is the API's search over every task of the tenant; other text filters the page.
    page.fill("#task-search", "team=blue")
    page.wait_for_selector("p:has-text('Tasks whose metadata has team=blue')")
    page.wait_for_function(
        "id => [...document.querySelectorAll('tr[data-task]')].map(r => r.dataset.task).join() === id", arg=older
    )
    assert any("metadata=team%3Dblue" in url for _, url in tab.responses)
    page.fill("#task-search", "newer task")
    page.wait_for_function(
        "id => [...document.querySelectorAll('tr[data-task]')].map(r => r.dataset.task).join() === id", arg=newer
    )
    page.fill("#task-search", "")
    page.click("button[data-status='succeeded']")
    page.wait_for_selector("button[data-status='succeeded'][aria-pressed='true']")
    shot(console, tab, "tasks")
    no_errors(tab)


def test_a_task_submitted_from_the_page_opens_and_a_refused_one_shows_the_apis_field(
    console: Console, tab: Page
) -> None:
    page = tab.page
    tab_to(tab, "new-task")
    page.keyboard.press("Enter")  # a <details> opens by keyboard
    page.wait_for_selector("#new-task-json", state="visible")
    template = json.loads(page.input_value("#new-task-json"))
    assert set(template) >= {"goal", "provider", "model", "constraints"}
    # What the API refuses is shown with its field, and nothing is created.
    before = [t["task_id"] for t in console.http("GET", "/tasks?limit=100")[1]["tasks"]]
    page.fill(
        "#new-task-json", json.dumps({**scripted("g", [{"text": "x"}]), "constraints": {"tools": ["no_such_tool"]}})
    )
    page.click("#new-task-submit")
    page.wait_for_selector(".json-form .error-box:has-text('422')")
    assert "constraints.tools" in page.inner_text(".json-form .error-box")
    page.fill("#new-task-json", '{"goal": "unfinished"')
    page.click("#new-task-submit")
    page.wait_for_selector(".json-form .error-box:has-text('Not JSON')")
    assert [t["task_id"] for t in console.http("GET", "/tasks?limit=100")[1]["tasks"]] == before
    page.fill(
        "#new-task-json",
        json.dumps(scripted("from the console", [{"text": "submitted by hand"}], metadata={"via": "console"})),
    )
    tab_to(tab, "new-task-submit")
    page.keyboard.press("Enter")
    page.wait_for_selector("#task-id")
    page.wait_for_selector("h1 .badge.s-succeeded")
    view = console.until(page.inner_text("#task-id"), lambda v: v["status"] == "succeeded")
    assert view["result"] == "submitted by hand" and view["metadata"] == {"via": "console"}
    assert [e for e in tab.errors if "status of 422" not in e] == []


def test_a_running_task_shows_its_steps_as_they_commit_and_polls_with_etags(console: Console, tab: Page) -> None:
    # Steps 1 and 2 (the first call, its lookup) commit at once; the second call's reply is held
    # until the page has shown them without step 3, then the rest commits: the page, open all
    # along, shows each step as it commits, whatever the machine's speed.
    held = Gate(limit=120)
    calls = [tool_use_reply("lookup", {"query": f"q{i}", "size": 50}, text=f"looking up {i}") for i in range(4)]
    calls[1] = dataclasses.replace(calls[1], gate=held)
    console.fake.enqueue(*calls, text_reply('{"found": 4, "ok": true}'))
    task_id = console.submit(
        {"goal": "look four things up", "provider": "anthropic", "model": "claude-haiku-4-5",
         "constraints": {"tools": ["lookup"]}}
    )  # fmt: skip
    console.until(task_id, lambda v: v["step"] >= 2)
    page = tab.page
    page.goto(f"{console.url}/console/#/tasks/{task_id}")
    page.wait_for_selector("#task-id")
    page.wait_for_selector("tr[data-step='2']")
    assert page.locator("tr[data-step='3']").count() == 0  # not there yet: it appears as it commits
    held.open()
    page.wait_for_selector("tr[data-step='9']", timeout=60_000)
    assert not held.expired
    page.wait_for_selector("h1 .badge.s-succeeded")
    worker = page.inner_text("tr[data-step='1'] td:nth-child(4)")  # the lease owner, host:pid
    assert int(worker.rsplit(":", 1)[1]) in {p.pid for p in console.stack.processes}
    # Its lease epoch: 1, unless a loaded machine's worker lost the task to another mid-call.
    step_1 = next(s for s in console.stack.store().steps.load(task_id) if s.number == 1)
    assert page.inner_text("tr[data-step='1'] td:nth-child(5)") == str(step_1.epoch)
    assert page.locator("svg.gauge .gauge-used").count() == 1
    assert page.locator("svg.chart rect.bar-in:not(.orphan)").count() == 5  # one bar per committed LLM call
    assert page.locator("#result-h").inner_text() == "Result"
    assert page.locator("pre.json").first.inner_text().startswith("{")  # structured result rendered as JSON
    page.click(f"{FIRST_COMMITTED_CALL} >> summary >> nth=0")
    page.wait_for_selector("ul.trace details.llm[open] details.tool")
    # Finished: the next polls find nothing new and the API answers 304.
    page.wait_for_function("() => /, [1-9][0-9]* not modified/.test(document.getElementById('live').textContent)")
    assert any(status == 304 and f"/tasks/{task_id}" in url for status, url in tab.responses)
    shot(console, tab, "task")
    no_errors(tab)


def test_a_running_task_page_follows_the_event_stream_and_polls_where_there_is_none(
    console: Console, tab: Page
) -> None:
    # Each task waits for approval until its page follows it, then runs to its end: the page
    # opens a stream only for a task not yet ended, however slowly the browser loads it.
    ask = {"text": "", "tool_calls": [call("request_approval", question="Follow me?")]}
    turns = [
        {"text": f"step {i}", "tool_calls": [call("lookup", query=f"q{i}", size=20)], "latency_seconds": 0.4}
        for i in range(3)
    ]
    body = scripted("look three things up", [ask, *turns, {"text": "streamed to the end"}],
                    tools=["lookup", "request_approval"])  # fmt: skip
    page = tab.page
    streamed = console.submit(body)
    console.until(streamed, lambda v: v["status"] == "paused")
    page.goto(f"{console.url}/console/#/tasks/{streamed}")
    page.wait_for_function("() => window.agentqStream && window.agentqStream.streaming === true")
    assert console.http("POST", f"/tasks/{streamed}/approve", {})[0] == 200
    page.wait_for_selector("h1 .badge.s-succeeded", timeout=60_000)
    page.wait_for_function("() => window.agentqStream.ended === 'ended'")
    assert page.evaluate("window.agentqStream.events") >= 6  # its steps and its end, each from the stream
    # The head is drawn before the trace's fetch returns: the last step's row comes a moment after the badge.
    page.wait_for_selector("tr[data-step='9']", timeout=30_000)
    assert page.locator("tr[data-step='9']").count() == 1
    assert any(status == 200 and url.endswith(f"/tasks/{streamed}/events") for status, url in tab.responses)

    # An API that does not stream (a proxy that buffers, say): the page polls and still follows the task.
    page.route("**/events", lambda route: route.fulfill(status=200, content_type="application/json", body="{}"))
    polled = console.submit(body)
    console.until(polled, lambda v: v["status"] == "paused")
    page.goto(f"{console.url}/console/#/tasks/{polled}")
    page.wait_for_function("() => window.agentqStream && window.agentqStream.fallback")
    assert console.http("POST", f"/tasks/{polled}/approve", {})[0] == 200
    page.wait_for_selector("h1 .badge.s-succeeded", timeout=60_000)
    page.wait_for_selector("tr[data-step='9']", timeout=30_000)
    assert page.locator("tr[data-step='9']").count() == 1
    no_errors(tab)


def test_approving_a_paused_task_shows_the_exact_calls_and_resumes_it_by_keyboard(console: Console, tab: Page) -> None:
    task_id = console.submit(
        scripted(
            "charge the customer once approved",
            [
                {
                    "text": "I need a go-ahead.",
                    "tool_calls": [
                        call("request_approval", question="Charge $12.50 to card 4242?"),
                        call("charge_card", amount_cents=1250, memo="order 17"),
                    ],
                },
                {"text": "charged"},
            ],
            tools=["request_approval", "charge_card"],
        )
    )
    console.until(task_id, lambda v: v["status"] == "paused")
    page = tab.page
    page.goto(f"{console.url}/console/#/tasks/{task_id}")
    page.wait_for_selector("#approve")
    approval = page.inner_text(".approval")
    assert "Charge $12.50 to card 4242?" in approval and "charge_card" in approval
    assert '"amount_cents": 1250' in approval and '"memo": "order 17"' in approval
    page.wait_for_selector("#trace-h")
    shot(console, tab, "approval")
    page.fill("#decision-note", "go ahead")
    tab_to(tab, "approve")
    page.keyboard.press("Enter")
    page.wait_for_selector(".notice:has-text('Approved')")
    page.wait_for_selector("h1 .badge.s-succeeded")
    assert page.inner_text("#result-h + pre") == "charged"
    view = console.until(task_id, lambda v: v["status"] == "succeeded")
    assert view["pending_calls"] == []
    no_errors(tab)


def test_rejecting_a_paused_task_resumes_it_with_the_rejection_on_the_page(console: Console, tab: Page) -> None:
    task_id = console.paused(
        "ship only if approved", "Ship release 4.2 today?", "not shipped: the release was rejected"
    )
    page = tab.page
    page.goto(f"{console.url}/console/#/tasks/{task_id}")
    page.wait_for_selector("#reject")
    assert "Ship release 4.2 today?" in page.inner_text(".approval")
    page.fill("#decision-note", "wait for the freeze to end")
    tab_to(tab, "reject")
    page.keyboard.press("Enter")
    page.wait_for_selector(".notice:has-text('Rejected')")
    page.wait_for_selector("h1 .badge.s-succeeded")
    assert page.inner_text("#result-h + pre") == "not shipped: the release was rejected"
    assert page.locator("#approve").count() == 0 and page.locator("#reject").count() == 0
    # What the model was told is in the trace: the verdict, who gave it and the note.
    # The first committed call: on a loaded machine a worker may lose its task mid-call, and the
    # trace then starts with that orphan call (paid for, never committed, with no tool under it).
    page.click(f"{FIRST_COMMITTED_CALL} >> summary >> nth=0")
    page.wait_for_selector("ul.trace details.tool:has-text('REJECTED')")
    assert "wait for the freeze to end" in page.inner_text("ul.trace")
    no_errors(tab)


def test_a_step_opened_on_the_page_stays_open_when_the_trace_redraws_before_its_toggle_event(
    console: Console, tab: Page
) -> None:
    """The browser reports a click on a step's summary by a toggle event one task later, and a
    redraw (a step committing) can land in between: that once drew the step closed again on a
    loaded machine. Here the page never hears the toggle at all, the worst order: the step opened
    before the approval is still open in the trace drawn after it."""
    task_id = console.paused("open a step while it waits", "Go on?", "went on")
    page = tab.page
    page.goto(f"{console.url}/console/#/tasks/{task_id}")
    page.wait_for_selector("#approve")
    page.wait_for_selector(FIRST_COMMITTED_CALL)
    page.evaluate("() => window.addEventListener('toggle', (e) => e.stopImmediatePropagation(), true)")
    page.click(f"{FIRST_COMMITTED_CALL} >> summary >> nth=0")
    status, view = console.http("POST", f"/tasks/{task_id}/approve", {"note": "yes"})
    assert status == 200, view
    page.wait_for_selector("h1 .badge.s-succeeded")
    # The approval's tool call is drawn inside the first step only after the decision: visible only if that step is open.
    page.wait_for_selector("ul.trace details.llm[open] details.tool:has-text('APPROVED')")
    no_errors(tab)


def test_raising_the_budget_of_a_cost_exceeded_task_resumes_it_from_the_page(console: Console, tab: Page) -> None:
    turns = [{"text": f"turn {i}", "tool_calls": [call("lookup", query=str(i), size=1500)]} for i in range(4)]
    task_id = console.submit(
        scripted(
            "read four pages",
            [*turns, {"text": "read them all"}],
            constraints={"tools": ["lookup"], "max_tokens": 3000, "max_output_tokens": 200},
        )
    )
    stopped = console.until(task_id, lambda v: v["status"] == "cost_exceeded")
    page = tab.page
    page.goto(f"{console.url}/console/#/tasks/{task_id}")
    page.wait_for_selector("h1 .badge.s-cost_exceeded")
    page.wait_for_selector("svg.gauge .gauge-used")
    page.fill("#add-tokens", "100000")
    tab_to(tab, "raise-budget")
    page.keyboard.press("Enter")
    page.wait_for_selector(".notice:has-text('Budget raised: cap 103,000 tokens')")
    page.wait_for_selector("h1 .badge.s-succeeded")
    assert page.inner_text("#result-h + pre") == "read them all"
    view = console.until(task_id, lambda v: v["status"] == "succeeded")
    assert view["step"] > stopped["step"] and view["budget"]["cap"] == 103_000
    assert page.locator("#raise-budget").count() == 0  # a finished task has no budget to raise
    no_errors(tab)


def test_forking_a_finished_task_at_a_step_opens_the_fork_with_its_model(console: Console, tab: Page) -> None:
    turns = [{"text": f"looking up {i}", "tool_calls": [call("lookup", query=f"q{i}", size=40)]} for i in range(2)]
    source = console.submit(scripted("look two things up", [*turns, {"text": "found both"}], tools=["lookup"]))
    console.until(source, lambda v: v["status"] == "succeeded")
    page = tab.page
    page.goto(f"{console.url}/console/#/tasks/{source}")
    page.wait_for_selector("#fork")
    page.fill("#fork-step", "2")
    page.fill("#fork-model", "claude-haiku-4-5")
    # The notice shows 0.6 s before the page goes to the fork (whose notice is empty): a starved
    # browser can go before a poll for it sees it, so every notice shown is recorded as it is set.
    page.evaluate(
        """() => { window.notices = []; new MutationObserver(() => document.querySelectorAll('.notice')
          .forEach((n) => n.textContent && window.notices.push(n.textContent)))
          .observe(document.body, { subtree: true, childList: true, characterData: true }); }"""
    )
    tab_to(tab, "fork")
    page.keyboard.press("Enter")
    page.wait_for_function(
        "(source) => /^#\\/tasks\\/[0-9a-f]+$/.test(location.hash) && !location.hash.endsWith(source)", arg=source
    )
    fork_id = page.evaluate("location.hash").rsplit("/", 1)[1]
    assert f"Forked as {fork_id}." in page.evaluate("window.notices")
    page.wait_for_selector(f"#task-id:has-text('{fork_id}')")
    page.wait_for_selector("h1 .badge.s-succeeded")
    assert "at step 2" in page.inner_text("main") and page.locator(f"a[href='#/tasks/{source}']").count() >= 1
    view = console.until(fork_id, lambda v: v["status"] == "succeeded")
    assert view["forked_from"] == {"task_id": source, "step": 2} and view["model"] == "claude-haiku-4-5"
    # The fork copied steps 1-2 and ran on from there: the source is untouched.
    assert console.until(source, lambda v: True)["step"] == 5
    no_errors(tab)


def test_a_money_budget_is_a_second_gauge_and_is_raised_in_dollars_from_the_page(console: Console, tab: Page) -> None:
    notes = "n" * 800  # ~200 output tokens a turn: a few turns cost more than the cap
    turns = [{"text": f"turn {i} {notes}", "tool_calls": [call("lookup", query=f"q{i}")]} for i in range(8)]
    task_id = console.submit(
        scripted(
            "spend in dollars",
            [*turns, {"text": "spent"}],
            constraints={"tools": ["lookup"], "max_steps": 20, "max_output_tokens": 500, "max_tokens": 2_000_000,
                         "max_cost_usd": "0.025"},
        )
    )  # fmt: skip
    stopped = console.until(task_id, lambda v: v["status"] == "cost_exceeded")
    assert "money budget" in stopped["error"]["message"]
    page = tab.page
    page.goto(f"{console.url}/console/#/tasks/{task_id}")
    page.wait_for_selector("#money-gauge")
    label = page.get_attribute("#money-gauge", "aria-label") or ""
    assert " of $0.0250 dollars used (" in label, label
    assert page.locator("#token-gauge").count() == 1
    page.wait_for_selector("#trace-h")
    shot(console, tab, "money-budget")
    page.fill("#add-tokens", "0")
    page.fill("#add-usd", "5")
    tab_to(tab, "raise-budget")
    page.keyboard.press("Enter")
    page.wait_for_selector(".notice:has-text('$5.03')")  # $5.025, to the cent
    page.wait_for_selector("h1 .badge.s-succeeded")
    view = console.until(task_id, lambda v: v["status"] == "succeeded")
    assert view["budget"]["money"]["cap_usd"] == "5.025000" and view["step"] > stopped["step"]
    no_errors(tab)


def test_a_blocked_task_shows_what_it_runs_after_and_starts_when_that_succeeds(console: Console, tab: Page) -> None:
    first = console.paused("collect the figures once approved", "Collect?", "figures: 3, 5")
    then = console.submit({**scripted("sum the figures", [{"text": "sum: 8"}]), "depends_on": [first]})
    page = tab.page
    page.goto(f"{console.url}/console/#/tasks/{then}")
    page.wait_for_selector("h1 .badge.s-blocked")
    page.wait_for_selector(f"#depends-on li[data-dependency='{first}'] .badge.s-paused")
    shot(console, tab, "blocked")
    assert console.http("POST", f"/tasks/{first}/approve", {"note": "yes"})[0] == 200
    page.wait_for_selector("h1 .badge.s-succeeded", timeout=60_000)
    page.wait_for_selector(f"#depends-on li[data-dependency='{first}'] .badge.s-succeeded")
    assert page.inner_text("#result-h + pre") == "sum: 8"
    no_errors(tab)


def test_an_agent_is_shown_by_version_run_and_edited_into_a_new_version_from_the_page(
    console: Console, tab: Page
) -> None:
    name = f"triage-{uuid.uuid4().hex[:6]}"
    agent = {"name": name, "description": "sorts tickets", "provider": "scripted",
             "script": {"turns": [{"text": "ticket 7 is a billing question"}]}, "tools": ["lookup"],
             "system": "You sort support tickets."}  # fmt: skip
    assert console.http("POST", "/agents", agent)[0] == 201
    assert console.http("POST", "/agents", {**agent, "system": "You sort support tickets, briefly."})[0] == 201
    # The other tenant's agent of the same name is theirs alone.
    assert console.http("POST", "/agents", {**agent, "description": "theirs"}, key=console.other_key)[0] == 201
    page = tab.page
    page.click("a[data-nav='agents']")
    page.wait_for_selector(f"tr[data-agent='{name}']")
    row = page.inner_text(f"tr[data-agent='{name}']")
    assert "sorts tickets" in row and "2" in row and "theirs" not in page.inner_text("table.agents")
    page.click(f"tr[data-agent='{name}'] a")
    page.wait_for_selector(f"#definition-h:has-text('{name}@2')")
    assert "briefly" in page.inner_text("main")
    page.select_option("#agent-version", "1")
    page.wait_for_selector(f"#definition-h:has-text('{name}@1')")
    assert "briefly" not in page.inner_text("main") and "lookup" in page.inner_text("main")
    shot(console, tab, "agent")
    page.fill("#run-goal", "sort ticket 7")
    tab_to(tab, "run-agent")
    page.keyboard.press("Enter")
    page.wait_for_selector("#task-id")
    page.wait_for_selector("h1 .badge.s-succeeded")
    task_id = page.inner_text("#task-id")
    view = console.until(task_id, lambda v: v["status"] == "succeeded")
    assert view["agent"] == f"{name}@1" and view["result"] == "ticket 7 is a billing question"
    assert f"{name}@1" in page.inner_text("main")
    # A new version from the page: the latest definition, edited; then a new agent from the list.
    page.goto(f"{console.url}/console/#/agents/{name}")
    page.click("#new-version")
    edited = {**json.loads(page.input_value("#new-version-json")), "system": "You sort tickets, in one word."}
    assert edited["name"] == name and edited["tools"] == ["lookup"] and "version" not in edited
    page.fill("#new-version-json", json.dumps(edited))
    page.click("#new-version-submit")
    page.wait_for_selector(f".notice:has-text('Created {name}@3')")
    assert page.input_value("#agent-version") == "3" and "in one word" in page.inner_text(
        "#definition-h + dl + h3 + pre"
    )
    page.click("#new-version-submit")  # the same definition again: no new version
    page.wait_for_selector(f".notice:has-text('Unchanged: {name}@3')")
    page.click("a[data-nav='agents']")
    page.click("#new-agent")
    fresh = f"{name}-b"
    page.fill(
        "#new-agent-json", json.dumps({"name": fresh, "provider": "scripted", "script": {"turns": [{"text": "ok"}]}})
    )
    page.click("#new-agent-submit")
    page.wait_for_selector(f"#definition-h:has-text('{fresh}@1')")
    page.click("a[data-nav='agents']")
    page.click("#new-agent")
    page.fill("#new-agent-json", json.dumps({"name": "Bad Name!", "provider": "scripted"}))
    page.click("#new-agent-submit")
    page.wait_for_selector(".json-form .error-box:has-text('422')")
    # An agent that is not this tenant's: the API's 404 on the page.
    page.goto(f"{console.url}/console/#/agents/no-such-agent")
    page.wait_for_selector(".error-page:has-text('404')")
    assert [e for e in tab.errors if "status of 404" not in e and "status of 422" not in e] == []


def test_an_agents_aliases_are_shown_with_their_split_and_a_task_runs_through_one(console: Console, tab: Page) -> None:
    name = f"aliased-{uuid.uuid4().hex[:6]}"
    for text in ("answer of v1", "answer of v2"):
        agent = {"name": name, "provider": "scripted", "script": {"turns": [{"text": text}]}}
        assert console.http("POST", "/agents", agent)[0] == 201
    split = {"versions": [{"version": 1, "weight": 90}, {"version": 2, "weight": 10}]}
    assert console.http("PUT", f"/agents/{name}/aliases/prod", split)[0] == 200
    assert console.http("PUT", f"/agents/{name}/aliases/next", {"versions": [{"version": 2, "weight": 100}]})[0] == 200
    page = tab.page
    page.goto(f"{console.url}/console/#/agents/{name}")
    page.wait_for_selector("#aliases tr[data-alias='prod']")
    assert "v1 90% · v2 10%" in page.inner_text("#aliases tr[data-alias='prod']")
    assert "v2 100%" in page.inner_text("#aliases tr[data-alias='next']")
    assert page.input_value("#agent-version") == "2"  # the latest version stays the default
    shot(console, tab, "agent-aliases")
    page.select_option("#agent-version", "next")
    page.fill("#run-goal", "through the alias")
    page.click("#run-agent")
    page.wait_for_selector("#task-id")
    task_id = page.inner_text("#task-id")
    view = console.until(task_id, lambda v: v["status"] == "succeeded")
    assert view["agent"] == f"{name}@2" and view["result"] == "answer of v2"
    no_errors(tab)


def test_schedules_are_listed_with_their_next_fire_and_deleted_from_the_page(console: Console, tab: Page) -> None:
    name = f"nightly-{uuid.uuid4().hex[:6]}"
    spec = {"name": name, "expression": "cron(0 3 * * ? *)", "submission": scripted("nightly report", [{"text": "ok"}])}
    status, created = console.http("POST", "/schedules", spec)
    assert status == 201, created
    assert console.http("POST", "/schedules", {**spec, "name": f"{name}-theirs"}, key=console.other_key)[0] == 201
    page = tab.page
    page.click("a[data-nav='schedules']")
    page.wait_for_selector(f"tr[data-schedule='{name}']")
    row = page.inner_text(f"tr[data-schedule='{name}']")
    assert "cron(0 3 * * ? *)" in row and "nightly report" in row and "skip" in row
    assert page.locator(f"tr[data-schedule='{name}-theirs']").count() == 0
    shot(console, tab, "schedules")
    tab_to(tab, f"delete-{name}")
    page.keyboard.press("Enter")
    page.wait_for_selector(f"#delete-{name}:has-text('Click again')")
    assert console.http("GET", f"/schedules/{name}")[0] == 200  # one press does not delete
    page.keyboard.press("Enter")
    page.wait_for_selector(f".notice:has-text('Deleted schedule {name}')")
    page.wait_for_selector(f"tr[data-schedule='{name}']", state="detached")
    assert console.http("GET", f"/schedules/{name}")[0] == 404
    assert console.http("GET", f"/schedules/{name}-theirs", key=console.other_key)[0] == 200
    no_errors(tab)


def test_the_breakers_page_shows_an_open_circuit_and_when_it_probes(console: Console, tab: Page) -> None:
    from agentq.core.flow import Admission

    key = f"anthropic/claude-breaker-{uuid.uuid4().hex[:6]}"
    flow = console.stack.store().flow
    while not flow.failed(key, Admission(ok=True)):
        pass  # the fleet's failures open it
    page = tab.page
    page.click("a[data-nav='breakers']")
    page.wait_for_selector(f"tr[data-breaker='{key}']")
    row = page.inner_text(f"tr[data-breaker='{key}']")
    assert "open" in row and "half-open" not in row
    assert "A circuit opens after" in page.inner_text("main")
    no_errors(tab)


def test_cancelling_a_fan_out_cancels_its_children_on_the_page(console: Console, tab: Page) -> None:
    slow = {"turns": [{"text": "thinking", "latency_seconds": 20}, {"text": "done"}]}
    children = [{"goal": f"part {i}", "script": slow} for i in range(3)]
    task_id = console.submit(
        scripted(
            "split the work",
            [{"text": "splitting", "tool_calls": [call("spawn_subagents", subagents=children)]}, {"text": "merged"}],
            tools=["spawn_subagents"],
        )
    )
    console.until(task_id, lambda v: v["status"] == "waiting" and v["children"]["total"] == 3)
    page = tab.page
    page.goto(f"{console.url}/console/#/tasks/{task_id}")
    page.wait_for_selector("li[data-child]")
    assert page.locator("li[data-child]").count() == 3
    page.wait_for_selector("#trace-h")
    shot(console, tab, "fanout")
    page.click("#cancel")
    page.wait_for_selector(".notice:has-text('Cancelled 4 task(s)')")
    page.wait_for_selector("h1 .badge.s-cancelled")
    page.wait_for_function("() => document.querySelectorAll('li[data-child] > .badge.s-cancelled').length === 3")
    assert page.locator("#cancel").count() == 0  # a cancelled task offers no cancel
    no_errors(tab)


def test_a_dead_letter_is_listed_with_its_reason_and_redriven_from_the_page(console: Console, tab: Page) -> None:
    # One tool turn that commits, then the provider overloaded on every attempt of both receives:
    # the task fails into the DLQ; the reply after those is what its redriven run gets.
    console.fake.enqueue(
        tool_use_reply("lookup", {"query": "x"}, text="let me look"),
        *[overloaded()] * (PROVIDER_ATTEMPTS * MAX_RECEIVES),
        text_reply("recovered after the redrive"),
    )
    task_id = console.submit(
        {
            "goal": "look it up",
            "provider": "anthropic",
            "model": "claude-haiku-4-5",
            "constraints": {"tools": ["lookup"]},
        }
    )
    console.until(task_id, lambda v: v["status"] == "failed", timeout=120)
    # Another tenant's dead letter in the same queue: team-a never sees or moves it.
    queues = console.stack.queues()
    other = console.submit(scripted("theirs", [{"text": "x"}]), key=console.other_key)
    console.until(other, lambda v: v["status"] == "succeeded", key=console.other_key)
    queues.dead_letter("normal", json.dumps({"task_id": other, "kind": "run"}), "theirs, dead-lettered by hand")

    page = tab.page
    page.click("a[data-nav='dead-letters']")
    # A dead letter's row (its reason's cell): the task list shown before the click has a row for
    # the task too, drawn when it was still running, until the page draws the dead letters.
    letter = f"tr[data-task='{task_id}']:has(td.reason)"
    page.wait_for_selector(letter)
    row = page.inner_text(letter)
    assert "failed" in row and "529" in row
    assert page.locator(f"tr[data-task='{other}']").count() == 0
    shot(console, tab, "dead-letters")
    tab_to(tab, "redrive-normal")
    page.keyboard.press("Enter")
    page.wait_for_selector(".notice:has-text('Redrove 1 message(s) of the normal tier')")
    view = console.until(task_id, lambda v: v["status"] == "succeeded", timeout=60)
    # Each receive after the first took over the run its predecessor left (a resume); the
    # redrive started a new run of a failed task, which is not one.
    assert view["result"] == "recovered after the redrive" and view["latency"]["resumes"] == MAX_RECEIVES - 1
    status, theirs = console.http("GET", "/dead-letters", key=console.other_key)
    assert status == 200 and [d["task_id"] for d in theirs["dead_letters"]] == [other]
    page.wait_for_selector("#redrive-normal[disabled]")
    no_errors(tab)


def test_an_unknown_or_foreign_task_shows_the_apis_error_not_a_blank_page(console: Console, tab: Page) -> None:
    foreign = console.submit(scripted("not yours", [{"text": "x"}]), key=console.other_key)
    page = tab.page
    for task_id in (foreign, "no-such-task"):
        page.goto(f"{console.url}/console/#/tasks/{task_id}")
        page.wait_for_selector(f".error-page:has-text(\"no task '{task_id}'\")")
        assert "404 task_not_found" in page.inner_text(".error-page")
    shot(console, tab, "not-found")
    # The browser logs each refused fetch; nothing else may be logged.
    assert [e for e in tab.errors if "status of 404" not in e] == []
    assert len(tab.errors) == 2


def test_a_forbidden_action_shows_the_apis_409_message(console: Console, tab: Page) -> None:
    task_id = console.paused("wait", "ok?", "done")
    page = tab.page
    page.goto(f"{console.url}/console/#/tasks/{task_id}")
    page.wait_for_selector("#approve")
    # Someone else acts first, and this page has not polled since: its polls are held from here on.
    page.route(f"**/tasks/{task_id}", lambda route: route.continue_() if route.request.method != "GET" else None)
    assert console.http("POST", f"/tasks/{task_id}/cancel")[0] == 200
    page.click("#approve")
    page.wait_for_selector("#alert:has-text('409 illegal_transition')")
    assert "not waiting for approval" in page.inner_text("#alert")
    assert [e for e in tab.errors if "status of 409" not in e] == []


def test_an_approve_of_a_call_decided_meanwhile_is_refused_and_the_next_held_call_stays_undecided(
    console: Console, tab: Page
) -> None:
    """The page's approve names the held call it shows (``tool_use_id``, the call marked "this
    decision"). Another reviewer approves that call and the task holds its next ask before this
    page polls again: the click is the API's 409 naming the call as decided already, the next ask
    is still undecided, and the page loaded again shows it with its own approve. Before, the
    click approved the next ask, which this page never showed."""
    turns: list[dict[str, Any]] = [
        {"text": "", "tool_calls": [call("request_approval", question="Charge 5 cents?")]},
        {"text": "", "tool_calls": [call("request_approval", question="Charge 500 dollars?")]},
        {"text": "charged"},
    ]
    task_id = console.submit(scripted("charge twice", turns, tools=["request_approval"]))
    first = console.until(task_id, lambda v: v["status"] == "paused")["pending_tool_use_id"]
    page = tab.page
    page.goto(f"{console.url}/console/#/tasks/{task_id}")
    page.wait_for_selector(".approval:has-text('Charge 5 cents?')")
    assert "this decision" in page.inner_text(f'.approval .call[data-tool-use-id="{first}"]')
    # This page's polls are held from here on: it still shows the first ask when it is clicked.
    page.route(f"**/tasks/{task_id}", lambda route: route.continue_() if route.request.method != "GET" else None)
    assert console.http("POST", f"/tasks/{task_id}/approve", {"tool_use_id": first})[0] == 200
    second = console.until(task_id, lambda v: v["status"] == "paused" and v["pending_tool_use_id"] != first)
    page.click("#approve")
    page.wait_for_selector("#alert:has-text('409 illegal_transition')")
    assert "was approved already" in page.inner_text("#alert")
    view = console.until(task_id, lambda v: True)
    assert view["status"] == "paused" and view["pending_tool_use_id"] == second["pending_tool_use_id"], view
    page.unroute(f"**/tasks/{task_id}")
    page.reload()
    page.wait_for_selector(".approval:has-text('Charge 500 dollars?')")
    page.click("#approve")
    page.wait_for_selector("h1 .badge.s-succeeded")
    status, events = console.http("GET", f"/tasks/{task_id}/events?limit=200")
    decided = [e["data"]["tool_use_id"] for e in events["events"] if e["type"] == "approval.decided"]
    assert status == 200 and decided == [first, second["pending_tool_use_id"]], decided
    assert [e for e in tab.errors if "status of 409" not in e] == []


def test_a_call_held_under_an_id_an_earlier_call_had_is_marked_this_decision_and_decided_from_the_page(
    console: Console, tab: Page
) -> None:
    """A model (a gateway passing its ids through) gives its second ask the id of its first: the
    held call's name is ``agentq-<step>-call_0`` (core.call_keys), the turn's call is listed as
    ``call_0``, and the page marks that call "this decision" (the view marks it ``held``) and
    approves it by its name. Before, the mark compared the listed id with the name: nothing was
    marked."""
    console.fake.enqueue(
        tool_use_reply("request_approval", {"question": "Look up the order?"}, tool_use_id="call_0"),
        tool_use_reply("request_approval", {"question": "Refund 500 dollars?"}, tool_use_id="call_0"),
        text_reply("refunded"),
    )
    body = {"goal": "refund", "provider": "anthropic", "model": "claude-haiku-4-5",
            "constraints": {"tools": ["request_approval"]}}  # fmt: skip
    task_id = console.submit(body)
    first = console.until(task_id, lambda v: v["status"] == "paused")["pending_tool_use_id"]
    assert first == "call_0"
    assert console.http("POST", f"/tasks/{task_id}/approve", {"tool_use_id": first})[0] == 200
    second = console.until(task_id, lambda v: v["status"] == "paused" and v["pending_tool_use_id"] != first)
    held = second["pending_tool_use_id"]
    assert held.startswith("agentq-") and held.endswith("-call_0"), second
    page = tab.page
    page.goto(f"{console.url}/console/#/tasks/{task_id}")
    page.wait_for_selector(".approval:has-text('Refund 500 dollars?')")
    assert "this decision" in page.inner_text('.approval .call[data-tool-use-id="call_0"]')
    page.click("#approve")
    page.wait_for_selector("h1 .badge.s-succeeded")
    status, events = console.http("GET", f"/tasks/{task_id}/events?limit=200")
    decided = [e["data"]["tool_use_id"] for e in events["events"] if e["type"] == "approval.decided"]
    assert status == 200 and decided == [first, held], decided
    no_errors(tab)


def test_the_api_explorer_is_swagger_ui_over_the_generated_document_offline(console: Console, tab: Page) -> None:
    page = tab.page
    page.goto(f"{console.url}/console/explorer")
    # Swagger UI parses and renders the whole document in the page: over 30 s (the default wait)
    # with two suites and more on the machine's two cores.
    page.wait_for_selector("text=List tasks, newest first", timeout=120_000)
    page.wait_for_selector("text=Redrive this tenant's dead letters of a tier")
    shot(console, tab, "explorer")
    no_errors(tab)


# ---------------------------------------------------------------------------- the HTTP side


def test_console_pages_need_no_key_and_are_locked_to_this_origin(console: Console) -> None:
    def get(path: str) -> tuple[int, dict[str, str], bytes]:
        req = urllib.request.Request(console.url + path)
        opener = urllib.request.build_opener(_NoRedirect())
        try:
            with opener.open(req, timeout=10) as resp:
                return resp.status, dict(resp.headers), resp.read()
        except urllib.error.HTTPError as err:
            return err.code, dict(err.headers), err.read()

    status, headers, _ = get("/console")
    assert status == 302 and headers["Location"] == "console/"
    status, headers, body = get("/console/")
    assert status == 200 and headers["Content-Type"].startswith("text/html") and b'src="app.js"' in body
    assert (
        "script-src 'self'" in headers["Content-Security-Policy"]
        and "connect-src 'self'" in headers["Content-Security-Policy"]
    )
    status, headers, _ = get("/console/app.js")
    assert status == 200 and headers["Content-Type"].startswith("text/javascript") and headers["ETag"]
    status, _, body = get("/console/secrets.txt")
    assert status == 404 and json.loads(body)["error"]["code"] == "route_not_found"
    status, _, body = get("/tasks")  # the data is not public
    assert status == 401


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


def test_a_get_answers_304_when_its_etag_still_matches(console: Console) -> None:
    task_id = console.submit(scripted("etag", [{"text": "done"}]))
    console.until(task_id, lambda v: v["status"] == "succeeded")
    auth = {"Authorization": f"Bearer {console.key}"}
    with urllib.request.urlopen(urllib.request.Request(f"{console.url}/tasks/{task_id}/trace", headers=auth)) as resp:
        etag = resp.headers["ETag"]
    assert etag.startswith('"') and etag.endswith('"')
    req = urllib.request.Request(f"{console.url}/tasks/{task_id}/trace", headers={**auth, "If-None-Match": etag})
    with pytest.raises(urllib.error.HTTPError) as not_modified:
        urllib.request.urlopen(req)
    assert not_modified.value.code == 304 and not_modified.value.read() == b""
    assert not_modified.value.headers["ETag"] == etag
    req = urllib.request.Request(f"{console.url}/tasks/{task_id}/trace", headers={**auth, "If-None-Match": '"other"'})
    with urllib.request.urlopen(req) as resp:
        assert resp.status == 200 and json.loads(resp.read())["task_id"] == task_id


def test_a_running_task_that_has_not_changed_answers_304(console: Console) -> None:
    """The view reads no clock, so between two commits of a running task a poll costs a 304."""
    task_id = console.submit(scripted("think slowly", [{"text": "done", "latency_seconds": 6}]))
    console.until(task_id, lambda v: v["status"] == "running")
    auth = {"Authorization": f"Bearer {console.key}"}
    answers: list[tuple[int, str]] = []
    etag = None
    for _ in range(6):
        headers = {**auth, **({"If-None-Match": etag} if etag else {})}
        req = urllib.request.Request(f"{console.url}/tasks/{task_id}", headers=headers)
        try:
            with urllib.request.urlopen(req) as resp:
                view = json.loads(resp.read())
                answers.append((resp.status, view["status"]))
                etag = resp.headers["ETag"]
                assert view["latency"]["run_seconds"] is None and view["latency"]["total_seconds"] is None
        except urllib.error.HTTPError as err:
            answers.append((err.code, "not modified"))
        time.sleep(0.3)
    assert answers[0] == (200, "running") and (304, "not modified") in answers, answers
    done = console.until(task_id, lambda v: v["status"] == "succeeded")
    assert done["latency"]["total_seconds"] >= done["latency"]["run_seconds"] >= 6


def test_agentq_dev_prints_the_console_url_and_serves_it() -> None:
    proc = agentq_process(
        ["dev", "--workers", "1"], dict(os.environ), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        lines: list[str] = []
        assert proc.stdout is not None
        while not any("Ctrl-C" in line for line in lines):
            line = proc.stdout.readline()
            assert line, "".join(lines)
            lines.append(line)
        console_line = next(line for line in lines if line.strip().startswith("console"))
        url = console_line.split()[1]
        assert url.endswith("/console/")
        with urllib.request.urlopen(url, timeout=10) as resp:
            assert resp.status == 200 and b"agentq console" in resp.read()
    finally:
        proc.send_signal(2)
        proc.wait(timeout=60)


def test_the_conversation_is_a_chat_with_a_follow_up_sent_from_the_page(console: Console, tab: Page) -> None:
    task_id = console.submit(
        scripted("summarise Q3", [{"text": "Q3 grew 2.5x"}, {"text": "C grew 1.4x"}, {"text": "unused"}])
    )
    console.until(task_id, lambda v: v["status"] == "succeeded")
    page = tab.page
    page.goto(f"{console.url}/console/#/tasks/{task_id}")
    page.wait_for_selector("#chat .bubble.agent:has-text('Q3 grew 2.5x')")
    assert page.inner_text("#turn-goal p") == "summarise Q3"
    page.fill("#message-text", "also cover competitor C")
    tab_to(tab, "send-message")
    page.keyboard.press("Enter")
    page.wait_for_selector(".notice:has-text('Follow-up sent (message 1)')")
    page.wait_for_selector("#turn-m1:has-text('also cover competitor C')")
    page.wait_for_selector("#chat .bubble.agent:has-text('C grew 1.4x')")  # answered in the same task
    assert [b.inner_text().split("\n", 1)[0] for b in page.locator("#chat .bubble").all()] == [
        "you", "agent", "you", "agent",
    ]  # fmt: skip
    assert console.until(task_id, lambda v: v["status"] == "succeeded")["result"] == "C grew 1.4x"
    shot(console, tab, "conversation")
    no_errors(tab)


def _holder_pid(console: Console, task_id: str) -> int:
    """The pid of the worker process holding the task (its latest claim's worker is host:pid)."""
    return int(console.stack.store().tasks.claims(task_id)[-1].worker.rsplit(":", 1)[1])


def test_a_takeover_is_marked_resumed_and_a_follow_up_is_a_new_turn_of_the_conversation_not_a_resume(
    console: Console, tab: Page
) -> None:
    turns = [  # slow enough that the task still runs when the test has seen step 1 and stops its worker
        {"text": f"step {i}", "tool_calls": [call("lookup", query=f"q{i}", size=20)], "latency_seconds": 2.0}
        for i in range(3)
    ]
    task_id = console.submit(
        scripted("look three things up", [*turns, {"text": "three found"}, {"text": "a fourth too"}], tools=["lookup"])
    )
    console.until(task_id, lambda v: v["status"] == "running" and v["step"] >= 1)
    # Its worker stopped mid-run: the other takes the run over once the stopped one's liveness lapses.
    holder = _holder_pid(console, task_id)
    os.kill(holder, signal.SIGSTOP)
    try:
        deadline = time.monotonic() + 60
        while len(console.stack.store().tasks.claims(task_id)) < 2:
            assert time.monotonic() < deadline, "the stopped worker's task was not taken over"
            time.sleep(0.1)
    finally:
        os.kill(holder, signal.SIGCONT)
    console.until(task_id, lambda v: v["status"] == "succeeded" and v["result"] == "three found")
    status, sent = console.http("POST", f"/tasks/{task_id}/messages", {"text": "and a fourth?"})
    assert status == 202 and sent["reopened"], sent
    view = console.until(task_id, lambda v: v["status"] == "succeeded" and v["result"] == "a fourth too")
    assert view["latency"]["resumes"] == 1  # the takeover; the follow-up's run is a new turn, not a resume

    page = tab.page
    page.goto(f"{console.url}/console/#/tasks/{task_id}")
    page.wait_for_selector(f"tr[data-step='{view['step']}']")
    message = f"tr[data-step='{view['step'] - 1}']"  # the follow-up's step, before its answer
    assert page.inner_text(f"{message} td:nth-child(2)") == "message"
    assert page.inner_text(f"{message} td:nth-child(3)") == "you (message 1): and a fourth?"
    timeline = page.inner_text("table.timeline")
    assert "undefined" not in timeline
    assert page.locator("tr.resume").count() == 1, timeline
    assert "took over the run of epoch 1" in page.inner_text("tr.resume")
    follow_up = page.inner_text("tr.mark.follow_up")
    assert "new turn: your follow-up (message 1)" in follow_up
    # The follow-up stands right before its message's step, and the answer after it.
    kinds = [
        r.get_attribute("data-kind") or r.get_attribute("data-mark")
        for r in page.locator("table.timeline tbody tr:not(.resume)").all()
    ]
    assert kinds[-3:] == ["follow_up", "message", "llm"], kinds
    assert page.inner_text("dt:text-is('resumes') + dd") == "1"
    shot(console, tab, "task-resumed")
    page.evaluate("window.scrollTo(0, 0)")
    shot(console, tab, "readme", full_page=False)  # the README's first screen: the page as it opens
    no_errors(tab)


def test_an_interrupt_from_the_page_stands_in_the_conversation_and_the_steps_where_it_stopped_the_agent(
    console: Console, tab: Page
) -> None:
    # The model's answer is held until the interrupt is recorded: it is in flight when the page
    # interrupts, however long the page takes to get there.
    held = Gate(limit=120)
    console.fake.enqueue(dataclasses.replace(text_reply("a very long essay"), gate=held))
    slow = console.submit(
        {"goal": "write slowly", "provider": "anthropic", "model": "claude-haiku-4-5", "constraints": {"tools": []}}
    )
    console.until(slow, lambda v: v["status"] == "running")
    page = tab.page
    page.goto(f"{console.url}/console/#/tasks/{slow}")
    page.wait_for_selector("#interrupt", timeout=90_000)  # a busy machine's first render can be slow
    page.click("#interrupt")
    page.wait_for_selector(".notice:has-text('Interrupt recorded')")
    held.open()
    page.wait_for_selector("h1 .badge.s-idle", timeout=60_000)  # the answer in flight discarded
    assert not held.expired
    page.wait_for_selector("#chat-idle")
    assert page.locator("#chat .bubble.agent").count() == 0
    # In the conversation, after the goal: the interrupt, then the stop it caused.
    page.wait_for_selector("#chat li.mark.interrupted")
    chat = [li.get_attribute("data-mark") or li.get_attribute("id") for li in page.locator("#chat > li").all()]
    assert chat == ["turn-goal", "interrupt_requested", "interrupted"], chat
    assert page.inner_text("#chat li.mark.interrupt_requested") == "■ you interrupted the agent"
    # And in the steps table, where they happened.
    page.wait_for_selector("tr.mark.interrupted")
    assert page.locator("tr.mark.interrupt_requested").count() == 1 and page.locator("tr.resume").count() == 0
    assert console.http("GET", f"/tasks/{slow}")[1]["latency"]["resumes"] == 0
    shot(console, tab, "interrupt")
    no_errors(tab)


def test_a_memory_store_is_browsed_edited_audited_and_a_stale_edit_shows_the_conflict(
    console: Console, tab: Page
) -> None:
    name = f"mem-{uuid.uuid4().hex[:6]}"
    assert console.http("POST", "/memory-stores", {"name": name, "description": "customers"})[0] == 201
    assert console.http("POST", "/memory-stores", {"name": f"{name}-theirs"}, key=console.other_key)[0] == 201
    doc = f"/memory-stores/{name}/document?path=/customers/ann.md"
    assert console.http("PUT", doc, {"content": "card 4242; ordered a lamp"})[0] == 200
    page = tab.page
    page.click("a[data-nav='memory']")
    page.wait_for_selector(f"tr[data-store='{name}']")
    assert page.locator(f"tr[data-store='{name}-theirs']").count() == 0
    page.click(f"tr[data-store='{name}'] a")
    page.click("tr[data-path='/customers/ann.md'] a")
    page.wait_for_selector("#memory-content")
    assert page.input_value("#memory-content") == "card 4242; ordered a lamp"
    page.fill("#memory-content", "card on file; ordered a lamp")
    page.click("#memory-save")
    page.wait_for_selector(".notice:has-text('as version 2')")
    page.wait_for_selector("tr[data-version='1'] #redact-1")
    shot(console, tab, "memory")
    page.click("#redact-1")
    page.wait_for_selector(".notice:has-text('Redacted version 1')")
    status, first = console.http("GET", f"/memory-stores/{name}/versions?path=/customers/ann.md")
    assert status == 200 and first["versions"][-1]["content"] is None and first["versions"][-1]["redacted_at"]
    # Someone else writes; this page still holds version 2's hash: its save is refused, not lost.
    current = console.http("GET", doc)[1]["content_sha256"]
    assert console.http("PUT", doc, {"content": "changed elsewhere", "expected_content_sha256": current})[0] == 200
    page.fill("#memory-content", "my stale edit")
    page.click("#memory-save")
    page.wait_for_selector("#alert:has-text('409 memory_conflict')")
    assert console.http("GET", doc)[1]["content"] == "changed elsewhere"
    assert [e for e in tab.errors if "status of 409" not in e] == []


def test_the_memory_page_lists_every_store_following_the_pages(console: Console, tab: Page) -> None:
    """GET /memory-stores answers a page (100 stores at most): a store past the first page is
    still on the console's list."""
    run = uuid.uuid4().hex[:6]
    for i in range(100):  # named to sort before the one looked for
        assert console.http("POST", "/memory-stores", {"name": f"a-{run}-{i:03d}"})[0] == 201
    name = f"mem-{run}"
    assert console.http("POST", "/memory-stores", {"name": name})[0] == 201
    first = console.http("GET", "/memory-stores")[1]
    assert first["next_cursor"] and name not in [s["name"] for s in first["stores"]]
    tab.page.click("a[data-nav='memory']")
    tab.page.wait_for_selector(f"tr[data-store='{name}']")
    for i in range(100):
        assert console.http("DELETE", f"/memory-stores/a-{run}-{i:03d}")[0] == 200
    assert tab.errors == []


def test_a_task_whose_reply_was_cut_shows_which_part_of_its_budget_is_known_and_which_unknown(
    console: Console, tab: Page
) -> None:
    """The first reply is cut in the middle of its body (billed, its usage unknown to the
    client), the retry answers: the page says how many tokens are known and how many unknown."""
    console.fake.enqueue(dataclasses.replace(text_reply("cut"), cut_at=0.5), text_reply("answered after a cut"))
    task_id = console.submit(
        {"goal": "answer once", "provider": "anthropic", "model": "claude-haiku-4-5", "constraints": {"tools": []}}
    )
    view = console.until(task_id, lambda v: v["status"] == "succeeded")
    budget = view["budget"]
    assert budget["unknown"] > 0 and budget["known"] + budget["unknown"] == budget["used"]
    page = tab.page
    page.goto(f"{console.url}/console/#/tasks/{task_id}")
    line = page.wait_for_selector("#unknown-usage")
    assert line is not None
    text = line.inner_text()
    assert f"{budget['known']:,} tokens known" in text and f"{budget['unknown']:,} unknown" in text, text
    no_errors(tab)


def test_a_tasks_files_are_shown_at_any_step_with_a_files_text_and_a_steps_diff(console: Console, tab: Page) -> None:
    turns: list[dict[str, Any]] = [
        {"text": "1", "tool_calls": [call("write_file", path="src/app.py", content="print('hi')\n")]},
        {"text": "2", "tool_calls": [call("edit_file", path="src/app.py", old_string="hi", new_string="bye"),
                                     call("write_file", path="notes.md", content="# notes\n")]},
        {"text": "done"},
    ]  # fmt: skip
    task = console.submit(scripted("edit files", turns, tools=["write_file", "edit_file"]))
    view = console.until(task, lambda v: v["status"] == "succeeded")
    page = tab.page
    page.goto(f"{console.url}/console/#/tasks/{task}")
    page.wait_for_selector(f"#files-summary:has-text('Step {view['step']}: 2 files')")
    assert page.locator("#files tr[data-path='src/app.py']").count() == 1
    page.click("a[data-file='src/app.py']")
    page.wait_for_selector("#file-text:has-text(\"print('bye')\")")
    # the files as step 2 (the first tools step) left them: one file, the first version
    page.fill("#files-step", "2")
    page.click("#files-show")
    page.wait_for_selector("#files-summary:has-text('Step 2: 1 files')")
    assert page.locator("#files tr[data-path='notes.md']").count() == 0
    page.click("a[data-file='src/app.py']")
    page.wait_for_selector("#file-text:has-text(\"print('hi')\")")
    # what step 4 (the second tools step) changed
    page.fill("#files-step", "4")
    page.click("#files-show")
    page.wait_for_selector("#files-summary:has-text('Step 4')")
    page.click("#files-diff")
    page.wait_for_selector("#diff-patch")
    assert page.inner_text("#diff-paths").split("\n") == ["added notes.md", "changed src/app.py"]
    patch = page.inner_text("#diff-patch")
    assert "-print('hi')" in patch and "+print('bye')" in patch and "+# notes" in patch
    shot(console, tab, "task-files")
    # a step the task never reached: the API's refusal, naming the field, on the page
    page.fill("#files-step", "99")
    page.click("#files-show")
    page.wait_for_selector("#files-error:has-text('(step)')")
    # a task without a workspace says so
    plain = console.submit(scripted("no files", [{"text": "hello"}]))
    console.until(plain, lambda v: v["status"] == "succeeded")
    page.goto(f"{console.url}/console/#/tasks/{plain}")
    page.wait_for_selector("#files:has-text('This task has no workspace.')")
    # Chromium logs the refusal asked for (the 422) as a console error; a task without a workspace
    # is not asked for its files at all (the view's has_workspace)
    tab.errors[:] = [e for e in tab.errors if "status of 422" not in e]


def test_the_vault_page_lists_a_users_credential_names_and_hosts_never_a_value_nor_anothers(
    console: Console, tab: Page
) -> None:
    """The vault page (console_assets/vault.js): a user's credentials by name, kind and hosts;
    another user's and another tenant's are not there, and no value reaches the page. A task
    paused for a credential the user lacks says which, and where."""
    user, marker = f"ann-{uuid.uuid4().hex[:6]}", "CONSOLEMARK" + uuid.uuid4().hex
    backend = console.stack.create_api_key("team-a", act_for_users=True)  # a key that may name users
    for name, body, key in (
        ("github", {"user": user, "value": marker, "hosts": ["api.github.com"]}, backend),
        ("crm", {"user": f"{user}-other", "value": marker, "hosts": ["crm.example.com"]}, backend),
        ("theirs", {"user": user, "value": marker, "hosts": ["x.example.com"]},
         console.stack.create_api_key("team-b", act_for_users=True)),
    ):  # fmt: skip
        assert console.http("PUT", f"/vault/credentials/{name}", body, key=key)[0] == 200
    page = tab.page
    page.click("#key-button")
    page.fill("#key-input", backend)
    page.press("#key-input", "Enter")
    page.click("a[data-nav='vault']")
    page.fill("#vault-user", user)
    page.click("#vault-form button[type=submit]")
    page.wait_for_selector("tr[data-credential='github']")
    assert page.inner_text("tr[data-credential='github']").split("\t")[:3] == ["github", "bearer", "api.github.com"]
    assert page.locator("tr[data-credential='crm'], tr[data-credential='theirs']").count() == 0
    assert marker not in page.content()
    shot(console, tab, "vault")
    # A task acting for the user, asking for a credential it lacks: the task page names it and the host.
    task = console.submit({**scripted("read my PRs", [
        {"text": "", "tool_calls": [{"name": "request_credential", "input": {"name": "jira", "host": "jira.example.com"}}]},
        {"text": "ok"},
    ], tools=["request_credential"]), "user": user}, key=backend)  # fmt: skip
    console.until(task, lambda v: v["status"] == "paused", key=backend)
    page.goto(f"{console.url}/console/#/tasks/{task}")
    page.wait_for_selector("text=credential 'jira' for jira.example.com")
    no_errors(tab)


def test_the_stop_button_asks_first_then_stops_a_users_tasks_until_resumed(console: Console, tab: Page) -> None:
    """The stops page (console_assets/stops.js): a stop is asked for in a dialog naming the scope;
    declined, nothing is stored and nothing stops; confirmed, the user's tasks are cancelled
    (another user's run on) and new ones are refused (423) until the row's Resume."""
    tenant = f"stop-console-{uuid.uuid4().hex[:6]}"  # a tenant of its own: the other tests' go on
    key = console.stack.create_api_key(tenant, act_for_users=True)
    slow = [{"text": "zzz", "latency_seconds": 20}]
    dora = [console.submit({**scripted("dora's", slow), "user": "dora"}, key=key) for _ in range(2)]
    ed = console.submit({**scripted("ed's", slow), "user": "ed"}, key=key)
    page = tab.page
    page.click("#key-button")
    page.fill("#key-input", key)
    page.press("#key-input", "Enter")
    page.click("a[data-nav='stops']")
    page.wait_for_selector("text=Nothing is stopped.")
    page.select_option("#stop-kind", "user")
    page.fill("#stop-value", "dora")
    page.fill("#stop-reason", "runaway")
    page.click("#stop-form button[type=submit]")
    page.wait_for_selector("#stop-dialog[open]")
    assert page.inner_text("#stop-question") == "Stop every task of user dora?"
    shot(console, tab, "stop-confirm", full_page=False)
    page.click("#stop-no")  # declined: nothing stored, nothing stopped
    assert console.http("GET", "/stops", key=key)[1] == {"stops": []}
    assert all(console.http("GET", f"/tasks/{t}", key=key)[1]["status"] in ("queued", "running") for t in dora)
    page.click("#stop-form button[type=submit]")
    page.click("#stop-yes")
    page.wait_for_selector("tr[data-stop='user:dora']")
    assert "2 tasks cancelled" in page.inner_text(".notice")
    assert page.inner_text("tr[data-stop='user:dora']").split("\t")[0] == "user dora"
    shot(console, tab, "stops")
    assert [console.http("GET", f"/tasks/{t}", key=key)[1]["status"] for t in dora] == ["cancelled"] * 2
    assert console.http("GET", f"/tasks/{ed}", key=key)[1]["status"] in ("queued", "running")
    refused = console.http("POST", "/tasks", {**scripted("again", slow), "user": "dora"}, key=key)
    assert refused[0] == 423 and refused[1]["error"]["scope"] == {"kind": "user", "value": "dora"}
    page.click("#resume-user-dora")
    page.wait_for_selector("text=Nothing is stopped.")
    assert console.http("POST", "/tasks", {**scripted("again", [{"text": "hi"}]), "user": "dora"}, key=key)[0] == 202
    console.http("POST", "/stops", {"tenant": tenant}, key=key)  # leave nothing running behind
    tab.errors[:] = [e for e in tab.errors if "status of 423" not in e]


def test_the_usage_page_shows_usage_by_end_user_and_the_caps_with_their_windows(console: Console, tab: Page) -> None:
    """The usage page (console_assets/usage.js): the last day's usage per end user of the key's
    tenant, and each cap per user, agent or key with what its hour and day hold; another
    tenant's users and caps are not there."""
    user = f"una-{uuid.uuid4().hex[:6]}"
    backend = console.stack.create_api_key("team-a", act_for_users=True)
    assert console.http("PUT", f"/caps/user/{user}", {"daily_usd": "5", "soft_daily_usd": "3"}, key=backend)[0] == 200
    task_id = console.submit({**scripted("hello", [{"text": "hi"}]), "user": user}, key=backend)
    used = console.until(task_id, lambda v: v["status"] == "succeeded")["budget"]["used"]
    theirs = console.stack.create_api_key("team-b", act_for_users=True)
    assert console.http("PUT", "/caps/agent/theirs", {"hourly_tokens": 10}, key=theirs)[0] == 200
    console.submit({**scripted("hello", [{"text": "hi"}]), "user": f"{user}-b"}, key=theirs)
    page = tab.page
    page.click("a[data-nav='usage']")
    page.wait_for_selector(f"tr[data-user='{user}']")
    cells = page.inner_text(f"tr[data-user='{user}']").split("\t")
    assert cells[:4] == [user, "1", "0", f"{used:,}"]
    cap = page.inner_text(f"tr[data-cap='user/{user}']")
    assert "$5.00 (ask above $3.00)" in cap and f"{used:,} tokens" in cap
    assert page.locator("tr[data-cap='agent/theirs'], tr[data-user$='-b']").count() == 0
    shot(console, tab, "usage")
    no_errors(tab)


def test_the_page_offers_an_interrupt_only_to_a_task_the_api_lets_it_interrupt(console: Console, tab: Page) -> None:
    """POST /tasks/{id}/interrupt takes a running or queued task only (storage.messages.interrupt:
    a paused or waiting one is 409). The conversation's Interrupt button must not be offered where
    every click of it is refused."""
    task_id = console.paused("wait for a person", "Go on?", "went on")
    status, body = console.http("POST", f"/tasks/{task_id}/interrupt")
    assert status == 409, body  # the API's word on a paused task
    page = tab.page
    page.goto(f"{console.url}/console/#/tasks/{task_id}")
    # The box and the button are drawn in one render (chat.drawChat): once the box is there, a
    # button that would be offered is too. A running task's is (the interrupt test above).
    page.wait_for_selector("#send-message", timeout=90_000)
    assert page.locator("#interrupt").count() == 0  # each click of it answered 409
    no_errors(tab)
