"""API keys: a bearer key maps to a tenant. Only the key's SHA-256 is stored.

Items in the task table:

- ``APIKEY#<sha256 hex of the key>`` / ``META``: tenant, key_id, created_at, revoked
  (what the authorizer reads: one GetItem per uncached key)
- ``APIKEYID#<key_id>`` / ``META``: the hash again, so ``agentq keys revoke KEY_ID`` finds the
  key without it; ``gsi1pk = "KEYS#<tenant>"`` lists a tenant's keys

In AWS a Lambda TOKEN authorizer (``functions/authorizer``) calls ``token_authorizer`` and
API Gateway passes ``{"tenant": ...}`` to the API in ``requestContext.authorizer``. The local
API server calls ``KeyStore.authorize`` in-process and puts the tenant in the same place.
A missing, malformed, unknown or revoked key is answered 401 alike: the answer tells a caller
nothing about which keys exist.
"""

from __future__ import annotations

import hashlib
import logging
import re
import secrets
import time
from dataclasses import dataclass
from typing import Any

from botocore.exceptions import ClientError

from agentq.core.errors import AgentqError, ValidationError
from agentq.storage.serdes import from_item, to_item, to_values

log = logging.getLogger("agentq.auth")

KEY_PREFIX = "aq_"
TENANT_PATTERN = re.compile(r"^[A-Za-z0-9._-]{1,64}$")
KEY_ID_PATTERN = re.compile(r"^key_[0-9a-f]{16}$")
_TOKEN_PATTERN = re.compile(r"^aq_[A-Za-z0-9_-]{20,200}$")
META = "META"


class Unauthorized(AgentqError):
    """No valid API key. ``str()`` is exactly "Unauthorized": what API Gateway expects a TOKEN
    authorizer to raise for a 401; the reason is in ``reason`` (logged, never returned)."""

    code = "unauthorized"

    def __init__(self, reason: str) -> None:
        super().__init__("Unauthorized")
        self.reason = reason


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


def bearer_token(header: str | None) -> str:
    """The key in an ``Authorization: Bearer <key>`` header value."""
    if not header:
        raise Unauthorized("no Authorization header")
    scheme, _, token = header.strip().partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        raise Unauthorized("Authorization is not 'Bearer <key>'")
    if not _TOKEN_PATTERN.match(token):
        raise Unauthorized("malformed key")
    return token


class KeyStore:
    def __init__(self, ddb: Any, table: str) -> None:
        self.ddb = ddb
        self.table = table

    def create(self, tenant: str) -> tuple[str, ApiKey]:
        """A new key for ``tenant``: returns (the key, shown once and never stored, its record)."""
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
                            {"pk": f"APIKEY#{digest}", "sk": META, "tenant": tenant, "key_id": record.key_id,
                             "created_at": record.created_at, "revoked": False}
                        ),  # fmt: skip
                        "ConditionExpression": "attribute_not_exists(pk)",
                    }
                },
                {
                    "Put": {
                        "TableName": self.table,
                        "Item": to_item(
                            {"pk": f"APIKEYID#{record.key_id}", "sk": META, "key_hash": digest, "tenant": tenant,
                             "created_at": record.created_at, "revoked": False,
                             "gsi1pk": f"KEYS#{tenant}", "gsi1sk": f"{int(record.created_at * 1000):015d}#{record.key_id}"}
                        ),  # fmt: skip
                        "ConditionExpression": "attribute_not_exists(pk)",
                    }
                },
            ]
        )
        return token, record

    def lookup(self, token: str) -> ApiKey | None:
        resp = self.ddb.get_item(
            TableName=self.table, Key=to_item({"pk": f"APIKEY#{key_hash(token)}", "sk": META}), ConsistentRead=True
        )
        if "Item" not in resp:
            return None
        item = from_item(resp["Item"])
        return ApiKey(
            key_id=item["key_id"],
            tenant=item["tenant"],
            created_at=item["created_at"],
            revoked=bool(item.get("revoked")),
            revoked_at=item.get("revoked_at"),
        )

    def authorize(self, header: str | None) -> ApiKey:
        """The live key behind an Authorization header value, or Unauthorized."""
        token = bearer_token(header)
        key = self.lookup(token)
        if key is None:
            raise Unauthorized("unknown key")
        if key.revoked:
            raise Unauthorized(f"key {key.key_id} is revoked")
        return key

    def revoke(self, key_id: str) -> ApiKey:
        """Revoke a key by its id (idempotent). API Gateway may serve a cached allow for up to the
        authorizer's result TTL after this."""
        if not KEY_ID_PATTERN.match(key_id or ""):
            raise ValidationError("key id looks like key_0123456789abcdef", field="key_id")
        resp = self.ddb.get_item(TableName=self.table, Key=to_item({"pk": f"APIKEYID#{key_id}", "sk": META}), ConsistentRead=True)
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
                            "Key": to_item({"pk": f"APIKEY#{item['key_hash']}", "sk": META}),
                            "UpdateExpression": update,
                            "ConditionExpression": "attribute_exists(pk)",
                            "ExpressionAttributeValues": values,
                        }
                    },
                    {
                        "Update": {
                            "TableName": self.table,
                            "Key": to_item({"pk": f"APIKEYID#{key_id}", "sk": META}),
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
        return ApiKey(key_id=key_id, tenant=item["tenant"], created_at=item["created_at"], revoked=True, revoked_at=item.get("revoked_at", now))

    def list(self, tenant: str) -> list[ApiKey]:
        """A tenant's keys, newest first (ids only: the keys themselves are not stored)."""
        from agentq.resources import GSI1

        out: list[ApiKey] = []
        request: dict[str, Any] = {
            "TableName": self.table,
            "IndexName": GSI1,
            "KeyConditionExpression": "gsi1pk = :pk",
            "ExpressionAttributeValues": to_values({":pk": f"KEYS#{tenant}"}),
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


def policy(principal: str, method_arn: str, *, effect: str = "Allow", context: dict[str, str] | None = None) -> dict[str, Any]:
    """An authorizer response. The resource is widened from the one method to the whole API
    stage, so API Gateway's cached answer for this key serves every route."""
    parts = method_arn.split("/")
    resource = "/".join(parts[:2]) + "/*" if len(parts) >= 2 else method_arn
    out: dict[str, Any] = {
        "principalId": principal,
        "policyDocument": {
            "Version": "2012-10-17",
            "Statement": [{"Action": "execute-api:Invoke", "Effect": effect, "Resource": resource}],
        },
    }
    if context:
        out["context"] = context
    return out


def token_authorizer(keys: KeyStore, event: dict[str, Any]) -> dict[str, Any]:
    """A Lambda TOKEN authorizer: the tenant of the bearer key, or raise Unauthorized (401)."""
    try:
        key = keys.authorize(event.get("authorizationToken"))
    except Unauthorized as exc:
        log.info("refused: %s", exc.reason)
        raise
    return policy(key.key_id, str(event.get("methodArn", "*")), context={"tenant": key.tenant, "key_id": key.key_id})
