"""Observability of real tasks: the EMF metrics they print (tokens per model, steps,
outcomes, tool errors, budget refusals, submissions), the task fields on every log line (also
across the worker's threads), and the X-Ray subsegments of LLM and tool calls."""

from __future__ import annotations

import io
import itertools
import json
import logging
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from aws_lambda_powertools import Logger, Tracer

from agentq import observe
from agentq.api.http_server import proxy_event
from agentq.control.submit import submit
from agentq.core.engine import Engine, EngineConfig
from agentq.core.models import LLMStep, TaskStatus, Usage
from agentq.core.tools import ToolRegistry, tool
from agentq.observe import names
from agentq.observe.tracing import active_tracer
from agentq.queueing.queues import TaskQueues
from agentq.resources import QueueSettings, provision
from agentq.runtime import Settings, build_queues, build_registry, build_store, session
from agentq.storage.container import Storage
from agentq.worker import Worker, WorkerConfig
from agentq_dev.moto_server import MotoServer

from tests.helpers import call, deployment, scripted, wait_for
from tests.lambda_support import FakeLambdaContext, load_handler, sqs_event

SHOUTS = logging.getLogger("agentq.tests.shout")


@tool
def shout(text: str) -> str:
    """Say it louder; 'boom' makes it raise. Logs from the tool's own thread."""
    SHOUTS.info("shouting %s", text)
    if text == "boom":
        raise RuntimeError("boom")
    return text.upper()


def shout_registry(settings: Settings) -> ToolRegistry:
    registry = build_registry(settings)
    registry.register(shout)
    return registry


def engine_for(store: Storage, registry: ToolRegistry) -> Engine:
    return Engine(store, worker_id="obs:1", tools=registry, config=EngineConfig(lease_seconds=5))


# -- EMF ------------------------------------------------------------------------------------


def emf_documents(out: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in out.splitlines() if line.startswith("{") and '"_aws"' in line]


def metric_total(docs: list[dict[str, Any]], name: str, **dimensions: str) -> float:
    """Sum of ``name`` over documents whose dimensions are exactly ``dimensions``."""
    total = 0.0
    for doc in docs:
        directive = doc["_aws"]["CloudWatchMetrics"][0]
        assert directive["Namespace"] == names.NAMESPACE
        if name not in {m["Name"] for m in directive["Metrics"]}:
            continue
        if set(directive["Dimensions"][0]) != set(dimensions) or any(doc[k] != v for k, v in dimensions.items()):
            continue
        value = doc[name]
        total += sum(value) if isinstance(value, list) else value
    return total


def usage_by_model(store: Storage, task_ids: list[str]) -> dict[str, tuple[int, int]]:
    """(tokens in, tokens out) the tasks' committed LLM steps were charged, per model."""
    out: dict[str, tuple[int, int]] = {}
    for task_id in task_ids:
        for step in store.steps.load(task_id):
            if isinstance(step.body, LLMStep):
                u = step.body.usage
                tin, tout = out.get(step.body.model, (0, 0))
                read = u.input_tokens + u.cache_creation_input_tokens + u.cache_read_input_tokens
                out[step.body.model] = (tin + read, tout + u.output_tokens)
    return out


@pytest.fixture
def lambda_env(moto_server: MotoServer, monkeypatch: pytest.MonkeyPatch) -> Settings:
    """A deployment's settings in the environment, as in Lambda (so metrics are recorded)."""
    settings = Settings.for_prefix(
        f"o{uuid.uuid4().hex[:10]}", moto_server.endpoint_url, tool_modules=("tests.effect_tools",)
    )
    provision(
        session(settings), settings.names, endpoint_url=settings.endpoint_url, queues=QueueSettings(max_receive_count=3)
    )
    for key, value in settings.env().items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("AWS_LAMBDA_FUNCTION_NAME", "agentq-test")
    for key in ("AGENTQ_EMF", "POWERTOOLS_METRICS_DISABLED", "POWERTOOLS_DEV"):
        monkeypatch.delenv(key, raising=False)
    observe.metrics.clear_metrics()
    observe.api_metrics.clear_metrics()
    return settings


def _drain_with_executor(
    handler: Any, queues: TaskQueues, store: Storage, task_ids: list[str], tier: str = "normal"
) -> None:
    arn = queues.sqs.get_queue_attributes(QueueUrl=queues.url(tier), AttributeNames=["QueueArn"])["Attributes"][
        "QueueArn"
    ]
    deadline = time.monotonic() + 60
    while not all(store.tasks.get(t).status.terminal for t in task_ids):
        assert time.monotonic() < deadline, "tasks did not finish"
        messages = queues.sqs.receive_message(
            QueueUrl=queues.url(tier),
            MaxNumberOfMessages=1,
            WaitTimeSeconds=1,
            AttributeNames=["All"],
            VisibilityTimeout=30,
        ).get("Messages", [])
        if not messages:
            continue
        result = handler.lambda_handler(sqs_event(messages, arn), FakeLambdaContext(60))
        assert result["batchItemFailures"] == []
        queues.delete(tier, messages[0]["ReceiptHandle"])


def test_the_executor_emits_tokens_per_model_equal_to_what_the_tasks_were_charged(
    lambda_env: Settings, capsys: pytest.CaptureFixture[str]
) -> None:
    store, queues, registry = build_store(lambda_env), build_queues(lambda_env), build_registry(lambda_env)
    haiku = scripted(
        [{"text": "looking", "tool_calls": [call("lookup", query="a", size=900)]}, {"text": "found it " * 40}],
        tools=["lookup"],
    )
    sonnet = scripted([{"text": "straight answer " * 20}])
    tasks = [
        submit(
            store, registry, haiku.model_copy(update={"model": "claude-haiku-4-5"}), tenant="t", queues=queues
        ).task_id,
        submit(
            store, registry, sonnet.model_copy(update={"model": "claude-sonnet-4-6"}), tenant="t", queues=queues
        ).task_id,
    ]
    handler = load_handler("executor")
    capsys.readouterr()
    _drain_with_executor(handler, queues, store, tasks)
    docs = emf_documents(capsys.readouterr().out)

    charged = usage_by_model(store, tasks)
    assert set(charged) == {"claude-haiku-4-5", "claude-sonnet-4-6"}
    for model, (tokens_in, tokens_out) in charged.items():
        dims = {names.SERVICE: names.EXECUTOR, names.MODEL: model}
        assert metric_total(docs, names.TOKENS_IN, **dims) == tokens_in > 0
        assert metric_total(docs, names.TOKENS_OUT, **dims) == tokens_out > 0
    executor = {names.SERVICE: names.EXECUTOR}
    steps = sum(len(store.steps.load(t)) for t in tasks)
    assert metric_total(docs, names.STEPS_COMMITTED, **executor) == steps == 4
    assert metric_total(docs, names.task_outcome("succeeded"), **executor) == 2
    assert metric_total(docs, names.PICKUP_LATENCY, **executor) > 0
    assert metric_total(docs, names.TOOL_ERRORS, **executor, tool="lookup") == 0


def test_the_executor_emits_each_pickup_latency_under_its_tasks_tier_too(
    lambda_env: Settings, capsys: pytest.CaptureFixture[str]
) -> None:
    """Each tier has its own pickup objective and the stack alarms each tier's p99 at its own
    (infra/alarms.py): a first claim's latency goes out under ``tier`` as well as fleet-wide."""
    store, queues, registry = build_store(lambda_env), build_queues(lambda_env), build_registry(lambda_env)
    by_tier = {
        tier: submit(store, registry, scripted([{"text": "done"}]).model_copy(update={"priority": tier}),
                     tenant="t", queues=queues).task_id
        for tier in ("high", "normal")
    }  # fmt: skip
    handler = load_handler("executor")
    capsys.readouterr()
    for tier, task_id in by_tier.items():
        _drain_with_executor(handler, queues, store, [task_id], tier=tier)
    docs = emf_documents(capsys.readouterr().out)

    executor = {names.SERVICE: names.EXECUTOR}
    per_tier = {tier: metric_total(docs, names.PICKUP_LATENCY, **executor, tier=tier) for tier in (*by_tier, "low")}
    assert per_tier["high"] > 0 and per_tier["normal"] > 0 and per_tier["low"] == 0, per_tier
    assert per_tier["high"] + per_tier["normal"] == pytest.approx(metric_total(docs, names.PICKUP_LATENCY, **executor))


def test_failing_tool_calls_count_as_tool_errors_under_the_registered_name_or_unregistered(
    settings: Settings, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("AGENTQ_EMF", "1")  # the long-running worker's switch
    monkeypatch.delenv("POWERTOOLS_METRICS_DISABLED", raising=False)
    store, registry = build_store(settings), shout_registry(settings)
    turns = [
        {"text": "", "tool_calls": [call("shout", text="boom"), call("shout", text="fine"), call("made_up_tool", x=1)]},
        {"text": "", "tool_calls": [call("shout", text="boom")]},
        {"text": "done"},
    ]
    task = submit(store, registry, scripted(turns, tools=["shout"]), tenant="t")
    capsys.readouterr()
    engine_for(store, registry).run(task.task_id)
    docs = emf_documents(capsys.readouterr().out)
    assert store.tasks.get(task.task_id).status is TaskStatus.SUCCEEDED
    assert metric_total(docs, names.TOOL_ERRORS, service=names.EXECUTOR, tool="shout") == 2
    assert metric_total(docs, names.TOOL_ERRORS, service=names.EXECUTOR, tool=names.UNREGISTERED_TOOL) == 1
    assert not any("made_up_tool" in json.dumps(doc) for doc in docs)  # the model's words mint no series


def test_a_task_whose_own_budget_refuses_its_call_counts_a_task_budget_refusal(
    settings: Settings, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("AGENTQ_EMF", "1")
    store, registry = build_store(settings), build_registry(settings)
    task = submit(store, registry, scripted([{"text": "never said"}], max_tokens=20), tenant="t")
    capsys.readouterr()
    result = engine_for(store, registry).run(task.task_id)
    docs = emf_documents(capsys.readouterr().out)
    assert result.status is TaskStatus.COST_EXCEEDED
    assert metric_total(docs, names.BUDGET_REFUSALS, service=names.EXECUTOR, budget="task") == 1
    assert metric_total(docs, names.TOKENS_IN, service=names.EXECUTOR, model="claude-sonnet-4-6") == 0  # no call made


def test_tokens_in_counts_cached_input_too_and_cache_metrics_appear_only_when_used(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("AGENTQ_EMF", "1")
    capsys.readouterr()
    observe.emf.record_llm_usage(
        "claude-opus-4-5",
        Usage(input_tokens=10, output_tokens=5, cache_creation_input_tokens=100, cache_read_input_tokens=1000),
    )
    observe.emf.record_llm_usage("claude-opus-4-5", Usage(input_tokens=3, output_tokens=2))
    docs = emf_documents(capsys.readouterr().out)
    dims = {names.SERVICE: names.EXECUTOR, names.MODEL: "claude-opus-4-5"}
    assert len(docs) == 2  # one document per call, all its token metrics in it
    assert (metric_total(docs, names.TOKENS_IN, **dims), metric_total(docs, names.TOKENS_OUT, **dims)) == (1113, 7)
    assert metric_total(docs, names.CACHE_READ_TOKENS, **dims) == 1000
    assert metric_total(docs, names.CACHE_WRITE_TOKENS, **dims) == 100
    assert names.CACHE_READ_TOKENS not in docs[1]


def test_past_max_models_distinct_models_share_the_other_series(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("AGENTQ_EMF", "1")
    monkeypatch.setattr(observe.emf, "_models", set())
    monkeypatch.setattr(observe.emf, "MAX_MODELS", 2)
    capsys.readouterr()
    for model in ("m-1", "m-2", "m-3", "m-4", "m-1"):
        observe.emf.record_llm_usage(model, Usage(input_tokens=1, output_tokens=1))
    seen = [doc[names.MODEL] for doc in emf_documents(capsys.readouterr().out)]
    assert seen == ["m-1", "m-2", names.OTHER_MODEL, names.OTHER_MODEL, "m-1"]


def test_metrics_go_nowhere_and_are_not_kept_outside_lambda_without_agentq_emf(
    settings: Settings, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    for key in ("AGENTQ_EMF", "AWS_LAMBDA_FUNCTION_NAME"):
        monkeypatch.delenv(key, raising=False)
    store, registry = build_store(settings), shout_registry(settings)
    task = submit(
        store,
        registry,
        scripted([{"text": "", "tool_calls": [call("shout", text="boom")]}, {"text": "ok"}], tools=["shout"]),
        tenant="t",
    )
    capsys.readouterr()
    engine_for(store, registry).run(task.task_id)
    assert emf_documents(capsys.readouterr().out) == []
    assert not observe.metrics.metric_set


def test_the_api_handler_counts_each_created_task_once_and_flushes_per_invocation(
    lambda_env: Settings, capsys: pytest.CaptureFixture[str]
) -> None:
    handler = load_handler("api")
    body = json.dumps({"goal": "say hi", "provider": "scripted", "script": {"turns": [{"text": "hi"}]}})
    key = {"Content-Type": "application/json", "Idempotency-Key": f"k-{uuid.uuid4().hex}"}
    capsys.readouterr()
    statuses = []
    for headers in (key, key, {"Content-Type": "application/json"}):  # the second is a replay
        resp = handler.lambda_handler(proxy_event("POST", "/tasks", headers, body, tenant="t"), FakeLambdaContext(30))
        statuses.append(resp["statusCode"])
        flushed = emf_documents(capsys.readouterr().out)
        assert metric_total(flushed, names.TASKS_SUBMITTED, service=names.API) == (0 if len(statuses) == 2 else 1)
    assert statuses == [202, 202, 202]
    handler.lambda_handler(proxy_event("GET", "/tasks", {}, None, tenant="t"), FakeLambdaContext(30))
    assert metric_total(emf_documents(capsys.readouterr().out), names.TASKS_SUBMITTED, service=names.API) == 0


# -- logs -----------------------------------------------------------------------------------


def json_logger(stream: io.StringIO) -> Logger:
    """A fresh powertools Logger (a new service name: powertools reuses a configured one)."""
    logger = Logger(service=f"obs-{uuid.uuid4().hex[:8]}", stream=stream, level="DEBUG")
    observe.route_core_logs(logger)
    return logger


def core_lines(stream: io.StringIO) -> list[dict[str, Any]]:
    lines = [json.loads(line) for line in stream.getvalue().splitlines() if line.strip()]
    return [line for line in lines if str(line.get("name", "")).startswith("agentq")]


def test_every_core_log_line_of_a_task_is_json_with_its_task_id_step_epoch_and_worker(settings: Settings) -> None:
    stream = io.StringIO()
    json_logger(stream)
    store, registry = build_store(settings), shout_registry(settings)
    turns = [
        {"text": "", "tool_calls": [call("shout", text="hello")]},
        {"text": "", "tool_calls": [call("shout", text="boom")]},
        {"text": "done"},
    ]
    task = submit(store, registry, scripted(turns, tools=["shout"]), tenant="t")
    engine_for(store, registry).run(task.task_id)

    lines = core_lines(stream)
    assert lines and all(line["task_id"] == task.task_id for line in lines)
    assert all(line["lease_epoch"] == 1 and line["worker_id"] == "obs:1" for line in lines)
    committed = {line["step"]: line["kind"] for line in lines if line["message"].endswith("step committed")}
    assert committed == {1: "llm", 2: "tools", 3: "llm", 4: "tools", 5: "llm"}
    shouts = {line["message"]: line["step"] for line in lines if line["name"] == "agentq.tests.shout"}
    assert shouts == {"shouting hello": 2, "shouting boom": 4}  # logged from the tool's own thread
    raised = [line for line in lines if line["name"] == "agentq.tools" and "raised" in line["message"]]
    assert len(raised) == 1 and raised[0]["step"] == 4 and raised[0]["level"] == "INFO"
    assert {"service", "timestamp", "location"} <= set(lines[0])  # powertools' shape


def test_concurrent_tasks_on_the_worker_threads_each_log_their_own_task_id(moto_server: MotoServer) -> None:
    stream = io.StringIO()
    json_logger(stream)
    settings = deployment(moto_server)
    store, queues, registry = build_store(settings), build_queues(settings), shout_registry(settings)
    markers: dict[str, str] = {}
    for name in ("red", "blue", "green"):
        turns = [
            {"text": "", "latency_seconds": 0.5, "tool_calls": [call("shout", text=f"{name}-{i}")]} for i in range(3)
        ]
        task = submit(store, registry, scripted([*turns, {"text": "done"}], tools=["shout"]), tenant="t", queues=queues)
        markers[name] = task.task_id
    engine = Engine(
        store, worker_id="obs:worker", tools=registry, config=EngineConfig(lease_seconds=3, heartbeat_seconds=0.5)
    )
    worker = Worker(
        settings,
        WorkerConfig(concurrency=4, lease_seconds=3, heartbeat_seconds=0.5, visibility_seconds=10),
        engine=engine,
    )
    worker.start()
    try:
        wait_for(
            lambda: all(store.tasks.get(t).status is TaskStatus.SUCCEEDED for t in markers.values()),
            60,
            "all three tasks done",
        )
    finally:
        worker.shutdown()

    shouts = [line for line in core_lines(stream) if line["name"] == "agentq.tests.shout"]
    assert len(shouts) == 9
    for line in shouts:
        name = line["message"].removeprefix("shouting ").split("-")[0]
        assert line["task_id"] == markers[name], line
    ids = [line["task_id"] for line in shouts]
    switches = sum(a != b for a, b in itertools.pairwise(ids))
    assert switches > 2, "the tasks ran one after another, so this proved nothing about threads"


def test_worker_cli_json_logging_puts_the_task_fields_at_top_level(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    root = logging.getLogger()
    saved = (list(root.handlers), root.level)
    monkeypatch.setenv("AGENTQ_LOG_FORMAT", "json")
    monkeypatch.setenv("POWERTOOLS_SERVICE_NAME", f"agentq-worker-{uuid.uuid4().hex[:6]}")
    try:
        observe.configure_process_logging(logging.INFO)
        with observe.task_context(task_id="task-1", worker_id="host:42"):
            observe.bind(step=7, lease_epoch=2)
            logging.getLogger("agentq.worker").info("in a task")
        logging.getLogger("agentq.worker").info("between tasks")
        first, second = (json.loads(line) for line in capsys.readouterr().out.strip().splitlines()[-2:])
    finally:
        root.handlers[:] = saved[0]
        root.setLevel(saved[1])
    assert first["message"] == "in a task" and first["name"] == "agentq.worker"
    assert (first["task_id"], first["step"], first["lease_epoch"], first["worker_id"]) == ("task-1", 7, 2, "host:42")
    assert second["message"] == "between tasks" and "task_id" not in second


def test_text_logging_ends_lines_in_a_task_with_its_fields() -> None:
    formatter = observe.logs.CorrelatedTextFormatter("%(name)s %(message)s")
    record = logging.LogRecord("agentq.engine", logging.INFO, __file__, 1, "hello", None, None)
    with observe.task_context(task_id="t-9"):
        observe.bind(step=2)
        observe.CorrelationFilter().filter(record)
    assert formatter.format(record) == "agentq.engine hello [task_id=t-9 step=2]"


# -- traces ---------------------------------------------------------------------------------


class MemoryEmitter:
    """Stands in for the UDP emitter to the X-Ray daemon."""

    def __init__(self) -> None:
        self.entities: list[Any] = []
        self._lock = threading.Lock()

    def send_entity(self, entity: Any) -> None:
        with self._lock:
            self.entities.append(entity)

    def set_daemon_address(self, address: str | None) -> None:
        pass

    @property
    def ip(self) -> str:
        return "127.0.0.1"

    @property
    def port(self) -> int:
        return 2000


def walk(entity: Any) -> Iterator[Any]:
    yield entity
    for child in getattr(entity, "subsegments", []):
        yield from walk(child)


@pytest.fixture
def xray(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Any, MemoryEmitter]]:
    """Tracing as in Lambda, into memory: a recorder of our own that samples everything."""
    from aws_xray_sdk import global_sdk_config
    from aws_xray_sdk.core.context import Context
    from aws_xray_sdk.core.recorder import AWSXRayRecorder

    was_enabled = global_sdk_config.sdk_enabled()
    recorder = AWSXRayRecorder()
    emitter = MemoryEmitter()
    recorder.configure(emitter=emitter, sampling=False, context=Context(), context_missing="RUNTIME_ERROR")
    monkeypatch.setenv("LAMBDA_TASK_ROOT", "/var/task")
    monkeypatch.delenv("POWERTOOLS_TRACE_DISABLED", raising=False)
    global_sdk_config.set_sdk_enabled(True)
    Tracer._reset_config()
    Tracer(provider=recorder, disabled=False, auto_patch=False)
    active_tracer.cache_clear()
    try:
        yield recorder, emitter
    finally:
        Tracer._reset_config()
        active_tracer.cache_clear()
        global_sdk_config.set_sdk_enabled(was_enabled)


def test_llm_and_tool_calls_are_subsegments_with_genai_annotations(
    settings: Settings, xray: tuple[Any, MemoryEmitter]
) -> None:
    recorder, emitter = xray
    store, registry = build_store(settings), shout_registry(settings)
    turns = [{"text": "", "tool_calls": [call("shout", text="hello"), call("shout", text="boom")]}, {"text": "done"}]
    task = submit(
        store, registry, scripted(turns, tools=["shout"]).model_copy(update={"model": "claude-haiku-4-5"}), tenant="t"
    )
    segment = recorder.begin_segment("agentq-executor")
    engine_for(store, registry).run(task.task_id)
    recorder.end_segment()

    entities = [e for sent in emitter.entities for e in walk(sent)]
    assert segment in emitter.entities
    llm = [e for e in entities if e.name == "chat claude-haiku-4-5"]
    tools = [e for e in entities if e.name == "execute_tool shout"]
    assert len(llm) == 2 and len(tools) == 2
    steps = [s.body for s in store.steps.load(task.task_id) if isinstance(s.body, LLMStep)]
    for sub, step, number in zip(llm, steps, (1, 3), strict=True):
        a = sub.annotations
        assert a["gen_ai_operation_name"] == "chat" and a["gen_ai_request_model"] == "claude-haiku-4-5"
        assert a["gen_ai_usage_input_tokens"] == step.usage.input_tokens > 0
        assert a["gen_ai_usage_output_tokens"] == step.usage.output_tokens
        assert a["gen_ai_response_finish_reasons"] == step.stop_reason
        assert (a["task_id"], a["step"]) == (task.task_id, number)
        assert sub.metadata["gen_ai"]["gen_ai.usage.output_tokens"] == step.usage.output_tokens
    assert [s.stop_reason for s in steps] == ["tool_use", "end_turn"]
    ok, failed = tools
    expected = {
        "gen_ai_tool_name": "shout",
        "tool_status": "ok",
        "tool_error": False,
        "task_id": task.task_id,
        "step": 2,
    }
    assert expected.items() <= ok.annotations.items()
    assert failed.annotations["tool_status"] == "error" and failed.annotations["tool_error"] is True
    assert ok.metadata["gen_ai"]["gen_ai.tool.call.id"].startswith("toolu_")


def test_a_provider_error_is_recorded_on_the_llm_subsegment(
    settings: Settings, xray: tuple[Any, MemoryEmitter]
) -> None:
    from agentq.core.errors import ProviderError

    recorder, emitter = xray
    store, registry = build_store(settings), build_registry(settings)
    task = submit(store, registry, scripted([{"text": "x"}]), tenant="t")

    class Refusing:
        name = "anthropic"

        def complete(self, request: Any) -> Any:
            raise ProviderError("bad request", retryable=False, status_code=400, attempts=1)

    engine = Engine(
        store, worker_id="obs:1", tools=registry, providers=lambda sub: Refusing(), config=EngineConfig(lease_seconds=5)
    )
    recorder.begin_segment("agentq-executor")
    assert engine.run(task.task_id).status is TaskStatus.FAILED
    recorder.end_segment()
    (sub,) = [e for sent in emitter.entities for e in walk(sent) if e.name.startswith("chat ")]
    assert sub.annotations["gen_ai_provider_name"] == "anthropic"
    assert sub.fault
    assert sub.cause["exceptions"][0].type == "ProviderError"


def test_tracing_outside_lambda_is_a_no_op_that_builds_no_tracer(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LAMBDA_TASK_ROOT", raising=False)
    active_tracer.cache_clear()
    try:
        assert active_tracer() is None
        with observe.tool_call("shout", registered=True, call_id="c", task_id="t", step=1) as tool_call:
            assert not tool_call.span.recording
    finally:
        active_tracer.cache_clear()
