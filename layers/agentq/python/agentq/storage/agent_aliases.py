"""Aliases of agents (``core.aliases``), in the agent's partition ``AGENT#<tenant>#<name>``.

Item ``ALIAS#<alias>``: ``versions`` (the targets' JSON), ``online`` (its online evaluation's
JSON, absent when it has none), ``revision`` (1, then one more at each
move) and ``updated_at``. Setting an alias is one transaction: a check that each version it names
exists (``V#n`` present) and the write of the alias item. So an alias never points at a missing
version, a move is all or nothing, and a reader sees the old targets or the new ones, never a
mix. Nothing else writes the item, and versions are never deleted, so what it names stays there.

A move reads the alias's revision ``r`` and writes the whole item at ``r + 1`` on the condition
that it is still at ``r`` (absent, for ``r = 0``): so each revision is one move's, and the answer
is the item this move wrote, never another caller's read back after it (two callers moving one
alias at once were each told of whichever move landed last, and two moves read the same
revision). A move that lost the race to another reads again and applies on top (the last move
wins, as a PUT does); one made with ``expected_revision`` (a canary bump computed from what the
caller read) is refused instead, ``AliasConflict``, so it never silently undoes a rollback made
since.

Resolving reads the alias item every time (strongly consistent: a move takes effect for the very
next submission, in every process) and the version it picks from a small per-process cache:
versions are immutable, so a cached one is never wrong. An alias submission therefore costs one
read more than ``name@N`` when the version is cached, and no more than ``name`` (HEAD, then the
version) when it is not.
"""

from __future__ import annotations

import json
import random
import threading
import time

from agentq.core.agents import AgentVersion
from agentq.core.aliases import AgentAlias, AliasSpec, AliasTarget, OnlineEval
from agentq.core.errors import AgentqError, ValidationError
from agentq.storage import keys
from agentq.storage.agents import AgentConflict, Agents
from agentq.storage.table import (
    Check,
    ConditionFailed,
    Item,
    Put,
    Table,
    TransactionCancelled,
    TransactionConflict,
    absent,
    plain,
    present,
)

ATTEMPTS = 10
BACKOFF_SECONDS = 0.01  # the first retry's ceiling; doubles each time (full jitter)
VERSION_CACHE_SECONDS = 300.0
VERSION_CACHE_SIZE = 512


class AliasNotFound(AgentqError):
    code = "alias_not_found"


class AliasConflict(AgentConflict):
    """The alias is not at the revision the caller expected (another move since it read it)."""

    code = "alias_conflict"


class AgentAliases:
    """A tenant's aliases of its agents, over any ``Table``."""

    def __init__(self, table: Table, agents: Agents) -> None:
        self.table = table
        self.agents = agents
        self._versions: dict[tuple[str, str, int], tuple[float, AgentVersion]] = {}
        self._lock = threading.Lock()

    def set(
        self, tenant: str, name: str, alias: str, spec: AliasSpec, *, expected_revision: int | None = None
    ) -> AgentAlias:
        """Point ``alias`` of agent ``name`` at ``spec.versions``, in one conditional write; the
        alias as this call wrote it. A version that does not exist is a ValidationError naming
        it; an alias not at ``expected_revision`` (0: one that does not exist yet) is an
        ``AliasConflict`` naming ``expected_revision``; nothing is written either way."""
        from boto3.dynamodb.conditions import Attr

        pk = keys.agent_pk(tenant, name)
        key = {"pk": pk, "sk": keys.agent_alias_sk(alias)}
        checks = [
            Check(f"v{i}", {"pk": pk, "sk": keys.agent_version_sk(t.version)}, present())
            for i, t in enumerate(spec.versions)
        ]
        for attempt in range(ATTEMPTS):
            if attempt:
                time.sleep(random.uniform(0, BACKOFF_SECONDS * 2**attempt))
            current = self.table.get(key)
            revision = int(current["revision"]) if current is not None else 0
            if expected_revision is not None and revision != expected_revision:
                raise _moved(name, alias, expected_revision, revision)
            item: Item = {
                **key,
                "versions": json.dumps([t.model_dump() for t in spec.versions]),
                "updated_at": time.time(),
                "agent": name,
                "alias": alias,
                "revision": revision + 1,
            }
            if spec.online is not None:
                item["online"] = spec.online.model_dump_json(exclude_none=True)
            condition = absent() if current is None else Attr("revision").eq(revision)
            try:
                self.table.transact([*checks, Put("alias", item, condition)])
            except TransactionConflict:
                continue  # another move of the same alias at the same moment: read it again
            except TransactionCancelled as exc:
                for i, target in enumerate(spec.versions):
                    if f"v{i}" in exc.failed:
                        raise ValidationError(
                            f"versions[{i}].version: agent {name!r} has no version {target.version}",
                            field=f"versions[{i}].version",
                        ) from None
                if "alias" not in exc.failed:
                    raise
                continue  # another move landed since the read: read it again (and, expected, refuse)
            return _alias(item)
        raise AgentConflict(f"alias {name}@{alias} is being moved by others; try again", field="alias")

    def get(self, tenant: str, name: str, alias: str) -> AgentAlias:
        item = self.table.get({"pk": keys.agent_pk(tenant, name), "sk": keys.agent_alias_sk(alias)})
        if item is None:
            raise AliasNotFound(f"agent {name!r} has no alias {alias!r}", field="alias")
        return _alias(item)

    def list(self, tenant: str, name: str) -> list[AgentAlias]:
        """Every alias of agent ``name``, by alias name."""
        items = self.table.query(keys.agent_pk(tenant, name), prefix=keys.AGENT_ALIAS_PREFIX)
        return [_alias(item) for item in items]

    def delete(self, tenant: str, name: str, alias: str) -> AgentAlias:
        """Delete ``alias``; what it was. A task submitted to it later is a 422 naming ``agent``."""
        try:
            old = self.table.delete(
                {"pk": keys.agent_pk(tenant, name), "sk": keys.agent_alias_sk(alias)}, condition=present()
            )
        except ConditionFailed:
            old = None
        if old is None:
            raise AliasNotFound(f"agent {name!r} has no alias {alias!r}", field="alias")
        return _alias(old)

    def version(self, tenant: str, name: str, version: int) -> AgentVersion:
        """A version of ``name``, from this process's cache when read in the last few minutes
        (versions are immutable: the cache bounds memory, not staleness)."""
        key = (tenant, name, version)
        now = time.monotonic()
        with self._lock:
            hit = self._versions.get(key)
        if hit is not None and now - hit[0] < VERSION_CACHE_SECONDS:
            return hit[1]
        found = self.agents.get(tenant, name, version)
        with self._lock:
            if len(self._versions) >= VERSION_CACHE_SIZE:
                self._versions.clear()  # simple and bounded; a refill is one read per version
            self._versions[key] = (now, found)
        return found

    def forget(self) -> None:
        """Empty this process's cache of versions (a bench's cold start)."""
        with self._lock:
            self._versions.clear()


def _moved(name: str, alias: str, expected: int, revision: int) -> AliasConflict:
    now = f"at revision {revision}" if revision else "does not exist"
    return AliasConflict(
        f"expected_revision: alias {name}@{alias} {now}, not {expected}: it was moved since it was read; read it "
        f"again (GET /agents/{name}/aliases/{alias}) and decide on what it is now",
        field="expected_revision",
    )


def _alias(item: Item) -> AgentAlias:
    data = plain(item)
    return AgentAlias(
        agent=str(data["agent"]),
        alias=str(data["alias"]),
        versions=[AliasTarget.model_validate(t) for t in json.loads(str(data["versions"]))],
        online=OnlineEval.model_validate_json(str(data["online"])) if data.get("online") else None,
        revision=int(data["revision"]),
        updated_at=float(data["updated_at"]),
    )
