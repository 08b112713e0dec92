"""API keys in the task table: a bearer key maps to a tenant. Only the key's SHA-256 is stored.

Items:

- ``APIKEY#<sha256 hex of the key>`` / ``META``: tenant, key_id, created_at, revoked
  (what the authorizer reads: one GetItem per uncached key)
- ``APIKEYID#<key_id>`` / ``META``: the hash again, so ``agentq keys revoke KEY_ID`` finds the
  key without it; ``gsi1pk = "KEYS#<tenant>"`` lists a tenant's keys

What a presented key is worth (the ``Authorization`` header, 401s, the IAM policy) is the
API's business: ``agentq.api.auth``.

Light on purpose: the authorizer Lambda imports this and little else, so the lookup path
(``lookup``) writes its one key and reads its one item of scalars by hand; the writers and the
listing use ``agentq.storage.serdes`` (and so boto3's type (de)serializer), imported on first use.
"""

from __future__ import annotations

import hashlib
import re
import secrets
import time
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from agentq.core.errors import AgentqError, ValidationError

KEY_PREFIX = "aq_"
TENANT_PATTERN = re.compile(r"^[A-Za-z0-9._-]{1,64}$")
KEY_ID_PATTERN = re.compile(r"^key_[0-9a-f]{16}$")
META = "META"
HASH_PK = "APIKEY#"  # + sha256 hex of the key
ID_PK = "APIKEYID#"  # + key id
TENANT_KEYS = "KEYS#"  # + tenant: gsi1pk of a tenant's key ids


class KeyNotFound(AgentqError):
    code = "key_not_found"


@dataclass(frozen=True)
class ApiKey:
    key_id: str
    tenant: str
    created_at: float
    revoked: bool = False
    revoked_at: float | None = None


def key_hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def _number(raw: str) -> int | float:
    """A DynamoDB number as ``serdes.from_item`` returns it: int when whole, else float."""
    value = Decimal(raw)
    return int(value) if value == value.to_integral_value() else float(value)


def _from_item(item: dict[str, Any]) -> dict[str, Any]:
    """``serdes.from_item`` for an item of scalars (S, N, BOOL, NULL), without boto3's
    deserializer; any other type goes through ``serdes.from_item`` itself."""
    out: dict[str, Any] = {}
    for name, attr in item.items():
        ((kind, value),) = attr.items()
        if kind in {"S", "BOOL"}:
            out[name] = value
        elif kind == "N":
            out[name] = _number(value)
        elif kind == "NULL":
            out[name] = None
        else:
            from agentq.storage.serdes import from_item

            return from_item(item)
    return out


class KeyStore:
    """A tenant's keys in the task table, through a low-level DynamoDB client."""

    def __init__(self, ddb: Any, table: str) -> None:
        self.ddb = ddb
        self.table = table

    def create(self, tenant: str) -> tuple[str, ApiKey]:
        """A new key for ``tenant``: returns (the key, shown once and never stored, its record)."""
        from agentq.storage.serdes import to_item

        if not TENANT_PATTERN.match(tenant or ""):
            raise ValidationError("tenant: 1-64 letters, digits, '.', '_' or '-'", field="tenant")
        token = KEY_PREFIX + secrets.token_urlsafe(32)
        record = ApiKey(key_id="key_" + secrets.token_hex(8), tenant=tenant, created_at=time.time())
        digest = key_hash(token)
        self.ddb.transact_write_items(
            TransactItems=[
                {
                    "Put": {
                        "TableName": self.table,
                        "Item": to_item(
                            {
                                "pk": f"{HASH_PK}{digest}",
                                "sk": META,
                                "tenant": tenant,
                                "key_id": record.key_id,
                                "created_at": record.created_at,
                                "revoked": False,
                            }
                        ),
                        "ConditionExpression": "attribute_not_exists(pk)",
                    }
                },
                {
                    "Put": {
                        "TableName": self.table,
                        "Item": to_item(
                            {
                                "pk": f"{ID_PK}{record.key_id}",
                                "sk": META,
                                "key_hash": digest,
                                "tenant": tenant,
                                "created_at": record.created_at,
                                "revoked": False,
                                "gsi1pk": f"{TENANT_KEYS}{tenant}",
                                "gsi1sk": f"{int(record.created_at * 1000):015d}#{record.key_id}",
                            }
                        ),
                        "ConditionExpression": "attribute_not_exists(pk)",
                    }
                },
            ]
        )
        return token, record

    def lookup(self, token: str) -> ApiKey | None:
        """The record of a presented key (revoked or not), or None: one consistent GetItem."""
        resp = self.ddb.get_item(
            TableName=self.table,
            Key={"pk": {"S": f"{HASH_PK}{key_hash(token)}"}, "sk": {"S": META}},
            ConsistentRead=True,
        )
        if "Item" not in resp:
            return None
        item = _from_item(resp["Item"])
        return ApiKey(
            key_id=item["key_id"],
            tenant=item["tenant"],
            created_at=item["created_at"],
            revoked=bool(item.get("revoked")),
            revoked_at=item.get("revoked_at"),
        )

    def revoke(self, key_id: str) -> ApiKey:
        """Revoke a key by its id (idempotent). API Gateway may serve a cached allow for up to the
        authorizer's result TTL after this."""
        from botocore.exceptions import ClientError

        from agentq.storage.serdes import from_item, to_item, to_values

        if not KEY_ID_PATTERN.match(key_id or ""):
            raise ValidationError("key id looks like key_0123456789abcdef", field="key_id")
        resp = self.ddb.get_item(
            TableName=self.table, Key=to_item({"pk": f"{ID_PK}{key_id}", "sk": META}), ConsistentRead=True
        )
        if "Item" not in resp:
            raise KeyNotFound(f"no key {key_id!r}", field="key_id")
        item = from_item(resp["Item"])
        now = time.time()
        update = "SET revoked = :true, revoked_at = if_not_exists(revoked_at, :now)"
        values = to_values({":true": True, ":now": now})
        try:
            self.ddb.transact_write_items(
                TransactItems=[
                    {
                        "Update": {
                            "TableName": self.table,
                            "Key": to_item({"pk": f"{HASH_PK}{item['key_hash']}", "sk": META}),
                            "UpdateExpression": update,
                            "ConditionExpression": "attribute_exists(pk)",
                            "ExpressionAttributeValues": values,
                        }
                    },
                    {
                        "Update": {
                            "TableName": self.table,
                            "Key": to_item({"pk": f"{ID_PK}{key_id}", "sk": META}),
                            "UpdateExpression": update,
                            "ExpressionAttributeValues": values,
                        }
                    },
                ]
            )
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") == "TransactionCanceledException":
                raise KeyNotFound(f"no key {key_id!r}", field="key_id") from exc
            raise
        return ApiKey(
            key_id=key_id,
            tenant=item["tenant"],
            created_at=item["created_at"],
            revoked=True,
            revoked_at=item.get("revoked_at", now),
        )

    def list(self, tenant: str) -> list[ApiKey]:
        """A tenant's keys, newest first (ids only: the keys themselves are not stored)."""
        from agentq.resources import GSI1
        from agentq.storage.serdes import from_item, to_item, to_values

        out: list[ApiKey] = []
        request: dict[str, Any] = {
            "TableName": self.table,
            "IndexName": GSI1,
            "KeyConditionExpression": "gsi1pk = :pk",
            "ExpressionAttributeValues": to_values({":pk": f"{TENANT_KEYS}{tenant}"}),
            "ScanIndexForward": False,
        }
        while True:
            resp = self.ddb.query(**request)
            for raw in resp["Items"]:
                item = from_item(raw)
                record = self.ddb.get_item(TableName=self.table, Key=to_item({"pk": item["pk"], "sk": META}))["Item"]
                data = from_item(record)
                out.append(
                    ApiKey(
                        key_id=item["pk"].split("#", 1)[1],
                        tenant=data["tenant"],
                        created_at=data["created_at"],
                        revoked=bool(data.get("revoked")),
                        revoked_at=data.get("revoked_at"),
                    )
                )
            if "LastEvaluatedKey" not in resp:
                return out
            request["ExclusiveStartKey"] = resp["LastEvaluatedKey"]
