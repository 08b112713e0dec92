"""A turn that is no answer does not end its task ``succeeded``: a model that refused (Anthropic's
``refusal``; OpenAI's ``content_filter``, or its ``message.refusal`` with no content; a Bedrock
guardrail's ``guardrail_intervened``), and a turn cut off where the model's context window ran
out (``model_context_window_exceeded``). Each was read as the final answer: the task ended
``succeeded`` with the refusal, or nothing, for its result, and its dependents and callback
took it for one. Now it ends ``failed`` with a code that says which (``model_refused``,
``context_window_exceeded``) and the provider's own word for why it stopped; so does a turn whose
tool call's arguments are not JSON (``model_output_malformed``, as Bedrock's ``malformed_tool_use``
is). The same ending
holds wherever a turn ends a task: a turn answered through a batch (economy), a task with an
outcome (a refusal is never graded) and a fork at such a turn. A message accepted while such a
turn was made is not left unread in the failed task: the model is asked again with it, the turn
before it without its tool calls, which are never made.

Through the real SDKs against the local Messages, Chat Completions and Converse servers, on
the in-memory twin with the real engine."""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from agentq.control import operations as control
from agentq.control.submit import parse_submission
from agentq.core.engine import Engine, EngineConfig
from agentq.core.models import TaskStatus, TaskSubmission
from agentq.core.tools import ToolRegistry
from agentq.storage.container import Storage

from tests.fake_messages_api import FakeMessagesAPI, message_reply, point_anthropic_at, text_reply
from tests.fake_model_servers import FakeChatCompletions, FakeConverse, chat_completion, converse_reply, point_boto3_at

STORAGE = "memory"
CLAUDE = "claude-sonnet-4-6"
GPT = "gpt-4.1-mini"
NOVA = "amazon.nova-lite-v1:0"
NO_RETRY = json.dumps({"max_attempts": 1, "base_delay": 0, "max_delay": 0})


def run(store: Storage, registry: ToolRegistry, task_id: str) -> Any:
    engine = Engine(store, worker_id="w1", tools=registry, config=EngineConfig(lease_seconds=30))
    return engine.run(task_id, keeper=lambda _: contextlib.nullcontext())


@contextlib.contextmanager
def model_server(provider: str, monkeypatch: pytest.MonkeyPatch, **kwargs: Any) -> Iterator[Any]:
    """The local server of ``provider``, with the provider pointed at it."""
    monkeypatch.setenv("AGENTQ_PROVIDER_RETRY", NO_RETRY)
    if provider == "anthropic":
        with FakeMessagesAPI(**kwargs) as server:
            point_anthropic_at(server, monkeypatch.setenv)
            yield server
    elif provider == "openai":
        with FakeChatCompletions(**kwargs) as server:
            monkeypatch.setenv("OPENAI_BASE_URL", server.openai_base_url)
            monkeypatch.setenv("OPENAI_API_KEY", "k")
            yield server
    else:
        with FakeConverse(**kwargs) as server:
            point_boto3_at(server, monkeypatch.setenv)
            yield server


ENDINGS: list[tuple[str, str, Callable[[], Any], str, str]] = [
    ("anthropic", CLAUDE, lambda: text_reply("", stop_reason="refusal"), "model_refused", "refusal"),
    ("openai", GPT, lambda: chat_completion("", finish_reason="content_filter"), "model_refused", "content_filter"),
    ("bedrock-converse", NOVA, lambda: converse_reply("The content was blocked.", stop_reason="guardrail_intervened"),
     "model_refused", "guardrail_intervened"),
    ("openai", GPT, lambda: chat_completion(None, refusal="I'm sorry, I can't help with that."), "model_refused",
     "stop"),  # Chat Completions' own refusal: message.refusal, with finish_reason "stop"
    ("anthropic", CLAUDE, lambda: text_reply("half an answ", stop_reason="model_context_window_exceeded"),
     "context_window_exceeded", "model_context_window_exceeded"),
    ("bedrock-converse", NOVA, lambda: converse_reply("{\"city\": ", stop_reason="malformed_model_output"),
     "model_output_malformed", "malformed_model_output"),
    ("bedrock-converse", NOVA, lambda: converse_reply("", stop_reason="malformed_tool_use"),
     "model_output_malformed", "malformed_tool_use"),
    ("openai", GPT, lambda: chat_completion(None, [("get_weather", {})], raw_arguments='{"city": "Par'),
     "model_output_malformed", "tool_calls"),  # arguments that are not JSON: no Bedrock word for it, as malformed
]  # fmt: skip


@pytest.mark.parametrize(
    ("provider", "model", "reply", "code", "said"),
    ENDINGS,
    ids=["anthropic-refusal", "openai-content_filter", "converse-guardrail", "openai-message.refusal",
         "anthropic-context_window", "converse-malformed_output", "converse-malformed_tool_use",
         "openai-arguments_not_json"],
)  # fmt: skip
def test_a_turn_the_model_refused_or_a_filter_stopped_or_the_context_window_cut_fails_the_task_saying_which(
    provider: str,
    model: str,
    reply: Callable[[], Any],
    code: str,
    said: str,
    store: Storage,
    registry: ToolRegistry,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with model_server(provider, monkeypatch) as server:
        server.enqueue(reply())
        submission = TaskSubmission(goal="hi", provider=provider, model=model)  # type: ignore[arg-type]
        task = store.tasks.create(submission, tenant="t")
        result = run(store, registry, task.task_id)
    assert result.status is TaskStatus.FAILED, result
    error = store.tasks.get(task.task_id).error
    assert error is not None and error["code"] == code and error["finish_reason"] == said, error
    assert said in error["message"]


def test_a_refusal_answered_through_a_batch_fails_the_task_too(
    store: Storage, registry: ToolRegistry, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An economy task's turn comes from a batch's result, committed by the same ending."""
    with model_server("anthropic", monkeypatch, batch_seconds=0.2) as server:
        server.enqueue(text_reply("I can't help with that.", stop_reason="refusal"))
        body = {"goal": "hi", "provider": "anthropic", "model": CLAUDE, "constraints": {"economy": True}}
        task = store.tasks.create(parse_submission(body), tenant="t")
        assert run(store, registry, task.task_id).outcome == "waiting"
        time.sleep(0.3)
        store.tasks.transition(task.task_id, TaskStatus.QUEUED)  # what the batch's poll message does
        result = run(store, registry, task.task_id)
    assert result.status is TaskStatus.FAILED, result
    assert (store.tasks.get(task.task_id).error or {}).get("code") == "model_refused"


def test_a_refusal_of_a_task_with_an_outcome_fails_it_without_grading_the_refusal(
    store: Storage, registry: ToolRegistry, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No grading call is made (the one reply queued is the refusal): a refusal is no answer."""
    with model_server("anthropic", monkeypatch) as server:
        server.enqueue(text_reply("I can't help with that.", stop_reason="refusal"))
        body = {"goal": "hi", "provider": "anthropic", "model": CLAUDE, "outcome": {"rubric": "Score 1.0 if answered."}}
        task = store.tasks.create(parse_submission(body), tenant="t")
        result = run(store, registry, task.task_id)
        assert len(server.requests) == 1 and not server.unexpected
    assert result.status is TaskStatus.FAILED, result
    ended = store.tasks.get(task.task_id)
    assert (ended.error or {}).get("code") == "model_refused" and ended.grade is None


CHARGE = {"amount_cents": 500, "memo": "m"}
STOPPED_WITH_A_CALL: list[tuple[str, str, Callable[[], Any], Callable[[], Any], str]] = [
    ("anthropic", CLAUDE, lambda: message_reply([{"type": "text", "text": "I can't do that."}, {"type": "tool_use",
     "id": "toolu_1", "name": "charge_card", "input": CHARGE}], stop_reason="refusal"), lambda: text_reply("Done."),
     "I can't do that."),
    ("openai", GPT, lambda: chat_completion("I can't do that.", [("charge_card", CHARGE)], finish_reason="content_filter"),
     lambda: chat_completion("Done."), "I can't do that."),
    ("bedrock-converse", NOVA, lambda: converse_reply(None, [("charge_card", CHARGE)], stop_reason="malformed_tool_use"),
     lambda: converse_reply("Done."), "(no answer: this turn was malformed)"),
    ("openai", GPT, lambda: chat_completion(None, [("charge_card", CHARGE)], raw_arguments='{"amount_cents": 500, memo}'),
     lambda: chat_completion("Done."), "(no answer: this turn was malformed)"),
    ("openai", GPT, lambda: chat_completion(None, [("charge_card", CHARGE)], raw_arguments='{"amount_cents": 5',
                                            finish_reason="length"), lambda: chat_completion("Done."),
     "(no answer: this turn was cut off at the output limit)"),
]  # fmt: skip


@pytest.mark.parametrize(("provider", "model", "first", "then", "turn_says"), STOPPED_WITH_A_CALL,
                         ids=["anthropic-refusal", "openai-content_filter", "converse-malformed_tool_use",
                              "openai-arguments_not_json", "openai-cut_in_a_call"])  # fmt: skip
def test_a_message_sent_while_a_turn_with_a_tool_call_was_refused_is_answered_in_a_conversation_each_provider_takes(
    provider: str,
    model: str,
    first: Callable[[], Any],
    then: Callable[[], Any],
    turn_says: str,
    store: Storage,
    registry: ToolRegistry,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Any,
) -> None:
    """The message is delivered (ARCHITECTURE 11) and the model asked again with it, the refused
    turn before it: without its tool call, which is never made (a call every provider wants
    followed by its result), and, left with no text, saying what it was (none takes an empty turn).
    So is a turn whose tool call's arguments are not JSON: the model reads that its turn was
    malformed, or cut off, and the call is made by no one."""
    ledger = tmp_path / "ledger.jsonl"
    monkeypatch.setenv("AGENTQ_TEST_LEDGER", str(ledger))
    sent: list[Any] = []
    submission = TaskSubmission(goal="hi", provider=provider, model=model, constraints={"tools": ["charge_card"]})  # type: ignore[arg-type]
    task = store.tasks.create(submission, tenant="t")

    def respond(recorded: Any) -> Any:
        sent.append(recorded.body)
        if len(sent) == 1:
            store.messages.accept(task.task_id, "try it another way")  # a person, while the model answers
            return first()
        return then()

    with model_server(provider, monkeypatch, responder=respond):
        result = run(store, registry, task.task_id)
    after = store.tasks.get(task.task_id)
    assert result.status is TaskStatus.SUCCEEDED, (after.status, after.error)
    assert (after.messages_delivered, after.result, ledger.exists()) == (1, "Done.", False)
    asked_again = sent[1]["messages"]
    said = json.dumps(asked_again)
    assert not any(word in said for word in ("tool_use", "tool_calls", "toolUse", "tool_result", "toolResult")), said
    assert [m["role"] for m in asked_again] == ["user", "assistant", "user"]
    assert turn_says in json.dumps(asked_again[1]), asked_again[1]  # never an empty turn
    assert "try it another way" in json.dumps(asked_again[2])


class _Queues:
    """Stands in for TaskQueues: a fork is enqueued; here the test runs it itself."""

    def send(self, *_: Any, **__: Any) -> None:
        return None


def test_a_fork_at_a_refused_turn_ends_failed_as_its_source_did(
    store: Storage, registry: ToolRegistry, monkeypatch: pytest.MonkeyPatch
) -> None:
    with model_server("anthropic", monkeypatch) as server:
        server.enqueue(text_reply("I can't help with that.", stop_reason="refusal"))
        source = store.tasks.create(TaskSubmission(goal="hi", provider="anthropic", model=CLAUDE), tenant="t")
        assert run(store, registry, source.task_id).status is TaskStatus.FAILED
        fork = control.fork(store, registry, _Queues(), source.task_id, at_step=1, tenant="t")  # type: ignore[arg-type]
        assert run(store, registry, fork.task_id).status is TaskStatus.FAILED
        assert not server.requests[1:]  # the fork asked the model nothing: it ended at the copied turn
    error = store.tasks.get(fork.task_id).error
    assert error is not None and error["code"] == "model_refused" and error["finish_reason"] == "refusal", error
