"""What the OpenTelemetry traces (``otel``) and metrics (``otel_metrics``) share: the switch that
turns both on, and the service they come from. Apart, so neither module imports the other's
providers to learn them."""

from __future__ import annotations

import os
from typing import Any

ENDPOINT_VARIABLE = "OTEL_EXPORTER_OTLP_ENDPOINT"
SERVICE_NAME = "agentq"


def configured() -> bool:
    """``OTEL_EXPORTER_OTLP_ENDPOINT`` is set: traces and metrics go there (the SDK adds the paths)."""
    return bool(os.environ.get(ENDPOINT_VARIABLE, "").strip())


def resource() -> Any:
    """The service the spans and the metrics come from (``OTEL_SERVICE_NAME``, default agentq)."""
    from opentelemetry.sdk.resources import Resource

    return Resource.create({"service.name": os.environ.get("OTEL_SERVICE_NAME") or SERVICE_NAME})
