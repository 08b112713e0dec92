"""A Query on moto by a table's own partition key reads that partition, not the whole table.

Why: moto 5.2's ``Table.query`` without an index starts from ``self.all_items()``, which lists
every item of the table and sorts them all by (hash key, range key), and only then keeps the
items of the partition asked for. So a Query costs time proportional to the whole table
(n log n comparisons of moto's DynamoType), however small its partition. agentq reads a task's
steps with such a Query at every claim (``Steps.load``) and for every page of a trace, and a
test module or ``agentq dev`` keeps one table for many tasks. Measured (``bench/local_commit.py``,
loading a task's 10 steps, p50): 12 ms on an empty table, 53 ms at 10,000 items, 437 ms at
100,000; with this patch 6, 6 and 8 ms. Real DynamoDB reads the partition.

What changes: only where the candidates come from. While ``Table.query`` runs for a base-table
Query with a partition key, ``all_items`` on that table returns that partition's items (a
partition is ``Table.items[hash]``, a dict by range key, or the one item of a table without
one) whose sort key meets the Query's sort-key condition, if it has one (``DynamoType.compare``
with the comparison and bounds moto applies itself): a claim's read of a task's ``META*``
items no longer sorts and walks every step of the task. moto then filters them by the hash
key (all match), sorts them by range key, pages, applies the key condition (all match), the
filter and the projection exactly as before: the same result, from the items that could be in
it.

An index Query (a GSI's partition: a tenant's live tasks, an agent's versions, a stop's listing)
walked every item too, after ``all_items`` had sorted the whole table by its own keys, an order
the index path then throws away: it sorts what it keeps by the index's keys and the table's (a
total order, the table's keys being unique). Here ``all_items`` gives that path, unsorted, the
items whose index key values equal the Query's (moto's own test: type and cast value), so a
Query costs one pass over the items instead of a sort of them (10,000 items in 50 index
partitions, moto in-process: 113 ms a Query, 26 ms with this). And each item is projected as
the index holds it (``KEYS_ONLY``: the table's and the index's keys; ``INCLUDE``: and its
attributes) before moto deep-copies the results, where moto deep-copied whole items and then
projected each with a serialising round trip an attribute (``SecondaryIndex.project``, skipped
for items projected here): a stop's listing, 1,000 tasks' META over the ``tenant_live`` index,
went from ~1,080 to ~160 ms, at load most of the time to a stop's first fence. Pages then end at
1 MB of projected items, as DynamoDB's do (moto counted whole ones). Scans are unchanged. The marker
is per thread, so a request on another thread never sees it (and ``moto_app`` serialises DynamoDB
requests anyway).

Which moto: ``moto_version.VERIFIED_MOTO``, as read in 5.2.5, 5.2.6 and in moto's main branch at 0af643a (August
2026): ``Table.query(hash_key, ..., index_name, ...)`` building its candidates from
``self.all_items()`` on both paths, the index path's ``hash_key_conditions`` and its
``sorted_items`` by the index's then the table's keys, and ``Table.items`` as above. ``install`` patches
only ``moto_version.VERIFIED_MOTO``; ``tests/test_moto_app.py`` checks Query results against
the server, and the conformance tests check Query semantics against the in-memory table.
"""

from __future__ import annotations

import inspect
import threading
from typing import Any

from agentq_dev import moto_version

_state = threading.local()


@moto_version.verified_patch
def install() -> None:
    """Patch moto's Table in this process (idempotent). False on a moto version not verified."""
    from moto.dynamodb.models.table import SecondaryIndex, Table

    original_query = Table.query
    original_all_items = Table.all_items
    signature = inspect.signature(original_query)

    def all_items(self: Any) -> list[Any]:
        querying = getattr(_state, "table", None) is self  # (a variable: `is` would narrow self's type)
        if not querying:
            return original_all_items(self)
        if _state.index_keys is not None:  # an index Query: the items with its partition's key values, unsorted
            keys = _state.index_keys
            parts = self.items.values()
            items = [item for part in parts for item in part.values()] if self.range_key_attr else list(parts)
            for name, value in keys:
                items = [item for item in items if _equal(item.attrs.get(name), value)]
            return _projected(self.get_index(_state.index_name), items)
        partition = self.items.get(_state.hash_key)  # .get: looking creates no partition
        if partition is None:
            return []
        if not self.range_key_attr:
            return [partition]
        comparison, bounds = _state.range
        if comparison is None:
            return list(partition.values())
        return [item for key, item in partition.items() if key.compare(comparison, bounds)]

    def query(self: Any, *args: Any, **kwargs: Any) -> Any:
        bound = signature.bind(self, *args, **kwargs).arguments
        if bound.get("index_name"):
            if not bound.get("hash_key_conditions"):
                return original_query(self, *args, **kwargs)
            _state.table, _state.index_keys = self, list(bound["hash_key_conditions"])
            _state.index_name = bound["index_name"]
        elif bound.get("hash_key") is None:
            return original_query(self, *args, **kwargs)
        else:
            _state.table, _state.hash_key, _state.index_keys = self, bound["hash_key"], None
            _state.range = (bound.get("range_comparison"), bound.get("range_objs") or [])
        try:
            return original_query(self, *args, **kwargs)
        finally:
            _state.table = _state.hash_key = _state.range = _state.index_keys = _state.index_name = None

    original_project = SecondaryIndex.project

    def project(self: Any, item: Any) -> Any:
        if getattr(_state, "index_name", None) is not None:
            return item  # projected already, by ``all_items`` (``_projected``)
        return original_project(self, item)

    Table.all_items = all_items  # type: ignore[method-assign]
    Table.query = query  # type: ignore[method-assign]
    SecondaryIndex.project = project  # type: ignore[method-assign]


def _projected(index: Any, items: list[Any]) -> list[Any]:
    """``items`` as the index holds them: copies with only its keys, the table's and the
    attributes it includes (all of them for an ``ALL`` index, the items themselves), which is
    what moto's ``SecondaryIndex.project`` keeps of each, later, from a deep copy of the whole
    item."""
    from moto.dynamodb.models.dynamo_type import Item

    projection = (index.projection or {}).get("ProjectionType")
    if projection not in ("KEYS_ONLY", "INCLUDE"):
        return items
    kept = [*index.table_key_attrs, *(key["AttributeName"] for key in index.schema)]
    if projection == "INCLUDE":
        kept += index.projection.get("NonKeyAttributes", [])
    return [
        Item(item.hash_key, item.range_key, {name: item.attrs[name] for name in kept if name in item.attrs})
        for item in items
    ]


def _equal(present: Any, wanted: Any) -> bool:
    """moto's own test of an index key value (``DynamoType.__eq__``: type and cast value), for an
    item that may lack it; the same raw value decides at once (numbers written apart, such as
    ``1`` and ``1.0``, go to moto's cast)."""
    if present is None or present.type != wanted.type:
        return False
    return present.value == wanted.value or (wanted.type == "N" and bool(present == wanted))
