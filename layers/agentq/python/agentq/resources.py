"""The one definition of the AWS resources agentq uses.

The local stack provisions from these dicts and the CDK stack (infra/) reads the same
ones, so a key schema or queue setting cannot drift between local and deployed.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

TABLE_KEY_SCHEMA: list[dict[str, str]] = [
    {"AttributeName": "pk", "KeyType": "HASH"},
    {"AttributeName": "sk", "KeyType": "RANGE"},
]
TABLE_ATTRIBUTES: list[dict[str, str]] = [
    {"AttributeName": "pk", "AttributeType": "S"},
    {"AttributeName": "sk", "AttributeType": "S"},
]
TTL_ATTRIBUTE = "expires_at"


class ResourceNames(BaseModel):
    """Physical names of one deployment's resources (one per environment / local run)."""

    table: str
    bucket: str

    @classmethod
    def for_prefix(cls, prefix: str) -> "ResourceNames":
        return cls(table=f"{prefix}-tasks", bucket=f"{prefix}-payloads")


def table_definition(name: str) -> dict[str, Any]:
    """CreateTable arguments: on-demand, pk/sk strings."""
    return {
        "TableName": name,
        "KeySchema": TABLE_KEY_SCHEMA,
        "AttributeDefinitions": TABLE_ATTRIBUTES,
        "BillingMode": "PAY_PER_REQUEST",
    }


def provision(session: Any, names: ResourceNames, *, endpoint_url: str | None = None) -> None:
    """Create the table and bucket if missing (idempotent), the way the local stack and tests do."""
    ddb = session.client("dynamodb", endpoint_url=endpoint_url)
    s3 = session.client("s3", endpoint_url=endpoint_url)
    try:
        ddb.create_table(**table_definition(names.table))
    except ddb.exceptions.ResourceInUseException:
        pass
    ddb.get_waiter("table_exists").wait(TableName=names.table, WaiterConfig={"Delay": 0.05, "MaxAttempts": 200})
    try:
        ddb.update_time_to_live(
            TableName=names.table, TimeToLiveSpecification={"Enabled": True, "AttributeName": TTL_ATTRIBUTE}
        )
    except ddb.exceptions.ClientError:
        pass  # already enabled
    try:
        s3.create_bucket(Bucket=names.bucket)
    except (s3.exceptions.BucketAlreadyOwnedByYou, s3.exceptions.BucketAlreadyExists):
        pass
