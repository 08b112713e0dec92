"""Agent definitions in the task table, versioned and tenant-scoped.

Items (``storage.keys``), all in the partition ``AGENT#<tenant>#<name>``:

- ``V#<version, 9 digits>``: one immutable version (``spec``: its JSON), written once, only if
  absent, so two writers can never produce two different version 3s;
- ``HEAD``: the latest version's number and digest, its description, ``updated_at``, and
  ``gsi1pk = AGENTS#<tenant>`` so a tenant's agents are one index query.

A new version is one transaction: put ``V#n+1`` if absent, and move ``HEAD`` from ``n`` to
``n+1`` on the condition that it is still at ``n``. A writer that lost the race reads ``HEAD``
again and tries the next number, after a jittered wait that doubles with each loss: each loss is
another writer's version written, so racing writers always make progress, and the waits spread
them out rather than having all of them meet again at once (16 creators at one instant each get
a version; with 8 attempts and no wait the last of them was refused ``agent_conflict``). A
transaction that meets another writer's on HEAD (DynamoDB cancels it with the reason
``TransactionConflict``, nothing written) is tried again the same way, as the alias's move is.
Creating what the latest version already is creates nothing and returns that version, so
applying the same file twice is harmless.
"""

from __future__ import annotations

import json
import random
import time

from agentq.core.agents import AgentSpec, AgentSummary, AgentVersion
from agentq.core.errors import AgentqError, ValidationError
from agentq.core.models import McpToolPin
from agentq.storage import keys
from agentq.storage.table import Item, Put, Table, TransactionCancelled, TransactionConflict, absent, plain

MAX_SPEC_BYTES = 300_000  # a version is one item: far under DynamoDB's 400 KB, with room for keys
# A writer loses at most once to each writer ahead of it: 40 attempts outlast far more
# concurrent creators of one agent than a tenant has, the waits (full jitter, up to
# BACKOFF_SECONDS * 2**attempt, at most BACKOFF_CAP_SECONDS each) a few seconds at worst.
ATTEMPTS = 40
BACKOFF_SECONDS = 0.005
BACKOFF_CAP_SECONDS = 0.2
LIST_PAGE = 100


class AgentNotFound(AgentqError):
    code = "agent_not_found"


class AgentConflict(AgentqError):
    code = "agent_conflict"


class Agents:
    """A tenant's agent definitions, over any ``Table`` (DynamoDB, or memory in tests)."""

    def __init__(self, table: Table, *, list_page: int = LIST_PAGE) -> None:
        self.table = table
        self.list_page = list_page

    def create(
        self, tenant: str, spec: AgentSpec, mcp_tools: list[McpToolPin] | None = None
    ) -> tuple[AgentVersion, bool]:
        """The next version of ``spec.name`` (with the MCP tools listed for it), or the latest
        if it is the same (created False)."""
        body = spec.model_dump_json(exclude_none=True)
        pinned = json.dumps([p.model_dump(mode="json") for p in mcp_tools or []])
        size = len(body.encode()) + len(pinned.encode())
        if size > MAX_SPEC_BYTES:
            raise ValidationError(
                f"body: the agent definition (with its MCP tools' schemas) is {size:,} bytes; at most {MAX_SPEC_BYTES:,}",
                field="body",
            )
        digest = spec.digest(mcp_tools)
        pk = keys.agent_pk(tenant, spec.name)
        for attempt in range(ATTEMPTS):
            if attempt:
                time.sleep(random.uniform(0, min(BACKOFF_CAP_SECONDS, BACKOFF_SECONDS * 2**attempt)))
            head = self.table.get({"pk": pk, "sk": keys.AGENT_HEAD})
            latest = int(head["latest"]) if head else 0
            if head is not None and head.get("digest") == digest:
                return self.get(tenant, spec.name, latest), False
            version = AgentVersion.of(spec, latest + 1, time.time(), mcp_tools)
            from boto3.dynamodb.conditions import Attr

            head_condition = absent() if head is None else Attr("latest").eq(latest)
            try:
                self.table.transact(
                    [
                        Put(
                            "version",
                            {
                                "pk": pk,
                                "sk": keys.agent_version_sk(version.version),
                                "spec": body,
                                "mcp_tools": pinned,
                                "version": version.version,
                                "created_at": version.created_at,
                            },
                            absent(),
                        ),
                        Put(
                            "head",
                            {
                                "pk": pk,
                                "sk": keys.AGENT_HEAD,
                                "name": spec.name,
                                "tenant": tenant,
                                "latest": version.version,
                                "digest": digest,
                                "description": spec.description,
                                "updated_at": version.created_at,
                                "gsi1pk": keys.tenant_agents_pk(tenant),
                                "gsi1sk": spec.name,
                            },
                            head_condition,
                        ),
                    ]
                )
            except (TransactionCancelled, TransactionConflict):
                # Cancelled: another writer took this number. Conflict: another writer's
                # transaction was on HEAD at that moment (DynamoDB's TransactionConflict, its own
                # answer, not a failed condition). Nothing written either way: read HEAD again,
                # after a wait.
                continue
            return version, True
        raise AgentConflict(f"agent {spec.name!r} is being changed by others; try again", field="name")

    def latest(self, tenant: str, name: str) -> int:
        """The latest version's number of ``name`` of ``tenant`` only: one read of its HEAD, or
        ``AgentNotFound`` (what a read of the agent's aliases or quality checks first)."""
        head = self.table.get({"pk": keys.agent_pk(tenant, name), "sk": keys.AGENT_HEAD})
        if head is None:
            raise AgentNotFound(f"no agent {name!r}", field="agent")
        return int(head["latest"])

    def get(self, tenant: str, name: str, version: int | None = None) -> AgentVersion:
        """A version of ``name`` (the latest when ``version`` is None) of ``tenant`` only."""
        if version is None:
            version = self.latest(tenant, name)
        item = self.table.get({"pk": keys.agent_pk(tenant, name), "sk": keys.agent_version_sk(version)})
        if item is None:
            raise AgentNotFound(f"no version {version} of agent {name!r}", field="agent")
        return _version(item)

    def versions(self, tenant: str, name: str) -> list[AgentVersion]:
        """Every version of ``name``, newest first."""
        items = self.table.query(keys.agent_pk(tenant, name), prefix="V#", descending=True)
        if not items:
            raise AgentNotFound(f"no agent {name!r}", field="agent")
        return [_version(item) for item in items]

    def versions_page(
        self, tenant: str, name: str, *, limit: int, before: int | None = None
    ) -> tuple[list[AgentVersion], bool]:
        """Up to ``limit`` versions of ``name``, newest first, older than ``before`` (a page's last
        version); and whether there are more."""
        after = keys.agent_version_sk(before) if before is not None else None
        items = self.table.query(
            keys.agent_pk(tenant, name), prefix="V#", descending=True, limit=limit + 1, after=after
        )
        if not items and before is None:
            raise AgentNotFound(f"no agent {name!r}", field="agent")
        return [_version(item) for item in items[:limit]], len(items) > limit

    def list(self, tenant: str) -> list[AgentSummary]:
        """A tenant's agents by name, each with its latest version."""
        from agentq.resources import GSI1

        heads: list[Item] = []
        start: Item | None = None
        while True:
            page = self.table.query_index(
                GSI1, ("gsi1pk", keys.tenant_agents_pk(tenant)), descending=False, limit=self.list_page, start=start
            )
            heads += page.items
            if page.last_key is None:
                break
            start = page.last_key
        # The index projects no agent attributes: read the HEAD items themselves.
        found = self.table.batch_get([{"pk": item["pk"], "sk": keys.AGENT_HEAD} for item in heads])
        rows = [plain(item) for item in found]
        return sorted(
            (
                AgentSummary(
                    name=row["name"],
                    latest_version=row["latest"],
                    description=row.get("description"),
                    updated_at=row["updated_at"],
                )
                for row in rows
            ),
            key=lambda summary: summary.name,
        )


def _version(item: Item) -> AgentVersion:
    data = plain(item)
    spec = AgentSpec.model_validate_json(data["spec"])
    pins = [McpToolPin.model_validate(p) for p in json.loads(data.get("mcp_tools") or "[]")]
    return AgentVersion.of(spec, int(data["version"]), float(data["created_at"]), pins)
