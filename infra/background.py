"""The functions beside the task path, each on its own trigger: the reaper (the table's stream:
what TTL left of an expired task), the sweeper (a schedule: unfinished tasks with no worker and
no message) and the webhooks deliverer (the webhooks queue: signed task-end callbacks).
"""

from __future__ import annotations

import aws_cdk as cdk
from aws_cdk import aws_events as events
from aws_cdk import aws_events_targets as targets
from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_lambda_event_sources as sources
from aws_cdk import aws_sqs as sqs
from constructs import Construct

from agentq.control.retention import ttl_removal_pattern
from agentq.observe.names import NAMESPACE as METRICS_NAMESPACE
from agentq.resources import GSI_LIVE, PAYLOAD_PREFIX, WEBHOOK_BATCH_SIZE, WEBHOOK_TIMEOUT_SECONDS
from agentq.storage.keys import task_pk, tenant_pk
from infra.access import SLOT_PARTITIONS, liveness_statements, payload_objects
from infra.data import Data
from infra.functions import FunctionFactory
from infra.retention import removal_policy
from infra.settings import EnvironmentSettings
from infra.task_runners import defaults_env

# The reaper deletes a finished task's items (Query its partition, BatchWriteItem deletes, and
# DeleteItem for META and the budget) and its payload objects (listed by prefix).
REAPER_TABLE_ACTIONS = ["dynamodb:Query", "dynamodb:BatchWriteItem", "dynamodb:DeleteItem"]
REAPER_PAYLOAD_ACTIONS = ["s3:DeleteObject"]


def build_webhooks(function: FunctionFactory, data: Data, common: dict[str, str]) -> lambda_.Function:
    """The deliverer of callbacks, on the webhooks queue (``WEBHOOK_BATCH_SIZE`` a batch, within
    ``WEBHOOK_TIMEOUT_SECONDS`` at the longest delivery each, partial failures): it reads the
    tenant's signing secret (made on first use), POSTs, sets a retry's backoff, and sends a
    refused callback to the webhooks DLQ with its reason."""
    deliverer = function(
        "webhooks",
        memory=256,
        timeout=WEBHOOK_TIMEOUT_SECONDS,
        env=common,
        reserved=None,
        description="agentq webhooks: POSTs signed task-end callbacks",
    )
    deliverer.add_event_source(
        sources.SqsEventSource(data.webhooks, batch_size=WEBHOOK_BATCH_SIZE, report_batch_item_failures=True)
    )
    for statement in (
        iam.PolicyStatement(
            sid="Secrets",
            actions=["dynamodb:GetItem", "dynamodb:PutItem"],
            resources=[data.table.table_arn],
            conditions={"ForAllValues:StringLike": {"dynamodb:LeadingKeys": [tenant_pk("*")]}},
        ),
        iam.PolicyStatement(
            sid="Backoff",
            actions=["sqs:ChangeMessageVisibility", "sqs:GetQueueUrl"],
            resources=[data.webhooks.queue_arn],
        ),
        iam.PolicyStatement(
            sid="DeadLetter", actions=["sqs:SendMessage", "sqs:GetQueueUrl"], resources=[data.webhooks_dlq.queue_arn]
        ),
    ):
        deliverer.add_to_role_policy(statement)
    return deliverer


def build_sweeper(
    scope: Construct, function: FunctionFactory, cfg: EnvironmentSettings, data: Data
) -> lambda_.Function:
    """The sweeper on a schedule: it lists unfinished tasks from the sparse ``live`` index,
    reads their META, re-enqueues the stranded ones, moves on a blocked one past a dependency's
    end no walk reported, gives back the running slots a parked one still names, and takes
    ended ones out of the index."""
    names, sc = cfg.names, cfg.sweeper
    sweeper = function(
        "sweeper",
        memory=sc.memory_mb,
        timeout=sc.timeout_seconds,
        env={
            "AGENTQ_PREFIX": names.prefix,
            "AGENTQ_TABLE": data.table.table_name,
            "AGENTQ_BUCKET": data.payloads.bucket_name,
            "AGENTQ_SWEEP_STALE_AFTER_SECONDS": str(sc.stale_after_seconds),
            **defaults_env(cfg),  # the default running limit: it wakes waiters a raised default has room for
            "AGENTQ_EMF": "1",
            "POWERTOOLS_LOG_LEVEL": cfg.log_level,
            "POWERTOOLS_METRICS_NAMESPACE": METRICS_NAMESPACE,
        },
        reserved=1,  # one sweep at a time: two would only send duplicates
        description="agentq sweeper: re-enqueues unfinished tasks left with no worker and no message",
    )
    table = data.table.table_arn
    for statement in (
        iam.PolicyStatement(sid="ListLive", actions=["dynamodb:Query"], resources=[f"{table}/index/{GSI_LIVE}"]),
        # META of the listed tasks (and their submissions, for the tier), and taking an ended
        # task out of the index; only task partitions.
        iam.PolicyStatement(
            sid="ReadTasks",
            actions=["dynamodb:BatchGetItem", "dynamodb:GetItem", "dynamodb:UpdateItem"],
            resources=[table],
            conditions={"ForAllValues:StringLike": {"dynamodb:LeadingKeys": [task_pk("*")]}},
        ),
        # The waiting lists of the running limits (storage/running_slots.py): a task parked
        # for a slot is left alone, so the sweeper reads whether it has a WAIT item; and it
        # wakes (deletes the WAIT item of) the waiters a tenant's slot item has room for.
        iam.PolicyStatement(
            sid="WaitingLists",
            actions=["dynamodb:Query", "dynamodb:GetItem", "dynamodb:DeleteItem"],
            resources=[table],
            conditions={"ForAllValues:StringLike": {"dynamodb:LeadingKeys": SLOT_PARTITIONS}},
        ),
        # A parked task still naming running slots (its worker died before the release, and no
        # message of its own came): they are given back (queueing.sweeper, FairShare.release):
        # the slot items' counts updated (its META's by ReadTasks, a key's HOLD# item deleted by
        # WaitingLists), and a key's or the fleet's freed slot handed off to its waiter (its
        # admission: the counts again, and a key's HOLD# item put). Only the slot partitions.
        iam.PolicyStatement(
            sid="GiveBackSlots",
            actions=["dynamodb:UpdateItem", "dynamodb:PutItem"],
            resources=[table],
            conditions={"ForAllValues:StringLike": {"dynamodb:LeadingKeys": SLOT_PARTITIONS}},
        ),
        # The fleet's wake (storage/fleet_slots.py): the shards and the waiting tenants' slot
        # items in one BatchGetItem; a waiting tenant's mark put back when a task parked as its
        # list was found empty (only under FLEET#).
        iam.PolicyStatement(
            sid="FleetShares",
            actions=["dynamodb:BatchGetItem"],
            resources=[table],
            conditions={"ForAllValues:StringLike": {"dynamodb:LeadingKeys": [tenant_pk("*"), "FLEET*"]}},
        ),
        iam.PolicyStatement(
            sid="FleetMarks",
            actions=["dynamodb:PutItem"],
            resources=[table],
            conditions={"ForAllValues:StringLike": {"dynamodb:LeadingKeys": ["FLEET*"]}},
        ),
        iam.PolicyStatement(
            sid="Enqueue",
            # ChangeMessageVisibility: a dead worker's held messages are made visible again
            actions=["sqs:SendMessage", "sqs:GetQueueUrl", "sqs:ChangeMessageVisibility"],
            resources=[q.queue_arn for q in data.queues.values()],
        ),
        # A blocked task whose dependency ended with no walk reported (queueing.endings.resolve,
        # from the sweep): the task read (a Query of its partition), moved on (a transaction of
        # its META, ReadTasks' UpdateItem, and its event, PutItem), its dependents listed (a Query
        # of its partition); only task partitions. A task it cancels has its callback queued.
        iam.PolicyStatement(
            sid="ReleaseBlocked",
            actions=["dynamodb:Query", "dynamodb:PutItem"],
            resources=[table],
            conditions={"ForAllValues:StringLike": {"dynamodb:LeadingKeys": [task_pk("*")]}},
        ),
        iam.PolicyStatement(
            sid="Callbacks", actions=["sqs:SendMessage", "sqs:GetQueueUrl"], resources=[data.webhooks.queue_arn]
        ),
        *liveness_statements(data),
    ):
        sweeper.add_to_role_policy(statement)
    events.Rule(
        scope,
        "SweeperSchedule",
        description="agentq: run the sweeper",
        schedule=events.Schedule.rate(cdk.Duration.minutes(sc.every_minutes)),
        targets=[targets.LambdaFunction(sweeper, retry_attempts=0)],
    )
    return sweeper


def build_reaper(
    scope: Construct, function: FunctionFactory, cfg: EnvironmentSettings, data: Data
) -> tuple[lambda_.Function, sqs.Queue]:
    """The reaper on the table's stream: only TTL deletions of task META reach it (the filter
    is ``agentq.control.retention.ttl_removal_pattern``); each one purges that task's remaining items,
    its budget and its payloads. A batch that keeps failing is split in halves to isolate the
    bad record, and one that still fails after the retries lands in the reaper DLQ."""
    names = cfg.names
    rc = cfg.reaper
    reaper = function(
        "reaper",
        memory=rc.memory_mb,
        timeout=rc.timeout_seconds,
        env={
            "AGENTQ_PREFIX": names.prefix,
            "AGENTQ_TABLE": data.table.table_name,
            "AGENTQ_BUCKET": data.payloads.bucket_name,
            "AGENTQ_TASK_RETENTION_DAYS": str(cfg.task_retention_days),
            "POWERTOOLS_LOG_LEVEL": cfg.log_level,
            "POWERTOOLS_METRICS_NAMESPACE": METRICS_NAMESPACE,
        },
        reserved=None,
        description="agentq reaper: purges a task's items and payloads once TTL deleted its META",
    )
    # Only in task partitions: what a purge deletes is TASK#<id> (storage/purge.py), never a
    # tenant's API keys, limits, secrets or vault items.
    reaper.add_to_role_policy(
        iam.PolicyStatement(
            sid="PurgeTaskItems",
            actions=REAPER_TABLE_ACTIONS,
            resources=[data.table.table_arn],
            conditions={"ForAllValues:StringLike": {"dynamodb:LeadingKeys": [task_pk("*")]}},
        )
    )
    reaper.add_to_role_policy(
        iam.PolicyStatement(sid="DeletePayloads", actions=REAPER_PAYLOAD_ACTIONS, resources=[payload_objects(data)])
    )
    reaper.add_to_role_policy(
        iam.PolicyStatement(
            sid="ListPayloads",
            actions=["s3:ListBucket"],
            resources=[data.payloads.bucket_arn],
            conditions={"StringLike": {"s3:prefix": [f"{PAYLOAD_PREFIX}*"]}},
        )
    )
    dlq = sqs.Queue(
        scope,
        "ReaperDlq",
        queue_name=f"{names.prefix}-reaper-dlq",
        encryption=sqs.QueueEncryption.SQS_MANAGED,
        enforce_ssl=True,
        retention_period=cdk.Duration.seconds(cfg.dlq_retention_seconds),
        removal_policy=removal_policy(cfg),
    )
    reaper.add_event_source(
        sources.DynamoEventSource(
            data.table,
            # From the oldest record the stream holds (24 h): a mapping created or re-enabled
            # after some expiries still reaps them.
            starting_position=lambda_.StartingPosition.TRIM_HORIZON,
            batch_size=rc.batch_size,
            bisect_batch_on_error=True,
            retry_attempts=rc.retry_attempts,
            report_batch_item_failures=True,
            on_failure=sources.SqsDlq(dlq),
            filters=[lambda_.FilterCriteria.filter(ttl_removal_pattern())],
        )
    )
    return reaper, dlq
