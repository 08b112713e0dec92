"""OpenTelemetry traces by OTLP/HTTP (``observe/otel.py``), received by a local OTLP receiver
that decodes the protobuf the real exporter sends: a task that spawns sub-agents, parks, and
resumes on another worker arrives as one tree in one trace (its id derived from the root task):
the task's span, a span per run, a span per step, ``chat`` spans with the GenAI attributes,
``execute_tool`` spans, sub-agents under the spawning call; a retried model call carries its
retry as a span event."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from typing import Any

import pytest

from agentq.core.engine import Engine, EngineConfig
from agentq.core.models import Task, TaskStatus, TaskSubmission
from agentq.core.tools import ToolRegistry
from agentq.observe import otel
from agentq.runtime import Settings, build_registry, build_store
from agentq.storage.container import Storage

from tests.conftest import child_env
from tests.fake_model_servers import FakeChatCompletions, FakeReply, chat_completion, chat_error
from tests.helpers import call, run_agentq, scripted
from tests.otlp_receiver import OtlpReceiver, ReceivedSpan

STORAGE = "memory"


@pytest.fixture
def receiver(monkeypatch: pytest.MonkeyPatch) -> Iterator[OtlpReceiver]:
    with OtlpReceiver() as received:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", received.endpoint)
        monkeypatch.setenv("OTEL_SERVICE_NAME", "agentq-test")
        otel.reset()
        yield received
        otel.reset()


class Fanout:
    """Step Functions' part of a spawn (the children are run by hand below)."""

    def start(self, *, parent: Task, spawn_id: str, children: list[Any], max_concurrency: int) -> str:
        return "arn:aws:states:local:000000000000:execution:fanout:1"

    def child_finished(self, task_token: str, task_id: str, status: TaskStatus) -> None:
        raise AssertionError("not reached")


def run(store: Storage, registry: ToolRegistry, task_id: str, worker: str) -> TaskStatus | None:
    engine = Engine(store, worker_id=worker, tools=registry, config=EngineConfig(lease_seconds=30), fanout=Fanout())
    return engine.run(task_id, keeper=lambda _: contextlib.nullcontext()).status


def by_id(spans: list[ReceivedSpan]) -> dict[int, ReceivedSpan]:
    return {s.span_id: s for s in spans}


def test_a_resumed_task_with_sub_agents_arrives_as_one_tree_in_one_trace(
    receiver: OtlpReceiver, store: Storage, registry: ToolRegistry
) -> None:
    child = {"turns": [{"text": "child looks", "tool_calls": [call("lookup", query="c")]}, {"text": "child done"}]}
    turns = [
        {"text": "splitting", "tool_calls": [call("spawn_subagents", subagents=[
            {"goal": "one", "tools": ["lookup"], "script": child},
            {"goal": "two", "tools": ["lookup"], "script": child},
        ])]},
        {"text": "both done"},
    ]  # fmt: skip
    root = store.tasks.create(scripted(turns, tools=["spawn_subagents", "lookup"]), tenant="t")
    assert run(store, registry, root.task_id, "w1") is TaskStatus.WAITING
    spawn = store.steps.load(root.task_id)[-1].body.tool_uses()[0]["id"]  # type: ignore[union-attr]
    record = store.spawns.get(root.task_id, spawn)
    assert record is not None
    for child_id in record.children:
        assert run(store, registry, child_id, "w3") is TaskStatus.SUCCEEDED
    store.spawns.mark(root.task_id, record.spawn_id, woken=True)
    store.tasks.transition(root.task_id, TaskStatus.QUEUED)
    assert run(store, registry, root.task_id, "w2") is TaskStatus.SUCCEEDED

    spans = receiver.spans
    assert {s.trace_id for s in spans} == {otel.trace_id_of(root.task_id)}  # one trace, its id the root's
    assert {s.service for s in spans} == {"agentq-test"}
    ids = by_id(spans)
    assert len(ids) == len(spans)  # no span sent twice
    roots = [s for s in spans if s.parent_span_id is None]
    assert [(s.name, s.span_id) for s in roots] == [("invoke_agent agentq", otel.span_id_of("task", root.task_id))]
    assert all(s.parent_span_id in ids for s in spans if s.parent_span_id is not None)  # one tree: no orphan

    def children(of: ReceivedSpan, prefix: str) -> list[ReceivedSpan]:
        return [s for s in spans if s.parent_span_id == of.span_id and s.name.startswith(prefix)]

    task_span = roots[0]
    assert task_span.attributes["gen_ai.operation.name"] == "invoke_agent"
    runs = sorted(children(task_span, "run"), key=lambda r: r.start_ns)
    assert len(runs) == 2  # the first worker's run and the resumed one
    steps = [s for r in runs for s in children(r, "step ")]
    # Step 2 (the spawn) is begun by the first run, which parks for the sub-agents, and ended by the second.
    numbers = [sorted(s.attributes["agentq.step"] for s in children(r, "step ")) for r in runs]
    assert numbers == [[1, 2], [2, 3]]
    chats = [s for st in steps for s in children(st, "chat ")]
    assert len(chats) == 2 and all(c.attributes["gen_ai.operation.name"] == "chat" for c in chats)
    assert all(c.attributes["gen_ai.usage.output_tokens"] > 0 for c in chats)
    (spawned,) = [s for st in steps for s in children(st, "execute_tool spawn_subagents")]
    assert spawned.span_id == otel.span_id_of("tool", root.task_id, spawn)
    # The call began in the first run, which parked for the sub-agents, and ended in the second.
    assert (
        runs[0].start_ns <= spawned.start_ns <= runs[0].end_ns <= runs[1].start_ns <= spawned.end_ns <= runs[1].end_ns
    )
    assert spawned.status_code == 0 and "error.type" not in spawned.attributes
    agents = children(spawned, "invoke_agent")
    assert sorted(a.attributes["agentq.task_id"] for a in agents) == sorted(record.children)
    for agent in agents:  # each sub-agent's own run, steps, model calls and tool call under it
        (child_run,) = children(agent, "run")
        child_steps = children(child_run, "step ")
        assert len(child_steps) == 3
        assert [s.name for st in child_steps for s in children(st, "execute_tool")] == ["execute_tool lookup"]


@pytest.mark.parametrize("offered", [True, False], ids=["refused", "not-offered"])
def test_a_spawn_that_made_no_sub_agents_is_one_error_span_of_its_call(
    receiver: OtlpReceiver, store: Storage, registry: ToolRegistry, offered: bool
) -> None:
    """A spawn the limits refuse (no sub-agent asked for), or one the task was not offered, is
    one ``execute_tool spawn_subagents`` span with an ``error.type``, as any failed tool call."""
    turns = [{"text": "", "tool_calls": [call("spawn_subagents", subagents=[])]}, {"text": "done"}]
    task = store.tasks.create(scripted(turns, tools=["spawn_subagents"] if offered else ["lookup"]), tenant="t")
    assert run(store, registry, task.task_id, "w1") is TaskStatus.SUCCEEDED
    (result,) = store.steps.load(task.task_id)[1].body.results  # type: ignore[union-attr]
    assert result.is_error
    (spawned,) = [s for s in receiver.spans if s.name == "execute_tool spawn_subagents"]
    assert spawned.status_code == 2 and spawned.attributes["error.type"] == "error"
    assert spawned.attributes["gen_ai.tool.call.id"] == result.tool_use_id


def test_a_model_call_carries_the_genai_attributes_and_its_retry_as_an_event(
    receiver: OtlpReceiver, store: Storage, registry: ToolRegistry, monkeypatch: pytest.MonkeyPatch
) -> None:
    with FakeChatCompletions() as server:
        monkeypatch.setenv("OPENAI_BASE_URL", server.openai_base_url)
        monkeypatch.setenv("OPENAI_API_KEY", "k")
        monkeypatch.setenv("AGENTQ_PROVIDER_RETRY", json.dumps({"max_attempts": 3, "base_delay": 0, "max_delay": 0}))
        server.enqueue(
            chat_error(503, "server_error", "loading"),
            chat_completion("hello", prompt_tokens=120, completion_tokens=7, cached_tokens=100),
        )
        task = store.tasks.create(TaskSubmission(goal="hi", provider="openai", model="gpt-4.1-mini"), tenant="t")
        assert run(store, registry, task.task_id, "w1") is TaskStatus.SUCCEEDED
    (chat,) = [s for s in receiver.spans if s.name.startswith("chat ")]
    assert chat.name == "chat gpt-4.1-mini"
    attributes = chat.attributes
    assert attributes["gen_ai.provider.name"] == "openai" and attributes["gen_ai.request.model"] == "gpt-4.1-mini"
    assert attributes["gen_ai.response.finish_reasons"] == ["stop"]  # OpenAI's own word (the engine reads end_turn)
    assert (attributes["gen_ai.usage.input_tokens"], attributes["gen_ai.usage.output_tokens"]) == (120, 7)
    assert attributes["gen_ai.usage.cache_read.input_tokens"] == 100
    ((name, event),) = chat.events
    assert name == "agentq.retry" and event["error.type"] == "provider_server_error" and event["agentq.attempt"] == 1


def test_a_failed_calls_span_carries_no_more_of_the_servers_body_than_its_error_excerpt(
    receiver: OtlpReceiver, store: Storage, registry: ToolRegistry, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A 400 whose 240 KB message quotes what it was sent (as servers that echo the offending
    input do): the task's error keeps an excerpt of it, and so does the call's span. The SDK's
    exception, which the provider error was raised from, holds the whole message; the span's
    ``exception`` event tells the provider error's own frames, not that chain."""
    said = "bad input: " + "SECRET-ECHO " * 20_000
    page = json.dumps({"error": {"message": said, "type": "invalid_request_error"}}).encode()
    with FakeChatCompletions() as server:
        monkeypatch.setenv("OPENAI_BASE_URL", server.openai_base_url)
        monkeypatch.setenv("OPENAI_API_KEY", "k")
        monkeypatch.setenv("AGENTQ_PROVIDER_RETRY", json.dumps({"max_attempts": 1, "base_delay": 0, "max_delay": 0}))
        server.enqueue(FakeReply(400, raw=page))
        task = store.tasks.create(TaskSubmission(goal="hi", provider="openai", model="gpt-4.1-mini"), tenant="t")
        assert run(store, registry, task.task_id, "w1") is TaskStatus.FAILED
    error = store.tasks.get(task.task_id).error
    assert error is not None
    excerpt = error["message"].count("SECRET-ECHO")
    assert 0 < excerpt < 50
    (chat,) = [s for s in receiver.spans if s.name.startswith("chat ")]
    values = [str(v) for _, attributes in chat.events for v in attributes.values()]
    values += [str(v) for v in chat.attributes.values()]
    assert [name for name, _ in chat.events] == ["exception"] and chat.status_code == 2
    assert max(v.count("SECRET-ECHO") for v in values) == excerpt


def test_no_attribute_of_a_span_is_longer_than_the_limit_unless_the_sdk_setting_says_otherwise(
    receiver: OtlpReceiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The SDK keeps attribute values whole by default; agentq's spans cut each at 4096
    characters, or where ``OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT`` says."""
    with otel.span("execute_tool long", {"agentq.said": "x" * 100_000}):
        otel.event("agentq.retry", {"agentq.message": "y" * 100_000})
    otel.reset()
    monkeypatch.setenv("OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT", "10")
    with otel.span("execute_tool short", {"agentq.said": "x" * 100_000}):
        pass
    otel.flush()
    spans = {s.name: s for s in receiver.spans}
    long, short = spans["execute_tool long"], spans["execute_tool short"]
    assert len(long.attributes["agentq.said"]) == 4096
    assert [len(a["agentq.message"]) for _, a in long.events] == [4096]
    assert len(short.attributes["agentq.said"]) == 10


def test_runs_in_two_processes_hang_under_the_same_task_span(
    receiver: OtlpReceiver, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker process runs the task to its approval and exits; this process resumes it: both
    runs' spans arrive in the root's trace under the one task span, derived by each alone."""
    store = build_store(settings)
    registry = build_registry(settings)
    turns = [{"text": "asking", "tool_calls": [call("request_approval", question="go?")]}, {"text": "went"}]
    task = store.tasks.create(scripted(turns, tools=["request_approval"]), tenant="t")
    first = run_agentq(
        ["run-task", task.task_id], env=child_env(settings, OTEL_EXPORTER_OTLP_ENDPOINT=receiver.endpoint), timeout=120
    )
    assert store.tasks.get(task.task_id).status is TaskStatus.PAUSED, first.stderr[-2000:]
    pending = store.approvals.pending(task.task_id)
    assert pending is not None
    store.approvals.decide(task.task_id, pending.use_id, approved=True, note="", by="alice")
    assert run(store, registry, task.task_id, "here") is TaskStatus.SUCCEEDED

    spans = receiver.spans
    assert {s.trace_id for s in spans} == {otel.trace_id_of(task.task_id)}
    task_span = otel.span_id_of("task", task.task_id)
    runs = [s for s in spans if s.name == "run"]
    assert len(runs) == 2 and {r.parent_span_id for r in runs} == {task_span}
    workers = {r.attributes["agentq.worker_id"] for r in runs}
    assert len(workers) == 2 and "here" in workers
    assert [s.name for s in spans if s.parent_span_id is None] == ["invoke_agent agentq"]


class _Queues:
    """The queues the dispatcher reports an ended task's end to: nothing to send here."""

    def send(self, *_: Any, **__: Any) -> None:
        pass

    def send_webhook(self, body: str) -> None:
        pass

    def forwards(self, submission: Any) -> bool:
        return False


def test_an_invocation_whose_ending_run_was_killed_gets_its_invoke_agent_span_from_the_redelivery(
    receiver: OtlpReceiver, settings: Settings
) -> None:
    """Run 1 parks for an approval (its spans sent, under the invocation's derived span id); run
    2, in a worker process, commits the final answer and is SIGKILLed before it sends the
    ``invoke_agent`` span. The message's redelivery finds the task ended and reports the end
    again (``queueing.dispatch._ended``): it sends the span the run would have, once (a second
    redelivery finds it noted), so the invocation's runs hang from a span that arrives."""
    from agentq.runtime import build_dispatcher

    store = build_store(settings)
    registry = build_registry(settings)
    turns = [{"text": "asking", "tool_calls": [call("request_approval", question="go?")]}, {"text": "went"}]
    task = store.tasks.create(scripted(turns, tools=["request_approval"]), tenant="t")
    assert run(store, registry, task.task_id, "w1") is TaskStatus.PAUSED
    pending = store.approvals.pending(task.task_id)
    assert pending is not None
    store.approvals.decide(task.task_id, pending.use_id, approved=True, note="", by="alice")
    killed = run_agentq(["run-task", task.task_id], timeout=120, env=child_env(
        settings, OTEL_EXPORTER_OTLP_ENDPOINT=receiver.endpoint, AGENTQ_CRASH_AT="after_llm_commit:1"))  # fmt: skip
    assert killed.returncode == -9, killed.stderr[-2000:]
    ended = store.tasks.get(task.task_id)
    assert ended.status is TaskStatus.SUCCEEDED and ended.traced_invocation is None
    engine = Engine(store, worker_id="w3", tools=registry, config=EngineConfig(lease_seconds=30))
    dispatcher = build_dispatcher(engine, store, _Queues(), max_receive_count=5)  # type: ignore[arg-type]
    for receive in (2, 3):
        action = dispatcher.handle(json.dumps({"task_id": task.task_id}), tier="normal", receive_count=receive)
        assert action.kind == "delete"
    otel.flush()
    spans = receiver.spans
    root = otel.span_id_of("task", task.task_id)
    (agent,) = [s for s in spans if s.span_id == root]
    assert agent.name == "invoke_agent agentq" and agent.parent_span_id is None
    assert agent.attributes["agentq.status"] == "succeeded" and agent.status_code != 2
    assert agent.attributes["gen_ai.usage.output_tokens"] == ended.tokens_out > 0
    (first,) = [s for s in spans if s.name == "run"]  # the killed run sent none of its spans
    assert first.parent_span_id == root and first.attributes["agentq.worker_id"] == "w1"
    assert store.tasks.get(task.task_id).traced_invocation == 0


def test_a_redelivered_end_whose_invoke_agent_span_was_sent_sends_it_no_more(
    receiver: OtlpReceiver, store: Storage, registry: ToolRegistry
) -> None:
    """The run that ends an invocation notes its span sent once flushed: a redelivery of the
    message (the worker died before deleting it) finds the note and sends no second span."""
    from agentq.runtime import build_dispatcher

    task = store.tasks.create(scripted([{"text": "done"}]), tenant="t")
    assert run(store, registry, task.task_id, "w1") is TaskStatus.SUCCEEDED
    assert store.tasks.get(task.task_id).traced_invocation == 0
    engine = Engine(store, worker_id="w2", tools=registry, config=EngineConfig(lease_seconds=30))
    dispatcher = build_dispatcher(engine, store, _Queues(), max_receive_count=5)  # type: ignore[arg-type]
    assert dispatcher.handle(json.dumps({"task_id": task.task_id}), tier="normal", receive_count=2).kind == "delete"
    otel.flush()
    assert [s.name for s in receiver.spans if s.parent_span_id is None] == ["invoke_agent agentq"]


def test_the_steps_of_a_run_whose_worker_was_killed_hang_from_a_span_that_arrives(
    receiver: OtlpReceiver, settings: Settings
) -> None:
    """A worker sends each span as it ends: a claim killed mid-task has sent its finished steps,
    never its ``run`` span (open until the run ends). Its span id is derived from the task and
    the lease's epoch, and the claim that takes the task over sends it, closed, an error
    (``worker_lost``), before its own: every step the dead worker sent hangs from a span that
    arrives, and no span id arrives twice."""
    from agentq.worker import run_task

    store = build_store(settings)
    turns = [{"text": "looking", "tool_calls": [call("lookup", query="a")]},
             {"text": "slow answer", "latency_seconds": 2}]  # fmt: skip
    task = store.tasks.create(scripted(turns, tools=["lookup"]), tenant="t")
    killed = run_agentq(["run-task", task.task_id, "--lease", "1"], timeout=120, env=child_env(
        settings, OTEL_EXPORTER_OTLP_ENDPOINT=receiver.endpoint, OTEL_BSP_SCHEDULE_DELAY="100",
        AGENTQ_CRASH_AT="after_llm_call:2", AGENTQ_MAX_CALL_SECONDS="1"))  # fmt: skip
    assert killed.returncode == -9, killed.stderr[-2000:]
    resumed = run_task(task.task_id, settings=settings, lease_seconds=1, wait_seconds=20)
    assert resumed.status is TaskStatus.SUCCEEDED, resumed
    otel.flush()
    spans = receiver.spans
    ids = by_id(spans)
    assert len(ids) == len(spans), "a span id was sent twice"
    sent_by_the_dead = [s for s in spans if s.name in ("step 1", "step 2")]
    assert sent_by_the_dead, "the killed worker's finished steps were exported before the kill"
    lost = ids[otel.run_span_id(task.task_id, 1)]
    assert {s.parent_span_id for s in sent_by_the_dead} == {lost.span_id}
    assert lost.name == "run" and lost.status_code == 2
    assert lost.attributes["error.type"] == "worker_lost" and lost.attributes["agentq.lease_epoch"] == 1
    assert lost.parent_span_id == otel.span_id_of("task", task.task_id)
    assert lost.start_ns <= min(s.start_ns for s in sent_by_the_dead)
    taker = ids[otel.run_span_id(task.task_id, 2)]
    assert taker.attributes["agentq.worker_id"] != lost.attributes["agentq.worker_id"] and taker.status_code != 2
    assert all(s.parent_span_id in ids for s in spans if s.parent_span_id is not None), [
        s.name for s in spans if s.parent_span_id not in ids and s.parent_span_id is not None
    ]


class TakenOverMidCall:
    """The scripted provider, whose first call outlasts its run's lease (no heartbeat keeps it)
    while another worker takes the task over: a stalled worker that goes on after the takeover."""

    name = "scripted"

    def __init__(self, store: Storage, registry: ToolRegistry, task: Task) -> None:
        self.store, self.registry, self.task, self.calls = store, registry, task, 0
        from agentq.core.providers import default_provider_factory

        self.inner = default_provider_factory(task.submission)

    def complete(self, request: Any) -> Any:
        import threading
        import time

        self.calls += 1
        if self.calls == 1:
            time.sleep(1.2)  # past the lease
            taker = threading.Thread(target=run, args=(self.store, self.registry, self.task.task_id, "w2"))
            taker.start()
            taker.join()
        return self.inner.complete(request)


def test_a_run_whose_claim_was_taken_over_while_it_went_on_sends_no_second_span_of_that_claim(
    receiver: OtlpReceiver, store: Storage, registry: ToolRegistry
) -> None:
    """The claim that takes a task over from a worker that never gave the lease back sends that
    worker's ``run`` span (``worker_lost``); a worker that was only stalled goes on, learns its
    lease was taken at its next write, and sends no span of its own under the same id."""
    task = store.tasks.create(scripted([{"text": "answered"}]), tenant="t")
    provider = TakenOverMidCall(store, registry, task)
    engine = Engine(store, worker_id="w1", tools=registry, config=EngineConfig(lease_seconds=1),
                    providers=lambda _: provider)  # fmt: skip
    stalled = engine.run(task.task_id, keeper=lambda _: contextlib.nullcontext())
    assert stalled.outcome == "lease_lost"
    otel.flush()
    spans = receiver.spans
    assert len(by_id(spans)) == len(spans), "a span id was sent twice"
    (first,) = [s for s in spans if s.span_id == otel.run_span_id(task.task_id, 1)]
    assert first.attributes["error.type"] == "worker_lost" and first.attributes["agentq.worker_id"] == "w1"
    steps = [s for s in spans if s.name.startswith("step ") and s.parent_span_id == first.span_id]
    assert steps  # the stalled run's step, sent when it ended, under the span the taker sent
    assert otel.run_span_id(task.task_id, 2) in by_id(spans)


def test_the_steps_of_a_killed_run_hang_from_a_span_that_arrives_even_when_its_taker_is_killed_too(
    receiver: OtlpReceiver, settings: Settings
) -> None:
    """Run 1 is killed mid-task, its finished steps exported (a short batch delay). Run 2 takes
    over and makes run 1's ``run`` span (``lost_run``), then is killed within the batch
    processor's default delay (5 s: a task that crash-loops). Run 3 takes over from run 2 only
    (``Task.lost_claim`` is the last claim): unless run 2 flushed run 1's span as it made it,
    that span never arrives and run 1's steps hang from nothing."""
    from agentq.worker import run_task

    store = build_store(settings)
    turns = [{"text": "looking", "tool_calls": [call("lookup", query="a")]},
             {"text": "slow answer", "latency_seconds": 2}]  # fmt: skip
    task = store.tasks.create(scripted(turns, tools=["lookup"]), tenant="t")
    first = run_agentq(["run-task", task.task_id, "--lease", "1"], timeout=120, env=child_env(
        settings, OTEL_EXPORTER_OTLP_ENDPOINT=receiver.endpoint, OTEL_BSP_SCHEDULE_DELAY="100",
        AGENTQ_CRASH_AT="after_llm_call:2", AGENTQ_MAX_CALL_SECONDS="1"))  # fmt: skip
    assert first.returncode == -9, first.stderr[-2000:]
    second = run_agentq(["run-task", task.task_id, "--lease", "1", "--wait", "20"], timeout=120, env=child_env(
        settings, OTEL_EXPORTER_OTLP_ENDPOINT=receiver.endpoint,  # the SDK's default delay
        AGENTQ_CRASH_AT="after_llm_call:1", AGENTQ_MAX_CALL_SECONDS="1"))  # fmt: skip
    assert second.returncode == -9, second.stderr[-2000:]
    resumed = run_task(task.task_id, settings=settings, lease_seconds=1, wait_seconds=20)
    assert resumed.status is TaskStatus.SUCCEEDED, resumed
    otel.flush()
    spans = receiver.spans
    ids = {s.span_id for s in spans}
    assert [s for s in spans if s.name in ("step 1", "step 2")], "run 1's finished steps were exported"
    orphans = [s.name for s in spans if s.parent_span_id is not None and s.parent_span_id not in ids]
    assert orphans == [], orphans


class TakenOverThenOutage(TakenOverMidCall):
    """As ``TakenOverMidCall``, and the stalled worker's next write then fails for an outage (the
    store unreachable: what stalls a worker often fails its writes too), not with ``LeaseLost``."""

    def complete(self, request: Any) -> Any:
        answer = super().complete(request)
        if self.calls == 1:

            def unreachable(*_: Any, **__: Any) -> Any:
                raise ConnectionError("could not reach the table")

            self.store.steps.commit = unreachable  # type: ignore[method-assign]
        return answer


def test_a_stalled_run_taken_over_that_then_fails_for_an_outage_sends_no_second_span_of_its_claim(
    receiver: OtlpReceiver, store: Storage, registry: ToolRegistry
) -> None:
    """The taker sent the stalled claim's ``run`` span (``worker_lost``); the stalled run, raising
    for the outage, sent its own under the same id, as only a ``LeaseLost`` made it look."""
    task = store.tasks.create(scripted([{"text": "answered"}]), tenant="t")
    provider = TakenOverThenOutage(store, registry, task)
    engine = Engine(store, worker_id="w1", tools=registry, config=EngineConfig(lease_seconds=1),
                    providers=lambda _: provider)  # fmt: skip
    with pytest.raises(ConnectionError):
        engine.run(task.task_id, keeper=lambda _: contextlib.nullcontext())
    otel.flush()
    first = [s for s in receiver.spans if s.span_id == otel.run_span_id(task.task_id, 1)]
    assert [s.attributes["error.type"] for s in first] == ["worker_lost"]


def test_no_span_name_carries_a_task_id(receiver: OtlpReceiver, store: Storage, registry: ToolRegistry) -> None:
    """Span names name a class of operation, its ids are attributes (the trace API's span-name
    rule): ``run <task_id>`` made every claim of every task an operation of its own."""
    turns = [{"text": "looking", "tool_calls": [call("lookup", query="a")]}, {"text": "done"}]
    task = store.tasks.create(scripted(turns, tools=["lookup"]), tenant="t")
    assert run(store, registry, task.task_id, "w1") is TaskStatus.SUCCEEDED
    otel.flush()
    named = sorted({s.name for s in receiver.spans if task.task_id in s.name})
    assert named == [], named
    (made,) = [s for s in receiver.spans if s.name == "run"]
    assert made.attributes["agentq.task_id"] == task.task_id
