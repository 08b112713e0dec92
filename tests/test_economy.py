"""Economy mode: each LLM turn goes through the Message Batches API (the real ``anthropic`` SDK
against a local server that implements the batch endpoints); the task parks in ``waiting``
holding no compute while the batch runs, keeps its budget hold until the result is in, and is
charged half the list price, exactly; a failed batch request ends or retries the task as a
failed call would; providers without a batch API are refused at submission."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from decimal import Decimal
from typing import Any

import pytest

from agentq.control.submit import check_submission, parse_submission, submit
from agentq.core.engine import Engine, EngineConfig, RunResult
from agentq.core.errors import ValidationError
from agentq.core.models import LLMStep, TaskStatus
from agentq.core.pricing import load_price_table, micros
from agentq.core.tools import ToolRegistry
from agentq.storage.container import Storage
from agentq_dev.stack import LocalStack

from tests.fake_messages_api import FakeMessagesAPI, RecordedRequest, invalid_request, message_reply, point_anthropic_at
from tests.helpers import wait_for

LOOKUPS = 3


def _plan(request: RecordedRequest) -> Any:
    """Look up three things, one a turn, then answer."""
    body = request.body
    turns = sum(1 for m in body["messages"] if m["role"] == "assistant")
    usage = {"input_tokens": len(json.dumps(body["messages"])) // 4, "output_tokens": 40}
    if turns < LOOKUPS:
        use = {"type": "tool_use", "id": f"toolu_e{turns}", "name": "lookup", "input": {"query": f"q{turns}"}}
        return message_reply([use], stop_reason="tool_use", usage=usage)
    return message_reply([{"type": "text", "text": "all looked up"}], usage=usage)


# The engine against the batch API needs no AWS (the local stack test below does). ``store`` and ``registry`` (tests/conftest.py) are the in-memory twin's;
# tests that race processes or use queues ask for ``settings`` and build their own.
STORAGE = "memory"


@pytest.fixture
def api(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeMessagesAPI]:
    with FakeMessagesAPI(responder=_plan, batch_seconds=0.3) as server:
        point_anthropic_at(server, monkeypatch.setenv)
        yield server


def _economy(**constraints: Any) -> dict[str, Any]:
    return {"goal": "look things up", "provider": "anthropic", "model": "claude-sonnet-4-6",
            "constraints": {"tools": ["lookup"], "economy": True, **constraints}}  # fmt: skip


def _parked(store: Storage, registry: ToolRegistry, lease_seconds: float = 30) -> tuple[str, Engine]:
    """An economy task whose first turn went out as a batch (it parks ``waiting``), and the
    engine that sent it."""
    task = store.tasks.create(parse_submission(_economy(max_cost_usd="1")), tenant="t")
    engine = Engine(store, worker_id="w1", tools=registry, config=EngineConfig(lease_seconds=lease_seconds))
    assert engine.run(task.task_id).outcome == "waiting"
    return task.task_id, engine


def _latest_batch_ended(api: FakeMessagesAPI) -> None:
    """Wait until the latest batch the server holds has ended, by the server's own rule."""
    last = max(b["created"] for b in api.batches.values())
    wait_for(lambda: time.time() >= last + api.batch_seconds, what="the latest batch's end")


def _run_to_its_end(api: FakeMessagesAPI, store: Storage, engine: Engine, task_id: str) -> RunResult:
    """Run the task as its poll messages would, each time its latest batch has ended, until it ends."""
    for _ in range(20):
        _latest_batch_ended(api)
        if store.tasks.get(task_id).status is TaskStatus.WAITING:
            store.tasks.transition(task_id, TaskStatus.QUEUED)  # what the poll message does
        result = engine.run(task_id)
        if result.outcome == "finished":
            return result
    raise AssertionError(f"task {task_id} did not end in 20 runs: {result}")


def _ended_batch_to_read(api: FakeMessagesAPI, store: Storage, registry: ToolRegistry) -> str:
    """A task whose batch has ended, queued (as its poll message queues it) for a run to read
    the answer; its workers' leases last a second, so a stopped one's lapses at once."""
    task_id, _ = _parked(store, registry, lease_seconds=1)
    _latest_batch_ended(api)
    store.tasks.transition(task_id, TaskStatus.QUEUED)  # what the poll message does
    return task_id


def test_an_economy_task_waits_for_each_batch_holding_its_budget_and_pays_half_the_price(
    api: FakeMessagesAPI, store: Storage, registry: ToolRegistry
) -> None:
    task = store.tasks.create(parse_submission(_economy(max_cost_usd="1")), tenant="t")
    parks = 0
    for worker in range(20):
        result = Engine(store, worker_id=f"w{worker}", tools=registry, config=EngineConfig(lease_seconds=30)).run(
            task.task_id
        )
        if result.outcome == "finished":
            break
        assert result.outcome == "waiting" and result.batch_poll is not None, result
        parks += 1
        waiting = store.tasks.get(task.task_id)
        assert waiting.status is TaskStatus.WAITING and waiting.lease_expires == 0  # no compute held
        assert waiting.batch is not None and waiting.batch["id"] in api.batches
        assert waiting.inflight is not None and (waiting.inflight.until or 0) > time.time() + 23 * 3600
        assert store.budgets.get(task.task_id).reserved == waiting.inflight.amount  # still counted
        time.sleep(0.35)  # the batch ends
        store.tasks.transition(task.task_id, TaskStatus.QUEUED)  # what the poll message does
    assert result.status is TaskStatus.SUCCEEDED, result
    assert parks == LOOKUPS + 1 == len(api.batches)

    calls = [s.body for s in store.steps.load(task.task_id) if isinstance(s.body, LLMStep)]
    assert len(calls) == LOOKUPS + 1 and all(c.batched for c in calls)
    prices = load_price_table()
    assert all(c.cost_usd == prices.cost("claude-sonnet-4-6", c.usage) / 2 for c in calls)
    final = store.tasks.get(task.task_id)
    assert final.batch is None and final.inflight is None and final.result == "all looked up"
    budget = store.budgets.get(task.task_id)
    assert budget.reserved == 0 and budget.used == sum(c.usage.total for c in calls)
    assert budget.reserved_micros == 0 and budget.used_micros == sum(micros(c.cost_usd) for c in calls)
    assert final.cost_usd == sum(c.cost_usd for c in calls)


def test_a_batch_request_the_api_refused_fails_the_task_with_its_error_and_returns_the_hold(
    api: FakeMessagesAPI, store: Storage, registry: ToolRegistry
) -> None:
    api.enqueue(invalid_request("messages.0.content: too long for this model"))
    task = store.tasks.create(parse_submission(_economy()), tenant="t")
    engine = Engine(store, worker_id="w", tools=registry, config=EngineConfig(lease_seconds=30))
    assert engine.run(task.task_id).outcome == "waiting"
    time.sleep(0.35)
    store.tasks.transition(task.task_id, TaskStatus.QUEUED)
    result = engine.run(task.task_id)
    assert result.status is TaskStatus.FAILED and result.error is not None
    assert result.error["code"] == "invalid_request_error" and "too long" in result.error["message"]
    budget = store.budgets.get(task.task_id)
    assert budget.reserved == 0 and budget.used == 0 and budget.reserved_micros == 0


def test_economy_needs_a_provider_with_a_batch_api(registry: ToolRegistry) -> None:
    for provider, extra in (("bedrock", {}), ("scripted", {"script": {"turns": [{"text": "x"}]}})):
        submission = parse_submission({**_economy(), "provider": provider, **extra})
        with pytest.raises(ValidationError) as refused:
            check_submission(submission, registry)
        assert refused.value.field == "constraints.economy" and "no batch API" in str(refused.value)
    assert parse_submission(_economy()).constraints.economy is True


def test_on_the_local_stack_the_poll_message_resumes_the_task_when_its_batch_ends(
    api: FakeMessagesAPI, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AGENTQ_BATCH_POLL_SECONDS", "1")
    with LocalStack(prefix="econ", workers=1, api=False, tool_modules=("tests.effect_tools",)) as stack:
        assert stack.settings is not None
        store = stack.store()
        from agentq.runtime import build_registry

        task = submit(store, build_registry(stack.settings), _economy(max_cost_usd=Decimal("1")), tenant="t",
                      queues=stack.queues())  # fmt: skip
        seen: set[str] = set()

        def ended() -> bool:
            current = store.tasks.get(task.task_id)
            seen.add(current.status.value)
            return bool(current.status.terminal)

        wait_for(ended, timeout=90, what="the economy task to end", interval=0.05)
        final = store.tasks.get(task.task_id)
        assert final.status is TaskStatus.SUCCEEDED, final.error
        assert "waiting" in seen  # it parked while its batches ran
        calls = [s.body for s in store.steps.load(task.task_id) if isinstance(s.body, LLMStep)]
        assert len(calls) == LOOKUPS + 1 and all(c.batched for c in calls)
        assert final.claim_count == LOOKUPS + 2  # submitted once, resumed once per batch


def test_a_batch_looked_at_twice_before_it_ends_keeps_one_hold_and_no_wait(
    store: Storage, registry: ToolRegistry
) -> None:
    """Each poll is a claim of its own: the hold of the batch's turn passes from claim to claim
    (adopted), never set aside as a lost worker's (which would count it twice for the batch's
    24 hours and could make the task wait that long)."""
    from agentq.core.models import Script
    from agentq.core.providers import LLMRequest, LLMResponse
    from agentq.core.providers.scripted import ScriptedProvider

    turns = [{"text": "all looked up"}]
    ended: list[bool] = []
    sent: dict[str, LLMRequest] = {}

    class Batches:
        name = "anthropic"
        inner = ScriptedProvider(Script.model_validate({"turns": turns}))

        def complete(self, request: LLMRequest) -> LLMResponse:
            raise AssertionError("an economy task's calls go through batches")

        def submit_batch(self, request: LLMRequest, custom_id: str) -> str:
            sent["b1"] = request
            return "b1"

        def batch_result(self, batch_id: str, custom_id: str) -> LLMResponse | None:
            return self.inner.complete(sent[batch_id]) if ended else None

    task = store.tasks.create(parse_submission(_economy()), tenant="t")
    held = []
    for worker in ("w1", "w2", "w3"):  # sent, then looked at twice before it ends
        run = Engine(store, worker_id=worker, tools=registry, providers=lambda _: Batches()).run(task.task_id)
        assert run.outcome == "waiting", run
        held.append(store.budgets.get(task.task_id).reserved)
        store.tasks.transition(task.task_id, TaskStatus.QUEUED)  # what the poll message does
    assert held[0] > 0 and held == [held[0]] * 3  # one hold, whichever claim looked
    assert store.tasks.get(task.task_id).lapsed_holds == {}
    ended.append(True)
    done = Engine(store, worker_id="w4", tools=registry, providers=lambda _: Batches()).run(task.task_id)
    assert done.status is TaskStatus.SUCCEEDED, done
    assert store.budgets.get(task.task_id).reserved == 0


def test_a_batch_wait_whose_look_was_lost_is_found_by_the_sweeper_and_its_answer_is_read_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``agentq run-task`` sends the turn as a batch and parks the task as a worker does, but
    queues no look: the look a worker that died between its park and its send would have lost.
    Nothing would ever wake the task. The sweeper sends one once it is overdue, a worker takes
    it, reads the batch's answer and the task succeeds; one batch was sent, not two."""
    from agentq.queueing.sweeper import sweep
    from agentq.runtime import build_registry

    from tests.helpers import run_agentq

    with FakeMessagesAPI(
        responder=lambda _: message_reply([{"type": "text", "text": "done"}]), batch_seconds=0.1
    ) as api:
        point_anthropic_at(api, monkeypatch.setenv)
        # The park's look is due in 1 s, so the sweeper's look (sent here at once, the sweep's
        # clock moved past the due) arrives when it is due, not as a stray.
        monkeypatch.setenv("AGENTQ_BATCH_POLL_SECONDS", "1")
        with LocalStack(prefix="econlost", workers=0, api=False) as stack:
            assert stack.settings is not None
            store = stack.store()
            body = {"goal": "answer", "provider": "anthropic", "model": "claude-sonnet-4-6",
                    "constraints": {"economy": True, "max_cost_usd": "1"}}  # fmt: skip
            task = submit(store, build_registry(stack.settings), body, tenant="t")  # no message: run-task runs it
            parked = run_agentq(["run-task", task.task_id, "--lease", "2"], env=stack.env(), timeout=120)
            assert json.loads(parked.stdout.splitlines()[-1])["status"] == "waiting", parked.stderr[-2000:]
            waiting = store.tasks.get(task.task_id)
            assert waiting.status is TaskStatus.WAITING and waiting.batch is not None and waiting.look_due is not None
            assert task.task_id not in sweep(store, stack.queues(), stale_after=60, now=waiting.look_due + 59).looked
            assert task.task_id in sweep(store, stack.queues(), stale_after=60, now=waiting.look_due + 61).looked
            stack.spawn_worker()
            wait_for(lambda: store.tasks.get(task.task_id).status.terminal, timeout=90, what="the swept task to end")
            final = store.tasks.get(task.task_id)
            assert final.status is TaskStatus.SUCCEEDED, final.error
            assert final.result == "done" and len(api.batches) == 1
            calls = [s.body for s in store.steps.load(task.task_id) if isinstance(s.body, LLMStep)]
            assert len(calls) == 1 and calls[0].batched


def test_a_message_sent_while_a_batch_runs_waits_for_the_batchs_answer_which_is_charged(
    api: FakeMessagesAPI, store: Storage, registry: ToolRegistry
) -> None:
    """A person's message to a task parked on its batch is delivered after the batch's answer is
    read, never before: a message delivered first moved the conversation past the batch's step,
    so its answer, which the provider billed, was never read or charged, and a second batch was
    sent for the same turn."""
    from agentq.control.conversations import send_message

    from tests.test_conversations import Queues

    task_id, engine = _parked(store, registry)
    send_message(store, Queues(), task_id, "and one more thing", tenant="t")
    result = _run_to_its_end(api, store, engine, task_id)
    assert result.status is TaskStatus.SUCCEEDED, result
    steps = [s.body for s in store.steps.load(task_id)]
    calls = [s for s in steps if isinstance(s, LLMStep)]
    assert len(api.batches) == len(calls)  # every batch sent was read: none abandoned
    assert [s.kind for s in steps[:2]] == ["llm", "tools"]  # the batch's answer first, then its tools
    assert [s.kind for s in steps].count("message") == 1  # and then the message
    budget = store.budgets.get(task_id)
    assert budget.reserved == 0 and budget.used == sum(c.usage.total for c in calls)


def test_a_batch_that_cannot_be_read_for_a_while_is_looked_at_again_never_sent_anew(
    api: FakeMessagesAPI, store: Storage, registry: ToolRegistry, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The batch ended (and was billed) but the API fails every read of it for a while, past
    the worker's retries: the task parks on the same batch, its hold kept, and reads its answer
    once the API is back. It used to give the hold back and forget the batch, so the turn went
    out as a second batch and the first, billed, was never charged."""
    monkeypatch.setenv("AGENTQ_PROVIDER_RETRY", '{"max_attempts": 2, "base_delay": 0, "max_delay": 0}')
    task_id, engine = _parked(store, registry)
    [first] = api.batches.values()
    _latest_batch_ended(api)
    api.batch_read_failures = 2  # every attempt of the next look
    store.tasks.transition(task_id, TaskStatus.QUEUED)  # what the poll message does
    looked = engine.run(task_id)
    assert looked.outcome == "waiting", looked  # parked on it again
    again = store.tasks.get(task_id)
    assert again.batch is not None and again.batch["id"] == first["id"] and again.inflight is not None
    assert store.budgets.get(task_id).reserved == again.inflight.amount  # still counted
    result = _run_to_its_end(api, store, engine, task_id)
    assert result.status is TaskStatus.SUCCEEDED, result
    calls = [s.body for s in store.steps.load(task_id) if isinstance(s.body, LLMStep)]
    assert len(api.batches) == len(calls) == LOOKUPS + 1  # every batch read once, none sent anew
    budget = store.budgets.get(task_id)
    assert budget.reserved == 0 and budget.used == sum(c.usage.total for c in calls)


def test_a_run_killed_after_reading_its_batchs_answer_leaves_the_next_run_to_adopt_it_again(
    api: FakeMessagesAPI, store: Storage, registry: ToolRegistry, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The run that adopted the batch's hold read its answer and died before its commit. The
    next claim adopts the hold again (the batch's record names the epoch that holds it now),
    reads the answer and commits it under that hold: the batch is charged once and nothing is
    left held. The adoption used to move only the hold, so the next claim took it for a lost
    worker's: it set it aside for the batch's 24-hour window and held anew for the same answer."""
    from tests.stopped_worker import resume, stopped_at

    task_id = _ended_batch_to_read(api, store, registry)
    killed = Engine(store, worker_id="killed", tools=registry, config=EngineConfig(lease_seconds=1))
    with stopped_at(killed, task_id, "after_llm_call:1", monkeypatch):
        successor = Engine(store, worker_id="successor", tools=registry, config=EngineConfig(lease_seconds=1))
        result = resume(successor, task_id, wait_seconds=30)
        assert result.outcome == "waiting", result  # its answer committed, the next turn's batch sent
        steps = [s.body for s in store.steps.load(task_id) if isinstance(s.body, LLMStep)]
        assert len(steps) == 1 and steps[0].batched
        after = store.tasks.get(task_id)
        assert after.lapsed_holds == {}  # nothing set aside for the answer it read
        budget = store.budgets.get(task_id)
        assert budget.reserved == after.inflight.amount if after.inflight else budget.reserved == 0
        assert budget.used == steps[0].usage.total and budget.unknown == 0


def test_a_run_paused_after_reading_its_batchs_answer_leaves_it_to_the_next_claim_charged_once(
    api: FakeMessagesAPI, store: Storage, registry: ToolRegistry, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As above, but the run is paused (SIGSTOP), not killed: the next claim adopts the batch's
    hold, reads its answer and commits it; then the paused run wakes, finds its lease lost, and
    leaves the answer to that claim. It used to settle it as an orphan too: charged twice."""
    from tests.stopped_worker import resume, stopped_at

    task_id = _ended_batch_to_read(api, store, registry)
    paused = Engine(store, worker_id="paused", tools=registry, config=EngineConfig(lease_seconds=1))
    with stopped_at(paused, task_id, "after_llm_call:1", monkeypatch, wakes=True) as zombie:
        successor = Engine(store, worker_id="successor", tools=registry, config=EngineConfig(lease_seconds=1))
        assert resume(successor, task_id, wait_seconds=30).outcome == "waiting"  # the next turn's batch
    assert zombie.result == [] or zombie.result[0].outcome != "finished"
    steps = [s.body for s in store.steps.load(task_id) if isinstance(s.body, LLMStep)]
    assert len(steps) == 1 and steps[0].batched and store.steps.orphans(task_id) == []
    budget = store.budgets.get(task_id)
    assert budget.used == steps[0].usage.total and budget.unknown == 0  # charged once


@pytest.mark.parametrize("attempts", [2, 1], ids=["retried at once", "retried by the next run"])
def test_a_batch_whose_creation_reply_was_cut_keeps_its_hold_counted_as_unknown_and_the_resend_holds_anew(
    api: FakeMessagesAPI, store: Storage, registry: ToolRegistry, monkeypatch: pytest.MonkeyPatch, attempts: int
) -> None:
    """The API made the batch, and its reply was cut after the headers: the batch runs and is
    billed, and the client cannot know it exists (creating one is not idempotent). So that
    attempt's hold stays counted as unknown, and the turn goes out again as a second batch
    under a hold of its own: at once (a retry of the call), or by the task's next run when the
    call has no attempt left. It used to give the first hold back, so the cap could be passed
    by what the provider billed for the first batch."""
    monkeypatch.setenv("AGENTQ_PROVIDER_RETRY", json.dumps({"max_attempts": attempts, "base_delay": 0, "max_delay": 0}))
    api.batch_create_cuts = 1
    task = store.tasks.create(parse_submission(_economy(max_cost_usd="1")), tenant="t")
    engine = Engine(store, worker_id="w", tools=registry, config=EngineConfig(lease_seconds=30))
    first = engine.run(task.task_id)
    budget = store.budgets.get(task.task_id)
    assert budget.unknown > 0 and budget.used == budget.unknown and budget.known == 0, budget
    assert budget.unknown_micros > 0 and budget.used_micros == budget.unknown_micros, budget
    held = store.tasks.get(task.task_id).inflight
    if attempts == 2:
        assert first.outcome == "waiting" and len(api.batches) == 2, first  # the retry's batch
        assert held is not None and budget.reserved == held.amount
    else:
        assert first.outcome == "retry" and held is None and budget.reserved == 0, first
        store.tasks.transition(task.task_id, TaskStatus.QUEUED)  # what the redelivery does
        assert engine.run(task.task_id).outcome == "waiting"
    unknown = budget.unknown
    result = _run_to_its_end(api, store, engine, task.task_id)
    assert result.status is TaskStatus.SUCCEEDED, result
    calls = [s.body for s in store.steps.load(task.task_id) if isinstance(s.body, LLMStep)]
    assert len(api.batches) == len(calls) + 1  # the cut one was never read: it is the unknown
    final = store.budgets.get(task.task_id)
    assert final.known == sum(c.usage.total for c in calls) and final.unknown == unknown and final.reserved == 0
    assert final.used == final.known + final.unknown


def test_a_lease_lost_between_attempts_of_a_batchs_creation_gives_back_the_holds_of_a_batch_never_made(
    api: FakeMessagesAPI, store: Storage, registry: ToolRegistry, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The creation is answered 529 (nothing made, nothing billed), and the run learns, as it
    records the retry, that its lease is gone: no batch exists, so the budget's hold and the
    tenant hour's go back now, as a model call's do. They used to stay: the budget's set aside
    by the next claim for the batch's 24 hours, the hour's held until it rolled over."""
    from agentq.core.errors import LeaseLost
    from agentq.core.tenancy import TenantLimits
    from agentq.storage.tenant_windows import TenantWindows

    monkeypatch.setenv("AGENTQ_PROVIDER_RETRY", '{"max_attempts": 2, "base_delay": 0, "max_delay": 0}')
    windows = TenantWindows(store.table)
    windows.set_limits("t", TenantLimits(hourly_tokens=1_000_000))
    api.batch_create_overloads = 1

    def lost(*_: Any, **__: Any) -> None:
        raise LeaseLost("a successor claimed the task")

    monkeypatch.setattr(store.tasks, "record_retry", lost)
    task = store.tasks.create(parse_submission(_economy(max_cost_usd="1")), tenant="t")
    engine = Engine(store, worker_id="w", tools=registry, config=EngineConfig(lease_seconds=30))
    result = engine.run(task.task_id)
    assert result.outcome == "lease_lost" and api.batches == {}, result
    budget = store.budgets.get(task.task_id)
    assert (budget.reserved, budget.used, budget.unknown) == (0, 0, 0), budget
    after = store.tasks.get(task.task_id)
    assert after.inflight is None and after.lapsed_holds == {}
    assert windows.usage("t") == {"held": 0, "used": 0}


def test_a_lease_lost_as_a_look_parks_the_task_again_keeps_the_hold_of_its_batch(
    api: FakeMessagesAPI, store: Storage, registry: ToolRegistry, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A look finds the batch still running and parks the task again, and learns there that its
    lease is gone: the batch exists and will be billed, so its hold stays counted (the next
    claim adopts it). It used to be given back, as if no batch had been made."""
    from agentq.core.errors import LeaseLost

    api.batch_seconds = 600  # still running at the look
    task_id, engine = _parked(store, registry)
    held = store.tasks.get(task_id).inflight
    assert held is not None
    store.tasks.transition(task_id, TaskStatus.QUEUED)  # what the poll message does
    moved = store.tasks.transition

    def lost_at_the_park(task_id: str, to: TaskStatus, **kwargs: Any) -> str:
        if to is TaskStatus.WAITING:
            raise LeaseLost("a successor claimed the task")
        return moved(task_id, to, **kwargs)

    monkeypatch.setattr(store.tasks, "transition", lost_at_the_park)
    assert engine.run(task_id).outcome == "lease_lost"
    budget = store.budgets.get(task_id)
    assert (budget.reserved, budget.used) == (held.amount, 0), budget  # still counted, for the batch


def test_a_batch_that_can_no_longer_be_read_keeps_its_hold_counted_as_unknown(
    api: FakeMessagesAPI, store: Storage, registry: ToolRegistry
) -> None:
    """The API no longer knows the batch (404): whether it ran, and was billed, is unknown, so
    its hold is counted as spent, unknown, not given back as an errored request's is."""
    task_id, engine = _parked(store, registry)
    held = store.tasks.get(task_id).inflight
    assert held is not None
    _latest_batch_ended(api)
    api.batches.clear()  # gone from the API
    store.tasks.transition(task_id, TaskStatus.QUEUED)  # what the poll message does
    result = engine.run(task_id)
    assert result.status is TaskStatus.FAILED and result.error is not None, result
    assert result.error["code"] == "batch_not_found" and "could not be read" in result.error["message"], result.error
    budget = store.budgets.get(task_id)
    assert (budget.reserved, budget.used, budget.unknown) == (0, held.amount, held.amount), budget
