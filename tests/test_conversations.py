"""Talking to a task: follow-ups, messages while it runs, interrupts (storage.messages, engine._messages).

The engine's side runs on the in-memory twin; tests/test_conversations_race.py races real processes.
"""

from __future__ import annotations

import functools
import json
import threading
from collections.abc import Callable
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from agentq.control.conversations import close, interrupt, send_message
from agentq.core.engine import Engine, EngineConfig
from agentq.core.engine.conversation import conversation
from agentq.core.errors import IdempotencyConflict, IllegalTransition, MessageRefused, ValidationError
from agentq.core.models import LLMStep, MessageStep, TaskStatus, TaskSubmission, ToolsStep
from agentq.core.providers import LLMRequest, LLMResponse, default_provider_factory
from agentq.core.tools import ToolRegistry
from agentq.storage.container import Storage
from agentq.storage.messages import MAX_MESSAGES_PER_TASK

from tests.helpers import call, scripted

STORAGE = "memory"


class _Queues:
    """Stands in for TaskQueues: what was enqueued (a follow-up's run)."""

    def __init__(self) -> None:
        self.sent: list[str] = []
        self.webhooks: list[dict[str, Any]] = []

    def send(self, task_id: str, priority: Any, **_: Any) -> None:
        self.sent.append(task_id)

    def send_webhook(self, body: str) -> None:
        self.webhooks.append(json.loads(body)["payload"])

    def forwards(self, submission: Any) -> bool:
        return False  # one pool here: nothing leaves for a workspace pool


def Queues() -> Any:
    return _Queues()


class Recording:
    """The scripted provider, keeping each request; ``during`` runs inside the n-th call (a
    person acting while the model is answering)."""

    name = "scripted"

    def __init__(self, submission: TaskSubmission, during: dict[int, Callable[[], object]] | None = None) -> None:
        self.inner = default_provider_factory(submission)
        self.requests: list[LLMRequest] = []
        self.during = during or {}

    def complete(self, request: LLMRequest) -> LLMResponse:
        self.requests.append(request)
        action = self.during.pop(len(self.requests), None)
        if action is not None:
            action()
        return self.inner.complete(request)


def engine(store: Storage, registry: ToolRegistry, provider: Recording | None = None) -> Engine:
    kwargs: dict[str, Any] = {"providers": (lambda s: provider)} if provider else {}
    return Engine(store, worker_id="w1", tools=registry, config=EngineConfig(lease_seconds=5), **kwargs)


def kinds(store: Storage, task_id: str) -> list[str]:
    return [s.body.kind for s in store.steps.load(task_id)]


def texts_sent(request: LLMRequest) -> list[str]:
    """Every text block of the request's user turns, in order."""
    out: list[str] = []
    for m in request.messages:
        if m["role"] != "user":
            continue
        content = m["content"]
        out += [content] if isinstance(content, str) else [b["text"] for b in content if b.get("type") == "text"]
    return out


def test_a_follow_up_continues_the_answered_conversation_with_its_steps_and_budget(
    store: Storage, registry: ToolRegistry
) -> None:
    sub = scripted([{"text": "A is big"}, {"text": "C is small"}])
    task = store.tasks.create(sub, tenant="t")
    assert engine(store, registry).run(task.task_id).status is TaskStatus.SUCCEEDED
    used_first = store.budgets.get(task.task_id).used
    queues = Queues()

    sent = send_message(store, queues, task.task_id, "also cover competitor C", tenant="t")

    assert (sent.status, sent.reopened, sent.message.seq) == (TaskStatus.QUEUED, True, 1)
    assert queues.sent == [task.task_id]  # the follow-up's run is on its way
    reopened = store.tasks.get(task.task_id)
    assert reopened.status is TaskStatus.QUEUED and reopened.expires_at is None and reopened.finished_at is None
    provider = Recording(sub)
    assert engine(store, registry, provider).run(task.task_id).status is TaskStatus.SUCCEEDED
    assert kinds(store, task.task_id) == ["llm", "message", "llm"]
    (request,) = provider.requests
    assert texts_sent(request) == [sub.goal, "also cover competitor C"]  # the whole conversation, then the message
    assert request.messages[1] == {"role": "assistant", "content": [{"type": "text", "text": "A is big"}]}
    done = store.tasks.get(task.task_id)
    assert done.result == "C is small" and done.messages_delivered == 1
    budget = store.budgets.get(task.task_id)
    assert budget.used > used_first and budget.reserved == 0  # the same budget, charged for both exchanges


def test_a_message_that_arrives_while_the_last_answer_is_in_flight_is_heard_not_stranded(
    store: Storage, registry: ToolRegistry
) -> None:
    sub = scripted([{"text": "first answer"}, {"text": "answer to the message"}])
    task = store.tasks.create(sub, tenant="t")
    queues = Queues()
    provider = Recording(
        sub, during={1: lambda: send_message(store, queues, task.task_id, "wait, one more", tenant="t")}
    )

    result = engine(store, registry, provider).run(task.task_id)

    assert result.status is TaskStatus.SUCCEEDED and queues.sent == []  # held for the running task, no requeue
    assert kinds(store, task.task_id) == ["llm", "message", "llm"]
    assert texts_sent(provider.requests[1])[-1] == "wait, one more"
    assert store.tasks.get(task.task_id).result == "answer to the message"


class NoAnswerFirst(Recording):
    """``Recording`` whose first turn comes back with ``stop_reason``: a turn that is no answer
    (refused, cut off, malformed), as a provider's stop reason is translated to."""

    def __init__(self, submission: TaskSubmission, stop_reason: str, during: Callable[[], object]) -> None:
        super().__init__(submission, during={1: during})
        self.stop_reason = stop_reason

    def complete(self, request: LLMRequest) -> LLMResponse:
        answer = super().complete(request)
        if len(self.requests) == 1:
            return answer.model_copy(update={"stop_reason": self.stop_reason})
        return answer


NO_ANSWERS = ["refusal", "model_context_window_exceeded", "malformed_output", "max_tokens"]


@pytest.mark.parametrize("stop_reason", NO_ANSWERS)
def test_a_message_that_arrives_while_a_turn_that_is_no_answer_is_in_flight_is_delivered_and_answered(
    stop_reason: str, store: Storage, registry: ToolRegistry
) -> None:
    """ARCHITECTURE 11: no turn ends over a waiting message. A refused, cut off or malformed turn
    ends its task ``failed`` (``_llm_answer.turn_end``); with a message accepted (202) while it
    was made, that ending was committed without heeding it, and the message was never read."""
    sub = scripted([{"text": "I can't help with that."}, {"text": "Sure, here it is."}])
    task = store.tasks.create(sub, tenant="t")
    during = lambda: send_message(store, Queues(), task.task_id, "try this instead", tenant="t")  # noqa: E731
    provider = NoAnswerFirst(sub, stop_reason, during)

    result = engine(store, registry, provider).run(task.task_id)

    after = store.tasks.get(task.task_id)
    assert result.status is TaskStatus.SUCCEEDED, (after.status, after.error)
    assert (after.messages_received, after.messages_delivered) == (1, 1)
    assert kinds(store, task.task_id) == ["llm", "message", "llm"]
    asked_again = provider.requests[1].messages
    assert asked_again[1] == {"role": "assistant", "content": [{"type": "text", "text": "I can't help with that."}]}
    assert texts_sent(provider.requests[1])[-1] == "try this instead"
    assert after.result == "Sure, here it is."


@pytest.mark.parametrize("stop_reason", NO_ANSWERS)
def test_the_tool_calls_of_a_turn_that_is_no_answer_are_never_carried_out_when_a_message_follows_it(
    stop_reason: str, store: Storage, registry: ToolRegistry, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The message goes on from the turn, not from its calls: none runs, none is sent back to the
    model as a call without its result (which every provider refuses), and a turn left with no
    text says what it was (an empty turn is refused too)."""
    ledger = tmp_path / "ledger.jsonl"
    monkeypatch.setenv("AGENTQ_TEST_LEDGER", str(ledger))
    turns = [{"text": "", "tool_calls": [call("charge_card", amount_cents=500, memo="m")]}, {"text": "done"}]
    sub = scripted(turns, tools=["charge_card"])
    task = store.tasks.create(sub, tenant="t")
    during = lambda: send_message(store, Queues(), task.task_id, "and also this", tenant="t")  # noqa: E731
    provider = NoAnswerFirst(sub, stop_reason, during)

    result = engine(store, registry, provider).run(task.task_id)

    assert result.status is TaskStatus.SUCCEEDED, result
    assert not ledger.exists()
    assert kinds(store, task.task_id) == ["llm", "message", "llm"]  # no tools step
    first = store.steps.load(task.task_id)[0].body
    assert isinstance(first, LLMStep) and first.content[-1]["type"] == "tool_use"  # kept as the provider said it
    turn = provider.requests[1].messages[1]
    assert turn["role"] == "assistant" and [b["type"] for b in turn["content"]] == ["text"], turn
    assert turn["content"][0]["text"].startswith("(no answer: ")
    # What a worker that resumed the task would send: the conversation rebuilt from its steps.
    assert provider.requests[1].messages == conversation(sub.goal, store.steps.load(task.task_id)[:2])


def test_a_message_with_a_raise_that_arrives_during_a_turn_the_budget_cut_short_goes_on_with_it(
    store: Storage, registry: ToolRegistry
) -> None:
    """A turn cut at an output limit lowered to what was left of the budget ends the task
    ``cost_exceeded``, unless a message came in meanwhile: the message is delivered, and with the
    raise it carried (written with it) the model answers it. One without a raise is delivered too,
    then the task ends ``cost_exceeded`` at the next call, the message in its conversation."""
    for add_tokens, status, turns in ((5000, TaskStatus.SUCCEEDED, 2), (0, TaskStatus.COST_EXCEEDED, 1)):
        sub = scripted([{"text": "word " * 2000}, {"text": "shorter"}], max_tokens=900, max_output_tokens=1000)
        task = store.tasks.create(sub, tenant="t")
        said = functools.partial(send_message, store, Queues(), task.task_id, "shorter please", add_tokens=add_tokens)
        provider = Recording(sub, during={1: said})

        result = engine(store, registry, provider).run(task.task_id)

        after = store.tasks.get(task.task_id)
        assert result.status is status, (after.status, after.error)
        assert (after.messages_received, after.messages_delivered) == (1, 1)
        assert store.steps.load(task.task_id)[0].body.stop_reason == "max_tokens"  # type: ignore[union-attr]
        assert kinds(store, task.task_id)[:2] == ["llm", "message"] and len(provider.requests) == turns
    assert after.error is not None and "token budget" in after.error["message"]  # the next call's, not the turn's


def test_messages_to_a_running_task_wait_for_its_tools_and_arrive_in_order_in_one_turn(
    store: Storage, registry: ToolRegistry
) -> None:
    sub = scripted([{"text": "looking", "tool_calls": [call("lookup", query="a")]}, {"text": "done"}], tools=["lookup"])
    task = store.tasks.create(sub, tenant="t")
    queues = Queues()

    def three() -> None:
        for text in ("one", "two", "three"):
            send_message(store, queues, task.task_id, text, tenant="t")

    provider = Recording(sub, during={1: three})
    assert engine(store, registry, provider).run(task.task_id).status is TaskStatus.SUCCEEDED

    steps = store.steps.load(task.task_id)
    assert [s.body.kind for s in steps] == ["llm", "tools", "message", "llm"]  # the tool result first
    delivered = steps[2].body
    assert isinstance(delivered, MessageStep) and [m.seq for m in delivered.messages] == [1, 2, 3]
    last_user = provider.requests[1].messages[-1]
    assert last_user["role"] == "user"
    assert [b["type"] for b in last_user["content"]] == ["tool_result", "text", "text", "text"]
    assert [b["text"] for b in last_user["content"][1:]] == ["one", "two", "three"]


def test_an_interrupt_discards_the_answer_in_flight_charges_it_and_leaves_the_task_idle(
    store: Storage, registry: ToolRegistry
) -> None:
    sub = scripted([{"text": "a long essay"}, {"text": "the short version"}])
    task = store.tasks.create(sub, tenant="t")
    provider = Recording(sub, during={1: lambda: interrupt(store, task.task_id, tenant="t")})

    result = engine(store, registry, provider).run(task.task_id)

    assert (result.outcome, result.status) == ("waiting", TaskStatus.IDLE)
    idle = store.tasks.get(task.task_id)
    assert idle.status is TaskStatus.IDLE and idle.step == 0 and idle.interrupt_at is None
    assert idle.lease_expires == 0 and idle.inflight is None
    (orphan,) = store.steps.orphans(task.task_id)  # the discarded answer: in the trace, and paid for
    budget = store.budgets.get(task.task_id)
    assert budget.used == orphan.call.usage.total and budget.reserved == 0

    queues = Queues()
    assert send_message(store, queues, task.task_id, "shorter please", tenant="t").reopened
    assert engine(store, registry).run(task.task_id).status is TaskStatus.SUCCEEDED
    assert kinds(store, task.task_id) == ["message", "llm"]
    assert store.tasks.get(task.task_id).result == "a long essay"  # the script's first turn, asked again


def test_an_answer_discarded_by_an_interrupt_is_labelled_interrupted_in_the_trace_never_lease_lost(
    store: Storage, registry: ToolRegistry
) -> None:
    from agentq.api.views import trace_page
    from agentq.cli.views import event_line

    sub = scripted([{"text": "a long essay"}, {"text": "the short version"}])
    task = store.tasks.create(sub, tenant="t")
    provider = Recording(sub, during={1: lambda: interrupt(store, task.task_id, tenant="t")})
    assert engine(store, registry, provider).run(task.task_id).status is TaskStatus.IDLE

    (orphan,) = store.steps.orphans(task.task_id)
    assert orphan.reason == "interrupted"
    events = trace_page(store, store.tasks.get(task.task_id), limit=100, cursor=None).events
    (call,) = [e for e in events if e.type == "llm_call"]
    assert call.orphan and call.orphan_reason == "interrupted"
    line = event_line(call, origin=task.created_at).plain
    assert "interrupted: answer discarded" in line and "lease" not in line


def test_a_task_that_failed_without_reaching_the_dlq_is_never_told_to_be_redriven(
    store: Storage, registry: ToolRegistry, monkeypatch: pytest.MonkeyPatch
) -> None:
    for variable in ("ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN"):
        monkeypatch.delenv(variable, raising=False)
    sub = TaskSubmission.model_validate({"goal": "g", "provider": "anthropic", "model": "claude-sonnet-4-6"})
    task = store.tasks.create(sub, tenant="t")
    assert engine(store, registry).run(task.task_id).status is TaskStatus.FAILED
    failed = store.tasks.get(task.task_id)
    assert failed.error is not None and failed.error["code"] == "missing_api_key"
    for add_tokens in (0, 1000):  # the plain send, and the one that raises the budget first
        with pytest.raises(IllegalTransition) as refused:
            send_message(store, Queues(), task.task_id, "go on", tenant="t", add_tokens=add_tokens)
        said = refused.value.message
        assert "missing_api_key" in said and "fork" in said and "never reached the dead-letter queue" in said
        assert "redrive" not in said


def test_a_task_out_of_budget_is_told_a_follow_up_can_carry_the_raise(store: Storage, registry: ToolRegistry) -> None:
    turns = [
        {"text": f"turn {i} " + "n" * 800, "tool_calls": [call("note_write", key="k", value="v")]} for i in range(10)
    ]
    sub = scripted(turns, tools=["note_write"], max_tokens=2_600, max_output_tokens=1_000)
    task = store.tasks.create(sub, tenant="t")
    assert engine(store, registry).run(task.task_id).status is TaskStatus.COST_EXCEEDED
    ended = store.tasks.get(task.task_id)
    assert ended.error is not None and "follow-up message with add_tokens" in ended.error["message"]
    with pytest.raises(IllegalTransition) as refused:
        send_message(store, Queues(), task.task_id, "go on", tenant="t")
    assert "add_tokens" in refused.value.message and "agentq send --add-tokens" in refused.value.message
    # ... and the follow-up that carries the raise is taken, and the task goes on from its checkpoint
    assert send_message(store, Queues(), task.task_id, "go on", tenant="t", add_tokens=50_000).message.seq == 1


def test_an_interrupt_during_a_side_effect_lets_it_finish_once_and_records_it(
    store: Storage, registry: ToolRegistry, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ledger = tmp_path / "ledger.jsonl"
    monkeypatch.setenv("AGENTQ_TEST_LEDGER", str(ledger))
    sub = scripted(
        [{"text": "charging", "tool_calls": [call("charge_card", amount_cents=5, memo="m")]}, {"text": "done"}],
        tools=["charge_card"],
    )
    task = store.tasks.create(sub, tenant="t")
    # The person interrupts while the model asks for the charge: the call it asked for still runs.
    provider = Recording(sub, during={1: lambda: interrupt(store, task.task_id, tenant="t")})

    result = engine(store, registry, provider).run(task.task_id)

    # The LLM step was answered under the interrupt, so it was discarded: no charge asked for.
    assert result.status is TaskStatus.IDLE and kinds(store, task.task_id) == []
    assert not ledger.exists()

    # Interrupted after the model asked for the charge (the LLM step committed first): it runs once.
    sub2 = scripted(
        [{"text": "charging", "tool_calls": [call("charge_card", amount_cents=7, memo="m")]}, {"text": "done"}],
        tools=["charge_card"],
    )
    task2 = store.tasks.create(sub2, tenant="t")
    lease, _ = store.tasks.claim(task2.task_id, "w0", 5)  # type: ignore[misc]
    store.tasks.release(lease)
    provider2 = Recording(sub2)
    eng = engine(store, registry, provider2)
    original = eng._tool_turn.tools.call

    def interrupted_mid_tool(*args: Any, **kwargs: Any) -> Any:
        interrupt(store, task2.task_id, tenant="t")
        return original(*args, **kwargs)

    monkeypatch.setattr(eng._tool_turn.tools, "call", interrupted_mid_tool)
    assert eng.run(task2.task_id).status is TaskStatus.IDLE
    steps = store.steps.load(task2.task_id)
    assert [s.body.kind for s in steps] == ["llm", "tools"]  # the effect completed and is recorded
    tools_step = steps[1].body
    assert isinstance(tools_step, ToolsStep) and tools_step.results[0].content.startswith("charged 7 cents")
    assert len(ledger.read_text().splitlines()) == 1  # exactly once
    assert store.budgets.get(task2.task_id).reserved == 0  # the next call's hold went back


def test_an_interrupt_with_a_message_goes_on_with_the_message(store: Storage, registry: ToolRegistry) -> None:
    sub = scripted([{"text": "drafting"}, {"text": "about C now"}]).model_copy(update={"double_texting": "interrupt"})
    task = store.tasks.create(sub, tenant="t")
    queues = Queues()
    provider = Recording(sub, during={1: lambda: send_message(store, queues, task.task_id, "switch to C", tenant="t")})

    result = engine(store, registry, provider).run(task.task_id)

    assert result.status is TaskStatus.SUCCEEDED
    assert kinds(store, task.task_id) == ["message", "llm"]  # the first answer discarded, the message heard
    assert len(store.steps.orphans(task.task_id)) == 1
    assert store.tasks.get(task.task_id).interrupt_at is None


def test_double_texting_reject_refuses_a_message_while_busy_and_takes_it_once_answered(
    store: Storage, registry: ToolRegistry
) -> None:
    sub = scripted([{"text": "one"}, {"text": "two"}]).model_copy(update={"double_texting": "reject"})
    task = store.tasks.create(sub, tenant="t")
    with pytest.raises(MessageRefused, match="double_texting: reject"):
        send_message(store, Queues(), task.task_id, "hurry", tenant="t")
    assert store.tasks.get(task.task_id).messages_received == 0  # nothing written
    engine(store, registry).run(task.task_id)
    assert send_message(store, Queues(), task.task_id, "and now?", tenant="t").reopened


@pytest.mark.parametrize("ending", [TaskStatus.FAILED, TaskStatus.CANCELLED])
def test_a_message_to_a_failed_or_cancelled_task_is_refused_with_the_reason(store: Storage, ending: TaskStatus) -> None:
    task = store.tasks.create(scripted([{"text": "x"}]), tenant="t")
    lease, _ = store.tasks.claim(task.task_id, "w", 5)  # type: ignore[misc]
    store.tasks.transition(task.task_id, ending, lease=lease)
    with pytest.raises(IllegalTransition, match=r"takes no messages: it (failed|was cancelled)"):
        send_message(store, Queues(), task.task_id, "hello", tenant="t")
    assert store.messages.listed(task.task_id) == []


def test_another_tenants_task_is_not_found_and_bad_messages_are_refused_precisely(store: Storage) -> None:
    task = store.tasks.create(scripted([{"text": "x"}]), tenant="t")
    from agentq.core.errors import TaskNotFound

    with pytest.raises(TaskNotFound):
        send_message(store, Queues(), task.task_id, "hi", tenant="other")
    with pytest.raises(TaskNotFound):
        interrupt(store, task.task_id, tenant="other")
    with pytest.raises(ValidationError) as empty:
        send_message(store, Queues(), task.task_id, "  ", tenant="t")
    assert empty.value.field == "text"
    with pytest.raises(ValidationError, match="at most 32,000") as big:
        send_message(store, Queues(), task.task_id, "x" * 32_001, tenant="t")
    assert big.value.field == "text"
    assert store.messages.listed(task.task_id) == []


def test_the_same_idempotency_key_gives_the_same_message_once(store: Storage) -> None:
    task = store.tasks.create(scripted([{"text": "x"}]), tenant="t")
    first = send_message(store, Queues(), task.task_id, "once", tenant="t", idempotency_key="k1")
    again = send_message(store, Queues(), task.task_id, "once", tenant="t", idempotency_key="k1")
    assert again.replayed and again.message == first.message
    assert [m.text for m in store.messages.listed(task.task_id)] == ["once"]
    with pytest.raises(IdempotencyConflict):
        send_message(store, Queues(), task.task_id, "different", tenant="t", idempotency_key="k1")


def test_a_closed_conversation_and_a_full_inbox_take_no_more_messages(store: Storage) -> None:
    task = store.tasks.create(scripted([{"text": "x"}]), tenant="t")
    close(store, task.task_id, tenant="t")
    with pytest.raises(MessageRefused, match="closed"):
        send_message(store, Queues(), task.task_id, "hi", tenant="t")
    other = store.tasks.create(scripted([{"text": "x"}]), tenant="t")
    from agentq.storage import keys
    from agentq.storage.table import Update

    store.table.update(keys.meta_key(other.task_id), Update(set={"messages_received": MAX_MESSAGES_PER_TASK}))
    with pytest.raises(MessageRefused, match="most messages") as full:
        send_message(store, Queues(), other.task_id, "hi", tenant="t")
    assert full.value.field == "text"


def test_a_follow_up_may_raise_the_budget_of_a_task_that_ran_out(store: Storage, registry: ToolRegistry) -> None:
    sub = scripted([{"text": "x" * 400}, {"text": "fine"}], max_tokens=3000)
    task = store.tasks.create(sub, tenant="t")
    lease, _ = store.tasks.claim(task.task_id, "w", 5)  # type: ignore[misc]
    store.tasks.transition(task.task_id, TaskStatus.COST_EXCEEDED, lease=lease)
    with pytest.raises(IllegalTransition, match="ran out of budget"):
        send_message(store, Queues(), task.task_id, "go on", tenant="t")
    queues = Queues()
    sent = send_message(store, queues, task.task_id, "go on", tenant="t", add_tokens=5000)
    assert sent.status is TaskStatus.QUEUED and queues.sent == [task.task_id]
    assert store.budgets.get(task.task_id).cap == 8000
    assert engine(store, registry).run(task.task_id).status is TaskStatus.SUCCEEDED


def test_a_message_to_a_paused_task_is_held_until_it_runs_again(store: Storage, registry: ToolRegistry) -> None:
    sub = scripted(
        [{"text": "asking", "tool_calls": [call("request_approval", question="ok?")]}, {"text": "approved, done"}],
        tools=["request_approval"],
    )
    task = store.tasks.create(sub, tenant="t")
    assert engine(store, registry).run(task.task_id).status is TaskStatus.PAUSED
    queues = Queues()
    assert send_message(store, queues, task.task_id, "please hurry", tenant="t").status is TaskStatus.PAUSED
    assert queues.sent == []
    from agentq.control.operations import decide

    decide(store, queues, task.task_id, approved=True, tenant="t")
    assert engine(store, registry).run(task.task_id).status is TaskStatus.SUCCEEDED
    assert kinds(store, task.task_id) == ["llm", "tools", "message", "llm"]


def test_the_conversation_rebuilt_from_steps_joins_tool_results_and_messages_in_one_user_turn() -> None:
    from agentq.core.engine.conversation import conversation
    from agentq.core.models import StepRecord, ToolOutcome, Usage, UserMessage

    llm = LLMStep(
        content=[{"type": "tool_use", "id": "u1", "name": "lookup", "input": {}}], stop_reason="tool_use",
        model="m", usage=Usage(), started_at=0, duration_ms=0,
    )  # fmt: skip
    tools = ToolsStep(results=[ToolOutcome(tool_use_id="u1", name="lookup", content="r", started_at=0, duration_ms=0)])
    said = MessageStep(messages=[UserMessage(message_id="m1", seq=1, text="hi", sent_at=0)])
    bodies: list[LLMStep | ToolsStep | MessageStep] = [llm, tools, said]
    records = [StepRecord(task_id="t", number=i + 1, epoch=1, committed_at=0, body=b) for i, b in enumerate(bodies)]
    messages = conversation("goal", records)
    assert [m["role"] for m in messages] == ["user", "assistant", "user"]
    assert messages[-1]["content"][-1] == {"type": "text", "text": "hi"}
    first = conversation("goal", records[2:])  # a message before any turn joins the goal's turn
    assert first == [{"role": "user", "content": [{"type": "text", "text": "goal"}, {"type": "text", "text": "hi"}]}]
    assert Decimal(0) == 0


def test_a_follow_up_after_a_resume_resends_what_the_first_run_sent_so_the_cache_prefix_holds(
    store: Storage, registry: ToolRegistry
) -> None:
    sub = scripted(
        [{"text": "looking", "tool_calls": [call("lookup", query="a")]}, {"text": "found it"}, {"text": "and more"}],
        tools=["lookup"],
    )
    task = store.tasks.create(sub, tenant="t")
    first = Recording(sub)
    assert engine(store, registry, first).run(task.task_id).status is TaskStatus.SUCCEEDED
    send_message(store, Queues(), task.task_id, "tell me more", tenant="t")
    later = Recording(sub)  # another worker, another process as far as the engine knows: rebuilt from the steps
    resumed = Engine(store, worker_id="w2", tools=registry, config=EngineConfig(lease_seconds=5),
                     providers=lambda s: later)  # fmt: skip
    assert resumed.run(task.task_id).status is TaskStatus.SUCCEEDED

    before, after = first.requests[-1], later.requests[0]
    assert (after.system, after.tools, after.model) == (before.system, before.tools, before.model)
    n = len(before.messages)
    assert after.messages[:n] == before.messages  # the prefix the first run sent, byte for byte
    assert after.messages[n]["role"] == "assistant" and after.messages[n + 1]["role"] == "user"
    assert after.messages[n + 1]["content"] == [{"type": "text", "text": "tell me more"}]


def test_callbacks_carry_message_received_and_idle_when_the_submission_asks(
    store: Storage, registry: ToolRegistry
) -> None:
    from agentq.core.models import Notify
    from agentq.runtime import build_dispatcher

    hook = Notify(url="https://example.com/hook", events=["idle", "message_received", "succeeded"])
    sub = scripted([{"text": "a long essay"}, {"text": "ok"}]).model_copy(update={"notify": hook})
    task = store.tasks.create(sub, tenant="t")
    queues = Queues()
    interrupt(store, task.task_id, tenant="t")
    dispatcher = build_dispatcher(engine(store, registry), store, queues, max_receive_count=5)
    action = dispatcher.handle(json.dumps({"task_id": task.task_id}), tier="normal", receive_count=1)
    assert action.kind == "delete" and store.tasks.get(task.task_id).status is TaskStatus.IDLE
    send_message(store, queues, task.task_id, "hello", tenant="t")
    dispatcher.handle(json.dumps({"task_id": task.task_id}), tier="normal", receive_count=1)
    assert [(w["type"], w["status"]) for w in queues.webhooks] == [
        ("task.idle", "idle"), ("task.message_received", "queued"), ("task.ended", "succeeded"),
    ]  # fmt: skip
    assert queues.webhooks[1]["seq"] == 1


def test_the_event_log_holds_each_message_its_delivery_the_interrupt_and_the_idle_stop_in_order(
    store: Storage, registry: ToolRegistry
) -> None:
    sub = scripted([{"text": "a long essay"}, {"text": "short"}])
    task = store.tasks.create(sub, tenant="t")
    provider = Recording(sub, during={1: lambda: interrupt(store, task.task_id, tenant="t")})
    assert engine(store, registry, provider).run(task.task_id).status is TaskStatus.IDLE
    send_message(store, Queues(), task.task_id, "shorter please", tenant="t")
    assert engine(store, registry).run(task.task_id).status is TaskStatus.SUCCEEDED

    head = store.events.head(task.task_id)
    assert head is not None
    log = store.events.read(task.task_id, head, None)
    kinds = [(e.type, e.data.get("status")) for e in log if e.type != "step"]
    assert kinds == [
        ("task.created", "queued"), ("task.status", "running"), ("task.interrupt_requested", None),
        ("task.status", "idle"), ("message.received", "queued"), ("task.status", "running"),
        ("task.status", "succeeded"),
    ]  # fmt: skip
    steps = [e.step.body.kind for e in log if e.step is not None]
    assert steps == ["message", "llm"]  # the discarded answer is no step; the message's delivery is
    received = next(e for e in log if e.type == "message.received")
    assert received.data["text"] == "shorter please" and received.data["seq"] == 1


def test_a_fork_at_a_later_exchange_carries_the_messages_and_goes_on_as_a_conversation_of_its_own(
    store: Storage, registry: ToolRegistry
) -> None:
    from agentq.control.operations import fork

    sub = scripted([{"text": "first"}, {"text": "second"}, {"text": "third"}, {"text": "fourth"}])
    source = store.tasks.create(sub, tenant="t")
    engine(store, registry).run(source.task_id)
    send_message(store, Queues(), source.task_id, "go on", tenant="t")
    engine(store, registry).run(source.task_id)
    assert kinds(store, source.task_id) == ["llm", "message", "llm"]

    forked = fork(store, registry, Queues(), source.task_id, at_step=3, tenant="t")
    assert kinds(store, forked.task_id) == ["llm", "message", "llm"]  # the exchange, copied
    send_message(store, Queues(), forked.task_id, "and in the fork?", tenant="t")
    later = Recording(sub)
    assert engine(store, registry, later).run(forked.task_id).status is TaskStatus.SUCCEEDED
    assert texts_sent(later.requests[0])[-2:] == ["go on", "and in the fork?"]  # both exchanges, in order
    assert store.tasks.get(forked.task_id).result == "third"
    assert [m.text for m in store.messages.listed(source.task_id)] == ["go on"]  # the source is its own


def _out_of_budget(store: Storage, **update: Any) -> str:
    """A task that stopped cost_exceeded (its budget 3,000 tokens), as the engine leaves one."""
    sub = scripted([{"text": "x" * 400}, {"text": "fine"}], max_tokens=3000).model_copy(update=update)
    task = store.tasks.create(sub, tenant="t")
    lease, _ = store.tasks.claim(task.task_id, "w", 5)  # type: ignore[misc]
    store.tasks.transition(task.task_id, TaskStatus.COST_EXCEEDED, lease=lease)
    return task.task_id


def test_a_retried_send_that_raises_the_budget_raises_it_once_and_a_different_raise_under_its_key_conflicts(
    store: Storage, registry: ToolRegistry
) -> None:
    task = store.tasks.create(scripted([{"text": "first"}, {"text": "second"}]), tenant="t")
    assert engine(store, registry).run(task.task_id).status is TaskStatus.SUCCEEDED
    cap = store.budgets.get(task.task_id).cap
    first = send_message(store, Queues(), task.task_id, "more", tenant="t", idempotency_key="once", add_tokens=1000)
    # The Python client retries this POST itself on a 502, 503 or 504: its retry raises nothing again.
    again = send_message(store, Queues(), task.task_id, "more", tenant="t", idempotency_key="once", add_tokens=1000)
    assert again.replayed and again.message == first.message
    assert store.budgets.get(task.task_id).cap == cap + 1000
    with pytest.raises(IdempotencyConflict):  # the key names the raise too, not the text alone
        send_message(store, Queues(), task.task_id, "more", tenant="t", idempotency_key="once", add_tokens=9000)
    assert store.budgets.get(task.task_id).cap == cap + 1000


def test_two_messages_that_raise_the_step_cap_at_once_raise_it_by_both(
    store: Storage, registry: ToolRegistry, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each send reads the task and then accepts its message; the accept that lost the race for
    the message number tried again with the submission its sender had planned from that read,
    so one step raise was lost (the token raises, ADDs on META, both counted). The caps are now
    raised on the submission as each attempt of the accept reads it, put only while it is still
    that one."""
    sub = scripted([{"text": "hi"}], max_steps=10)
    task = store.tasks.create(sub, tenant="t")
    assert engine(store, registry).run(task.task_id).status is TaskStatus.SUCCEEDED
    cap = store.budgets.get(task.task_id).cap
    both_read = threading.Barrier(2)
    accept = store.messages.accept

    def after_both_read(*args: Any, **kwargs: Any) -> Any:
        both_read.wait(timeout=10)  # both senders have read the task and planned their raise
        return accept(*args, **kwargs)

    monkeypatch.setattr(store.messages, "accept", after_both_read)
    errors: list[BaseException] = []

    def send(text: str) -> None:
        try:
            send_message(store, Queues(), task.task_id, text, tenant="t", add_tokens=100, add_steps=5)
        except BaseException as exc:
            errors.append(exc)

    senders = [threading.Thread(target=send, args=(text,)) for text in ("one", "two")]
    for sender in senders:
        sender.start()
    for sender in senders:
        sender.join()

    assert not errors, errors
    after = store.tasks.get(task.task_id)
    assert after.messages_received == 2 and store.budgets.get(task.task_id).cap == cap + 200
    assert after.submission.constraints.max_steps == 20


def test_a_message_refused_by_a_closed_conversation_raises_no_budget_and_resumes_no_task(store: Storage) -> None:
    task_id = _out_of_budget(store)
    close(store, task_id, tenant="t")
    queues = Queues()
    with pytest.raises(MessageRefused, match="closed"):
        send_message(store, queues, task_id, "go on", tenant="t", add_tokens=5000, add_steps=5)
    after = store.tasks.get(task_id)
    assert after.status is TaskStatus.COST_EXCEEDED and queues.sent == []  # not resumed
    assert store.budgets.get(task_id).cap == 3000 and after.submission.constraints.max_steps == 50
    assert after.messages_received == 0


def test_a_raise_refused_with_its_message_by_double_texting_reject_changes_nothing(store: Storage) -> None:
    sub = scripted([{"text": "one"}]).model_copy(update={"double_texting": "reject"})
    task = store.tasks.create(sub, tenant="t")  # queued: busy
    cap = store.budgets.get(task.task_id).cap
    with pytest.raises(MessageRefused, match="double_texting: reject"):
        send_message(store, Queues(), task.task_id, "hurry", tenant="t", add_tokens=1000)
    assert store.budgets.get(task.task_id).cap == cap


def test_an_out_of_budget_task_that_rejects_double_texts_takes_the_follow_up_carrying_the_raise(
    store: Storage, registry: ToolRegistry
) -> None:
    task_id = _out_of_budget(store, double_texting="reject")
    queues = Queues()
    sent = send_message(store, queues, task_id, "go on", tenant="t", add_tokens=5000)
    assert sent.reopened and sent.status is TaskStatus.QUEUED and sent.message.seq == 1
    assert queues.sent == [task_id] and store.budgets.get(task_id).cap == 8000
    head = store.events.head(task_id)
    assert head is not None
    logged = [(e.type, e.data.get("status")) for e in store.events.read(task_id, head, None)]
    # One write raised the budget and took the message that resumed the task: both logged by it, in order.
    assert logged[-2:] == [("budget.raised", None), ("message.received", "queued")]
    assert engine(store, registry).run(task_id).status is TaskStatus.SUCCEEDED
    assert store.tasks.get(task_id).messages_delivered == 1


class _SendFailsOnce(_Queues):
    """Queues whose first send raises: SQS unreachable, or the API Lambda timed out after the accept."""

    def __init__(self) -> None:
        super().__init__()
        self.failed = False

    def send(self, task_id: str, priority: Any, **kw: Any) -> None:
        if not self.failed:
            self.failed = True
            raise ConnectionError("sqs unreachable")
        super().send(task_id, priority, **kw)


def test_a_retried_follow_up_whose_first_enqueue_failed_queues_its_run_and_one_delivered_queues_nothing(
    store: Storage, registry: ToolRegistry
) -> None:
    task = store.tasks.create(scripted([{"text": "first"}, {"text": "second"}]), tenant="t")
    assert engine(store, registry).run(task.task_id).status is TaskStatus.SUCCEEDED
    queues: Any = _SendFailsOnce()
    with pytest.raises(ConnectionError):  # answered 500: the client retries with the same key
        send_message(store, queues, task.task_id, "go on", tenant="t", idempotency_key="k")
    assert store.tasks.get(task.task_id).status is TaskStatus.QUEUED  # the message taken, its run not queued
    again = send_message(store, queues, task.task_id, "go on", tenant="t", idempotency_key="k")
    # Queued again, as a retried submission is: else the run waits for the sweeper (960 s by default).
    assert again.replayed and queues.sent == [task.task_id]
    assert engine(store, registry).run(task.task_id).status is TaskStatus.SUCCEEDED
    late = send_message(store, queues, task.task_id, "go on", tenant="t", idempotency_key="k")
    assert late.replayed and late.delivered and queues.sent == [task.task_id]  # answered: nothing to run


@pytest.mark.parametrize("point", ["after_step_put:1", "after_message_commit:1", "after_tools_commit:1"])
def test_a_worker_paused_past_its_lease_around_the_delivering_commit_delivers_each_message_once(
    point: str, store: Storage, registry: ToolRegistry, monkeypatch: pytest.MonkeyPatch
) -> None:
    import time

    from tests.stopped_worker import resume, stopped_at

    turns = [{"text": "looking", "tool_calls": [call("note_write", key="k", value="v")]}, {"text": "answer"}]
    task = store.tasks.create(scripted(turns, tools=["note_write"]), tenant="t")
    for text in ("first", "second"):
        store.messages.accept(task.task_id, text)

    def eng(worker: str) -> Engine:
        return Engine(store, worker_id=worker, tools=registry, config=EngineConfig(lease_seconds=1))

    with stopped_at(eng("zombie"), task.task_id, point, monkeypatch, wakes=True):
        time.sleep(1.5)  # its lease lapses while it is paused (SIGSTOP, a GC pause): it wakes a zombie
        assert resume(eng("successor"), task.task_id).status is TaskStatus.SUCCEEDED
        store.messages.accept(task.task_id, "third")  # a follow-up while the zombie still sleeps
    assert resume(eng("successor"), task.task_id).status is TaskStatus.SUCCEEDED
    delivered = [
        m.seq for s in store.steps.load(task.task_id) if isinstance(s.body, MessageStep) for m in s.body.messages
    ]
    assert delivered == [1, 2, 3]
    done = store.tasks.get(task.task_id)
    assert (done.messages_received, done.messages_delivered) == (3, 3)
