"""How the OpenTelemetry spans and metrics leave a worker (``observe/otel.py``,
``observe/otel_metrics.py``): what a run waits for on the collector, and what a sampler keeps.
Against a real OTLP/HTTP receiver (``tests/otlp_receiver.py``) and the real SDK."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pytest

from agentq.core.engine import Engine, EngineConfig
from agentq.core.tools import ToolRegistry
from agentq.observe import otel, otel_metrics
from agentq.storage.container import Storage

from tests.helpers import scripted
from tests.otlp_receiver import OtlpReceiver

STORAGE = "memory"


@pytest.fixture
def receiver(monkeypatch: pytest.MonkeyPatch) -> Iterator[OtlpReceiver]:
    with OtlpReceiver() as received:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", received.endpoint)
        # Nothing exported but by a flush: the SDK's own schedules never race the counts below.
        monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "600000")
        monkeypatch.setenv("OTEL_METRIC_EXPORT_INTERVAL", "600000")
        monkeypatch.delenv("AWS_LAMBDA_FUNCTION_NAME", raising=False)
        otel.reset()
        yield received
        otel.reset()


def run(store: Storage, registry: ToolRegistry, task_id: str, worker: str = "w1") -> Any:
    engine = Engine(store, worker_id=worker, tools=registry, config=EngineConfig(lease_seconds=30))
    return engine.run(task_id, keeper=lambda _: contextlib.nullcontext()).status


def _exporter_timeouts() -> tuple[float, float]:
    """The seconds the span and the metric exporter the process built wait on the collector,
    retries included, as the SDK resolved them (its own state: the SDK has no getter)."""
    spans = otel._provider()._active_span_processor._span_processors[0]._batch_processor._exporter
    metrics = otel_metrics._meter_provider()._metric_readers[0]._exporter
    return spans._client._timeout, metrics._client._timeout


def test_the_otlp_exporters_wait_on_a_collector_two_seconds_unless_the_sdks_timeout_setting_says(
    receiver: OtlpReceiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The SDK's default (10 s a request, retried with backoff within it) held each flush ~7-10 s
    with the ADOT sidecar down or hung, and every run waited for its flushes: 28-40 s a run.
    ``OTEL_EXPORTER_OTLP_TIMEOUT`` (or a signal's own) still decides when it is set."""
    assert _exporter_timeouts() == (2.0, 2.0)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TIMEOUT", "7")
    otel.reset()
    assert _exporter_timeouts() == (7.0, 7.0)
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_TIMEOUT")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", "9")
    otel.reset()
    assert _exporter_timeouts() == (9.0, 2.0)


def test_a_run_waits_on_the_collector_once_and_a_long_lived_worker_leaves_metrics_to_the_periodic_reader(
    receiver: OtlpReceiver, store: Storage, registry: ToolRegistry
) -> None:
    """Each flush waits on the collector (up to its timeout when it is down or hung): a run that
    ends its invocation sends its spans and the ``invoke_agent`` span in one export (it flushed
    twice: at the run's end and the invocation's); a worker outside Lambda sends no metric
    points at a run's end (its periodic reader does, every minute)."""
    task = store.tasks.create(scripted([{"text": "hi"}]), tenant="t")
    assert run(store, registry, task.task_id).value == "succeeded"
    assert receiver.paths == ["/v1/traces"]
    assert {s.name.split(" ")[0] for s in receiver.spans} >= {"invoke_agent", "run", "step", "chat"}


def test_a_lambdas_handler_flush_sends_the_metric_points_before_it_may_be_frozen(
    receiver: OtlpReceiver, store: Storage, registry: ToolRegistry, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In a Lambda the container may be frozen once the handler returns (no periodic reader runs
    then): the executor's ``otel.flush()`` sends the points too, once an invocation."""
    monkeypatch.setenv("AWS_LAMBDA_FUNCTION_NAME", "agentq-executor")
    task = store.tasks.create(scripted([{"text": "hi"}]), tenant="t")
    assert run(store, registry, task.task_id).value == "succeeded"
    otel.flush()  # functions/executor/handler.py, as it returns
    assert receiver.paths == ["/v1/traces", "/v1/metrics"]
    assert receiver.histogram("gen_ai.client.operation.duration")


def test_a_sampler_from_the_sdk_settings_keeps_or_drops_a_tasks_trace_whole(
    receiver: OtlpReceiver, store: Storage, registry: ToolRegistry, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``parentbased_traceidratio`` (the SDK's usual setting): the root ``invoke_agent`` span is
    sampled by its trace id, and every run hangs from a made-up remote parent: flagged SAMPLED
    whatever the sampler said of the root, the traces the ratio dropped arrived as runs, steps
    and model calls without their root. The flag is the sampler's decision on the trace id."""
    monkeypatch.setenv("OTEL_TRACES_SAMPLER", "parentbased_traceidratio")
    monkeypatch.setenv("OTEL_TRACES_SAMPLER_ARG", "0.5")
    otel.reset()
    tasks = [store.tasks.create(scripted([{"text": "hi"}]), tenant="t").task_id for _ in range(20)]
    for task_id in tasks:
        assert run(store, registry, task_id).value == "succeeded"
    otel.flush()
    kept, rootless = 0, []
    for task_id in tasks:
        spans = [s for s in receiver.spans if s.trace_id == otel.trace_id_of(task_id)]
        kept += bool(spans)
        if spans and not any(s.parent_span_id is None for s in spans):
            rootless.append(sorted(s.name.split(" ")[0] for s in spans))
    assert rootless == []
    assert 0 < kept < len(tasks)  # the ratio decided (the ids are random: 20 at 0.5, both ends ~1e-6)


def test_the_model_names_tenants_submit_mint_no_more_genai_metric_series_than_the_emf_metrics_allow(
    receiver: OtlpReceiver, store: Storage, registry: ToolRegistry
) -> None:
    """The EMF token metrics keep at most MAX_MODELS model values a process (``emf._model_dimension``:
    the scripted provider echoes any name it is given); the OTLP GenAI client metrics took every
    model a submission names as an attribute value: a series per name, held by the SDK for the
    process's life and exported every minute, at no cost to the tenant (scripted) or for a 404."""
    from agentq.control.validation import check_submission
    from agentq.observe.emf import MAX_MODELS

    for i in range(MAX_MODELS + 10):
        sub = scripted([{"text": "hi"}]).model_copy(update={"model": f"made-up-model-{i}"})
        check_submission(sub, registry)  # accepted as the API accepts it
        task = store.tasks.create(sub, tenant="t")
        assert run(store, registry, task.task_id).value == "succeeded"
    otel.flush(metrics=True)
    points = receiver.histogram("gen_ai.client.operation.duration")
    models = {p.attributes["gen_ai.request.model"] for p in points}
    assert len(models) == MAX_MODELS + 1 and "other" in models, sorted(models)
    assert {p.attributes["gen_ai.response.model"] for p in points} <= models
    chats = {s.name for s in receiver.spans if s.name.startswith("chat ")}
    assert len(chats) == MAX_MODELS + 10  # the spans name the model as given
