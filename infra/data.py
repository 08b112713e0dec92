"""State: the single table, the payload bucket, the tier queues and their DLQs.

Key schema, TTL attribute, GSIs, tiers, queue settings and names all come from
``agentq.resources`` (what the local stack provisions too); this module only adds what only a
deployment has: encryption, TLS-only policies, PITR, lifecycle, removal policies.
"""

from __future__ import annotations

from dataclasses import dataclass

import aws_cdk as cdk
from aws_cdk import aws_dynamodb as dynamodb
from aws_cdk import aws_kms as kms
from aws_cdk import aws_s3 as s3
from aws_cdk import aws_sqs as sqs
from constructs import Construct

from agentq.queueing.queues import pooled
from agentq.resources import (
    TABLE_ATTRIBUTES,
    TABLE_GSIS,
    TABLE_KEY_SCHEMA,
    TABLE_STREAM_VIEW_TYPE,
    TIERS,
    TTL_ATTRIBUTE,
    WEBHOOK_ATTEMPTS,
    WEBHOOK_VISIBILITY_SECONDS,
)
from infra.retention import removal_policy
from infra.settings import EnvironmentSettings

# The table's point-in-time recovery window, and how long the payload bucket of a retained
# environment keeps what was deleted or replaced: a restored table finds the objects it names.
RECOVERY_DAYS = 35


def table_attribute_types() -> dict[str, str]:
    return {a["AttributeName"]: a["AttributeType"] for a in TABLE_ATTRIBUTES}


_TYPES = {"S": dynamodb.AttributeType.STRING, "N": dynamodb.AttributeType.NUMBER, "B": dynamodb.AttributeType.BINARY}
_PROJECTIONS = {
    "ALL": dynamodb.ProjectionType.ALL,
    "KEYS_ONLY": dynamodb.ProjectionType.KEYS_ONLY,
    "INCLUDE": dynamodb.ProjectionType.INCLUDE,
}


def _key(schema: list[dict[str, str]], kind: str, types: dict[str, str]) -> dynamodb.Attribute | None:
    for k in schema:
        if k["KeyType"] == kind:
            return dynamodb.Attribute(name=k["AttributeName"], type=_TYPES[types[k["AttributeName"]]])
    return None


@dataclass
class Data:
    table: dynamodb.Table
    payloads: s3.Bucket
    access_logs: s3.Bucket
    queues: dict[str, sqs.Queue]
    dlqs: dict[str, sqs.Queue]
    webhooks: sqs.Queue
    webhooks_dlq: sqs.Queue
    vault_key: kms.Key  # wraps the data key of each vault credential (core.vault_crypto)

    @property
    def gsi_names(self) -> list[str]:
        return [g["IndexName"] for g in TABLE_GSIS]


def build_data(scope: Construct, cfg: EnvironmentSettings) -> Data:
    table = _table(scope, cfg)
    access_logs, payloads = _buckets(scope, cfg)
    queues, dlqs = tier_queues(scope, cfg)
    webhooks, webhooks_dlq = _webhook_queues(scope, cfg)
    # The vault's key: the API may only generate data keys under it, the task runners only
    # decrypt them, each with an encryption context naming the credential's tenant (infra.access).
    vault_key = kms.Key(
        scope, "VaultKey", description=f"agentq {cfg.prefix} vault: wraps each credential's data key",
        enable_key_rotation=True, removal_policy=removal_policy(cfg),
    )  # fmt: skip
    return Data(
        table=table, payloads=payloads, access_logs=access_logs, queues=queues, dlqs=dlqs,
        webhooks=webhooks, webhooks_dlq=webhooks_dlq, vault_key=vault_key,
    )  # fmt: skip


def _table(scope: Construct, cfg: EnvironmentSettings) -> dynamodb.Table:
    """The single table, from ``agentq.resources`` (keys, GSIs, TTL, stream) as the local stack makes it."""
    types = table_attribute_types()
    table = dynamodb.Table(
        scope,
        "Table",
        table_name=cfg.names.table,
        partition_key=_key(TABLE_KEY_SCHEMA, "HASH", types),
        sort_key=_key(TABLE_KEY_SCHEMA, "RANGE", types),
        billing_mode=dynamodb.BillingMode.PAY_PER_REQUEST,
        encryption=dynamodb.TableEncryption.AWS_MANAGED,
        point_in_time_recovery_specification=dynamodb.PointInTimeRecoverySpecification(
            point_in_time_recovery_enabled=True, recovery_period_in_days=RECOVERY_DAYS
        ),
        time_to_live_attribute=TTL_ATTRIBUTE,
        # The reaper's trigger: TTL deletions of task META (infra/background.py filters the rest).
        stream=dynamodb.StreamViewType[TABLE_STREAM_VIEW_TYPE],
        deletion_protection=not cfg.destroy,
        removal_policy=removal_policy(cfg),
    )
    for gsi in TABLE_GSIS:
        projection = gsi.get("Projection", {"ProjectionType": "ALL"})
        table.add_global_secondary_index(
            index_name=gsi["IndexName"],
            partition_key=_key(gsi["KeySchema"], "HASH", types),
            sort_key=_key(gsi["KeySchema"], "RANGE", types),
            projection_type=_PROJECTIONS[projection["ProjectionType"]],
            non_key_attributes=projection.get("NonKeyAttributes"),
        )
    return table


def _buckets(scope: Construct, cfg: EnvironmentSettings) -> tuple[s3.Bucket, s3.Bucket]:
    """The payload bucket (offloaded bodies under ``PAYLOAD_PREFIX``), and its access logs'.

    No lifecycle rule expires ``PAYLOAD_PREFIX``: a task's payloads go with the task (the reaper,
    when its record expires; ``agentq purge``), never by their age, since a task may live on past
    any age counted from an object's creation (a conversation reopened, a pause): a committed
    step's files are never lost.

    In a retained environment the bucket is versioned, and what was deleted (the reaper, a purge,
    a mistake) or replaced stays as a noncurrent version for the table's PITR window
    (``RECOVERY_DAYS``), then expires with its delete marker: a table restored to any point of
    the window finds the objects its items name. Only noncurrent versions expire."""
    removal = removal_policy(cfg)
    retained = not cfg.destroy
    payload_rules = [
        s3.LifecycleRule(id="abort-incomplete-uploads", abort_incomplete_multipart_upload_after=cdk.Duration.days(1))
    ]
    if retained:
        payload_rules.append(
            s3.LifecycleRule(
                id="expire-noncurrent-versions",
                noncurrent_version_expiration=cdk.Duration.days(RECOVERY_DAYS),
                expired_object_delete_marker=True,
            )
        )
    # Server access logs of the payload bucket. It cannot log to itself (a loop), which is the
    # one cdk-nag S1 acknowledgement in infra/nag.py.
    access_logs = s3.Bucket(
        scope,
        "AccessLogs",
        encryption=s3.BucketEncryption.S3_MANAGED,
        enforce_ssl=True,
        minimum_tls_version=1.2,
        block_public_access=s3.BlockPublicAccess.BLOCK_ALL,
        object_ownership=s3.ObjectOwnership.BUCKET_OWNER_ENFORCED,
        lifecycle_rules=[
            s3.LifecycleRule(id="expire-access-logs", expiration=cdk.Duration.days(max(90, cfg.log_retention_days)))
        ],
        removal_policy=removal,
        auto_delete_objects=cfg.destroy,
    )
    payloads = s3.Bucket(
        scope,
        "Payloads",
        encryption=s3.BucketEncryption.S3_MANAGED,
        enforce_ssl=True,
        minimum_tls_version=1.2,
        block_public_access=s3.BlockPublicAccess.BLOCK_ALL,
        object_ownership=s3.ObjectOwnership.BUCKET_OWNER_ENFORCED,
        server_access_logs_bucket=access_logs,
        server_access_logs_prefix="payloads/",
        versioned=retained,
        lifecycle_rules=payload_rules,
        removal_policy=removal,
        auto_delete_objects=cfg.destroy,
    )
    return access_logs, payloads


def tier_queues(
    scope: Construct, cfg: EnvironmentSettings, pool: str | None = None
) -> tuple[dict[str, sqs.Queue], dict[str, sqs.Queue]]:
    """A queue per tier, each with its DLQ (``max_receive_count`` tries): SSE-SQS, TLS only. A
    ``pool`` (the EC2 workspace tier's) gets its own set, ``{prefix}-{pool}-{tier}``, built alike."""
    removal, names, qs = removal_policy(cfg), cfg.names, cfg.queue_settings()
    queues: dict[str, sqs.Queue] = {}
    dlqs: dict[str, sqs.Queue] = {}
    for tier in TIERS:
        name, construct = pooled(tier, pool), f"{(pool or '').capitalize()}{tier.capitalize()}"
        # The DLQ only takes redrives from its own tier queue. The source ARN is built from the
        # queue's fixed name: a reference would make the two queues depend on each other.
        source_arn = cdk.Stack.of(scope).format_arn(service="sqs", resource=names.queue(name))
        dlq = sqs.Queue(
            scope,
            f"{construct}Dlq",
            queue_name=names.dlq(name),
            encryption=sqs.QueueEncryption.SQS_MANAGED,
            enforce_ssl=True,
            retention_period=cdk.Duration.seconds(qs.dlq_retention_seconds),
            redrive_allow_policy=sqs.RedriveAllowPolicy(
                redrive_permission=sqs.RedrivePermission.BY_QUEUE,
                source_queues=[sqs.Queue.from_queue_arn(scope, f"{construct}QueueRef", source_arn)],
            ),
            removal_policy=removal,
        )
        queue = sqs.Queue(
            scope,
            f"{construct}Queue",
            queue_name=names.queue(name),
            encryption=sqs.QueueEncryption.SQS_MANAGED,
            enforce_ssl=True,
            visibility_timeout=cdk.Duration.seconds(qs.visibility_timeout),
            retention_period=cdk.Duration.seconds(qs.retention_seconds),
            dead_letter_queue=sqs.DeadLetterQueue(queue=dlq, max_receive_count=qs.sqs_max_receive_count),
            removal_policy=removal,
        )
        queues[tier] = queue
        dlqs[tier] = dlq
    return queues, dlqs


def _webhook_queues(scope: Construct, cfg: EnvironmentSettings) -> tuple[sqs.Queue, sqs.Queue]:
    """Callbacks (agentq.queueing.webhooks): a queue of their own, WEBHOOK_ATTEMPTS tries, a DLQ."""
    removal, names, qs = removal_policy(cfg), cfg.names, cfg.queue_settings()
    webhooks_dlq = sqs.Queue(
        scope, "WebhooksDlq", queue_name=names.webhooks_dlq, encryption=sqs.QueueEncryption.SQS_MANAGED,
        enforce_ssl=True, retention_period=cdk.Duration.seconds(qs.dlq_retention_seconds), removal_policy=removal,
    )  # fmt: skip
    webhooks = sqs.Queue(
        scope, "WebhooksQueue", queue_name=names.webhooks, encryption=sqs.QueueEncryption.SQS_MANAGED,
        enforce_ssl=True, visibility_timeout=cdk.Duration.seconds(WEBHOOK_VISIBILITY_SECONDS),
        dead_letter_queue=sqs.DeadLetterQueue(queue=webhooks_dlq, max_receive_count=WEBHOOK_ATTEMPTS),
        removal_policy=removal,
    )  # fmt: skip
    return webhooks, webhooks_dlq
