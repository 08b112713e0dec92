"""The agent loop against moto server: runs, caps, timeouts, tool errors, resumes, ledgers."""

from __future__ import annotations

import time
from decimal import Decimal
from typing import Any

import pytest

from agentq.core.engine import Engine, EngineConfig, conversation
from agentq.core.errors import ProviderError
from agentq.core.models import LLMStep, TaskStatus, TaskSubmission, ToolsStep, Usage
from agentq.core.providers import LLMRequest, LLMResponse, default_provider_factory
from agentq.core.tools import ToolRegistry
from agentq.storage.container import Storage

from tests.helpers import call, scripted

THREE_TURNS = [
    {"text": "looking", "tool_calls": [call("lookup", query="a")]},
    {"text": "charging", "tool_calls": [call("charge_card", amount_cents=500, memo="m"), call("lookup", query="b")]},
    {"text": "all done"},
]


# The engine's own behaviour needs no AWS: ``store`` and ``registry`` (tests/conftest.py) are the
# in-memory twin's, which tests/storage_conformance holds to DynamoDB's rules. Races between
# processes stay on moto server (test_crash_recovery, test_zombie_worker, test_budget_race).
STORAGE = "memory"


def engine(store: Storage, registry: ToolRegistry, **kwargs: Any) -> Engine:
    return Engine(store, worker_id="w1", tools=registry, config=EngineConfig(lease_seconds=5), **kwargs)


def test_scripted_task_runs_to_success_with_every_step_committed(store: Storage, registry: ToolRegistry) -> None:
    task = store.tasks.create(scripted(THREE_TURNS, tools=["lookup", "charge_card"]), tenant="t")
    result = engine(store, registry).run(task.task_id)
    assert (result.outcome, result.status) == ("finished", TaskStatus.SUCCEEDED)
    steps = store.steps.load(task.task_id)
    assert [s.body.kind for s in steps] == ["llm", "tools", "llm", "tools", "llm"]
    assert [s.number for s in steps] == [1, 2, 3, 4, 5]
    final = store.tasks.get(task.task_id)
    assert final.status is TaskStatus.SUCCEEDED and final.result == "all done" and final.step == 5
    tools_step = steps[3].body
    assert isinstance(tools_step, ToolsStep)
    assert [r.name for r in tools_step.results] == ["charge_card", "lookup"]
    assert tools_step.results[0].content.startswith("charged 500 cents")


def test_budget_used_equals_provider_usage_exactly_and_nothing_stays_reserved(
    store: Storage, registry: ToolRegistry
) -> None:
    task = store.tasks.create(scripted(THREE_TURNS, tools=["lookup", "charge_card"]), tenant="t")
    engine(store, registry).run(task.task_id)
    llm_steps = [s.body for s in store.steps.load(task.task_id) if isinstance(s.body, LLMStep)]
    budget = store.budgets.get(task.task_id)
    assert budget.used == sum(s.usage.total for s in llm_steps)
    assert budget.reserved == 0
    assert budget.available == budget.cap - budget.used
    final = store.tasks.get(task.task_id)
    assert final.tokens_in == sum(s.usage.input_tokens for s in llm_steps)
    assert final.tokens_out == sum(s.usage.output_tokens for s in llm_steps)
    # claude-sonnet-4-5 at $3/$15 per million tokens
    expected = sum(Decimal(s.usage.input_tokens) * 3 + Decimal(s.usage.output_tokens) * 15 for s in llm_steps) / 10**6
    assert final.cost_usd == expected == budget.cost_usd
    assert all(s.cost_usd > 0 for s in llm_steps)


def test_max_steps_stops_with_cost_exceeded_and_keeps_the_partial_result(
    store: Storage, registry: ToolRegistry
) -> None:
    turns = [{"text": f"turn {i}", "tool_calls": [call("lookup", query=str(i))]} for i in range(10)]
    task = store.tasks.create(scripted(turns, tools=["lookup"], max_steps=3), tenant="t")
    result = engine(store, registry).run(task.task_id)
    assert result.status is TaskStatus.COST_EXCEEDED
    final = store.tasks.get(task.task_id)
    assert final.llm_steps == 3
    assert final.error and final.error["code"] == "max_steps_exceeded"
    assert final.result == "turn 2"
    assert store.budgets.get(task.task_id).reserved == 0


def test_token_budget_exhaustion_stops_before_the_cap_is_passed(store: Storage, registry: ToolRegistry) -> None:
    turns = [
        {"text": f"turn {i} " + "y" * 400, "tool_calls": [call("lookup", query=str(i), size=2000)]} for i in range(50)
    ]
    task = store.tasks.create(scripted(turns, tools=["lookup"], max_tokens=6000, max_output_tokens=300), tenant="t")
    result = engine(store, registry).run(task.task_id)
    assert result.status is TaskStatus.COST_EXCEEDED
    budget = store.budgets.get(task.task_id)
    assert budget.used <= budget.cap
    assert budget.reserved == 0
    final = store.tasks.get(task.task_id)
    assert final.error and final.error["code"] == "budget_exceeded"
    assert final.result and final.result.startswith("turn")


def test_task_timeout_ends_in_timed_out(store: Storage, registry: ToolRegistry) -> None:
    turns = [{"text": f"t{i}", "latency_seconds": 0.6, "tool_calls": [call("lookup", query="q")]} for i in range(10)]
    task = store.tasks.create(scripted(turns, tools=["lookup"], timeout_seconds=1), tenant="t")
    result = engine(store, registry).run(task.task_id)
    assert result.status is TaskStatus.TIMED_OUT
    assert store.tasks.get(task.task_id).error["code"] == "timeout"  # type: ignore[index]


def test_unknown_and_disallowed_tools_and_bad_input_become_error_results_not_crashes(
    store: Storage, registry: ToolRegistry
) -> None:
    turns = [
        {
            "text": "",
            "tool_calls": [call("no_such_tool", x=1), call("charge_card", amount_cents=1, memo="m"), call("lookup")],
        },
        {"text": "recovered"},
    ]
    task = store.tasks.create(scripted(turns, tools=["lookup"]), tenant="t")
    result = engine(store, registry).run(task.task_id)
    assert result.status is TaskStatus.SUCCEEDED
    results = store.steps.load(task.task_id)[1].body.results  # type: ignore[union-attr]
    assert all(r.is_error for r in results)
    assert "unknown tool 'no_such_tool'" in results[0].content
    assert "not allowed" in results[1].content
    assert "query" in results[2].content  # the missing field is named


def test_a_time_slice_ends_cleanly_and_the_next_run_continues(store: Storage, registry: ToolRegistry) -> None:
    turns = [{"text": f"t{i}", "latency_seconds": 0.3, "tool_calls": [call("lookup", query="q")]} for i in range(4)]
    turns.append({"text": "done"})
    task = store.tasks.create(scripted(turns, tools=["lookup"]), tenant="t")
    eng = Engine(store, worker_id="w1", tools=registry, config=EngineConfig(lease_seconds=5, slice_margin_seconds=0))
    first = eng.run(task.task_id, deadline=time.time() + 0.7)
    assert first.outcome == "continue" and 0 < first.steps_committed < 9
    meta = store.tasks.get(task.task_id)
    assert meta.lease_expires == 0  # released: the next claim needs no wait
    # and with it the next call's hold: that call never started, so nothing of it is counted
    assert meta.inflight is None and store.budgets.get(task.task_id).reserved == 0
    second = eng.run(task.task_id)
    assert second.status is TaskStatus.SUCCEEDED
    assert second.resumed_from_step == first.steps_committed
    steps = store.steps.load(task.task_id)
    assert len(steps) == 9 and [s.epoch for s in steps][-1] == 2


def test_a_finished_task_cannot_be_claimed_again(store: Storage, registry: ToolRegistry) -> None:
    task = store.tasks.create(scripted([{"text": "done"}]), tenant="t")
    engine(store, registry).run(task.task_id)
    assert engine(store, registry).run(task.task_id).outcome == "not_claimed"
    assert store.tasks.claim(task.task_id, "other", 5) is None


def test_live_lease_blocks_a_second_worker(store: Storage) -> None:
    task = store.tasks.create(scripted([{"text": "done"}]), tenant="t")
    assert store.tasks.claim(task.task_id, "a", 30) is not None
    assert store.tasks.claim(task.task_id, "b", 30) is None


class _Failing:
    name = "failing"

    def __init__(self, retryable: bool) -> None:
        self.retryable = retryable

    def complete(self, request: LLMRequest) -> LLMResponse:
        raise ProviderError(
            "provider said no", retryable=self.retryable, status_code=529 if self.retryable else 400, attempts=3
        )


def test_provider_overload_releases_reservation_and_lease_for_a_retry(store: Storage, registry: ToolRegistry) -> None:
    task = store.tasks.create(scripted([{"text": "done"}]), tenant="t")
    result = engine(store, registry, providers=lambda s: _Failing(True)).run(task.task_id)
    assert result.outcome == "retry" and result.error and result.error["status_code"] == 529
    meta = store.tasks.get(task.task_id)
    assert meta.status is TaskStatus.RUNNING and meta.lease_expires == 0 and meta.inflight is None
    assert store.budgets.get(task.task_id).reserved == 0
    assert engine(store, registry).run(task.task_id).status is TaskStatus.SUCCEEDED


def test_provider_rejection_fails_the_task_with_the_error(store: Storage, registry: ToolRegistry) -> None:
    task = store.tasks.create(scripted([{"text": "done"}]), tenant="t")
    result = engine(store, registry, providers=lambda s: _Failing(False)).run(task.task_id)
    assert result.status is TaskStatus.FAILED
    meta = store.tasks.get(task.task_id)
    assert meta.status is TaskStatus.FAILED and meta.error and meta.error["status_code"] == 400
    assert store.budgets.get(task.task_id).reserved == 0


class _Broken:
    """A provider with a bug every call meets (a reply read as the wrong shape)."""

    name = "broken"

    def complete(self, request: LLMRequest) -> LLMResponse:
        reply: dict[str, LLMResponse] = {}
        return reply["content"]


class _Unreachable:
    name = "unreachable"

    def complete(self, request: LLMRequest) -> LLMResponse:
        raise ConnectionResetError("connection reset by peer")


def test_a_fault_every_run_would_meet_fails_the_task_at_once_with_the_error(
    store: Storage, registry: ToolRegistry
) -> None:
    """The fault is met in the call (a reply read as the wrong shape: it came, so it was
    billed): the task fails at once, and the call's hold is counted as spent, its outcome
    unknown (``BudgetHolds.give_up``). It used to be given back as unspent."""
    task = store.tasks.create(scripted([{"text": "done"}]), tenant="t")
    result = engine(store, registry, providers=lambda s: _Broken()).run(task.task_id)
    assert (result.outcome, result.status) == ("finished", TaskStatus.FAILED)
    meta = store.tasks.get(task.task_id)
    assert meta.status is TaskStatus.FAILED and meta.error == {
        "code": "processing_failed",
        "message": "KeyError: 'content'",
    }
    assert meta.lease_expires == 0 and meta.inflight is None
    budget = store.budgets.get(task.task_id)
    assert budget.reserved == 0 and budget.used == budget.unknown > 0


def test_a_script_that_cannot_be_loaded_fails_the_task_at_once(
    store: Storage, registry: ToolRegistry, tmp_path: Any
) -> None:
    path = tmp_path / "gone.json"
    path.write_text('{"turns": [{"text": "hi"}]}')
    task = store.tasks.create(
        TaskSubmission(goal="g", provider="scripted", script=str(path)), tenant="t"
    )  # a trusted caller's file (the HTTP API and spawns take built-in names only)
    path.unlink()
    result = engine(store, registry).run(task.task_id)
    assert result.status is TaskStatus.FAILED and result.error is not None
    assert result.error["code"] == "invalid_script" and str(path) in result.error["message"]
    assert store.tasks.get(task.task_id).error == result.error


def test_an_outage_is_raised_to_the_queue_with_the_lease_given_back(store: Storage, registry: ToolRegistry) -> None:
    """An error of no known kind from the call (no provider's classifier said it was unbilled):
    raised to the queue, the lease given back, and the call's hold counted as spent, its outcome
    unknown (``BudgetHolds.leave``): the request may have reached the provider. It used to be
    given back as unspent."""
    task = store.tasks.create(scripted([{"text": "done"}]), tenant="t")
    with pytest.raises(ConnectionResetError):
        engine(store, registry, providers=lambda s: _Unreachable()).run(task.task_id)
    meta = store.tasks.get(task.task_id)
    assert meta.status is TaskStatus.RUNNING and meta.lease_expires == 0  # the redelivery may claim at once
    budget = store.budgets.get(task.task_id)
    assert meta.inflight is None and budget.reserved == 0
    assert budget.used == budget.unknown > 0
    assert engine(store, registry).run(task.task_id).status is TaskStatus.SUCCEEDED


def test_a_done_effect_is_replayed_not_rerun_and_a_started_one_is_reported_unknown(
    store: Storage, registry: ToolRegistry, tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    ledger = tmp_path / "ledger.jsonl"
    monkeypatch.setenv("AGENTQ_TEST_LEDGER", str(ledger))
    turns = [
        {
            "text": "",
            "tool_calls": [
                call("charge_card", amount_cents=1, memo="a"),
                call("charge_card", amount_cents=2, memo="b"),
            ],
        },
        {"text": "done"},
    ]
    task = store.tasks.create(scripted(turns, tools=["charge_card"]), tenant="t")
    # A first worker commits the LLM step and records effects as a crash would leave them.
    lease, claimed = store.tasks.claim(task.task_id, "crashed", 0.1)  # type: ignore[misc]
    provider = default_provider_factory(claimed.submission)
    request = LLMRequest(model="m", messages=conversation("test goal", []), max_tokens=1000, task_id=task.task_id)
    response = provider.complete(request)
    step = LLMStep(
        content=response.content, stop_reason="tool_use", model="m", usage=response.usage, started_at=0, duration_ms=0
    )
    store.steps.commit(lease, 1, step, root_id=task.task_id)
    first, second = step.tool_uses()
    assert store.effects.begin(lease, first["id"], "charge_card") is None
    from agentq.core.models import ToolOutcome

    store.effects.finish(
        lease,
        first["id"],
        ToolOutcome(
            tool_use_id=first["id"], name="charge_card", content="charged earlier", started_at=0, duration_ms=1
        ),
    )
    assert store.effects.begin(lease, second["id"], "charge_card") is None  # started, never finished
    time.sleep(0.15)

    assert engine(store, registry).run(task.task_id).status is TaskStatus.SUCCEEDED
    results = store.steps.load(task.task_id)[1].body.results  # type: ignore[union-attr]
    assert (results[0].status, results[0].content) == ("replayed", "charged earlier")
    assert results[1].status == "unknown_outcome" and results[1].is_error
    assert not ledger.exists()  # neither charge ran in the second worker


def test_history_rebuilds_into_alternating_messages(store: Storage, registry: ToolRegistry) -> None:
    task = store.tasks.create(scripted(THREE_TURNS, tools=["lookup", "charge_card"]), tenant="t")
    engine(store, registry).run(task.task_id)
    messages = conversation("test goal", store.steps.load(task.task_id))
    assert [m["role"] for m in messages] == ["user", "assistant", "user", "assistant", "user", "assistant"]
    tool_use_ids = [b["id"] for b in messages[1]["content"] if b["type"] == "tool_use"]
    assert [b["tool_use_id"] for b in messages[2]["content"]] == tool_use_ids


def test_usage_total_counts_cache_tokens() -> None:
    assert Usage(input_tokens=1, output_tokens=2, cache_creation_input_tokens=3, cache_read_input_tokens=4).total == 10


def test_submission_defaults_are_sane() -> None:
    sub = scripted([{"text": "x"}])
    assert sub.priority == "normal" and sub.constraints.timeout_seconds == 3600


class _Dated:
    """Answers under a dated id the price table does not list (its family is priced)."""

    name = "dated"

    def complete(self, request: LLMRequest) -> LLMResponse:
        usage = Usage(input_tokens=1000, output_tokens=100)
        return LLMResponse(
            content=[{"type": "text", "text": "ok"}], stop_reason="end_turn", model="2099-unknown", usage=usage
        )


def test_a_call_answered_under_an_unpriced_model_id_is_priced_as_the_model_asked_for(
    store: Storage, registry: ToolRegistry
) -> None:
    task = store.tasks.create(scripted([{"text": "done"}]), tenant="t")  # model claude-sonnet-4-6: $3/$15
    engine(store, registry, providers=lambda s: _Dated()).run(task.task_id)
    assert store.tasks.get(task.task_id).cost_usd == Decimal("0.0045")  # 1000 x 3 + 100 x 15, per million


def test_a_call_answered_after_the_heartbeat_lost_the_lease_is_charged_once_as_an_orphan(
    store: Storage, registry: ToolRegistry
) -> None:
    """The other half of issue 12.1: the heartbeat learns first that the lease is lost (here,
    while the call is on the wire: a successor took the task), so the run never tries the
    commit; the provider answered all the same, so its usage must reach the ledger."""
    task = store.tasks.create(scripted([{"text": "done"}]), tenant="t")
    sessions: list[Any] = []
    delivered: list[int] = []

    class _Keeper:
        def __init__(self, session: Any) -> None:
            sessions.append(session)

        def __enter__(self) -> _Keeper:
            return self

        def __exit__(self, *exc: object) -> None:
            return None

    def provider(submission: Any) -> Any:
        inner = default_provider_factory(submission)

        class _LosesLeaseMidCall:
            name = inner.name

            def complete(self, request: LLMRequest) -> LLMResponse:
                sessions[0].lost.set()  # what a failed heartbeat does
                response = inner.complete(request)
                delivered.append(response.usage.total)
                return response

        return _LosesLeaseMidCall()

    result = engine(store, registry, providers=provider).run(task.task_id, keeper=_Keeper)
    assert result.outcome == "lease_lost"
    budget = store.budgets.get(task.task_id)
    orphans = store.steps.orphans(task.task_id)
    assert len(orphans) == 1 and orphans[0].call.usage.total == delivered[0]
    assert orphans[0].reason == "lease_lost"  # what the trace says of it (not "interrupted")
    assert budget.used == sum(delivered) and budget.reserved == 0
    assert store.steps.load(task.task_id) == []


def test_a_run_deferred_behind_a_lapsed_hold_after_losing_its_lease_ends_lease_lost_in_one_log_line(
    store: Storage, registry: ToolRegistry, caplog: pytest.LogCaptureFixture
) -> None:
    """Found under chaos: the budget cannot cover the next call while an older epoch's call may
    still be charged (the run defers), and meanwhile another worker took the task over. Giving
    the lease back is then refused: the run ends ``lease_lost`` (an expected race), no traceback."""
    import contextlib

    task = store.tasks.create(scripted([{"text": "never said"}], max_tokens=5_000), tenant="t")
    dead, _ = store.tasks.claim(task.task_id, "dead", 0.05)  # type: ignore[misc]
    store.budgets.reserve(dead, task.task_id, 4_990, 1, until=time.time() + 60)  # its call may complete for a minute
    wait_for_claimable = store.tasks.get  # the dead worker's lease lapses after 0.05 s
    from tests.helpers import wait_for

    wait_for(lambda: wait_for_claimable(task.task_id).lease_expires < time.time(), what="the dead lease lapses")

    real_get = store.tasks.get
    taken: list[bool] = []

    def get_then_lose_the_lease(task_id: str) -> Any:
        found = real_get(task_id)
        if not taken:  # the read that finds the live lapsed hold: a rival takes the task over now
            wait_for(lambda: store.tasks.claim(task_id, "rival", 30) is not None, what="the rival's claim")
            taken.append(True)
        return found

    store.tasks.get = get_then_lose_the_lease  # type: ignore[method-assign]
    with caplog.at_level("INFO", logger="agentq"):
        result = Engine(store, worker_id="w2", tools=registry, config=EngineConfig(lease_seconds=0.05)).run(
            task.task_id, keeper=lambda _: contextlib.nullcontext()
        )
    assert taken and result.outcome == "lease_lost", result
    assert not [r for r in caplog.records if r.exc_info], "an expected race logs no traceback"
    assert store.budgets.get(task.task_id).reserved == 4_990  # the lapsed hold stays counted until its deadline


def test_a_run_that_returned_every_lapsed_hold_at_its_claim_reports_none_left(
    store: Storage, registry: ToolRegistry
) -> None:
    """A lapsed hold returned at claim is gone: the run's ``lapsed_until`` (which schedules a
    ``release_holds`` message) does not name it."""
    import contextlib

    from tests.helpers import wait_for

    task = store.tasks.create(scripted([{"text": "done"}]), tenant="t")
    dead, _ = store.tasks.claim(task.task_id, "dead", 0.05)  # type: ignore[misc]
    store.budgets.reserve(dead, task.task_id, 300, 1, until=time.time() + 0.3)
    wait_for(lambda: store.tasks.get(task.task_id).lease_expires < time.time(), what="the dead lease lapses")
    second = Engine(store, worker_id="w2", tools=registry, config=EngineConfig(lease_seconds=0.05))
    stopping = __import__("threading").Event()
    stopping.set()  # a worker shutting down: the run sets the live hold aside and ends at once
    assert second.run(task.task_id, keeper=lambda _: contextlib.nullcontext(), stop=stopping).outcome == "continue"
    assert set(store.tasks.get(task.task_id).lapsed_holds) == {dead.epoch}
    wait_for(lambda: time.time() > (store.tasks.get(task.task_id).lapsed_holds[dead.epoch].until or 0), what="deadline")
    wait_for(lambda: store.tasks.get(task.task_id).lease_expires < time.time(), what="the second lease lapses")

    result = Engine(store, worker_id="w3", tools=registry, config=EngineConfig(lease_seconds=30)).run(task.task_id)
    assert result.status is TaskStatus.SUCCEEDED and store.tasks.get(task.task_id).lapsed_holds == {}
    assert result.lapsed_until is None
