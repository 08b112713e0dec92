"""What the roles of the stack are granted on: this deployment's resources by ARN, and the sets
of actions more than one role shares.

Every grant names resources of this environment (its table and indexes, the payload prefix of
its bucket, its fan-out machine's executions, its event bus, named secrets); the only ``*`` is
where AWS offers no resource-level permission (X-Ray, ``dynamodb:ListStreams``). The table's
partitions a role may reach are conditions on ``dynamodb:LeadingKeys``.
"""

from __future__ import annotations

import aws_cdk as cdk
from aws_cdk import aws_iam as iam

from agentq.resources import GSI_OWNER, PAYLOAD_PREFIX
from agentq.storage.keys import tenant_pk
from agentq.storage.workers import WORKERS_PK
from infra.data import Data
from infra.model_access import bedrock_resource_templates
from infra.settings import EnvironmentSettings

# What the table's users call. TransactWriteItems is authorised per item as Put/Update/Delete/
# ConditionCheckItem; BatchGetItem as GetItem on each table, but IAM lists it on its own.
TABLE_ACTIONS = [
    "dynamodb:GetItem",
    "dynamodb:BatchGetItem",
    "dynamodb:Query",
    "dynamodb:PutItem",
    "dynamodb:UpdateItem",
    "dynamodb:DeleteItem",
    "dynamodb:ConditionCheckItem",
]
# The running limits (storage/running_slots.py): admitting takes a slot item and a HOLD# item in
# the tenant's and a concurrency key's partitions; releasing deletes the HOLD# item, parking puts
# a WAIT# item and waking deletes it; the fleet's shards, lists and waiting tenants are under
# FLEET# (storage/fleet_slots.py), a tenant's slot of a tier and its waiters under TIER#
# (storage/tier_slots.py). DeleteItem reaches no further than those partitions.
SLOT_PARTITIONS = [tenant_pk("*"), "CKEY#*", "FLEET*", "TIER#*"]
PAYLOAD_ACTIONS = ["s3:GetObject", "s3:PutObject"]
# The vault (storage/vault.py): a tenant's and each user's credentials and waiting tasks, under
# VAULT#<digest>. The API writes and deletes credentials; a task runner reads them and puts and
# deletes the notes of the tasks that wait for one.
VAULT_PARTITIONS = ["VAULT#*"]
VAULT_KEY_VARIABLE = "AGENTQ_VAULT_KMS_KEY"


def vault_env(data: Data) -> dict[str, str]:
    return {VAULT_KEY_VARIABLE: data.vault_key.key_arn}


def vault_statements(data: Data, *, seal: bool) -> list[iam.PolicyStatement]:
    """The vault's table partitions, and the key: ``kms:GenerateDataKey`` for what seals (the
    API), ``kms:Decrypt`` for what opens (the task runners), never both, and only with an
    encryption context that names a tenant (``core.vault.context_for``)."""
    return [
        iam.PolicyStatement(
            sid="Vault",
            actions=["dynamodb:GetItem", "dynamodb:Query", "dynamodb:PutItem", "dynamodb:DeleteItem"],
            resources=table_resources(data, indexes=False),
            conditions={"ForAllValues:StringLike": {"dynamodb:LeadingKeys": VAULT_PARTITIONS}},
        ),
        iam.PolicyStatement(
            sid="VaultSeal" if seal else "VaultOpen",
            actions=["kms:GenerateDataKey"] if seal else ["kms:Decrypt"],
            resources=[data.vault_key.key_arn],
            conditions={"Null": {"kms:EncryptionContext:agentq:tenant": "false"}},
        ),
    ]


def table_resources(data: Data, *, indexes: bool) -> list[str]:
    arns = [data.table.table_arn]
    if indexes:
        arns += [f"{data.table.table_arn}/index/{name}" for name in data.gsi_names]
    return arns


def payload_objects(data: Data) -> str:
    return data.payloads.arn_for_objects(f"{PAYLOAD_PREFIX}*")


def workspace_objects(data: Data) -> str:
    """Every task's workspace content (``storage.workspaces``: ``tasks/<id>/workspace/...``)."""
    return data.payloads.arn_for_objects(f"{PAYLOAD_PREFIX}*/workspace/*")


def bedrock_resources(cfg: EnvironmentSettings) -> list[str]:
    """The Bedrock models ``bedrock_models`` names (infra/model_access.py)."""
    aws = cdk.Aws
    return [
        t.format(partition=aws.PARTITION, region=aws.REGION, account=aws.ACCOUNT_ID)
        for t in bedrock_resource_templates(cfg.bedrock_models)
    ]


def execution_arns(cfg: EnvironmentSettings) -> str:
    """Executions of this environment's fan-out machine, by its fixed name."""
    return f"arn:{cdk.Aws.PARTITION}:states:{cdk.Aws.REGION}:{cdk.Aws.ACCOUNT_ID}:execution:{cfg.names.state_machine}:*"


def event_bus_name(cfg: EnvironmentSettings) -> str | None:
    """The bus as ``AGENTQ_EVENT_BUS`` (PutEvents' ``EventBusName``, a name or an ARN) names it:
    ``stack``, the bus the stack creates (``{prefix}-events``); another name or an ARN, that
    bus; None: none."""
    if not cfg.event_bus:
        return None
    return f"{cfg.prefix}-events" if cfg.event_bus == "stack" else cfg.event_bus


def event_bus_arn(cfg: EnvironmentSettings) -> str | None:
    """What PutEvents is granted on: a bus named by its ARN as given (a central bus, perhaps of
    another account), a name as this account's and region's bus."""
    name = event_bus_name(cfg)
    if name is None:
        return None
    if name.startswith("arn:"):
        return name
    return f"arn:{cdk.Aws.PARTITION}:events:{cdk.Aws.REGION}:{cdk.Aws.ACCOUNT_ID}:event-bus/{name}"


def secret_arn(name: str) -> str:
    """A named secret's ARN: Secrets Manager appends six random characters."""
    return f"arn:{cdk.Aws.PARTITION}:secretsmanager:{cdk.Aws.REGION}:{cdk.Aws.ACCOUNT_ID}:secret:{name}-??????"


def anthropic_secret_arn(cfg: EnvironmentSettings) -> str:
    """The named secret: Secrets Manager appends six random characters to a secret's ARN."""
    return secret_arn(str(cfg.anthropic_api_key_secret))


def liveness_statements(data: Data) -> list[iam.PolicyStatement]:
    """Worker liveness (``storage.workers``, ``queueing.recovery``): the ``WORKERS`` partition
    (its items are removed when a worker stops or its recovery ends) and the ``owner`` index
    that lists a dead worker's tasks."""
    table = data.table.table_arn
    return [
        iam.PolicyStatement(
            sid="WorkerLiveness",
            actions=[
                "dynamodb:Query",
                "dynamodb:GetItem",
                "dynamodb:PutItem",
                "dynamodb:UpdateItem",
                "dynamodb:DeleteItem",
            ],
            resources=[table],
            conditions={"ForAllValues:StringLike": {"dynamodb:LeadingKeys": [WORKERS_PK]}},
        ),
        iam.PolicyStatement(sid="OwnerIndex", actions=["dynamodb:Query"], resources=[f"{table}/index/{GSI_OWNER}"]),
    ]
