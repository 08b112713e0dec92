"""Fleet-wide flow control under an outage, on the local stack with real worker processes and
the real ``anthropic`` SDK: the model server goes down mid-run; a few failed calls open the
shared circuit; from then on the provider sees only the half-open probes; tasks are deferred,
not failed and not dead-lettered; when the server is back a probe closes the circuit and every
task finishes. Also: a 429's retry-after slows the whole fleet; the breaker's moves alone."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest

from agentq.core.flow import Admission, BreakerSettings, FlowSettings, RateLimits
from agentq.core.models import CallStep, TaskStatus
from agentq.runtime import Settings
from agentq.storage.container import Storage, memory_storage
from agentq.storage.flow import FlowControl
from agentq_dev.stack import LocalStack

from tests.fake_messages_api import FakeMessagesAPI, point_anthropic_at
from tests.fake_model_servers import FakeChatCompletions, FakeReply, Recorded, chat_completion
from tests.helpers import queue_depth, wait_for
from tests.outage_model import LOOKUP_TASK, OutageModel, submit_lookups

TASKS = 12
COOLDOWN = 1.5
ATTEMPTS = 2


@pytest.fixture
def model(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[OutageModel, FakeMessagesAPI]]:
    behaviour = OutageModel()
    with FakeMessagesAPI(responder=behaviour) as api:
        point_anthropic_at(api, monkeypatch.setenv)
        monkeypatch.setenv("AGENTQ_PROVIDER_RETRY", json.dumps({"max_attempts": ATTEMPTS, "base_delay": 0.1,
                                                                "max_delay": 0.2}))  # fmt: skip
        monkeypatch.setenv("AGENTQ_BREAKER", json.dumps({"failures": 3, "window_seconds": 30,
                                                         "cooldown_seconds": COOLDOWN, "probes": 1}))  # fmt: skip
        yield behaviour, api


def test_an_outage_opens_the_circuit_tasks_wait_not_fail_and_the_provider_sees_only_probes(
    model: tuple[OutageModel, FakeMessagesAPI],
) -> None:
    behaviour, _ = model
    with LocalStack(prefix="outage", workers=2, api=False, tool_modules=("tests.effect_tools",)) as stack:
        store, queues, ids = submit_lookups(stack, TASKS, tenant="t")
        wait_for(lambda: sum(t.step for t in store.tasks.get_many(ids)) >= TASKS, timeout=60, what="a first step each")
        behaviour.down, went_down = True, time.time()
        key = "anthropic/claude-sonnet-4-6"
        wait_for(lambda: store.flow.state(key).get("state") == "open", timeout=60, what="the circuit to open")
        opened = time.time()
        time.sleep(4 * COOLDOWN)
        behaviour.down, came_back = False, time.time()
        wait_for(
            lambda: all(t.status.terminal for t in store.tasks.get_many(ids)), timeout=300, what="every task to end"
        )
        finished = time.time()

        tasks = store.tasks.get_many(ids)
        assert [t.status for t in tasks] == [TaskStatus.SUCCEEDED] * TASKS, [t.error for t in tasks]
        assert all(queue_depth(queues, queues.dlq_url(tier)) == 0 for tier in ("high", "normal", "low"))
        assert store.flow.state(key).get("state") == "closed"
        # Once open, the provider saw only probes: at most one per cooldown (each with its own
        # retries), where without the circuit every waiting task would have kept calling.
        after_open = [at for at, down in behaviour.calls if down and at > opened + 0.5]
        rounds = (came_back - opened) / COOLDOWN + 1
        # A round whose probe went silent for a cooldown is renewed (core.flow): on a loaded machine a
        # starved worker's probe can overlap the next round's, so allow twice one round per cooldown,
        # still a fraction of what twelve waiting tasks would send (each retrying every delivery).
        assert len(after_open) <= 2 * ATTEMPTS * rounds, (len(after_open), rounds)
        during = sum(1 for _, down in behaviour.calls if down)
        print(f"outage {came_back - went_down:.1f}s: {during} calls while down, {len(after_open)} after the circuit "
              f"opened; recovery to last task {finished - came_back:.1f}s")  # fmt: skip


def test_a_429_slows_the_whole_fleet_down_for_its_retry_after() -> None:
    flow = FlowControl(memory_storage().table, FlowSettings())
    key = "anthropic/claude-haiku-4-5"
    assert flow.admit(key, 10, 10, now=1000.0).ok
    flow.slow_down(key, 30, now=1000.0)
    waiting = flow.admit(key, 10, 10, now=1010.0)
    assert not waiting.ok and waiting.reason == "slowed_down" and waiting.wait == pytest.approx(20)
    flow.slow_down(key, 5, now=1010.0)  # a shorter one does not cut the longer short
    assert flow.admit(key, 10, 10, now=1020.0).reason == "slowed_down"
    assert flow.admit(key, 10, 10, now=1031.0).ok


def test_the_breaker_opens_at_the_threshold_lets_bounded_probes_through_and_closes_on_success() -> None:
    settings = FlowSettings(breaker=BreakerSettings(failures=3, window_seconds=60, cooldown_seconds=10, probes=2))
    store: Storage = memory_storage()
    flow = FlowControl(store.table, settings)
    key = "anthropic/m"
    closed = flow.admit(key, 1, 1, now=100.0)
    assert [flow.failed(key, closed, now=100.0 + i) for i in range(3)] == [False, False, True]
    refused = flow.admit(key, 1, 1, now=105.0)
    assert not refused.ok and refused.reason == "circuit_open" and refused.wait == pytest.approx(7)
    probes = [flow.admit(key, 1, 1, now=113.0) for _ in range(4)]
    assert [p.ok for p in probes] == [True, True, False, False] and all(p.probe for p in probes[:2])
    assert flow.failed(key, probes[0], now=114.0)  # a failed probe opens it again
    assert not flow.admit(key, 1, 1, now=120.0).ok
    probe = flow.admit(key, 1, 1, now=125.0)
    assert probe.ok and probe.probe
    flow.succeeded(key, probe)
    assert flow.state(key)["state"] == "closed" and flow.admit(key, 1, 1, now=126.0) == Admission(ok=True)
    # Failures spread wider than the window never open it.
    assert not any(flow.failed(key, Admission(ok=True), now=200.0 + 61 * i) for i in range(5))


def test_rate_limit_buckets_defer_a_call_until_they_refill() -> None:
    settings = FlowSettings(limits={"anthropic/claude": RateLimits(rpm=2, itpm=1000)})
    flow = FlowControl(memory_storage().table, settings)
    key = "anthropic/claude-sonnet-4-6"
    assert flow.admit(key, 400, 50, now=0.0).ok and flow.admit(key, 400, 50, now=1.0).ok
    third = flow.admit(key, 400, 50, now=2.0)
    assert not third.ok and third.reason == "rate_limited" and 0 < third.wait <= 30
    assert flow.admit(key, 400, 50, now=2.0 + third.wait + 0.01).ok
    assert flow.admit("anthropic/other", 10**6, 1, now=0.0).ok  # no limit configured for it


def test_an_answered_call_gives_back_the_output_allowance_it_did_not_use() -> None:
    """Taken at the most a call may use (so no burst goes past the limit), settled at what it
    used: short answers do not hold the fleet to a tenth of its output limit."""
    settings = FlowSettings(limits={"anthropic/claude": RateLimits(itpm=10_000, otpm=1000)})
    flow = FlowControl(memory_storage().table, settings)
    key = "anthropic/claude-sonnet-4-6"
    first = flow.admit(key, 2000, 800, now=0.0)
    assert first.ok and (first.taken_input, first.taken_output) == (2000, 800)
    assert not flow.admit(key, 2000, 800, now=0.0).ok  # 200 output tokens left
    flow.settle(key, first, input_tokens=1500, output_tokens=90)  # the answer was short
    second = flow.admit(key, 2000, 800, now=0.0)
    assert second.ok and second.taken_output == 800
    assert not flow.admit(key, 2000, 800, now=0.0).ok  # 910 - 800 = 110 left: no more than the limit
    # A refused take gives back what the buckets before it gave: the input bucket is whole again.
    itpm = flow.table.get({"pk": f"FLOW#{key}", "sk": "BUCKET#itpm"})
    assert itpm is not None and float(itpm["tokens"]) == 10_000 - 2000 - 2000 + 500
    # Given back while nearly full, a bucket still holds no more than its limit at the next take.
    flow.settle(key, second, input_tokens=0, output_tokens=0)
    flow.settle(key, second, input_tokens=0, output_tokens=0)
    assert flow.admit(key, 0, 1000, now=0.0).ok and not flow.admit(key, 0, 1, now=0.0).ok


def test_two_executors_taking_at_the_same_instant_never_both_get_the_last_tokens() -> None:
    """A take is conditional on the bucket's version, not on its refill time: two executors whose
    clocks give the same `at` cannot both pass (the lost update would grant 1,300 of 1,000)."""
    from typing import cast

    from agentq.storage.table import Table

    settings = FlowSettings(limits={"anthropic/claude": RateLimits(otpm=1000)})
    table = memory_storage().table
    other = FlowControl(table, settings)
    key = "anthropic/claude-sonnet-4-6"
    assert other.admit(key, 0, 100, now=5.0).ok  # the bucket exists: 900 left as of t=5

    class CutIn:
        """This executor's table: the other executor takes between its read and its write."""

        cut_in = True

        def get(self, item_key: dict[str, str]) -> Any:
            item = table.get(item_key)
            if self.cut_in and item_key["sk"] == "BUCKET#otpm":
                self.cut_in = False
                assert other.admit(key, 0, 600, now=5.0).ok  # same instant: `at` stays 5.0
            return item

        def __getattr__(self, name: str) -> Any:
            return getattr(table, name)

    late = FlowControl(cast(Table, CutIn()), settings).admit(key, 0, 600, now=5.0)
    assert not late.ok and late.reason == "rate_limited"  # it read again and found 300
    bucket = table.get({"pk": f"FLOW#{key}", "sk": "BUCKET#otpm"})
    assert bucket is not None and float(bucket["tokens"]) == 300


def test_twelve_processes_taking_from_one_bucket_at_once_never_get_more_than_it_holds(
    settings: Settings, store: Storage
) -> None:
    """Real processes against moto server, all at the same instant: the grants never pass the
    limit, and the bucket's level is exactly what they leave (no update lost either way)."""
    from tests.racers import race

    key = f"anthropic/claude-race-{time.time_ns()}"  # a fresh bucket
    limits = json.dumps({"anthropic/claude": {"otpm": 1000}})
    reports = race(settings, "tests.bucket_racer", [[key, "100", "4", "1000.0"]] * 12, AGENTQ_RATE_LIMITS=limits)
    granted = sum(r["granted"] for r in reports)
    bucket = store.table.get({"pk": f"FLOW#{key}", "sk": "BUCKET#otpm"})
    assert bucket is not None and 0 < granted <= 10, granted
    assert float(bucket["tokens"]) == 1000 - 100 * granted
    assert sum(1 for r in reports if r["granted"] < 4) > 0  # there really was contention


def test_the_engine_settles_each_answered_call_with_the_usage_the_provider_counts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from agentq.control.submit import parse_submission
    from agentq.core.engine import Engine, EngineConfig
    from agentq.core.providers.anthropic_provider import AnthropicProvider
    from agentq.core.tools import ToolRegistry

    from tests.fake_messages_api import text_reply, usage_dict

    monkeypatch.setenv("AGENTQ_RATE_LIMITS", json.dumps({"anthropic/claude": {"itpm": 400_000, "otpm": 80_000}}))
    store = memory_storage()
    settled: list[tuple[int, int, int, int]] = []
    settle = store.flow.settle

    def recording(key: str, admission: Admission, input_tokens: int, output_tokens: int) -> None:
        settled.append((admission.taken_input, admission.taken_output, input_tokens, output_tokens))
        settle(key, admission, input_tokens, output_tokens)

    monkeypatch.setattr(store.flow, "settle", recording)
    fake = FakeMessagesAPI().start()
    try:
        usage = usage_dict(input_tokens=300, output_tokens=40, cache_creation_input_tokens=100,
                           cache_read_input_tokens=5000)  # fmt: skip
        fake.enqueue(text_reply("done", usage=usage))
        task = store.tasks.create(parse_submission({"goal": "g", "provider": "anthropic", "model": "claude-sonnet-4-6",
                                                    "constraints": {"max_output_tokens": 4096}}), tenant="t")  # fmt: skip
        engine = Engine(store, worker_id="w", tools=ToolRegistry([]), config=EngineConfig(lease_seconds=30),
                        providers=lambda sub: AnthropicProvider(api_key="sk-ant-test", base_url=fake.base_url))  # fmt: skip
        assert engine.run(task.task_id).status is TaskStatus.SUCCEEDED
    finally:
        fake.stop()
    [(taken_in, taken_out, used_in, used_out)] = settled
    assert taken_out == 4096 and taken_in > 0  # held at the most the call could use
    assert (used_in, used_out) == (400, 40)  # given back down to what counts: cache reads do not


def test_a_tool_that_keeps_failing_gets_its_circuit_opened_and_the_model_a_clear_unavailable_result(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from agentq.control.submit import parse_submission
    from agentq.core.engine import Engine, EngineConfig
    from agentq.core.models import ToolsStep
    from agentq.core.tools import ToolRegistry, tool

    from tests.helpers import call

    monkeypatch.setenv("AGENTQ_BREAKER", json.dumps({"failures": 3, "window_seconds": 60, "cooldown_seconds": 600}))
    runs: list[int] = []

    @tool(name="flaky_backend", side_effects=True)
    def flaky_backend(n: int) -> str:
        """Call a backend that is down."""
        runs.append(n)
        raise ConnectionError("backend refused the connection")

    store = memory_storage()
    turns = [{"text": f"try {i}", "tool_calls": [call("flaky_backend", n=i)]} for i in range(5)] + [{"text": "gave up"}]
    task = store.tasks.create(parse_submission({"goal": "g", "script": {"turns": turns},
                                                "constraints": {"tools": ["flaky_backend"]}}), tenant="t")  # fmt: skip
    engine = Engine(store, worker_id="w", tools=ToolRegistry([flaky_backend]), config=EngineConfig(lease_seconds=30))
    assert engine.run(task.task_id).status is TaskStatus.SUCCEEDED
    results = [r for s in store.steps.load(task.task_id) if isinstance(s.body, ToolsStep) for r in s.body.results]
    assert runs == [0, 1, 2]  # the circuit opened after three failures: the side effect was not tried again
    assert all(r.is_error for r in results)
    assert all("is unavailable: it failed repeatedly and its circuit is open" in r.content for r in results[3:])
    assert store.flow.state("tool/flaky_backend")["state"] == "open"


def test_flow_settings_that_cannot_work_are_refused_naming_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    for variable, value, says in (
        ("AGENTQ_BREAKER", '{"failures": 0}', "failures: Input should be greater than or equal to 1"),
        ("AGENTQ_BREAKER", "{not json", "not JSON"),
        ("AGENTQ_RATE_LIMITS", '{"anthropic/claude": {"rpm": -5}}', "rpm: Input should be greater than 0"),
    ):
        monkeypatch.setenv(variable, value)
        with pytest.raises(ValueError) as refused:
            FlowSettings.from_env()
        assert str(refused.value).startswith(f"{variable}: ") and says in str(refused.value), str(refused.value)
        monkeypatch.delenv(variable)
    monkeypatch.setenv("AGENTQ_RATE_LIMITS", '{"anthropic/claude-sonnet-4": {"rpm": 50, "itpm": 30000}}')
    assert FlowSettings.from_env().limits_for("anthropic/claude-sonnet-4-6") == RateLimits(rpm=50, itpm=30000)


DRILL_TASKS = 6


def chat_lookups(recorded: Recorded) -> FakeReply:
    """The fallback model: the same plan as ``OutageModel``'s (lookups, then the answer), over
    Chat Completions, from wherever the conversation stands."""
    turns = sum(1 for m in recorded.body["messages"] if m["role"] == "assistant")
    tokens = len(json.dumps(recorded.body["messages"])) // 4
    if turns < 2:
        return chat_completion(None, [("lookup", {"query": f"q{turns}"})], prompt_tokens=tokens, completion_tokens=20)
    return chat_completion("done", prompt_tokens=tokens, completion_tokens=5)


def test_the_outage_drill_with_two_providers_the_fallback_takes_over_and_no_task_fails(
    model: tuple[OutageModel, FakeMessagesAPI], monkeypatch: pytest.MonkeyPatch
) -> None:
    behaviour, _ = model
    fallback = {"provider": "openai", "model": "gpt-4.1-mini"}
    monkeypatch.setitem(LOOKUP_TASK, "fallbacks", [fallback])
    with FakeChatCompletions(responder=chat_lookups) as second:
        monkeypatch.setenv("OPENAI_BASE_URL", second.openai_base_url)  # before the workers start: they inherit it
        monkeypatch.setenv("OPENAI_API_KEY", "k")
        with LocalStack(prefix="outage2", workers=2, api=False, tool_modules=("tests.effect_tools",)) as stack:
            run_the_drill(stack, behaviour)


def run_the_drill(stack: LocalStack, behaviour: OutageModel) -> None:
    store, queues, ids = submit_lookups(stack, DRILL_TASKS, tenant="t")
    wait_for(lambda: all(t.step for t in store.tasks.get_many(ids)), timeout=60, what="a first step each")
    behaviour.down = True  # mid-run: conversations begun on Claude go on on the fallback
    wait_for(lambda: all(t.status.terminal for t in store.tasks.get_many(ids)), timeout=90, what="every task to end")

    tasks = store.tasks.get_many(ids)
    assert [t.status for t in tasks] == [TaskStatus.SUCCEEDED] * DRILL_TASKS, [t.error for t in tasks]
    assert all(queue_depth(queues, queues.dlq_url(tier)) == 0 for tier in ("high", "normal", "low"))
    # Whether Claude's circuit is open by now depends on how many calls failed before every task
    # had moved over (a quiet run moves them first): the steps below prove the takeover.
    for task_id in ids:
        answered = [(s.body.provider, s.body.model) for s in store.steps.load(task_id) if isinstance(s.body, CallStep)]
        # Once a call went to the fallback, the task stayed with it.
        switched = answered.index(("openai", "gpt-4.1-mini")) if ("openai", "gpt-4.1-mini") in answered else None
        assert switched is None or set(answered[switched:]) == {("openai", "gpt-4.1-mini")}, answered
    assert any((s.body.provider, s.body.model) == ("openai", "gpt-4.1-mini") for i in ids for s in store.steps.load(i)
               if isinstance(s.body, CallStep))  # fmt: skip
