"""The end of a finished task: after its retention, everything it left behind is deleted.

Only META carries the TTL attribute (``expires_at``, stamped by the store in the write that
makes a task terminal): a task's other items (steps, effects, notes, spawns, approvals,
orphans) are many and immutable, and stamping each would cost a write per item. DynamoDB TTL
deletes META; that deletion reaches the table's stream, and the reaper (functions/reaper)
calls ``purge_task``, which deletes the rest: the task's partition (its budget went with META)
and its S3 payloads under ``tasks/<task_id>/``.

``purge_task`` is idempotent (a stream batch may be delivered twice, and a partly failed one is
retried whole) and refuses to touch a task that is still live.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from agentq.storage.container import Storage
from agentq.storage.keys import META, task_pk

TTL_PRINCIPAL = "dynamodb.amazonaws.com"  # userIdentity.principalId of a TTL deletion
TASK_PK_PREFIX = task_pk("")


def ttl_removal_pattern() -> dict[str, Any]:
    """The Lambda event filter that admits only TTL deletions of task META items.

    One definition for the deployed event source mapping (infra/background.py) and the tests;
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
    items: int = Field(
        description="items of the task's partition, META (which holds the task's budget) included if it was still there"
    )
    objects: int = Field(description="S3 payload objects under tasks/<task_id>/")


Sleep = Callable[[float], None]


def purge_task(store: Storage, task_id: str, *, attempts: int = 8, sleep: Sleep = time.sleep) -> PurgeResult:
    """Delete everything ``task_id`` left behind: safe to run again, and on a task whose META
    is already gone (the TTL path) or still there but terminal (then META goes first, so a
    purge cut short never leaves a visible task without its history).

    Raises IllegalTransition if the task is not finished. ``attempts`` bounds the retries of
    unprocessed batch deletes; past it a RuntimeError makes the stream batch fail and retry.
    """
    done = store.purge.task(task_id, attempts=attempts, sleep=sleep)
    return PurgeResult(task_id=task_id, items=done.items, objects=done.objects)
