"""Reaper Lambda: DynamoDB stream records -> purge the tasks whose META DynamoDB TTL deleted.

A thin adapter over ``agentq.control.retention``. The event source mapping's filter already admits
only TTL removals of task META items; ``expired_task_id`` checks again, so any other record
that reaches this function is acknowledged and left alone. Each record is purged on its own
and failures are reported per record (powertools partial batch response): the mapping
retries from the first failed record and bisects a batch that keeps failing, and a record
that never succeeds goes to the reaper's on-failure queue.
"""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools import Logger
from aws_lambda_powertools.utilities.batch import BatchProcessor, EventType, process_partial_response
from aws_lambda_powertools.utilities.batch.types import PartialItemFailureResponse
from aws_lambda_powertools.utilities.data_classes.dynamo_db_stream_event import DynamoDBRecord
from aws_lambda_powertools.utilities.typing import LambdaContext

from agentq.control.retention import expired_task_id, purge_task
from agentq.runtime import Settings, build_store
from agentq.storage.container import Storage

logger = Logger(service="agentq-reaper")
processor = BatchProcessor(event_type=EventType.DynamoDBStreams)

_store: Storage | None = None


def store() -> Storage:
    """Built on first use and kept by the container (cold start only)."""
    global _store
    if _store is None:
        _store = build_store(Settings.from_env(), pool=4)
    return _store


def record_handler(record: DynamoDBRecord) -> None:
    task_id = expired_task_id(record.raw_event)
    if task_id is None:
        logger.debug("not a TTL removal of a task META item: ignored", extra={"event_id": record.event_id})
        return
    result = purge_task(store(), task_id)
    logger.info("task purged", extra=result.model_dump())


@logger.inject_lambda_context
def lambda_handler(event: dict[str, Any], context: LambdaContext) -> PartialItemFailureResponse:
    return process_partial_response(event=event, record_handler=record_handler, processor=processor, context=context)
