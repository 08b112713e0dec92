"""A store that fails a write (throttled past botocore's retries, down, or applied with its answer
lost): what the model billed stays on the ledger, and a write whose answer was lost is applied
once. The faults are DynamoDB's own answers on the wire (``tests/dynamodb_faults.py``), in a
real worker process or in the test's own, against moto server."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest

from agentq.core.models import LLMStep, Task, TaskStatus, TaskSubmission
from agentq.runtime import Settings
from agentq.storage.container import Storage
from agentq.worker import run_task

from tests import dynamodb_faults
from tests.conftest import child_env
from tests.fake_messages_api import (
    FakeMessagesAPI,
    anthropic_env,
    message_reply,
    point_anthropic_at,
    text_reply,
    usage_dict,
)
from tests.helpers import run_agentq, scripted, wait_for

ANSWER = {"input_tokens": 20, "output_tokens": 100}


@pytest.fixture
def faults(monkeypatch: pytest.MonkeyPatch) -> Callable[..., None]:
    """``dynamodb_faults.install`` in the test's own process (botocore's retries each after
    10 ms), undone after the test."""
    from botocore.endpoint import Endpoint
    from botocore.retries.standard import ExponentialBackoff

    monkeypatch.setattr(Endpoint, "_send", vars(Endpoint)["_send"])
    monkeypatch.setattr(ExponentialBackoff, "delay_amount", lambda self, context: 0.01)
    dynamodb_faults.faulted.clear()
    return dynamodb_faults.install


def _answered_twice(
    settings: Settings, store: Storage, fake: FakeMessagesAPI, fault: str, **extra: str
) -> tuple[Task, dict[str, str]]:
    """A task whose model answers twice (``ANSWER``'s usage each time), and the environment of a
    worker that meets ``fault`` in DynamoDB (``tests.dynamodb_faults``), plus ``extra``."""
    fake.enqueue(
        text_reply("first answer", usage=usage_dict(**ANSWER)),
        text_reply("second answer", usage=usage_dict(**ANSWER)),
    )
    sub = TaskSubmission.model_validate(
        {"goal": "answer", "provider": "anthropic", "constraints": {"max_tokens": 5000, "max_output_tokens": 500}}
    )
    task = store.tasks.create(sub, tenant="t")
    env = child_env(
        settings,
        **anthropic_env(fake),
        AGENTQ_TOOL_MODULES="tests.effect_tools,tests.dynamodb_faults",
        AGENTQ_TEST_DYNAMODB_FAULT=fault,
        **extra,
    )
    return task, env


@pytest.mark.parametrize(
    ("fault", "extra"),
    [
        ("UpdateItem|llm_steps|1|6", {}),  # the first LLM step's commit point
        # The flow control's give-back of what the call took and did not use of the provider's
        # output tokens a minute (its second write of that bucket, after the take).
        ("UpdateItem|BUCKET#otpm|2|6", {"AGENTQ_RATE_LIMITS": '{"anthropic/claude-sonnet-4-6": {"otpm": 100000}}'}),
    ],
    ids=["step_commit", "flow_control"],
)
def test_a_call_answered_before_a_throttled_step_commit_is_charged_to_the_budget(
    settings: Settings, store: Storage, monkeypatch: pytest.MonkeyPatch, fault: str, extra: dict[str, str]
) -> None:
    """The model answers; a write after it (the step commit's META write, or the flow control's)
    is throttled past botocore's retries (ProvisionedThroughputExceeded x6), and the worker's run
    ends on that error. The provider billed the call, so the ledger charges it: the run, which
    holds the answer, settles it as an orphan (``Answers.commit_failed``), never gives its hold
    back as unspent. The run after the outage calls again: the budget charges both, each known."""
    with FakeMessagesAPI(within_max_tokens=True) as fake:
        task, env = _answered_twice(settings, store, fake, fault, **extra)
        worker = run_agentq(["run-task", task.task_id, "--lease", "2"], env=env, timeout=120)
        assert "ProvisionedThroughputExceeded" in worker.stderr, worker.stderr[-3000:]
        assert len(fake.delivered_usage) == 1  # the model answered (and billed) the throttled run's call
        assert store.tasks.get(task.task_id).step == 0  # nothing committed
        billed = sum(u["input_tokens"] + u["output_tokens"] for u in fake.delivered_usage)
        after_throttle = store.budgets.get(task.task_id)
        assert (after_throttle.used, after_throttle.reserved, after_throttle.unknown) == (billed, 0, 0)
        assert [o.reason for o in store.steps.orphans(task.task_id)] == ["commit_failed"]

        point_anthropic_at(fake, monkeypatch.setenv)
        resumed = run_task(task.task_id, settings=settings, lease_seconds=2, wait_seconds=60)
        assert resumed.status is TaskStatus.SUCCEEDED, resumed
        delivered = sum(u["input_tokens"] + u["output_tokens"] for u in fake.delivered_usage)

    budget = store.budgets.get(task.task_id)
    committed = sum(s.body.usage.total for s in store.steps.load(task.task_id) if isinstance(s.body, LLMStep))
    assert len(fake.delivered_usage) == 2
    assert committed == delivered - billed  # the second call's step; the first is the orphan
    assert (budget.used, budget.reserved, budget.unknown) == (delivered, 0, 0)


def test_a_call_answered_before_an_outage_of_the_store_stays_held_until_the_next_claim_counts_it(
    settings: Settings, store: Storage, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The store goes down at the step commit, after the model answered, and stays down for the
    rest of the worker's run: neither the commit nor the charge of the answer as an orphan nor
    the lease's release can be written. The call's hold stays on the task, counted, never given
    back as unspent; the next claim, after the hold's deadline, counts it as spent (its outcome
    unknown to the ledger): the budget charges at least what the provider billed."""
    with FakeMessagesAPI(within_max_tokens=True) as fake:
        task, env = _answered_twice(
            settings, store, fake, "UpdateItem|llm_steps|1|1|down",
            AGENTQ_MAX_CALL_SECONDS="3",  # the hold's deadline: 2 s to start, 3 s of call
        )  # fmt: skip
        worker = run_agentq(["run-task", task.task_id, "--lease", "2"], env=env, timeout=180)
        assert "ProvisionedThroughputExceeded" in worker.stderr, worker.stderr[-3000:]
        assert len(fake.delivered_usage) == 1
        billed = sum(u["input_tokens"] + u["output_tokens"] for u in fake.delivered_usage)
        left = store.tasks.get(task.task_id)
        assert left.step == 0 and left.inflight is not None  # the hold, as the call left it
        after_outage = store.budgets.get(task.task_id)
        assert (after_outage.used, after_outage.reserved) == (0, left.inflight.amount)
        assert left.inflight.amount >= billed

        until = left.inflight.until
        assert until is not None
        wait_for(lambda: time.time() > until + 0.5, timeout=30, what="the hold's deadline")
        point_anthropic_at(fake, monkeypatch.setenv)
        resumed = run_task(task.task_id, settings=settings, lease_seconds=2, wait_seconds=60)
        assert resumed.status is TaskStatus.SUCCEEDED, resumed
        delivered = sum(u["input_tokens"] + u["output_tokens"] for u in fake.delivered_usage)

    budget = store.budgets.get(task.task_id)
    assert budget.unknown == left.inflight.amount  # counted as spent, at its size
    assert budget.used == budget.unknown + delivered - billed >= delivered
    assert budget.reserved == 0


def test_a_batch_read_before_a_throttled_step_commit_keeps_its_hold_for_the_next_claim(
    settings: Settings, store: Storage, monkeypatch: pytest.MonkeyPatch, faults: Callable[..., None]
) -> None:
    """An economy task's batch ended; the run that reads its answer meets a throttled step
    commit, and ends on that error. The batch's answer is the next claim's to read and charge
    (it adopts the hold), so this run leaves the hold as it is (``BudgetHolds.leave``): the
    batch the provider billed stays counted meanwhile, and is charged once. It used to give the
    hold back as unspent (``Engine._give_back``): until the next read the budget counted nothing
    of a billed batch, free for another call of the tree to take."""
    from botocore.exceptions import ClientError

    from agentq.core.engine import Engine, EngineConfig
    from agentq.runtime import build_registry

    def answer(request: Any) -> Any:
        return message_reply([{"type": "text", "text": "done"}], usage=usage_dict(**ANSWER))

    with FakeMessagesAPI(responder=answer, batch_seconds=0.3) as api:
        point_anthropic_at(api, monkeypatch.setenv)
        sub = TaskSubmission.model_validate({
            "goal": "answer", "provider": "anthropic", "model": "claude-sonnet-4-6",
            "constraints": {"economy": True, "max_output_tokens": 500},
        })  # fmt: skip
        task_id = store.tasks.create(sub, tenant="t").task_id
        engine = Engine(store, worker_id="w", tools=build_registry(settings), config=EngineConfig(lease_seconds=30))
        assert engine.run(task_id).outcome == "waiting"
        held = store.tasks.get(task_id).inflight
        assert held is not None
        last = max(b["created"] for b in api.batches.values())
        wait_for(lambda: time.time() >= last + api.batch_seconds, what="the batch's end")

        store.tasks.transition(task_id, TaskStatus.QUEUED)  # what the batch's poll message does
        faults("UpdateItem", "llm_steps", 1, 6)
        with pytest.raises(ClientError, match="ProvisionedThroughputExceeded"):
            engine.run(task_id)
        billed = sum(u["input_tokens"] + u["output_tokens"] for u in api.delivered_usage)
        between = store.budgets.get(task_id)
        assert billed > 0 and (between.used, between.reserved) == (0, held.amount) and held.amount >= billed

        assert engine.run(task_id).status is TaskStatus.SUCCEEDED  # the outage over: read again, committed
        budget = store.budgets.get(task_id)
        assert (budget.used, budget.unknown, budget.reserved) == (billed, 0, 0), budget
        assert len(api.batches) == 1


def test_a_message_whose_accepting_write_answer_is_lost_is_accepted_once(
    settings: Settings, store: Storage, faults: Callable[..., None]
) -> None:
    """``POST /tasks/{id}/messages`` without an Idempotency-Key: the accept's TransactWriteItems is
    applied by DynamoDB, but its answer is lost (a 500: botocore sends it again, as after a
    connection reset or a read timeout after the write). The person sent one message, so the
    task holds one, delivered once: the retry carries the first attempt's ClientRequestToken,
    and DynamoDB answers it as the write it already applied (``Messages.accept``)."""
    from agentq.core.engine import Engine, EngineConfig
    from agentq.core.models import MessageStep
    from agentq.runtime import build_registry

    task = store.tasks.create(scripted([{"text": "first"}, {"text": "second"}]), tenant="t")
    faults("TransactWriteItems", "MSG#000001", 1, 1, mode="lost")
    store.messages.accept(task.task_id, "also check the invoices")  # one message, sent once
    assert dynamodb_faults.faulted == ["TransactWriteItems"]

    texts = [m.text for m in store.messages.listed(task.task_id)]
    engine = Engine(store, worker_id="w", tools=build_registry(settings), config=EngineConfig(lease_seconds=5))
    engine.run(task.task_id)
    delivered = [
        m.text for s in store.steps.load(task.task_id) if isinstance(s.body, MessageStep) for m in s.body.messages
    ]
    assert texts == ["also check the invoices"]
    assert delivered == ["also check the invoices"]


def _events(store: Storage, task_id: str) -> list[str]:
    """The task's event log, as the types of its events."""
    head = store.events.head(task_id)
    assert head is not None
    return [e.type for e in store.events.read(task_id, head, None)]


def test_a_budget_raise_whose_answer_is_lost_raises_the_budget_once(
    store: Storage, faults: Callable[..., None]
) -> None:
    """``POST /tasks/{id}/budget``: the raise's transaction is applied, its answer lost, and
    botocore sends it again. The person raised once, so the cap moves once and the log holds one
    ``budget.raised``. It used to be raised twice: the retry was refused (``seq`` had moved, by
    the raise itself), and ``logged_transact`` took that for another write and raised again."""
    task_id = store.tasks.create(scripted([{"text": "x"}], max_tokens=10_000), tenant="t").task_id
    before = store.budgets.get(task_id)
    faults("TransactWriteItems", "budget.raised", 1, 1, mode="lost")
    raised = store.budgets.raise_cap(task_id, 5_000)
    assert dynamodb_faults.faulted == ["TransactWriteItems"]
    assert raised.cap == store.budgets.get(task_id).cap == before.cap + 5_000
    assert _events(store, task_id).count("budget.raised") == 1


def test_an_approval_decided_whose_answer_is_lost_is_decided_without_an_error(
    store: Storage, faults: Callable[..., None]
) -> None:
    """A person approves a paused task's tool call; the decision's transaction is applied, its
    answer lost, and botocore sends it again. The decision stands and the person hears it went
    through. It used to be refused on the retry (the approval no longer pending, decided by the
    first attempt): ``IllegalTransition``, "no pending approval to decide", for a decision stored."""
    task_id = store.tasks.create(scripted([{"text": "x"}]), tenant="t").task_id
    claimed = store.tasks.claim(task_id, "w", 30)
    assert claimed is not None
    store.approvals.request(claimed[0], "toolu_1", "may I?")
    faults("TransactWriteItems", "approval.decided", 1, 1, mode="lost")
    store.approvals.decide(task_id, "toolu_1", approved=True, note="go", by="t")
    assert dynamodb_faults.faulted == ["TransactWriteItems"]
    decided = store.approvals.get(task_id, "toolu_1")
    assert decided is not None and decided.state == "approved"
    assert store.tasks.get(task_id).status is TaskStatus.QUEUED
    assert _events(store, task_id).count("approval.decided") == 1


def test_a_dead_letter_failure_whose_answer_is_lost_is_written_once_and_not_refused(
    store: Storage, faults: Callable[..., None]
) -> None:
    """The dispatcher ends a task out of retries ``failed``, naming its dead letter
    (``retry_or_dead_letter``); the transition's transaction is applied, its answer lost, and
    botocore sends it again. The failure is this dispatcher's: the transition returns, and the
    message goes to the DLQ. It used to be refused on the retry (``failed`` cannot move to
    ``failed``), which the dispatcher takes for another delivery's failure: the message was
    deleted, and the task's dead letter never reached the DLQ to be redriven."""
    task_id = store.tasks.create(scripted([{"text": "x"}]), tenant="t").task_id
    faults("TransactWriteItems", "dead_letter", 1, 1, mode="lost")
    store.tasks.transition(
        task_id, TaskStatus.FAILED, error={"code": "provider_error", "dead_lettered": True}, extra={"dead_letter": "f1"}
    )
    assert dynamodb_faults.faulted == ["TransactWriteItems"]
    assert store.tasks.get(task_id).status is TaskStatus.FAILED
    assert _events(store, task_id).count("task.status") == 1  # the failure: no claim, so no other
