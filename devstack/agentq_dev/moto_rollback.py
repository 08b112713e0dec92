"""TransactWriteItems on moto that rolls back the items it touched, not a copy of every table.

Why: moto 5.2's ``DynamoDBBackend.transact_write_items`` takes its rollback copy with
``copy.deepcopy(self.tables[name])`` once per action in the transaction, so every transaction
copies each table it names, whole, two or three times. agentq commits every step, reserve and
submission with a transaction, so on stock moto a commit costs time proportional to everything
ever written to the table: a step commit (three actions, p50) took 11 ms on an empty table,
0.7 s at 10,000 items and 10.6 s at 100,000, where a PutItem takes 2 ms; with this patch 6, 6
and 10 ms (``bench/local_commit.py``, 2 shared cores). A long test module, the demo or ``agentq
dev`` then measured moto's deepcopy, not agentq. Real DynamoDB has no such term.

What changes: only the backup. Before moto's own ``transact_write_items`` runs (its conditions,
order of actions, uniqueness check, errors and cancellation reasons are all kept), each item the
transaction names (Put, Update, Delete, ConditionCheck) is deep-copied, or noted as absent, and
so is the length of each touched table's stream. During the call the whole-table deepcopy is a
no-op (moto's rollback then puts back the very table object it got, changing nothing). If the
call raises, for any reason (a cancelled transaction, a validation error mid-way, the same item
named twice), every noted item is put back as it was: items the transaction created are
removed, items it deleted or changed come back as they were, and stream records it appended are
cut. (An empty partition left behind holds no item: moto leaves one whenever it looks up a
missing key.) That is the whole rollback because

- a transaction writes only the items it names (moto's Put/Update/Delete of one key each);
- nothing else runs meanwhile: ``moto_app.SerialisedDynamoDB`` admits one DynamoDB request at a
  time, so no other request can see or write the table between the action and its rollback.

It is also what DynamoDB does: all or nothing per transaction, no cost that grows with the table.
``tests/test_moto_app.py`` checks that a cancelled transaction leaves the table exactly as
before against the server, including items created and deleted by earlier actions of it.

Which moto: the internals relied on are those of moto 5.2 (read in 5.2.5, 5.2.6 and in moto's main
branch at 0af643a, August 2026): the ``copy`` module that ``moto.dynamodb.models`` imports and
takes the per-table backup with, ``Table.items`` as ``{hash: Item}`` or ``{hash: {range: Item}}``
(a ``defaultdict``), ``Table.stream_shard.items`` as the list of stream records, and
``DynamoDBBackend.get_table``/``get_keys_value``. moto 5.1 copied the whole ``tables`` dict
instead. ``install`` patches only the version ``moto_version.VERIFIED_MOTO`` names.
"""

from __future__ import annotations

import copy
import threading
from dataclasses import dataclass
from typing import Any

from agentq_dev import moto_version

_real_deepcopy = copy.deepcopy
_state = threading.local()


@dataclass
class _Saved:
    """One item a transaction names, as it was before the transaction."""

    table: Any  # moto.dynamodb.models.table.Table
    hash_key: Any  # DynamoType
    range_key: Any  # DynamoType | None (None: the table has no sort key)
    item: Any  # a deep copy of the Item, or None if there was none


@dataclass
class _Stream:
    shard: Any  # moto's StreamShard
    records: list[Any]  # its list of records before the transaction (appended to in place)
    length: int


class _CopyDuringTransaction:
    """``copy`` as ``moto.dynamodb.models`` sees it: a Table is not copied inside a transaction
    running on this thread (its rollback is taken item by item instead)."""

    def __getattr__(self, name: str) -> Any:
        return getattr(copy, name)

    @staticmethod
    def deepcopy(value: Any, memo: Any = None) -> Any:
        from moto.dynamodb.models.table import Table

        if getattr(_state, "in_transaction", False) and isinstance(value, Table):
            return value
        return _real_deepcopy(value, memo)


def _saved_items(backend: Any, transact_items: list[dict[str, Any]]) -> tuple[list[_Saved], list[_Stream]] | None:
    """The current version of every item the transaction names, or None when an action's table
    or key cannot be resolved (moto's own code then runs unchanged and reports the error)."""
    saved: list[_Saved] = []
    streams: dict[int, _Stream] = {}
    try:
        for entry in transact_items:
            _, op = next(iter(entry.items()))
            table = backend.get_table(op["TableName"])
            if "Item" in op:
                key = {table.hash_key_attr: op["Item"][table.hash_key_attr]}
                if table.range_key_attr is not None:
                    key[table.range_key_attr] = op["Item"][table.range_key_attr]
            else:
                key = op["Key"]
            hash_key, range_key = backend.get_keys_value(table, key)
            current = table.items.get(hash_key)  # .get: looking creates no partition
            if table.range_key_attr is not None and current is not None:
                current = current.get(range_key)
            saved.append(_Saved(table, hash_key, range_key, _real_deepcopy(current)))
            shard = table.stream_shard
            if shard is not None and id(table) not in streams:
                streams[id(table)] = _Stream(shard, shard.items, len(shard.items))
    except Exception:
        return None
    return saved, list(streams.values())


def _restore(saved: list[_Saved], streams: list[_Stream]) -> None:
    for s in reversed(saved):  # an item named twice (an error moto reports) was saved twice, unchanged
        items = s.table.items
        if s.range_key is None:
            if s.item is None:
                items.pop(s.hash_key, None)
            else:
                items[s.hash_key] = s.item
            continue
        if s.item is not None:
            items[s.hash_key][s.range_key] = s.item
        elif s.hash_key in items:
            items[s.hash_key].pop(s.range_key, None)
    for stream in streams:
        del stream.records[stream.length :]
        stream.shard.items = stream.records


@moto_version.verified_patch
def install() -> None:
    """Patch moto's DynamoDB backend in this process (idempotent). Returns whether the patch is
    in place: False on a moto version other than ``moto_version.VERIFIED_MOTO``, left as it is."""
    from moto.dynamodb import models

    original = models.DynamoDBBackend.transact_write_items

    def transact_write_items(self: Any, transact_items: list[dict[str, Any]]) -> None:
        before = _saved_items(self, transact_items)
        if before is None:
            return original(self, transact_items)
        _state.in_transaction = True
        try:
            return original(self, transact_items)
        except BaseException:
            _restore(*before)
            raise
        finally:
            _state.in_transaction = False

    models.copy = _CopyDuringTransaction()  # type: ignore[attr-defined,assignment]
    models.DynamoDBBackend.transact_write_items = transact_write_items  # type: ignore[method-assign]
