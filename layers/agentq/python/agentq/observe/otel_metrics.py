"""OpenTelemetry's GenAI client metrics by OTLP/HTTP, beside the traces (``observe/otel.py``) and
under the same switch: ``OTEL_EXPORTER_OTLP_ENDPOINT`` set and the ``otel`` extra installed.

Two histograms, as the GenAI semantic conventions name them (gen-ai-metrics.md), with their
units and the bucket boundaries they advise:

- ``gen_ai.client.operation.duration`` (``s``): every model call, answered or failed (a failure
  carries ``error.type``), retries included: what the caller waited;
- ``gen_ai.client.token.usage`` (``{token}``): each answered call's input and output tokens, one
  record each (``gen_ai.token.type`` ``input`` or ``output``), as billed: input counts cache reads
  and writes too, as ``gen_ai.usage.input_tokens`` does.

The points are exported every minute (the SDK's periodic reader; ``OTEL_METRIC_EXPORT_INTERVAL``)
and, in a Lambda, as its handler returns (``otel.flush``: it may be frozen right after).
Temporality and every other ``OTEL_EXPORTER_OTLP_*`` setting are the SDK's own;
``OTEL_METRICS_EXPORTER=none`` leaves the metrics out (for a collector that takes traces only). CloudWatch EMF
keeps its own metrics (``observe/emf.py``); these are for the backends that read OTLP.
"""

from __future__ import annotations

import functools
import logging
import os
import threading
from collections.abc import Mapping
from typing import Any

from agentq.observe import names
from agentq.observe.otlp import configured, export_timeout, resource

UNKNOWN_TOKENS = "agentq.budget.unknown_tokens"  # not a GenAI convention: agentq's own, in its namespace

log = logging.getLogger("agentq.observe")

# The SDK's own switch, honoured here: "none" sends traces only (a collector with no metrics pipeline).
EXPORTER_VARIABLE = "OTEL_METRICS_EXPORTER"
TOKEN_USAGE = "gen_ai.client.token.usage"
OPERATION_DURATION = "gen_ai.client.operation.duration"
# The boundaries the conventions advise for each (ExplicitBucketBoundaries).
TOKEN_BUCKETS = (1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304, 16777216, 67108864)
DURATION_BUCKETS = (0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92)

MetricAttributes = Mapping[str, str | int]

# A metric series per distinct attribute set, held by the SDK for the process's life and exported
# every minute: the model names a submission gives are the tenant's to choose (the scripted
# provider echoes any; an unknown one is a 404, at no cost), so a process keeps at most
# ``names.MAX_MODELS`` of them, as the EMF metrics do (``emf._model_dimension``); beyond, "other".
# The spans keep the name as given.
MODEL_ATTRIBUTES = ("gen_ai.request.model", "gen_ai.response.model")
_models: set[str] = set()
_models_lock = threading.Lock()


@functools.cache
def _meter_provider() -> Any:
    """The process's MeterProvider, or None (decided once, as the TracerProvider is)."""
    if not configured() or os.environ.get(EXPORTER_VARIABLE, "").strip() == "none":
        return None
    try:
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
    except ImportError:
        return None  # otel.py has said so once already
    timeout = export_timeout("OTEL_EXPORTER_OTLP_METRICS_TIMEOUT")
    exporter = OTLPMetricExporter(timeout=timeout)  # and the other OTEL_EXPORTER_OTLP_* settings
    reader = PeriodicExportingMetricReader(exporter)
    return MeterProvider(resource=resource(), metric_readers=[reader])


@functools.cache
def _instruments() -> tuple[Any, Any] | None:
    provider = _meter_provider()
    if provider is None:
        return None
    meter = provider.get_meter("agentq")
    tokens = meter.create_histogram(
        TOKEN_USAGE, unit="{token}", description="Number of input and output tokens used.",
        explicit_bucket_boundaries_advisory=list(TOKEN_BUCKETS),
    )  # fmt: skip
    duration = meter.create_histogram(
        OPERATION_DURATION, unit="s", description="GenAI operation duration.",
        explicit_bucket_boundaries_advisory=list(DURATION_BUCKETS),
    )  # fmt: skip
    return tokens, duration


def record_call(attributes: MetricAttributes, seconds: float, tokens: tuple[int, int] | None) -> None:
    """One model call: its duration and, when it answered, its (input, output) tokens.
    ``attributes``: the call's operation, provider, models, server and, when it failed, ``error.type``."""
    found = _instruments()
    if found is None:
        return
    token_usage, duration = found
    attributes = {key: _bounded_model(value) if key in MODEL_ATTRIBUTES else value for key, value in attributes.items()}
    duration.record(seconds, attributes=attributes)
    if tokens is not None:
        for kind, count in zip(("input", "output"), tokens, strict=True):
            token_usage.record(count, attributes={**attributes, "gen_ai.token.type": kind})


def _bounded_model(model: str | int) -> str | int:
    with _models_lock:
        if model in _models:
            return model
        if len(_models) < names.MAX_MODELS:
            _models.add(str(model))
            return model
    return names.OTHER_MODEL


@functools.cache
def _unknown_counter() -> Any:
    provider = _meter_provider()
    if provider is None:
        return None
    return provider.get_meter("agentq").create_counter(
        UNKNOWN_TOKENS, unit="{token}",
        description="Tokens of model calls counted at their budget holds because their outcome is unknown.",
    )  # fmt: skip


def record_unknown(tenant: str, tokens: int) -> None:
    """A hold counted as spent with its call's outcome unknown: ``tokens`` of it not known to be
    billed (its hold less what its stream said), for the tenant's bill to show apart."""
    counter = _unknown_counter()
    if counter is not None and tokens > 0:
        counter.add(tokens, attributes={"agentq.tenant": tenant})


def flush(timeout_millis: int) -> bool:
    provider = _meter_provider()
    return provider is None or bool(provider.force_flush(timeout_millis))


def reset() -> None:
    with _models_lock:
        _models.clear()
    _unknown_counter.cache_clear()
    provider = _meter_provider()
    if provider is not None:
        provider.shutdown()
    _instruments.cache_clear()
    _meter_provider.cache_clear()
