"""Aliases of agents (``core.aliases``), in the agent's partition ``AGENT#<tenant>#<name>``.

Item ``ALIAS#<alias>``: ``versions`` (the targets' JSON), ``online`` (its online evaluation's
JSON, absent when it has none), ``revision`` (1, then one more at each
move) and ``updated_at``. Setting an alias is one transaction: a check that each version it names
exists (``V#n`` present) and the write of the alias item. So an alias never points at a missing
version, a move is all or nothing, and a reader sees the old targets or the new ones, never a
mix. Nothing else writes the item, and versions are never deleted, so what it names stays there.

Resolving reads the alias item every time (strongly consistent: a move takes effect for the very
next submission, in every process) and the version it picks from a small per-process cache:
versions are immutable, so a cached one is never wrong. An alias submission therefore costs one
read more than ``name@N`` when the version is cached, and no more than ``name`` (HEAD, then the
version) when it is not.
"""

from __future__ import annotations

import json
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
    Patch,
    Table,
    TransactionCancelled,
    TransactionConflict,
    Update,
    plain,
    present,
)

ATTEMPTS = 5
VERSION_CACHE_SECONDS = 300.0
VERSION_CACHE_SIZE = 512


class AliasNotFound(AgentqError):
    code = "alias_not_found"


class AgentAliases:
    """A tenant's aliases of its agents, over any ``Table``."""

    def __init__(self, table: Table, agents: Agents) -> None:
        self.table = table
        self.agents = agents
        self._versions: dict[tuple[str, str, int], tuple[float, AgentVersion]] = {}
        self._lock = threading.Lock()

    def set(self, tenant: str, name: str, alias: str, spec: AliasSpec) -> AgentAlias:
        """Point ``alias`` of agent ``name`` at ``spec.versions``, in one conditional write; a
        version that does not exist is a ValidationError naming it, and nothing is written."""
        pk = keys.agent_pk(tenant, name)
        now = time.time()
        checks = [
            Check(f"v{i}", {"pk": pk, "sk": keys.agent_version_sk(t.version)}, present())
            for i, t in enumerate(spec.versions)
        ]
        sets = {
            "versions": json.dumps([t.model_dump() for t in spec.versions]),
            "updated_at": now,
            "agent": name,
            "alias": alias,
        }
        if spec.online is not None:
            sets["online"] = spec.online.model_dump_json(exclude_none=True)
        write = Patch(
            "alias",
            {"pk": pk, "sk": keys.agent_alias_sk(alias)},
            Update(set=sets, add={"revision": 1}, remove=() if spec.online is not None else ("online",)),
        )
        for _ in range(ATTEMPTS):
            try:
                self.table.transact([*checks, write])
            except TransactionConflict:
                continue  # another move of the same alias at the same moment: try again
            except TransactionCancelled as exc:
                for i, target in enumerate(spec.versions):
                    if f"v{i}" in exc.failed:
                        raise ValidationError(
                            f"versions[{i}].version: agent {name!r} has no version {target.version}",
                            field=f"versions[{i}].version",
                        ) from None
                raise
            return self.get(tenant, name, alias)
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
