"""Webhooks Lambda: on the webhooks queue (batch, partial failures), POST each task-end callback,
signed (``agentq.queueing.webhooks``). A thin adapter: a delivery to try again is reported as a
batch item failure after its visibility was set to the backoff; SQS moves it to the webhooks
DLQ after the last attempt; a refused URL, or a body that is not a delivery, goes there at once,
with the reason. A record that raises is reported failed alone: the batch's others stay done.

A record is started only with time left for its longest delivery (``time_for_another``): one
the invocation's timeout cut off would make Lambda return the whole batch, posting delivered
callbacks again. The records left are reported failed, never posted. The batch size and the
timeout leave room for a whole batch at those bounds (``agentq.resources``), so this happens
only when something is slower than them (a cold start, a slow table)."""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools import Logger
from aws_lambda_powertools.utilities.typing import LambdaContext

from agentq.queueing.webhooks import handle_message, time_for_another
from agentq.runtime import lazy_store_and_queues

logger = Logger(service="agentq-webhooks")

clients = lazy_store_and_queues()


@logger.inject_lambda_context
def lambda_handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    store, queues = clients()
    failures = []
    records = event.get("Records", [])
    for i, record in enumerate(records):
        if not time_for_another(context.get_remaining_time_in_millis()):
            # Not started, so not posted: handed back as they came, each to be received again.
            logger.warning(
                "no time left for the batch's last callbacks: they come back", extra={"left": len(records) - i}
            )
            failures += [{"itemIdentifier": r["messageId"]} for r in records[i:]]
            break
        count = int(record.get("attributes", {}).get("ApproximateReceiveCount", 1))
        try:
            outcome = handle_message(store, queues, record["body"], record["receiptHandle"], count, delete=False)
        except Exception:  # an outage on this one: it alone comes back, not the batch's delivered ones
            logger.exception("webhook delivery failed", extra={"message_id": record["messageId"]})
            outcome = "retry"
        if outcome == "retry":
            failures.append({"itemIdentifier": record["messageId"]})
    return {"batchItemFailures": failures}
