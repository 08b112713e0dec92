"""The one definition of the AWS resources agentq uses.

The local stack provisions from these dicts and the CDK stack (infra/) reads the same
ones, so a key schema or queue setting cannot drift between local and deployed.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from agentq.storage.keys import PAYLOAD_PREFIX as PAYLOAD_PREFIX

TABLE_KEY_SCHEMA: list[dict[str, str]] = [
    {"AttributeName": "pk", "KeyType": "HASH"},
    {"AttributeName": "sk", "KeyType": "RANGE"},
]
TABLE_ATTRIBUTES: list[dict[str, str]] = [
    {"AttributeName": "pk", "AttributeType": "S"},
    {"AttributeName": "sk", "AttributeType": "S"},
    {"AttributeName": "gsi1pk", "AttributeType": "S"},
    {"AttributeName": "gsi1sk", "AttributeType": "S"},
    {"AttributeName": "live_pk", "AttributeType": "S"},
    {"AttributeName": "live_sk", "AttributeType": "S"},
    {"AttributeName": "owner_worker", "AttributeType": "S"},
    {"AttributeName": "owner_task", "AttributeType": "S"},
    {"AttributeName": "user_pk", "AttributeType": "S"},
]
# A tenant's tasks, newest first: META items carry gsi1pk = "TENANT#<tenant>" and
# gsi1sk = "<created_at epoch millis, 15 digits>#<task_id>". The projection holds the keys plus
# the few attributes a listing filters on; they change only on a status transition, so a step
# commit (which updates META) never writes to the index.
GSI1 = "gsi1"
GSI1_PROJECTED: list[str] = ["status", "parent_id"]
TABLE_GSIS: list[dict[str, Any]] = [
    {
        "IndexName": GSI1,
        "KeySchema": [
            {"AttributeName": "gsi1pk", "KeyType": "HASH"},
            {"AttributeName": "gsi1sk", "KeyType": "RANGE"},
        ],
        "Projection": {"ProjectionType": "INCLUDE", "NonKeyAttributes": GSI1_PROJECTED},
    },
    {
        "IndexName": "live",
        "KeySchema": [
            {"AttributeName": "live_pk", "KeyType": "HASH"},
            {"AttributeName": "live_sk", "KeyType": "RANGE"},
        ],
        "Projection": {"ProjectionType": "KEYS_ONLY"},
    },
    {
        "IndexName": "owner",
        "KeySchema": [
            {"AttributeName": "owner_worker", "KeyType": "HASH"},
            {"AttributeName": "owner_task", "KeyType": "RANGE"},
        ],
        "Projection": {"ProjectionType": "KEYS_ONLY"},
    },
    {
        "IndexName": "user",
        "KeySchema": [
            {"AttributeName": "user_pk", "KeyType": "HASH"},
            {"AttributeName": "gsi1sk", "KeyType": "RANGE"},
        ],
        "Projection": {"ProjectionType": "INCLUDE", "NonKeyAttributes": GSI1_PROJECTED},
    },
    {
        "IndexName": "tenant_live",
        "KeySchema": [
            {"AttributeName": "gsi1pk", "KeyType": "HASH"},
            {"AttributeName": "live_sk", "KeyType": "RANGE"},
        ],
        "Projection": {"ProjectionType": "INCLUDE", "NonKeyAttributes": ["parent_id", "user_pk", "key_id", "agent"]},
    },
]
# The sweeper's index of unfinished tasks (sparse): META carries live_pk = "LIVE#<shard>" and
# live_sk = <task_id> from creation until the task ends (a step commit or transition to a terminal
# status removes them, a requeue from the DLQ sets them again). Keys only, and the keys never
# change while the task lives, so heartbeats and step commits never write to the index; the
# sweeper reads the few META items it lists. ``LIVE_SHARDS`` partitions spread the writes.
GSI_LIVE = "live"
LIVE_SHARDS = 8
LIVE_ATTRIBUTES = ("live_pk", "live_sk")
# The tasks a worker process holds under its liveness (sparse): META carries owner_worker =
# <worker id> and owner_task = <task_id> from a worker's claim until it lets the message go (``disown``).
# When a worker is found dead, one Query lists what it held (``queueing.recovery``). Keys only;
# a claim writes the index once, a heartbeat never does.
GSI_OWNER = "owner"
# The tasks acting for one end user of one tenant, newest first (sparse): the META of a task whose
# submission names a user (and of each of its children, which inherit it) carries user_pk =
# "USER#<digest of tenant and user>" (``storage.keys.user_tasks_pk``), sorted by the tenant listing's own gsi1sk; the same projection as gsi1,
# so a status or roots-only filter reads the index alone. Only tasks with a user are in it.
GSI_USER = "user"
# One tenant's unfinished tasks (sparse), what a stop cancels (``control.stops``): META's gsi1pk
# ("TENANT#<tenant>", on every task) with the ``live`` index's sort key, which only an unfinished
# task carries. So a task is in it exactly while it is in ``live``, and no write sets anything for
# it. Its projection names the task's scopes (user_pk, key_id, the agent's name ``agent``) and its
# parent, none of which changes while the task lives: the index is written when a task is created
# and when it ends (or is requeued from the DLQ), as ``live`` is, never by a step or a status.
GSI_TENANT_LIVE = "tenant_live"
TTL_ATTRIBUTE = "expires_at"
# The reaper learns of a task's expiry from the table's stream: the keys of a removed META are all
# it needs, so the stream carries keys only (no task content leaves the table that way).
TABLE_STREAM_VIEW_TYPE = "KEYS_ONLY"


TIERS: tuple[str, ...] = ("high", "normal", "low")


# Receives a message may spend on worker faults (a SIGKILL, a takeover, a duplicate waiting out
# a live lease) on top of the task's own attempts, before SQS's redrive policy moves it.
FAULT_RECEIVES = 20


class QueueSettings(BaseModel):
    """SQS settings shared by the CDK stack and the local stack.

    ``visibility_timeout`` is what a message gets on receive; a worker's heartbeat keeps
    extending it while the task runs, so a dead worker's message is back within one
    heartbeat period of this value, which bounds resume latency.

    ``max_receive_count`` is how many times a task may fail before it ends ``failed`` and its
    message goes to the DLQ with the reason: the task's own failures, counted on its META
    (``Tasks.record_failure``), not the message's receives. A receive also happens when a worker
    dies holding the message or a duplicate waits for a live lease, and those must not fail a
    healthy task. So the queue's own redrive policy is a backstop set ``FAULT_RECEIVES`` higher
    (``sqs_max_receive_count``), for a message no worker can even get to the dispatcher (one
    that kills its worker every time); and the dispatcher renews a message (a fresh copy, count
    1) once its receives pass ``max_receive_count``, long before that.
    """

    visibility_timeout: int = 30
    max_receive_count: int = 5
    retention_seconds: int = 4 * 24 * 3600
    dlq_retention_seconds: int = 14 * 24 * 3600

    @property
    def sqs_max_receive_count(self) -> int:
        return self.max_receive_count + FAULT_RECEIVES


class ResourceNames(BaseModel):
    """Physical names of one deployment's resources (one per environment / local run)."""

    table: str
    bucket: str
    prefix: str = "agentq"

    @classmethod
    def for_prefix(cls, prefix: str) -> ResourceNames:
        return cls(table=f"{prefix}-tasks", bucket=f"{prefix}-payloads", prefix=prefix)

    def queue(self, tier: str) -> str:
        return f"{self.prefix}-{tier}"

    def dlq(self, tier: str) -> str:
        return f"{self.prefix}-{tier}-dlq"

    @property
    def webhooks(self) -> str:
        return f"{self.prefix}-webhooks"

    @property
    def webhooks_dlq(self) -> str:
        return f"{self.prefix}-webhooks-dlq"

    @property
    def state_machine(self) -> str:
        return f"{self.prefix}-fanout"


FANOUT_ASL_PATH = Path(__file__).resolve().parent / "asl" / "fanout.asl.json"
LOCAL_ROLE_ARN = "arn:aws:iam::123456789012:role/agentq-local-fanout"  # moto does not check roles


def fanout_definition() -> dict[str, Any]:
    """The fan-out state machine (ASL), the same document CDK deploys."""
    return json.loads(FANOUT_ASL_PATH.read_text())  # type: ignore[no-any-return]


def provision_state_machine(sfn: Any, names: ResourceNames) -> str:
    """Create (or find) the fan-out state machine; returns its ARN."""
    for page in sfn.get_paginator("list_state_machines").paginate():
        for machine in page["stateMachines"]:
            if machine["name"] == names.state_machine:
                return str(machine["stateMachineArn"])
    return str(
        sfn.create_state_machine(
            name=names.state_machine,
            definition=json.dumps(fanout_definition()),
            roleArn=LOCAL_ROLE_ARN,
            type="STANDARD",
        )["stateMachineArn"]
    )


WEBHOOK_ATTEMPTS = 6  # deliveries of one callback before its message goes to the webhooks DLQ
# The deliverer Lambda (functions/webhooks): a batch of WEBHOOK_BATCH_SIZE callbacks, each of
# which may take its longest delivery (core.webhooks.longest_delivery_seconds, 15 s) and the
# deliverer's margin around it (queueing.webhooks, 5 s), fits its timeout with room for a cold
# start; a batch that did not would be ended by Lambda and come back whole.
WEBHOOK_BATCH_SIZE = 5
WEBHOOK_TIMEOUT_SECONDS = 120
# AWS: a queue a Lambda consumes hides a message >= 6x the function's timeout (a throttled invoke
# is retried while the clock runs). A retry's wait is set per message (queueing.webhooks.backoff_seconds);
# this is how long a message taken by an invocation that crashed, or not started for want of time, waits.
WEBHOOK_VISIBILITY_SECONDS = 6 * WEBHOOK_TIMEOUT_SECONDS


def queue_attributes(settings: QueueSettings, dlq_arn: str) -> dict[str, str]:
    return {
        "VisibilityTimeout": str(settings.visibility_timeout),
        "MessageRetentionPeriod": str(settings.retention_seconds),
        "RedrivePolicy": json.dumps(
            {"deadLetterTargetArn": dlq_arn, "maxReceiveCount": settings.sqs_max_receive_count}
        ),
    }


def table_definition(name: str, *, stream: bool = False) -> dict[str, Any]:
    """CreateTable arguments: on-demand, pk/sk strings, the tenant listing index ``gsi1``.

    ``stream`` adds the stream the deployed table has (``TABLE_STREAM_VIEW_TYPE``). A local
    stack has it when it runs the events hub (``agentq dev``: ``agentq.hub`` reads it), and goes
    without otherwise: moto runs no TTL, so nothing would reap (``agentq_dev.moto_streams``
    bounds the records moto keeps).
    """
    definition: dict[str, Any] = {
        "TableName": name,
        "KeySchema": TABLE_KEY_SCHEMA,
        "AttributeDefinitions": TABLE_ATTRIBUTES,
        "GlobalSecondaryIndexes": TABLE_GSIS,
        "BillingMode": "PAY_PER_REQUEST",
    }
    if stream:
        definition["StreamSpecification"] = {"StreamEnabled": True, "StreamViewType": TABLE_STREAM_VIEW_TYPE}
    return definition


def ensure_indexes(ddb: Any, table: str) -> None:
    """Add any index of ``TABLE_GSIS`` an existing table lacks (a table made before it existed)."""
    described = ddb.describe_table(TableName=table)["Table"]
    have = {i["IndexName"] for i in described.get("GlobalSecondaryIndexes", [])}
    for gsi in TABLE_GSIS:
        if gsi["IndexName"] not in have:
            ddb.update_table(
                TableName=table,
                AttributeDefinitions=TABLE_ATTRIBUTES,
                GlobalSecondaryIndexUpdates=[{"Create": gsi}],
            )


def provision(
    session: Any,
    names: ResourceNames,
    *,
    endpoint_url: str | None = None,
    queues: QueueSettings | None = None,
    stream: bool = False,
) -> None:
    """Create the table, bucket and (with ``queues``) the tier queues and their DLQs if
    missing (idempotent), the way the local stack and tests do; ``stream``: the table with its
    stream, as deployed (what the events hub reads)."""
    ddb = session.client("dynamodb", endpoint_url=endpoint_url)
    s3 = session.client("s3", endpoint_url=endpoint_url)
    try:
        ddb.create_table(**table_definition(names.table, stream=stream))
    except ddb.exceptions.ResourceInUseException:
        ensure_indexes(ddb, names.table)
    ddb.get_waiter("table_exists").wait(TableName=names.table, WaiterConfig={"Delay": 0.05, "MaxAttempts": 200})
    with contextlib.suppress(ddb.exceptions.ClientError):  # already enabled
        ddb.update_time_to_live(
            TableName=names.table, TimeToLiveSpecification={"Enabled": True, "AttributeName": TTL_ATTRIBUTE}
        )
    with contextlib.suppress(s3.exceptions.BucketAlreadyOwnedByYou, s3.exceptions.BucketAlreadyExists):
        s3.create_bucket(Bucket=names.bucket)
    if queues is not None:
        provision_queues(session.client("sqs", endpoint_url=endpoint_url), names, queues)
        provision_state_machine(session.client("stepfunctions", endpoint_url=endpoint_url), names)


def provision_queues(
    sqs: Any, names: ResourceNames, settings: QueueSettings, *, pool: str | None = None
) -> dict[str, str]:
    """Each tier queue with its own DLQ through a redrive policy; returns tier -> queue URL.
    ``pool``: the tier queues of that pool (``{prefix}-{pool}-{tier}``, agentq.queueing.queues)
    alone, without the webhooks queue."""
    urls: dict[str, str] = {}
    for tier in TIERS:
        name = f"{pool}-{tier}" if pool else tier
        dlq_url = sqs.create_queue(
            QueueName=names.dlq(name), Attributes={"MessageRetentionPeriod": str(settings.dlq_retention_seconds)}
        )["QueueUrl"]
        dlq_arn = sqs.get_queue_attributes(QueueUrl=dlq_url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
        urls[tier] = sqs.create_queue(QueueName=names.queue(name), Attributes=queue_attributes(settings, dlq_arn))[
            "QueueUrl"
        ]
    if pool:
        return urls
    # Callbacks (queueing/webhooks.py): their own queue, so a receiver that is down delays
    # nothing else; WEBHOOK_ATTEMPTS receives, then the DLQ.
    dlq_url = sqs.create_queue(
        QueueName=names.webhooks_dlq, Attributes={"MessageRetentionPeriod": str(settings.dlq_retention_seconds)}
    )["QueueUrl"]
    dlq_arn = sqs.get_queue_attributes(QueueUrl=dlq_url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    urls["webhooks"] = sqs.create_queue(
        QueueName=names.webhooks,
        Attributes={
            "VisibilityTimeout": str(WEBHOOK_VISIBILITY_SECONDS),
            "RedrivePolicy": json.dumps({"deadLetterTargetArn": dlq_arn, "maxReceiveCount": WEBHOOK_ATTEMPTS}),
        },
    )["QueueUrl"]
    return urls
