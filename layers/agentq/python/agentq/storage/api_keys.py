"""API keys in the task table: a bearer key maps to a tenant. Only the key's SHA-256 is stored.

Items (``storage.keys``):

- ``APIKEY#<sha256 hex of the key>`` / ``META``: tenant, operator, key_id, created_at, revoked,
  revoked_at (what the authorizer reads: one GetItem per uncached key)
- ``APIKEYID#<key_id>`` / ``META``: the hash again, so ``agentq keys revoke KEY_ID`` finds the
  key without it; ``gsi1pk = "KEYS#<tenant>"`` lists a tenant's keys

``operator``: the key may also read every tenant's usage (``GET /usage/tenants``); it still
acts as its own tenant everywhere else. ``act_for_users``: requests with the key may name the
end user they act for (``core.endusers``; a product's backend serving many users). A key
written before either field existed has neither.

Both are written in one transaction, and each only if absent, so a key is never half-created
and never overwrites another. What a presented key is worth (the ``Authorization`` header,
401s, the IAM policy) is the API's business: ``agentq.api.auth``.

The authorizer Lambda imports this module, ``storage.table`` and ``storage.dynamodb`` and
little else, so none of them loads boto3 or pydantic at import (``bench/import_time.py``); the
index name is read from ``agentq.resources`` only by a listing.
"""

from __future__ import annotations

import hashlib
import re
import secrets
import time
from dataclasses import dataclass

from agentq.core.errors import AgentqError, ValidationError
from agentq.storage import keys
from agentq.storage.table import Item, Key, Patch, Put, Table, TransactionCancelled, Update, absent, plain, present

KEY_PREFIX = "aq_"
TENANT_PATTERN = re.compile(r"[A-Za-z0-9._-]{1,64}")  # both fullmatch: `$` passes a trailing newline
KEY_ID_PATTERN = re.compile(r"key_[0-9a-f]{16}")
LIST_PAGE = 100


class KeyNotFound(AgentqError):
    code = "key_not_found"


@dataclass(frozen=True)
class ApiKey:
    key_id: str
    tenant: str
    created_at: float
    revoked: bool = False
    revoked_at: float | None = None
    operator: bool = False  # may read every tenant's usage (GET /usage/tenants)
    act_for_users: bool = False  # may name the end user a request acts for (core.endusers)


def key_hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def _record(key_id: str, raw: Item) -> ApiKey:
    data = plain(raw)
    return ApiKey(
        key_id=key_id,
        tenant=data["tenant"],
        created_at=data["created_at"],
        revoked=bool(data.get("revoked")),
        revoked_at=data.get("revoked_at"),
        operator=bool(data.get("operator")),
        act_for_users=bool(data.get("act_for_users")),
    )


class KeyStore:
    """A tenant's keys, over any ``Table`` (DynamoDB, or memory in tests)."""

    def __init__(self, table: Table, *, list_page: int = LIST_PAGE) -> None:
        self.table = table
        self.list_page = list_page  # index items read per request of a listing

    def create(self, tenant: str, *, operator: bool = False, act_for_users: bool = False) -> tuple[str, ApiKey]:
        """A new key for ``tenant`` (an operator's with ``operator``; one that may name the end
        user a request acts for with ``act_for_users``): returns (the key, shown once and never
        stored, its record)."""
        if not TENANT_PATTERN.fullmatch(tenant or ""):
            raise ValidationError("tenant: 1-64 letters, digits, '.', '_' or '-'", field="tenant")
        token = KEY_PREFIX + secrets.token_urlsafe(32)
        record = ApiKey(
            key_id="key_" + secrets.token_hex(8), tenant=tenant, created_at=time.time(), operator=operator,
            act_for_users=act_for_users,
        )  # fmt: skip
        digest = key_hash(token)
        common = {"tenant": tenant, "created_at": record.created_at, "revoked": False, "operator": operator,
                  "act_for_users": act_for_users}  # fmt: skip
        by_hash = {**keys.api_key_key(digest), **common, "key_id": record.key_id}
        by_id = {
            **keys.api_key_id_key(record.key_id),
            **common,
            "key_hash": digest,
            "gsi1pk": keys.tenant_keys_pk(tenant),
            "gsi1sk": keys.tenant_index_sk(record.created_at, record.key_id),
        }
        self.table.transact([Put("key", by_hash, absent()), Put("key_id", by_id, absent())])
        return token, record

    def lookup(self, token: str) -> ApiKey | None:
        """The record of a presented key (revoked or not), or None: one consistent read."""
        item = self.table.get(keys.api_key_key(key_hash(token)))
        return _record(str(item["key_id"]), item) if item is not None else None

    def revoke(self, key_id: str) -> ApiKey:
        """Revoke a key by its id (idempotent: a second revoke keeps the first ``revoked_at``).
        API Gateway may serve a cached allow for up to the authorizer's result TTL after this."""
        if not KEY_ID_PATTERN.fullmatch(key_id or ""):
            raise ValidationError("key id looks like key_0123456789abcdef", field="key_id")
        found = self.table.get(keys.api_key_id_key(key_id))
        if found is None:
            raise KeyNotFound(f"no key {key_id!r}", field="key_id")
        now = time.time()
        revoked = Update(set={"revoked": True}, set_if_absent={"revoked_at": now})
        try:
            self.table.transact(
                [
                    Patch("key", keys.api_key_key(str(found["key_hash"])), revoked, present()),
                    Patch("key_id", keys.api_key_id_key(key_id), revoked, present()),
                ]
            )
        except TransactionCancelled as exc:
            raise KeyNotFound(f"no key {key_id!r}", field="key_id") from exc
        before = _record(key_id, found)
        return ApiKey(
            key_id,
            before.tenant,
            before.created_at,
            revoked=True,
            revoked_at=before.revoked_at or now,
            operator=before.operator,
            act_for_users=before.act_for_users,
        )

    def get(self, key_id: str) -> ApiKey | None:
        """The key with id ``key_id`` (None if there is none)."""
        found = self.table.get(keys.api_key_id_key(key_id)) if KEY_ID_PATTERN.fullmatch(key_id or "") else None
        return _record(key_id, found) if found is not None else None

    def list(self, tenant: str) -> list[ApiKey]:
        """A tenant's keys, newest first (ids only: the keys themselves are not stored)."""
        from agentq.resources import GSI1

        ids: list[Key] = []
        start: Item | None = None
        while True:
            page = self.table.query_index(
                GSI1, ("gsi1pk", keys.tenant_keys_pk(tenant)), descending=True, limit=self.list_page, start=start
            )
            ids += [keys.api_key_id_key(keys.key_id_of(item["pk"])) for item in page.items]
            if page.last_key is None:
                break
            start = page.last_key
        # The index projects no key attributes (tenant, revoked): read the items themselves.
        found = {item["pk"]: item for item in self.table.batch_get(ids)}
        return [_record(keys.key_id_of(key["pk"]), found[key["pk"]]) for key in ids if key["pk"] in found]
