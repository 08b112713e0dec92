"""agentq's moto server (``agentq.local.moto_app``: DynamoDB requests serialised, transactions
rolled back item by item) with two bench-only changes that remove moto costs growing with the
amount of data, neither of which real DynamoDB or SQS has. Each keeps moto's own logic and
results; only the cost changes.

1. Query on the base table with a partition key reads only that partition: moto 5.2.5 builds
   and sorts the list of every item in the table, then filters by hash key (measured: 13 ms
   at 200 items, 188 ms at 6,000). agentq's ``load_steps`` is such a Query at every claim.
2. SQS ReceiveMessage: moto reads the clock through datetime arithmetic (~10 us) for every
   message's ``visible``/``delayed`` check and, for every message it returns, recomputes all
   queue attributes (three scans of the queue) just to read MessageRetentionPeriod. A receive
   of 10 from a 1,000-message queue took 1.4-1.8 s of moto CPU, which starves every other
   request (one GIL). Patched: ``time.time()`` for the clock, the retention period read
   directly from the queue.

(The third such cost, TransactWriteItems deep-copying every table it names, is fixed in the
project's own moto_app: ``agentq/local/moto_rollback.py``, measured by ``bench/local_commit.py``.)

Selected by the benchmarks' ``--moto fast`` (their default); ``--moto stock`` runs the
project's moto_app unchanged.
"""

from __future__ import annotations

import inspect
import sys
import threading
from typing import Any

_state = threading.local()


def install() -> None:
    _install_query()
    _install_sqs()


def _install_query() -> None:
    from moto.dynamodb.models.table import Table

    original_query = Table.query
    original_all_items = Table.all_items

    def all_items(self: Any) -> list[Any]:
        hash_key = getattr(_state, "query_hash", None)
        same_table = getattr(_state, "query_table", None) is self  # (a variable: no narrowing of self)
        if hash_key is not None and same_table and self.range_key_attr:
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

    original_unix_time = sqs_models.unix_time  # type: ignore[attr-defined]
    original_unix_time_millis = sqs_models.unix_time_millis  # type: ignore[attr-defined]

    def unix_time(dt: Any = None) -> float:
        return time.time() if dt is None else original_unix_time(dt)

    def unix_time_millis(dt: Any = None) -> float:
        return time.time() * 1000.0 if dt is None else original_unix_time_millis(dt)

    sqs_models.unix_time = unix_time  # type: ignore[attr-defined]
    sqs_models.unix_time_millis = unix_time_millis  # type: ignore[attr-defined]

    def is_message_valid_based_on_retention_period(self: Any, queue_name: str, message: Any) -> bool:
        queue = self.get_queue(queue_name)
        retain_until = int(queue.message_retention_period) + message.sent_timestamp / 1000
        return bool(retain_until > time.time())

    sqs_models.SQSBackend.is_message_valid_based_on_retention_period = is_message_valid_based_on_retention_period  # type: ignore[method-assign]


if __name__ == "__main__":
    install()
    from agentq.local.moto_app import main

    sys.argv[0] = "agentq.local.moto_app"
    main()
