"""What the OpenTelemetry traces (``otel``) and metrics (``otel_metrics``) share: the switch that
turns both on, and the service they come from. Apart, so neither module imports the other's
providers to learn them."""

from __future__ import annotations

import os
from typing import Any

ENDPOINT_VARIABLE = "OTEL_EXPORTER_OTLP_ENDPOINT"
SERVICE_NAME = "agentq"
# How long one export may wait on the collector, retries included, unless the SDK's own setting
# says: the SDK's default (10 s, retried with backoff) held every run 28-40 s when the ADOT sidecar
# was down or hung, as the worker slot (a Lambda invocation) waits for the run's flush.
TIMEOUT_VARIABLE = "OTEL_EXPORTER_OTLP_TIMEOUT"
EXPORT_TIMEOUT_SECONDS = 2.0


def configured() -> bool:
    """``OTEL_EXPORTER_OTLP_ENDPOINT`` is set: traces and metrics go there (the SDK adds the paths)."""
    return bool(os.environ.get(ENDPOINT_VARIABLE, "").strip())


def export_timeout(signal_variable: str) -> float | None:
    """The ``timeout`` to build an exporter with: None (the SDK reads its settings) when
    ``OTEL_EXPORTER_OTLP_TIMEOUT`` or the signal's own (``signal_variable``) is set, else
    ``EXPORT_TIMEOUT_SECONDS``: a collector that is down or hung costs a run that long, once."""
    if os.environ.get(TIMEOUT_VARIABLE, "").strip() or os.environ.get(signal_variable, "").strip():
        return None
    return EXPORT_TIMEOUT_SECONDS


def in_lambda() -> bool:
    """Running in a Lambda, which may be frozen once its handler returns."""
    return bool(os.environ.get("AWS_LAMBDA_FUNCTION_NAME"))


def resource() -> Any:
    """The service the spans and the metrics come from (``OTEL_SERVICE_NAME``, default agentq)."""
    from opentelemetry.sdk.resources import Resource

    return Resource.create({"service.name": os.environ.get("OTEL_SERVICE_NAME") or SERVICE_NAME})
