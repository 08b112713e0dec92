"""The end of a finished task: after its retention, everything it left behind is deleted.

Only META carries the TTL attribute (``expires_at``, stamped by the store in the write that
makes a task terminal): a task's other items (steps, effects, notes, spawns, approvals,
orphans) are many and immutable, and stamping each would cost a write per item. DynamoDB TTL
deletes META; that deletion reaches the table's stream, and the reaper (functions/reaper)
calls ``purge_task``, which deletes the rest: the task's partition, its ``BUDGET#`` item and
its S3 payloads under ``tasks/<task_id>/``.

``purge_task`` is idempotent (a stream batch may be delivered twice, and a partly failed one is
retried whole) and refuses to touch a task that is still live.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from botocore.exceptions import ClientError
from pydantic import BaseModel, ConfigDict, Field

from agentq.core.errors import IllegalTransition
from agentq.core.models import TERMINAL_STATUSES
from agentq.storage.serdes import from_item, to_item, to_values
from agentq.storage.store import META, Store, budget_pk, payload_prefix, task_pk

TTL_PRINCIPAL = "dynamodb.amazonaws.com"  # userIdentity.principalId of a TTL deletion
TASK_PK_PREFIX = task_pk("")
BATCH_WRITE_MAX = 25  # DeleteRequests per BatchWriteItem
DELETE_OBJECTS_MAX = 1000  # keys per S3 DeleteObjects


def ttl_removal_pattern() -> dict[str, Any]:
    """The Lambda event filter that admits only TTL deletions of task META items.

    One definition for the deployed event source mapping (infra/functions.py) and the tests;
    ``expired_task_id`` applies the same rule again in the handler, so a mapping deployed
    without its filter still purges nothing else.
    """
    return {
        "eventName": ["REMOVE"],
        "userIdentity": {"type": ["Service"], "principalId": [TTL_PRINCIPAL]},
        "dynamodb": {"Keys": {"pk": {"S": [{"prefix": TASK_PK_PREFIX}]}, "sk": {"S": [META]}}},
    }


class _Identity(BaseModel):
    type: str | None = None
    principal_id: str | None = Field(default=None, alias="principalId")


class _Change(BaseModel):
    keys: dict[str, dict[str, Any]] = Field(default_factory=dict, alias="Keys")


class StreamRecord(BaseModel):
    """The part of a DynamoDB Streams record (as GetRecords and Lambda deliver it) the reaper reads."""

    model_config = ConfigDict(extra="ignore")

    event_name: str | None = Field(default=None, alias="eventName")
    dynamodb: _Change = Field(default_factory=_Change)
    user_identity: _Identity | None = Field(default=None, alias="userIdentity")

    def key(self, name: str) -> str | None:
        """A string key attribute of the changed item (``Keys`` are in AttributeValue form)."""
        value = self.dynamodb.keys.get(name, {}).get("S")
        return value if isinstance(value, str) else None

    @property
    def by_ttl(self) -> bool:
        identity = self.user_identity
        return identity is not None and identity.type == "Service" and identity.principal_id == TTL_PRINCIPAL


def expired_task_id(raw: Mapping[str, Any]) -> str | None:
    """The task whose META DynamoDB TTL deleted, or None for any other stream record (an
    insert or update, a delete by a caller, or a TTL deletion of an idempotency record)."""
    record = StreamRecord.model_validate(raw)
    pk, sk = record.key("pk"), record.key("sk")
    if record.event_name != "REMOVE" or not record.by_ttl or sk != META or pk is None:
        return None
    if not pk.startswith(TASK_PK_PREFIX) or len(pk) == len(TASK_PK_PREFIX):
        return None
    return pk[len(TASK_PK_PREFIX) :]


class PurgeResult(BaseModel):
    """What one ``purge_task`` call deleted (zeros when a repeat found nothing left)."""

    task_id: str
    items: int = Field(description="items of the task's partition, META included if it was still there")
    budget: int = Field(description="1 if the task's BUDGET# item was deleted")
    objects: int = Field(description="S3 payload objects under tasks/<task_id>/")


Sleep = Callable[[float], None]


def purge_task(store: Store, task_id: str, *, attempts: int = 8, sleep: Sleep = time.sleep) -> PurgeResult:
    """Delete everything ``task_id`` left behind: safe to run again, and on a task whose META
    is already gone (the TTL path) or still there but terminal (then META goes first, so a
    purge cut short never leaves a visible task without its history).

    Raises IllegalTransition if the task is not finished. ``attempts`` bounds the retries of
    unprocessed batch deletes; past it a RuntimeError makes the stream batch fail and retry.
    """
    meta = _delete_finished_meta(store, task_id)
    items = 0
    for keys in _partition_pages(store, task_id):
        items += _batch_delete(store, keys, attempts=attempts, sleep=sleep)
    budget = _delete_budget(store, task_id)
    objects = _delete_payloads(store, task_id)
    return PurgeResult(task_id=task_id, items=items + meta, budget=budget, objects=objects)


def _delete_finished_meta(store: Store, task_id: str) -> int:
    statuses = sorted(s.value for s in TERMINAL_STATUSES)
    values = {f":t{i}": s for i, s in enumerate(statuses)}
    try:
        resp = store.ddb.delete_item(
            TableName=store.table,
            Key=to_item({"pk": task_pk(task_id), "sk": META}),
            ConditionExpression=f"attribute_not_exists(pk) OR #s IN ({', '.join(values)})",
            ExpressionAttributeNames={"#s": "status"},
            ExpressionAttributeValues=to_values(values),
            ReturnValues="ALL_OLD",
            ReturnValuesOnConditionCheckFailure="ALL_OLD",  # names the status without a read
        )
    except ClientError as exc:
        if exc.response.get("Error", {}).get("Code") != "ConditionalCheckFailedException":
            raise
        status = from_item(exc.response.get("Item") or {}).get("status", "live")
        raise IllegalTransition(f"task {task_id} is {status}; only a finished task is purged", field="task_id") from exc
    return 1 if resp.get("Attributes") else 0


def _partition_pages(store: Store, task_id: str) -> Iterator[list[dict[str, Any]]]:
    """The keys of the task's partition, a page at a time (deleting behind the cursor is safe)."""
    for page in store.ddb.get_paginator("query").paginate(
        TableName=store.table,
        KeyConditionExpression="pk = :pk",
        ExpressionAttributeValues=to_values({":pk": task_pk(task_id)}),
        ProjectionExpression="pk, sk",
        ConsistentRead=True,
    ):
        if page["Items"]:
            yield page["Items"]


def _batch_delete(store: Store, keys: list[dict[str, Any]], *, attempts: int, sleep: Sleep) -> int:
    for start in range(0, len(keys), BATCH_WRITE_MAX):
        pending = [{"DeleteRequest": {"Key": key}} for key in keys[start : start + BATCH_WRITE_MAX]]
        for attempt in range(attempts):
            resp = store.ddb.batch_write_item(RequestItems={store.table: pending})
            pending = (resp.get("UnprocessedItems") or {}).get(store.table, [])
            if not pending:
                break
            sleep(min(5.0, 0.05 * 2**attempt) * random.uniform(0.5, 1.0))  # throttled: back off
        else:
            first = from_item(pending[0]["DeleteRequest"]["Key"])
            raise RuntimeError(f"{len(pending)} deletes still unprocessed after {attempts} attempts (first: {first})")
    return len(keys)


def _delete_budget(store: Store, task_id: str) -> int:
    resp = store.ddb.delete_item(
        TableName=store.table, Key=to_item({"pk": budget_pk(task_id), "sk": META}), ReturnValues="ALL_OLD"
    )
    return 1 if resp.get("Attributes") else 0


def _delete_payloads(store: Store, task_id: str) -> int:
    s3, bucket = store.payloads.s3, store.payloads.bucket
    deleted = 0
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=payload_prefix(task_id)):
        keys = [{"Key": obj["Key"]} for obj in page.get("Contents", [])]
        for start in range(0, len(keys), DELETE_OBJECTS_MAX):
            chunk = keys[start : start + DELETE_OBJECTS_MAX]
            resp = s3.delete_objects(Bucket=bucket, Delete={"Objects": chunk, "Quiet": True})
            if resp.get("Errors"):
                error = resp["Errors"][0]
                raise RuntimeError(f"could not delete s3://{bucket}/{error['Key']}: {error.get('Code')} {error.get('Message')}")
            deleted += len(chunk)
    return deleted
