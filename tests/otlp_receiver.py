"""A local OTLP/HTTP receiver: what an OpenTelemetry collector (ADOT, Honeycomb, Langfuse ...)
is to an exporter. It takes ``POST /v1/traces`` and ``POST /v1/metrics`` bodies as the OTLP
exporters send them (protobuf ``ExportTraceServiceRequest``, ``ExportMetricsServiceRequest``),
decodes them with opentelemetry-proto, and keeps every span and every histogram point for a test
to check."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue


@dataclass
class ReceivedSpan:
    trace_id: int
    span_id: int
    parent_span_id: int | None
    name: str
    attributes: dict[str, Any]
    events: list[tuple[str, dict[str, Any]]]
    status_code: int  # 0 unset, 1 ok, 2 error
    service: str
    start_ns: int = 0
    end_ns: int = 0
    kind: int = 0  # 1 internal, 2 server, 3 client (opentelemetry.proto.trace.v1.Span.SpanKind)


@dataclass
class HistogramPoint:
    """One exported point of a histogram (cumulative unless the exporter says delta)."""

    name: str
    unit: str
    attributes: dict[str, Any]
    count: int
    sum: float
    bounds: list[float]
    bucket_counts: list[int]
    time_ns: int
    service: str


@dataclass
class SumPoint:
    """One exported point of a counter (a monotonic sum; cumulative)."""

    name: str
    unit: str
    attributes: dict[str, Any]
    value: float
    time_ns: int


def _sum_point(metric: Any, point: Any) -> SumPoint:
    value = point.as_int if point.WhichOneof("value") == "as_int" else point.as_double
    attributes = {a.key: _value(a.value) for a in point.attributes}
    return SumPoint(metric.name, metric.unit, attributes, value, point.time_unix_nano)


def _value(value: AnyValue) -> Any:
    kind = value.WhichOneof("value")
    if kind == "array_value":
        return [_value(v) for v in value.array_value.values]
    return getattr(value, kind) if kind else None


@dataclass
class OtlpReceiver:
    spans: list[ReceivedSpan] = field(default_factory=list)
    points: list[HistogramPoint] = field(default_factory=list)
    sums: list[SumPoint] = field(default_factory=list)
    posts: int = 0
    bodies: list[bytes] = field(default_factory=list)  # every POST's body as received (a scan for bytes)
    paths: list[str] = field(default_factory=list)  # every POST's path, in order: each is one export

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.01}, daemon=True)

    @property
    def endpoint(self) -> str:
        """What ``OTEL_EXPORTER_OTLP_ENDPOINT`` is set to (the exporter adds ``/v1/traces``)."""
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> OtlpReceiver:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()

    def histogram(self, name: str) -> list[HistogramPoint]:
        """The latest point of each attribute set of histogram ``name`` (cumulative: the last
        export holds everything recorded before it)."""
        latest: dict[tuple[tuple[str, str], ...], HistogramPoint] = {}
        with self._lock:
            for point in self.points:
                if point.name != name:
                    continue
                key = tuple(sorted((k, repr(v)) for k, v in point.attributes.items()))
                if key not in latest or point.time_ns >= latest[key].time_ns:
                    latest[key] = point
        return list(latest.values())

    def counter(self, name: str) -> dict[tuple[tuple[str, Any], ...], float]:
        """The latest value of counter ``name`` per attribute set (cumulative)."""
        latest: dict[tuple[tuple[str, Any], ...], SumPoint] = {}
        with self._lock:
            for point in self.sums:
                key = tuple(sorted(point.attributes.items()))
                if point.name == name and (key not in latest or point.time_ns >= latest[key].time_ns):
                    latest[key] = point
        return {key: point.value for key, point in latest.items()}

    def receive_metrics(self, body: bytes) -> None:
        with self._lock:
            self.bodies.append(body)
        request = ExportMetricsServiceRequest.FromString(body)
        found: list[HistogramPoint] = []
        sums: list[SumPoint] = []
        for resource_metrics in request.resource_metrics:
            resource = {a.key: _value(a.value) for a in resource_metrics.resource.attributes}
            for scope in resource_metrics.scope_metrics:
                for metric in scope.metrics:
                    if metric.WhichOneof("data") == "sum":
                        sums += [_sum_point(metric, point) for point in metric.sum.data_points]
                    if metric.WhichOneof("data") != "histogram":
                        continue
                    for point in metric.histogram.data_points:
                        found.append(
                            HistogramPoint(
                                name=metric.name,
                                unit=metric.unit,
                                attributes={a.key: _value(a.value) for a in point.attributes},
                                count=point.count,
                                sum=point.sum,
                                bounds=list(point.explicit_bounds),
                                bucket_counts=list(point.bucket_counts),
                                time_ns=point.time_unix_nano,
                                service=str(resource.get("service.name")),
                            )
                        )
        with self._lock:
            self.points.extend(found)
            self.sums.extend(sums)
            self.posts += 1

    def receive(self, body: bytes) -> None:
        with self._lock:
            self.bodies.append(body)
        request = ExportTraceServiceRequest.FromString(body)
        found: list[ReceivedSpan] = []
        for resource_spans in request.resource_spans:
            resource = {a.key: _value(a.value) for a in resource_spans.resource.attributes}
            for scope in resource_spans.scope_spans:
                for span in scope.spans:
                    found.append(
                        ReceivedSpan(
                            trace_id=int.from_bytes(span.trace_id, "big"),
                            span_id=int.from_bytes(span.span_id, "big"),
                            parent_span_id=int.from_bytes(span.parent_span_id, "big") if span.parent_span_id else None,
                            name=span.name,
                            attributes={a.key: _value(a.value) for a in span.attributes},
                            events=[(e.name, {a.key: _value(a.value) for a in e.attributes}) for e in span.events],
                            status_code=span.status.code,
                            service=str(resource.get("service.name")),
                            start_ns=span.start_time_unix_nano,
                            end_ns=span.end_time_unix_nano,
                            kind=span.kind,
                        )
                    )
        with self._lock:
            self.spans.extend(found)
            self.posts += 1


def _handler(receiver: OtlpReceiver) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("content-length") or 0))
            with receiver._lock:
                receiver.paths.append(self.path)
            # Each path: what takes the body, and the (empty) answer the exporter expects.
            routes: dict[str, tuple[Callable[[bytes], None], bytes]] = {
                "/v1/traces": (receiver.receive, ExportTraceServiceResponse().SerializeToString()),
                "/v1/metrics": (receiver.receive_metrics, ExportMetricsServiceResponse().SerializeToString()),
            }
            route = routes.get(self.path)
            if route is None or self.headers.get("content-type") != "application/x-protobuf":
                self.send_response(404)
                self.send_header("content-length", "0")
                self.end_headers()
                return
            take, payload = route
            take(body)
            self.send_response(200)
            self.send_header("content-type", "application/x-protobuf")
            self.send_header("content-length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    return Handler
