"""Lambda executor: an SQS event (batch size 1) -> run the task until the time slice ends.

A thin adapter: the policy lives in ``agentq.queueing.dispatch`` (composed by ``agentq.runtime.build_dispatcher``). It stops ``SLICE_MARGIN_SECONDS``
before the Lambda's deadline, commits, sends a continuation message and returns, so a
24-hour task runs as a chain of invocations. Failures are reported per record (powertools
partial batch response) so only the failed message comes back.

Observability: the core's log lines go out as this Logger's JSON (with the task id and step),
the Tracer patches the AWS SDK and holds the core's LLM and tool subsegments, and the shared
metric set is flushed after each invocation (``agentq.observe``).
"""

from __future__ import annotations

import os
import time
from typing import Any

from aws_lambda_powertools import Logger, Tracer
from aws_lambda_powertools.utilities.batch import BatchProcessor, EventType, process_partial_response
from aws_lambda_powertools.utilities.batch.types import PartialItemFailureResponse
from aws_lambda_powertools.utilities.data_classes.sqs_event import SQSRecord
from aws_lambda_powertools.utilities.typing import LambdaContext

from agentq.observe import metrics, otel, record_dead_letter, route_core_logs
from agentq.resources import QueueSettings
from agentq.runtime import Settings, build_dispatcher, build_engine, build_queues, build_store

logger = Logger(service="agentq-executor")
route_core_logs(logger)
tracer = Tracer(service="agentq-executor")
# Batch size 1: a failed record is the whole batch; report it, do not raise (no error alarm noise).
processor = BatchProcessor(event_type=EventType.SQS, raise_on_entire_batch_failure=False)

SLICE_MARGIN_SECONDS = float(os.environ.get("AGENTQ_SLICE_MARGIN_SECONDS", "30"))
VISIBILITY_SECONDS = int(os.environ.get("AGENTQ_VISIBILITY_SECONDS", "60"))
LEASE_SECONDS = float(os.environ.get("AGENTQ_LEASE_SECONDS", "45"))


class RetryLater(Exception):
    """Report this record as failed: SQS returns the message (after the visibility we set)."""


class _Runtime:
    """Built once per container (cold start), reused by every invocation."""

    def __init__(self) -> None:
        self.settings = Settings.from_env()
        self.store = build_store(self.settings)
        self.queues = build_queues(self.settings)
        engine = build_engine(
            self.settings,
            self.store,
            worker_id=f"lambda:{os.environ.get('AWS_LAMBDA_LOG_STREAM_NAME', os.getpid())}",
            lease_seconds=LEASE_SECONDS,
            slice_margin_seconds=SLICE_MARGIN_SECONDS,
        )
        max_receive = int(os.environ.get("AGENTQ_MAX_RECEIVE_COUNT", QueueSettings().max_receive_count))
        self.dispatcher = build_dispatcher(
            engine, self.store, self.queues, max_receive_count=max_receive,
            default_max_running=self.settings.defaults.tenant_max_running,
            fleet_capacity=self.settings.defaults.fleet_capacity,
            tier_limits=self.settings.defaults.tier_limits(),
        )  # fmt: skip


_runtime: _Runtime | None = None
_context: LambdaContext | None = None


def runtime() -> _Runtime:
    global _runtime
    if _runtime is None:
        _runtime = _Runtime()
    return _runtime


def record_handler(record: SQSRecord) -> None:
    rt = runtime()
    tier = rt.queues.tier_of(record.event_source_arn)
    remaining_ms = _context.get_remaining_time_in_millis() if _context is not None else 900_000
    logger.append_keys(message_id=record.message_id)

    def extend_visibility() -> None:
        rt.queues.change_visibility(tier, record.receipt_handle, VISIBILITY_SECONDS)

    action = rt.dispatcher.handle(
        record.body,
        tier=tier,
        receive_count=int(record.attributes.approximate_receive_count),
        attributes=_message_attributes(record) or None,
        deadline=time.time() + remaining_ms / 1000,
        on_beat=extend_visibility,
    )
    logger.info("message handled", extra={"action": action.kind, "reason": action.reason, "task_id": action.task_id})
    if action.kind == "delete":
        return  # success: Lambda deletes the message
    if action.kind == "dead_letter":
        try:
            rt.queues.dead_letter(
                tier, record.body, action.reason, _sqs_attributes(record), dead_letter_id=action.dead_letter_id
            )
        except Exception as exc:  # neither sent nor deleted: the record fails, and the message comes back
            logger.exception("could not dead-letter the message; it comes back after its visibility timeout")
            raise RetryLater(f"dead-letter send failed: {exc}") from exc
        record_dead_letter()
        return
    if action.kind == "retry":
        rt.queues.change_visibility(tier, record.receipt_handle, action.delay_seconds)
    raise RetryLater(action.reason)  # retry and abandon: the message stays in the queue


def _message_attributes(record: SQSRecord) -> dict[str, Any]:
    """The record's message attributes as Lambda delivers them (camelCase), {} when it has none.

    From the raw record: powertools' ``message_attributes`` is a dict subclass whose values are
    wrappers (it has no ``raw_event``)."""
    return dict(record.raw_event.get("messageAttributes") or {})


def _sqs_attributes(record: SQSRecord) -> dict[str, Any]:
    """Lambda's camelCase message attributes back into SendMessage's shape."""
    out: dict[str, Any] = {}
    for name, attr in _message_attributes(record).items():
        if attr.get("stringValue") is not None:
            out[name] = {"DataType": attr.get("dataType", "String"), "StringValue": attr["stringValue"]}
    return out


@logger.inject_lambda_context
@tracer.capture_lambda_handler
@metrics.log_metrics
def lambda_handler(event: dict[str, Any], context: LambdaContext) -> PartialItemFailureResponse:
    global _context
    _context = context
    try:
        return process_partial_response(
            event=event, record_handler=record_handler, processor=processor, context=context
        )
    finally:
        otel.flush()  # OpenTelemetry spans (tracing.exporter = adot) out before Lambda freezes the container
