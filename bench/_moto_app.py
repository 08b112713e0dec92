"""agentq's moto server (``agentq.local.moto_app``: DynamoDB requests serialised) with three
bench-only changes that remove moto costs growing with the amount of data, none of which real
DynamoDB or SQS has. Each keeps moto's own logic and results; only the cost changes.

1. TransactWriteItems backs up only the items it touches.
2. Query on the base table with a partition key reads only that partition: moto 5.2.5 builds
   and sorts the list of every item in the table, then filters by hash key (measured: 13 ms
   at 200 items, 188 ms at 6,000). agentq's ``load_steps`` is such a Query at every claim.
3. SQS ReceiveMessage: moto reads the clock through datetime arithmetic (~10 us) for every
   message's ``visible``/``delayed`` check and, for every message it returns, recomputes all
   queue attributes (three scans of the queue) just to read MessageRetentionPeriod. A receive
   of 10 from a 1,000-message queue took 1.4-1.8 s of moto CPU, which starves every other
   request (one GIL). Patched: ``time.time()`` for the clock, the retention period read
   directly from the queue.

Why (1): moto 5.2.5's ``DynamoDBBackend.transact_write_items`` makes its rollback copy with
``copy.deepcopy(self.tables[name])`` once per transaction item, i.e. it copies the whole table
2-3 times per transaction. Measured in-process (2 small Puts): 8.6 ms at 10 items, 94 ms at
1,000, 254 ms at 3,000, 551 ms at 6,000. agentq writes with a transaction at submit, reserve
and every step commit, so on stock moto the cost of a task grows with the number of items in
the table (every earlier task's META, budget and steps): a 1,000-task burst becomes quadratic
and measures moto's deepcopy, not agentq. Real DynamoDB has no such term.

The patch keeps moto's own transaction logic (conditions, order, errors, cancellation reasons)
and only replaces the backup: before the transaction it deep-copies the current version of each
item the transaction names (Put/Update/Delete/ConditionCheck), makes the whole-table deepcopy a
no-op for the duration of the call, and on failure restores those items. This is exact because
the middleware serialises DynamoDB requests (nothing else runs during a transaction) and a
transaction may not touch an item twice.

Selected by the benchmarks' ``--moto fast`` (their default); ``--moto stock`` runs the
project's moto_app unchanged.
"""

from __future__ import annotations

import copy
import inspect
import sys
import threading
from typing import Any

_real_deepcopy = copy.deepcopy
_state = threading.local()


def install() -> None:
    _install_transactions()
    _install_query()
    _install_sqs()


def _install_query() -> None:
    from moto.dynamodb.models.table import Table

    original_query = Table.query
    original_all_items = Table.all_items

    def all_items(self: Table) -> list[Any]:
        hash_key = getattr(_state, "query_hash", None)
        if hash_key is not None and getattr(_state, "query_table", None) is self and self.range_key_attr:
            partition = self.items.get(hash_key)  # .get: never create an empty partition
            return sorted(partition.values(), key=lambda x: x.range_key) if partition else []
        return original_all_items(self)

    signature = inspect.signature(original_query)

    def query(self: Any, hash_key: Any, *args: Any, **kwargs: Any) -> Any:
        index_name = signature.bind(self, hash_key, *args, **kwargs).arguments.get("index_name")
        if index_name is not None or hash_key is None:
            return original_query(self, hash_key, *args, **kwargs)
        _state.query_hash, _state.query_table = hash_key, self
        try:
            return original_query(self, hash_key, *args, **kwargs)
        finally:
            _state.query_hash = _state.query_table = None

    Table.all_items = all_items  # type: ignore[method-assign]
    Table.query = query  # type: ignore[method-assign]


def _install_sqs() -> None:
    import time

    import moto.sqs.models as sqs_models

    original_unix_time = sqs_models.unix_time  # type: ignore[attr-defined]  # imported there from moto.core.utils; the patch replaces that module's own name
    original_unix_time_millis = sqs_models.unix_time_millis  # type: ignore[attr-defined]  # (as above)

    def unix_time(dt: Any = None) -> float:
        return time.time() if dt is None else original_unix_time(dt)

    def unix_time_millis(dt: Any = None) -> float:
        return time.time() * 1000.0 if dt is None else original_unix_time_millis(dt)

    sqs_models.unix_time = unix_time  # type: ignore[attr-defined]  # (as above)
    sqs_models.unix_time_millis = unix_time_millis  # type: ignore[attr-defined]  # (as above)

    def is_message_valid_based_on_retention_period(self: Any, queue_name: str, message: Any) -> bool:
        queue = self.get_queue(queue_name)
        retain_until = int(queue.message_retention_period) + float(message.sent_timestamp) / 1000
        return retain_until > time.time()

    sqs_models.SQSBackend.is_message_valid_based_on_retention_period = is_message_valid_based_on_retention_period  # type: ignore[method-assign]


def _install_transactions() -> None:
    from moto.dynamodb import models
    from moto.dynamodb.models.table import Table

    original = models.DynamoDBBackend.transact_write_items

    class _CopyShim:
        """``copy`` as seen by moto.dynamodb.models: a Table is not copied inside a transaction."""

        def __getattr__(self, name: str) -> Any:
            return getattr(copy, name)

        @staticmethod
        def deepcopy(value: Any, memo: Any = None) -> Any:
            if getattr(_state, "in_transaction", False) and isinstance(value, Table):
                return value
            return _real_deepcopy(value, memo)

    models.copy = _CopyShim()  # type: ignore[attr-defined, assignment]  # a duck-typed stand-in for the copy module moto imported

    def transact_write_items(self: Any, transact_items: list[dict[str, Any]]) -> None:
        try:
            backups = []
            for entry in transact_items:
                _, op = next(iter(entry.items()))
                table = self.get_table(op["TableName"])
                if "Item" in op:
                    keys = {table.hash_key_attr: op["Item"][table.hash_key_attr]}
                    if table.range_key_attr is not None:
                        keys[table.range_key_attr] = op["Item"][table.range_key_attr]
                else:
                    keys = op["Key"]
                hash_key, range_key = self.get_keys_value(table, keys)
                backups.append((table, hash_key, range_key, _real_deepcopy(table.get_item(hash_key, range_key))))
        except Exception:
            return original(self, transact_items)  # malformed request: moto's own path and error
        _state.in_transaction = True
        try:
            return original(self, transact_items)
        except Exception:
            for table, hash_key, range_key, item in reversed(backups):
                if item is None:
                    table.delete_item(hash_key, range_key)
                elif range_key is not None:
                    table.items[hash_key][range_key] = item
                else:
                    table.items[hash_key] = item
            raise
        finally:
            _state.in_transaction = False

    models.DynamoDBBackend.transact_write_items = transact_write_items  # type: ignore[method-assign]


if __name__ == "__main__":
    install()
    from agentq.local.moto_app import main

    sys.argv[0] = "agentq.local.moto_app"
    main()
