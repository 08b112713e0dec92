"""moto keeps every DynamoDB stream record a table ever produced (``StreamShard.items``) and
never trims it: with the table's stream on (the reaper's, as in AWS), every write adds a record,
so a long ``agentq dev`` session or a soak grows by about a kilobyte per write (some 70 writes
a task) for as long as it runs, even with the items themselves deleted. DynamoDB keeps a
stream's records for 24 hours; here each shard keeps its ``RECENT`` newest records. Sequence
numbers go on from where they were, and an iterator that points before the window reads from
its start, as a reader that fell past DynamoDB's trim horizon would (minus the error).
"""

from __future__ import annotations

from typing import Any

from agentq_dev import moto_version

RECENT = 10_000
SLACK = 1_000  # trim in batches: deleting from the front of a list costs its length


def trim(shard: Any, limit: int = RECENT, slack: int = SLACK) -> None:
    """Keep ``shard``'s newest ``limit`` records once it holds more than ``limit + slack``."""
    excess = len(shard.items) - limit
    if excess > slack:
        del shard.items[:excess]
        shard.starting_sequence_number += excess


@moto_version.verified_patch
def install() -> None:
    """Bound every stream shard moto creates from now on (idempotent)."""
    from moto.dynamodb.models.table import StreamShard

    add, get = StreamShard.add, StreamShard.get

    def bounded_add(self: Any, old: Any, new: Any) -> None:
        add(self, old, new)
        trim(self)

    def windowed_get(self: Any, start: int, quantity: int) -> list[dict[str, Any]]:
        return get(self, max(start, self.starting_sequence_number), quantity)

    StreamShard.add = bounded_add  # type: ignore[method-assign]
    StreamShard.get = windowed_get  # type: ignore[method-assign]
