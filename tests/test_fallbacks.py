"""Fallbacks: a task names an ordered list of models across providers. When its model's circuit
is open, or a call still fails with an overload after its retries, the next model takes the
call; the step records the provider and model that answered, and the task goes on with it, a
resume included; the budget hold is sized on the dearest of the task's models, so it covers
whichever answers. Through the real SDKs against the local Messages and Chat Completions fakes."""

from __future__ import annotations

import json
from collections.abc import Iterator
from decimal import Decimal
from typing import Any

import pytest

from agentq.control.submit import submit
from agentq.core.engine import Engine, EngineConfig
from agentq.core.errors import ValidationError
from agentq.core.flow import Admission
from agentq.core.models import CallStep, TaskStatus
from agentq.core.pricing import load_price_table
from agentq.core.tools import ToolRegistry
from agentq.storage.container import Storage

from tests.fake_messages_api import (
    FakeMessagesAPI,
    FakeReply,
    RecordedRequest,
    error_in_stream,
    overloaded,
    point_anthropic_at,
    text_reply,
    tool_use_reply,
)
from tests.fake_model_servers import FakeChatCompletions, Recorded, chat_completion

STORAGE = "memory"
CLAUDE = "claude-sonnet-4-6"
GPT = "gpt-4.1-mini"
TASK: dict[str, Any] = {
    "goal": "look up a",
    "provider": "anthropic",
    "model": CLAUDE,
    "fallbacks": [{"provider": "openai", "model": GPT}],
    "constraints": {"tools": ["lookup"], "tool_policies": {"lookup": "ask"}},
}


class Claude:
    """Down (529) until told otherwise; answers at once when up."""

    def __init__(self) -> None:
        self.down = True
        self.calls = 0

    def __call__(self, request: RecordedRequest) -> FakeReply:
        self.calls += 1
        return overloaded() if self.down else text_reply("claude here")


def gpt_plan(recorded: Recorded) -> Any:
    last = recorded.body["messages"][-1]
    if last["role"] == "tool":
        return chat_completion("done", prompt_tokens=300, completion_tokens=5)
    return chat_completion(None, [("lookup", {"query": "a", "size": 20})], prompt_tokens=200, completion_tokens=20)


@pytest.fixture
def models(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Claude, FakeMessagesAPI, FakeChatCompletions]]:
    claude = Claude()
    with FakeMessagesAPI(responder=claude) as anthropic_api, FakeChatCompletions(responder=gpt_plan) as openai_api:
        point_anthropic_at(anthropic_api, monkeypatch.setenv)
        monkeypatch.setenv("OPENAI_API_KEY", "k")
        monkeypatch.setenv("OPENAI_BASE_URL", openai_api.openai_base_url)
        monkeypatch.setenv("AGENTQ_PROVIDER_RETRY", json.dumps({"max_attempts": 2, "base_delay": 0, "max_delay": 0}))
        yield claude, anthropic_api, openai_api


def engine(store: Storage, registry: ToolRegistry, worker: str = "w1") -> Engine:
    return Engine(store, worker_id=worker, tools=registry, config=EngineConfig(lease_seconds=5))


def call_steps(store: Storage, task_id: str) -> list[CallStep]:
    return [r.body for r in store.steps.load(task_id) if isinstance(r.body, CallStep)]


def test_an_overload_after_the_retries_falls_over_and_the_resume_stays_with_the_model_that_answered(
    models: tuple[Claude, FakeMessagesAPI, FakeChatCompletions], store: Storage, registry: ToolRegistry
) -> None:
    claude, _, openai_api = models
    task = submit(store, registry, TASK, tenant="t")
    first = engine(store, registry).run(task.task_id)
    assert first.status is TaskStatus.PAUSED, first.error  # the lookup waits for a person
    assert claude.calls == 2  # its two attempts, then the fallback took the call
    (answered,) = call_steps(store, task.task_id)
    assert (answered.provider, answered.model) == ("openai", GPT)
    assert store.flow.state(f"anthropic/{CLAUDE}")["failures"]  # the failure counts on Claude's circuit

    claude.down = False  # Claude is back, but the conversation goes on with the model that answered
    pending = store.approvals.pending(task.task_id)
    assert pending is not None
    store.approvals.decide(task.task_id, pending.use_id, approved=True, note="", by="alice")
    resumed = engine(store, registry, "w2").run(task.task_id)
    assert resumed.status is TaskStatus.SUCCEEDED, resumed.error
    assert claude.calls == 2 and len(openai_api.requests) == 2
    assert [(s.provider, s.model) for s in call_steps(store, task.task_id)] == [("openai", GPT)] * 2
    assert store.tasks.get(task.task_id).result == "done"


def test_an_open_circuit_sends_the_call_to_the_fallback_without_trying_the_model(
    models: tuple[Claude, FakeMessagesAPI, FakeChatCompletions], store: Storage, registry: ToolRegistry
) -> None:
    claude, _, openai_api = models
    key = f"anthropic/{CLAUDE}"
    while not store.flow.failed(key, Admission(ok=True)):
        pass  # the fleet's failures opened Claude's circuit
    task = submit(store, registry, {**TASK, "constraints": {"tools": ["lookup"]}}, tenant="t")
    assert engine(store, registry).run(task.task_id).status is TaskStatus.SUCCEEDED
    assert claude.calls == 0 and len(openai_api.requests) == 2
    note = call_steps(store, task.task_id)[0].fallback_from  # the switch, and why: the open circuit
    assert note is not None and (note.provider, note.model, note.reason) == ("anthropic", CLAUDE, "circuit_open")


def test_a_task_fails_over_only_for_an_outage_not_for_a_request_the_model_refuses(
    models: tuple[Claude, FakeMessagesAPI, FakeChatCompletions], store: Storage, registry: ToolRegistry
) -> None:
    _, anthropic_api, openai_api = models
    anthropic_api.responder = lambda request: FakeReply(
        400, {"type": "error", "error": {"type": "invalid_request_error", "message": "bad"}}
    )
    task = submit(store, registry, TASK, tenant="t")
    result = engine(store, registry).run(task.task_id)
    assert result.status is TaskStatus.FAILED and result.error is not None
    assert result.error["code"] == "invalid_request" and openai_api.requests == []


def test_an_overload_inside_a_stream_falls_over_and_the_input_its_stream_told_is_counted_as_known(
    models: tuple[Claude, FakeMessagesAPI, FakeChatCompletions], store: Storage, registry: ToolRegistry
) -> None:
    """How Anthropic reports an overload once a stream began (every call of the anthropic
    provider streams): an error event inside the 200. It is an outage as a 529 is, so the task's
    fallback takes the call; the failed attempts may have been billed, so their holds stay
    counted, what their streams told (10 input tokens and one output each) as known, the rest
    unknown (ARCHITECTURE 4). Before, it failed the task for good and returned the holds."""
    _, anthropic_api, openai_api = models
    anthropic_api.responder = None
    anthropic_api.enqueue(*(error_in_stream("overloaded_error", "Overloaded", input_tokens=10) for _ in range(2)))
    task = submit(store, registry, {**TASK, "constraints": {"tools": ["lookup"]}}, tenant="t")
    result = engine(store, registry).run(task.task_id)
    assert result.status is TaskStatus.SUCCEEDED, result.error
    assert len(anthropic_api.requests) == 2 and anthropic_api.pending == 0 and len(openai_api.requests) == 2
    steps = call_steps(store, task.task_id)
    assert [(s.provider, s.model) for s in steps] == [("openai", GPT)] * 2
    note = steps[0].fallback_from
    assert note is not None and (note.provider, note.reason) == ("anthropic", "overloaded")
    budget = store.budgets.get(task.task_id)
    answered = sum(s.usage.input_total + s.usage.output_tokens for s in steps)
    assert budget.known == 2 * (10 + 1) + answered and budget.unknown > 0 and budget.reserved == 0, budget


def test_the_hold_is_sized_on_the_dearest_of_the_tasks_models() -> None:
    prices = load_price_table()
    dearest = prices.dearest([GPT, CLAUDE])
    claude, gpt = prices.price_for(CLAUDE), prices.price_for(GPT)
    assert dearest is not None and claude is not None and gpt is not None
    assert dearest.hold_micros(1000, 1000) == claude.hold_micros(1000, 1000) > gpt.hold_micros(1000, 1000)
    assert dearest.cache_read_per_mtok == Decimal("0.3")  # Claude's reads (0.1 x $3) cost more than GPT's ($0.10)
    assert prices.dearest(["no-such-model", CLAUDE]) is None  # the task's own model must be priced


class _Fanout:
    """Step Functions' part of a spawn (the child is run by hand)."""

    def start(self, *, parent: Any, spawn_id: str, children: list[Any], max_concurrency: int) -> str:
        return "arn:aws:states:local:000000000000:execution:fanout:1"

    def child_finished(self, task_token: str, task_id: str, status: TaskStatus) -> None:
        return None


def test_a_sub_agent_falls_over_to_its_parents_fallback_under_a_hold_sized_on_the_dearest_model(
    models: tuple[Claude, FakeMessagesAPI, FakeChatCompletions], store: Storage, registry: ToolRegistry
) -> None:
    """A child took its parent's model but not its fallbacks: in the outage the parent's fallback
    answers, its sub-agents failed (or waited on the open circuit). The child's hold is priced
    on the dearest of its models (Claude's), whichever answers."""
    from agentq.control.submit import parse_submission
    from agentq.core.fanout import SpawnInput, plan_children

    _, anthropic_api, openai_api = models
    spawned = iter([tool_use_reply("spawn_subagents", {"subagents": [{"goal": "one"}]})])
    anthropic_api.responder = lambda _: next(spawned, None) or overloaded()  # down after the spawn
    holds: list[Any] = []

    def gpt(_: Recorded) -> Any:
        holds.append(store.tasks.get(child_id).inflight)  # the child's hold, while its call is in flight
        return chat_completion("child done")

    openai_api.responder = gpt
    body = {**TASK, "constraints": {"tools": ["spawn_subagents"], "max_tokens": 100_000}}
    parent = store.tasks.create(parse_submission(body), tenant="t")
    (plan,) = plan_children(parent, "toolu_1", SpawnInput.model_validate({"subagents": [{"goal": "one"}]}), 50_000)
    assert plan.submission.fallbacks == parent.submission.fallbacks
    spawning = Engine(store, worker_id="w1", tools=registry, config=EngineConfig(lease_seconds=5), fanout=_Fanout())
    assert spawning.run(parent.task_id).status is TaskStatus.WAITING
    spawn = call_steps(store, parent.task_id)[-1].content[-1]["id"]
    record = store.spawns.get(parent.task_id, spawn)
    assert record is not None
    (child_id,) = record.children
    assert store.tasks.get(child_id).submission.fallbacks == parent.submission.fallbacks
    assert engine(store, registry, "w2").run(child_id).status is TaskStatus.SUCCEEDED
    (answered,) = call_steps(store, child_id)
    assert (answered.provider, answered.model) == ("openai", GPT) and answered.fallback_from is not None
    prices = load_price_table()
    claude, gpt_price = prices.price_for(CLAUDE), prices.price_for(GPT)
    (held,) = holds
    assert claude is not None and gpt_price is not None and held is not None
    # every token of it at no less than Claude's input rate: more than any split of it costs at GPT's
    assert held.micros >= claude.hold_micros(held.amount, 0) > gpt_price.hold_micros(0, held.amount)


@pytest.mark.parametrize(
    ("change", "field"),
    [({"fallbacks": [{"provider": "openai", "model": "no-such-model"}]}, "fallbacks[0].model"),
     ({"fallbacks": [{"provider": "scripted", "model": "x"}]}, "fallbacks[0].provider"),
     ({"fallbacks": [{"provider": "anthropic", "model": CLAUDE}]}, "fallbacks"),
     ({"constraints": {"economy": True}}, "fallbacks"),
     ({"constraints": {"thinking_budget_tokens": 2048, "max_output_tokens": 8192}},
      "constraints.thinking_budget_tokens")],
)  # fmt: skip
def test_a_fallback_that_could_not_take_the_task_is_refused_at_submission(
    change: dict[str, Any], field: str, store: Storage, registry: ToolRegistry
) -> None:
    with pytest.raises(ValidationError) as refused:
        submit(store, registry, {**TASK, **change}, tenant="t")
    assert refused.value.field == field, refused.value.message


def test_after_a_fallback_answered_every_step_status_names_it_and_the_trace_records_the_switch(
    models: tuple[Claude, FakeMessagesAPI, FakeChatCompletions], store: Storage, registry: ToolRegistry
) -> None:
    from agentq.api.views import task_view, trace_page
    from agentq.cli.views import event_line, status_block, trace_tree

    task = submit(store, registry, {**TASK, "constraints": {"tools": ["lookup"]}}, tenant="t")
    assert engine(store, registry).run(task.task_id).status is TaskStatus.SUCCEEDED
    steps = call_steps(store, task.task_id)
    assert [(s.provider, s.model) for s in steps] == [("openai", GPT)] * 2
    # Only the step of the switch records it: from which model, and why.
    first, second = steps
    assert first.fallback_from is not None and second.fallback_from is None
    assert (first.fallback_from.provider, first.fallback_from.model, first.fallback_from.reason) == (
        "anthropic", CLAUDE, "overloaded",
    )  # fmt: skip

    done = store.tasks.get(task.task_id)
    view = task_view(store, done)
    assert [(c.provider, c.model) for c in view.fallbacks] == [("openai", GPT)]
    assert view.answered_by is not None and (view.answered_by.provider, view.answered_by.model) == ("openai", GPT)
    model_line = next(line for line in status_block(view).splitlines() if line.startswith("model"))
    assert model_line.startswith(f"model     openai / {GPT} (fallback; the task's own: anthropic / {CLAUDE})")
    assert f"fallbacks openai / {GPT}" in status_block(view)

    events = trace_page(store, done, limit=100, cursor=None).events
    (switch,) = [e for e in events if e.type == "transition" and e.event == "fallback"]
    assert (
        switch.detail["from"] == {"provider": "anthropic", "model": CLAUDE} and switch.detail["reason"] == "overloaded"
    )
    calls = [e for e in events if e.type == "llm_call"]
    assert [c.provider for c in calls] == ["openai", "openai"]
    assert events.index(switch) == events.index(calls[0]) - 1  # just before the call it led to
    said = event_line(calls[0], origin=done.created_at).plain
    assert f"LLM openai/{GPT}" in said and f"fallback: openai / {GPT} took over from anthropic / {CLAUDE}" in said
    assert "fallback" not in event_line(calls[1], origin=done.created_at).plain
    assert str(trace_tree(task.task_id, view, events)).count("took over") <= 1


def test_a_task_whose_own_model_answers_shows_no_fallback_in_its_view(
    models: tuple[Claude, FakeMessagesAPI, FakeChatCompletions], store: Storage, registry: ToolRegistry
) -> None:
    from agentq.api.views import task_view

    claude, _, _ = models
    claude.down = False
    task = submit(store, registry, {**TASK, "constraints": {"tools": ["lookup"]}}, tenant="t")
    assert engine(store, registry).run(task.task_id).status is TaskStatus.SUCCEEDED
    view = task_view(store, store.tasks.get(task.task_id))
    assert view.answered_by is None and [c.model for c in view.fallbacks] == [GPT]
    assert all(s.fallback_from is None and s.provider == "anthropic" for s in call_steps(store, task.task_id))


def _forbid_model(store: Storage, model: str) -> None:
    from agentq.core.policies import check

    text = f'@id("no-{model}") forbid(principal, action == Action::"model", resource == Model::"{model}");'
    store.policies.put("t", "tenant", text, check(text).digest)


def test_a_rule_denying_the_fallbacks_model_stops_the_fall_over_before_anything_is_sent_to_it(
    models: tuple[Claude, FakeMessagesAPI, FakeChatCompletions], store: Storage, registry: ToolRegistry
) -> None:
    """The fallback's call is a model call like the first: checked against the model it goes to
    (the rule sees ``Model::"<fallback>"``), so a rule denying that model ends the task ``failed``
    naming the rule, and the fallback is never called."""
    claude, _, openai_api = models
    _forbid_model(store, GPT)
    task = submit(store, registry, TASK, tenant="t")
    result = engine(store, registry).run(task.task_id)
    assert result.status is TaskStatus.FAILED and result.error is not None, result
    assert result.error["code"] == "policy_denied" and f"tenant/no-{GPT}" in result.error["message"], result.error
    assert f"anthropic/{CLAUDE} failed: overloaded" in result.error["message"]
    assert claude.calls == 2 and openai_api.requests == []  # the task's model tried, its fallback never
    assert call_steps(store, task.task_id) == []
    assert store.budgets.get(task.task_id).reserved == 0  # the hold went back (every attempt unbilled)


def test_the_check_before_a_call_sees_the_model_its_route_chose_past_an_open_circuit(
    models: tuple[Claude, FakeMessagesAPI, FakeChatCompletions], store: Storage, registry: ToolRegistry
) -> None:
    """With its model's circuit open the call goes to the fallback: the check names the
    fallback's model, so a rule denying it stops the call, and one denying the model that is
    not called does not."""
    claude, _, openai_api = models
    while not store.flow.failed(f"anthropic/{CLAUDE}", Admission(ok=True)):
        pass  # the fleet's failures opened Claude's circuit
    plain = {**TASK, "constraints": {"tools": ["lookup"]}}
    _forbid_model(store, GPT)
    denied = submit(store, registry, plain, tenant="t")
    result = engine(store, registry).run(denied.task_id)
    assert result.status is TaskStatus.FAILED and result.error is not None
    assert f"tenant/no-{GPT}" in result.error["message"] and openai_api.requests == [] and claude.calls == 0

    _forbid_model(store, CLAUDE)  # a new version of the tenant's rules: Claude denied, GPT allowed
    allowed = submit(store, registry, plain, tenant="t")
    result = engine(store, registry, "w2").run(allowed.task_id)  # a new worker: no rules cached
    assert result.status is TaskStatus.SUCCEEDED, result.error
    steps = call_steps(store, allowed.task_id)
    assert claude.calls == 0 and [(s.provider, s.model) for s in steps] == [("openai", GPT)] * 2


def test_a_fallback_the_budget_cannot_hold_for_after_a_possibly_billed_failure_is_never_sent_nor_blamed(
    models: tuple[Claude, FakeMessagesAPI, FakeChatCompletions], store: Storage, registry: ToolRegistry,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    """Claude's reply is cut (it may have been billed: its hold stays counted), and the budget has
    no room for a second hold: the fallback's call is not made, its admission goes back, and
    the failure is Claude's alone, on Claude's circuit, not counted on the fallback's."""
    import dataclasses

    claude, anthropic_api, openai_api = models
    claude.down = False
    probe = submit(store, registry, TASK, tenant="t")
    assert engine(store, registry).run(probe.task_id).status is TaskStatus.SUCCEEDED
    (answered,) = call_steps(store, probe.task_id)
    hold = answered.reserved_tokens  # the size of this turn's hold
    monkeypatch.setenv("AGENTQ_PROVIDER_RETRY", json.dumps({"max_attempts": 1, "base_delay": 0, "max_delay": 0}))
    anthropic_api.responder = lambda _: dataclasses.replace(text_reply("cut"), cut_at=0.5)
    task = submit(store, registry, {**TASK, "constraints": {**TASK["constraints"], "max_tokens": hold + hold // 2}},
                  tenant="t")  # fmt: skip
    result = engine(store, registry).run(task.task_id)
    assert result.outcome == "retry" and result.error is not None, result
    assert result.error["code"] == "provider_unreachable", result.error  # Claude's failure
    assert openai_api.requests == [] and call_steps(store, task.task_id) == []
    assert store.flow.state(f"openai/{GPT}").get("failures") is None  # the fallback is not blamed
    assert store.flow.state(f"anthropic/{CLAUDE}")["failures"]
    budget = store.budgets.get(task.task_id)
    assert (budget.used, budget.reserved) == (hold, 0) and budget.unknown > 0  # the cut attempt's (its stream
    # told the input billed: known)


def test_a_lease_lost_as_the_call_falls_over_gives_back_the_hold_and_the_windows_for_a_call_never_sent(
    models: tuple[Claude, FakeMessagesAPI, FakeChatCompletions], store: Storage, registry: ToolRegistry,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    """Claude answers 529 to every attempt (nothing billed) and the call falls over; the run then
    learns its lease is gone, before the fallback's call starts. Nothing went out that the hold
    answers for: it goes back now, with the tenant hour's hold, as when a lease is lost between
    a call's attempts. It used to stay counted (set aside by the next claim, then unknown), and
    the hour's hold stayed held until the hour rolled over."""
    import threading

    from agentq.core.engine._holds import BudgetHolds
    from agentq.core.errors import LeaseLost
    from agentq.core.tenancy import TenantLimits
    from agentq.storage.tenant_windows import TenantWindows

    claude, _, openai_api = models
    windows = TenantWindows(store.table)
    windows.set_limits("t", TenantLimits(hourly_tokens=1_000_000))
    cover, lost = BudgetHolds.cover, list[float]()

    def lost_at_the_fall_over(self: BudgetHolds, s: Any, start: float) -> None:
        # The fallback's cover: on the run's thread (a retry's is on the call's), once Claude is done.
        if claude.calls == 2 and threading.current_thread() is threading.main_thread() and not lost:
            lost.append(start)
            raise LeaseLost("a successor claimed the task")
        cover(self, s, start)

    monkeypatch.setattr(BudgetHolds, "cover", lost_at_the_fall_over)
    task = submit(store, registry, TASK, tenant="t")
    result = engine(store, registry).run(task.task_id)
    assert lost and result.outcome == "lease_lost" and claude.calls == 2 and openai_api.requests == [], result
    budget = store.budgets.get(task.task_id)
    assert (budget.reserved, budget.used, budget.unknown) == (0, 0, 0), budget
    after = store.tasks.get(task.task_id)
    assert after.inflight is None and after.lapsed_holds == {}
    assert windows.usage("t") == {"held": 0, "used": 0}
