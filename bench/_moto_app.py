"""agentq's moto server (``agentq_dev.moto_app``) with one bench-only change that removes a moto
cost growing with the amount of data, which real SQS does not have. It keeps moto's own logic and
results; only the cost changes.

SQS ReceiveMessage: moto reads the clock through datetime arithmetic (~10 us) for every
message's ``visible``/``delayed`` check and, for every message it returns, recomputes all queue
attributes (three scans of the queue) just to read MessageRetentionPeriod. A receive of 10 from
a 1,000-message queue took 1.4-1.8 s of moto CPU, which starves every other request (one GIL).
Patched: ``time.time()`` for the clock, the retention period read directly from the queue.

(The DynamoDB costs of that kind, a transaction deep-copying every table it names and a Query
sorting the whole table, are fixed in the project's own moto_app: ``devstack/agentq_dev/moto_rollback.py``
and ``moto_query.py``, measured by ``bench/local_commit.py``.)

Selected by the benchmarks' ``--moto fast`` (their default); ``--moto stock`` runs the
project's moto_app unchanged.
"""

from __future__ import annotations

import sys
from typing import Any


def install() -> None:
    _install_sqs()


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
    from agentq_dev.moto_app import main

    sys.argv[0] = "agentq_dev.moto_app"
    main()
