"""Which tasks changed: the table's own stream (DynamoDB Streams), read from now on.

The events hub (``api/stream_feed.py``) learns of every write to a task's partition from the
stream instead of polling each watched task's META: a stream record names the item's keys (the
table's stream is ``KEYS_ONLY``, ``agentq.resources.TABLE_STREAM_VIEW_TYPE``), so a task's
``pk`` says whose poller must read now. Nothing here decides what the change was: the stream
orders records per item, not across a task's items, so the hub reads META and the log after it
as every watcher does (``storage/events.py``), and the stream is only the doorbell.

Shards: every open shard is followed from ``LATEST`` when the reader starts (what was written
before is read from the table by whoever catches up); a shard that closes (``NextShardIterator``
absent: DynamoDB split or rolled it) is dropped and its children, found by describing the stream
again, are read from ``TRIM_HORIZON`` so nothing between is skipped. An iterator that expired or
points past the trim horizon is replaced by ``LATEST`` and the read says ``lost``: records may
have been missed, so the hub re-reads every task it serves. At most two readers should read a
shard at once (DynamoDB throttles more): the reaper's event source mapping is one, so the hub
runs one server (infra/live_settings.py).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from agentq.storage.keys import META, task_pk

TASK_PK_PREFIX = task_pk("")
RESCAN_SECONDS = 60.0  # how often the shard list is read again for shards that opened meanwhile
_LOST = ("ExpiredIteratorException", "TrimmedDataAccessException", "ResourceNotFoundException")


@dataclass
class Changes:
    """One pass over the stream: the tasks whose items changed, and whether records may have
    been missed (then every watched task must be read)."""

    tasks: set[str] = field(default_factory=set)
    metas: set[str] = field(default_factory=set)  # of those, the ones whose META changed
    logged: set[str] = field(default_factory=set)  # ... and whose other items did (a step, an event, a claim)
    lost: bool = False
    records: int = 0
    calls: int = 0  # GetRecords and DescribeStream calls made (what DynamoDB Streams bills)


class TableStream:
    def __init__(self, streams: Any, dynamodb: Any, table: str, *, limit: int = 1000) -> None:
        """``streams``: a ``dynamodbstreams`` client; ``dynamodb``: a ``dynamodb`` client (to
        find the table's stream)."""
        self.streams = streams
        self.dynamodb = dynamodb
        self.table = table
        self.limit = limit
        self.arn: str | None = None
        self.iterators: dict[str, str | None] = {}  # open shard -> its next iterator
        self.closed: set[str] = set()
        self.scanned_at = 0.0

    def start(self) -> TableStream:
        """Follow every open shard from now on. Raises if the table has no stream."""
        described = self.dynamodb.describe_table(TableName=self.table)["Table"]
        self.arn = described.get("LatestStreamArn")
        if not self.arn or not described.get("StreamSpecification", {}).get("StreamEnabled", True):
            raise RuntimeError(f"table {self.table} has no stream: the events hub needs it")
        for shard in self._shards():
            if "EndingSequenceNumber" in shard.get("SequenceNumberRange", {}):
                self.closed.add(shard["ShardId"])  # closed before this reader: older than it
            else:
                self.iterators[shard["ShardId"]] = self._iterator(shard["ShardId"], "LATEST")
        self.scanned_at = time.monotonic()
        return self

    def _shards(self) -> list[dict[str, Any]]:
        shards: list[dict[str, Any]] = []
        start: str | None = None
        while True:
            kwargs: dict[str, Any] = {"StreamArn": self.arn}
            if start:
                kwargs["ExclusiveStartShardId"] = start
            desc = self.streams.describe_stream(**kwargs)["StreamDescription"]
            shards += desc.get("Shards", [])
            start = desc.get("LastEvaluatedShardId")
            if not start:
                return shards

    def _iterator(self, shard: str, kind: str) -> str | None:
        answer = self.streams.get_shard_iterator(StreamArn=self.arn, ShardId=shard, ShardIteratorType=kind)
        return answer.get("ShardIterator")  # type: ignore[no-any-return]

    def _rescan(self, changes: Changes) -> None:
        """Shards not followed yet: children of closed ones from their start, others from now."""
        changes.calls += 1
        for shard in self._shards():
            sid = shard["ShardId"]
            if sid in self.iterators or sid in self.closed:
                continue
            parent = shard.get("ParentShardId")
            self.iterators[sid] = self._iterator(sid, "TRIM_HORIZON" if parent else "LATEST")
        self.scanned_at = time.monotonic()

    def changed(self) -> Changes:
        """The tasks written to since the last call."""
        changes = Changes()
        closed_one = False
        for shard, start in list(self.iterators.items()):
            iterator = start
            while iterator is not None:
                try:
                    page = self.streams.get_records(ShardIterator=iterator, Limit=self.limit)
                except Exception as exc:  # an expired or trimmed iterator: start again from now
                    if _error_code(exc) not in _LOST:
                        raise
                    changes.lost = True
                    iterator = self._iterator(shard, "LATEST")
                    break
                changes.calls += 1
                records = page.get("Records", [])
                changes.records += len(records)
                for record in records:
                    keys = record.get("dynamodb", {}).get("Keys", {})
                    pk = keys.get("pk", {}).get("S", "")
                    if pk.startswith(TASK_PK_PREFIX) and len(pk) > len(TASK_PK_PREFIX):
                        task_id = pk[len(TASK_PK_PREFIX) :]
                        changes.tasks.add(task_id)
                        if keys.get("sk", {}).get("S") == META:
                            changes.metas.add(task_id)
                        else:
                            changes.logged.add(task_id)
                iterator = page.get("NextShardIterator")
                if len(records) < self.limit:
                    break
            if iterator is None:
                del self.iterators[shard]
                self.closed.add(shard)
                closed_one = True
            else:
                self.iterators[shard] = iterator
        if closed_one or time.monotonic() - self.scanned_at > RESCAN_SECONDS:
            self._rescan(changes)
        return changes


def _error_code(exc: Exception) -> str:
    response = getattr(exc, "response", None) or {}
    return str(response.get("Error", {}).get("Code", ""))
