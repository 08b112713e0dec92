"""A tenant's policy documents, versioned per scope (``core.policies``), in the tenant's own
partition ``TENANT#<tenant>`` (``storage.keys``):

- ``POLICY#V#<scope>#<version, 9 digits>``: one immutable version (its Cedar text), written once,
  only if absent, so two writers can never produce two different version 3s;
- ``POLICY#HEAD#<scope>``: the current version, with its text, so the engine reads every scope's
  current rules of a tenant in one Query of the ``POLICY#HEAD#`` prefix.

A new version is one transaction (the version put if absent, the head moved from ``n`` to
``n+1`` on the condition that it is still at ``n``), as agent versions are (``storage.agents``).
Writing what the current version already is creates nothing. An empty document is a version
too: it is how a scope's rules are removed, with its history kept.
"""

from __future__ import annotations

import time

from agentq.core.errors import AgentqError
from agentq.core.policies import PolicyDocument
from agentq.storage import keys
from agentq.storage.table import Item, Put, Table, TransactionCancelled, absent, plain

ATTEMPTS = 8


class PolicyNotFound(AgentqError):
    code = "policy_not_found"


class PolicyConflict(AgentqError):
    code = "policy_conflict"


class Policies:
    """Policy documents over any ``Table`` (DynamoDB, or memory in tests)."""

    def __init__(self, table: Table) -> None:
        self.table = table

    def put(
        self, tenant: str, scope: str, text: str, digest: str, *, by: str | None = None
    ) -> tuple[PolicyDocument, bool]:
        """The next version of ``scope``'s document (checked by the caller: ``core.policies.check``),
        or the current one if it is the same text (created False)."""
        from boto3.dynamodb.conditions import Attr

        pk = keys.tenant_pk(tenant)
        for _ in range(ATTEMPTS):
            head = self.table.get({"pk": pk, "sk": keys.policy_head_sk(scope)})
            latest = int(head["version"]) if head else 0
            if head is not None and head.get("digest") == digest:
                return _document(tenant, head), False
            doc = PolicyDocument(tenant, scope, latest + 1, text, digest, time.time(), by)
            body = {"scope": scope, "version": doc.version, "text": text, "digest": digest,
                    "created_at": doc.created_at, **({"created_by": by} if by else {})}  # fmt: skip
            try:
                self.table.transact(
                    [
                        Put("version", {"pk": pk, "sk": keys.policy_version_sk(scope, doc.version), **body}, absent()),
                        Put(
                            "head",
                            {"pk": pk, "sk": keys.policy_head_sk(scope), **body},
                            absent() if head is None else Attr("version").eq(latest),
                        ),
                    ]
                )
            except TransactionCancelled:
                continue  # another writer took this number: read the head again
            return doc, True
        raise PolicyConflict(f"the rules of {scope} are being changed by others; try again", field="scope")

    def current(self, tenant: str) -> list[PolicyDocument]:
        """Every scope's current document of ``tenant``: one Query (what the engine reads)."""
        items = self.table.query(keys.tenant_pk(tenant), prefix=keys.POLICY_HEAD_PREFIX)
        return [_document(tenant, item) for item in items]

    def get(self, tenant: str, scope: str, version: int | None = None) -> PolicyDocument:
        pk = keys.tenant_pk(tenant)
        sk = keys.policy_head_sk(scope) if version is None else keys.policy_version_sk(scope, version)
        item = self.table.get({"pk": pk, "sk": sk})
        if item is None:
            what = f"version {version} of the rules of {scope}" if version else f"rules for {scope}"
            raise PolicyNotFound(f"no {what}", field="scope")
        return _document(tenant, item)

    def history(self, tenant: str, scope: str, *, limit: int = 100) -> list[PolicyDocument]:
        """``scope``'s versions, newest first (at most ``limit``)."""
        items = self.table.query(
            keys.tenant_pk(tenant), prefix=keys.policy_version_prefix(scope), descending=True, limit=limit
        )
        if not items:
            raise PolicyNotFound(f"no rules for {scope}", field="scope")
        return [_document(tenant, item) for item in items]

    def history_page(
        self, tenant: str, scope: str, *, limit: int, before: int | None = None
    ) -> tuple[list[PolicyDocument], bool]:
        """Up to ``limit`` of ``scope``'s versions, newest first, older than ``before`` (a page's
        last version); and whether there are more (each version is a text of up to 64,000 characters)."""
        after = keys.policy_version_sk(scope, before) if before is not None else None
        items = self.table.query(
            keys.tenant_pk(tenant), prefix=keys.policy_version_prefix(scope), descending=True, limit=limit + 1,
            after=after,
        )  # fmt: skip
        if not items and before is None:
            raise PolicyNotFound(f"no rules for {scope}", field="scope")
        return [_document(tenant, item) for item in items[:limit]], len(items) > limit


def _document(tenant: str, item: Item) -> PolicyDocument:
    data = plain(item)
    return PolicyDocument(
        tenant=tenant,
        scope=str(data["scope"]),
        version=int(data["version"]),
        text=str(data["text"]),
        digest=str(data["digest"]),
        created_at=float(data["created_at"]),
        created_by=data.get("created_by"),
    )
