"""The agent catalogue's calls of ``agentq.Client``: versioned agent definitions and their
aliases (``name@N``, ``name@alias`` with a canary's split), and moving a task to another version.
Part of ``Client`` (its base class); apart so ``api/client.py`` stays one room.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from agentq.api.client_pages import pages
from agentq.api.http_client import HttpClient, _seg
from agentq.api.models import (
    AgentAliasList,
    AgentCreated,
    AgentList,
    AgentQuality,
    AgentSpec,
    AgentSummary,
    AgentVersion,
    AgentVersions,
    TaskMoved,
)
from agentq.core.aliases import AgentAlias
from agentq.core.errors import ValidationError


class AgentCalls(HttpClient):
    """The ``/agents`` routes and ``POST /tasks/{id}/agent``."""

    def create_agent(self, spec: AgentSpec | Mapping[str, Any] | None = None, **fields: Any) -> AgentCreated:
        """Create the next version of an agent (or get the latest, ``created`` False, if it is
        the same definition): an ``AgentSpec``, a dict of one, or its fields as keywords."""
        body = spec.model_dump(mode="json", exclude_none=True) if isinstance(spec, AgentSpec) else dict(spec or {})
        body.update(fields)
        return self.call(AgentCreated, "POST", "/agents", body, retry=True)

    def list_agents(self) -> list[AgentSummary]:
        return self._get(AgentList, "/agents").agents

    def get_agent(self, name: str, version: int | None = None) -> AgentVersion:
        """A version of an agent; ``name`` may also be ``name@version``."""
        if version is None and "@" in name:
            name, _, number = name.partition("@")
            version = int(number) if number.isdigit() else None
            if version is None:
                raise ValidationError("agent: name or name@version, e.g. researcher@3", field="agent")
        return self._get(AgentVersion, f"/agents/{_seg(name, 'name')}", version=version)

    def agent_versions(self, name: str) -> list[AgentVersion]:
        """Every version of an agent, newest first (following the pages: one holds at most 2 MB)."""
        path = f"/agents/{_seg(name, 'name')}/versions"
        read = pages(lambda cursor: self._get(AgentVersions, path, limit=100, cursor=cursor))
        return [version for page in read for version in page.versions]

    def set_alias(
        self, name: str, alias: str, version: int, canary: tuple[int, int] | None = None,
        online: Mapping[str, Any] | None = None, expected_revision: int | None = None,
    ) -> AgentAlias:  # fmt: skip
        """Point ``name@alias`` at ``version``, or with ``canary`` (version, percent) split new
        tasks between them: one atomic write, in effect for the next submission. ``online``
        (``{"rate": 0.1, "grade": {"rubric": ...}}``) grades that fraction of its new tasks.
        ``expected_revision``: only if the alias is still at the revision read (0: absent), else
        ``Conflict`` (409 ``alias_conflict``); such a move is sent once, never again after a
        lost answer, whose retry would find its own move and be refused as if another's."""
        targets = [{"version": version, "weight": 100 - (canary[1] if canary else 0)}]
        if canary is not None:
            targets.append({"version": canary[0], "weight": canary[1]})
        path = f"/agents/{_seg(name, 'name')}/aliases/{_seg(alias, 'alias')}"
        body: dict[str, Any] = {"versions": targets}
        if online is not None:
            body["online"] = dict(online)
        if expected_revision is not None:
            body["expected_revision"] = expected_revision
        return self.call(AgentAlias, "PUT", path, body, retry=expected_revision is None)

    def agent_quality(self, name: str, hours: int = 48) -> AgentQuality:
        """Each version's online grades (pass rate, cost) per hour over the last ``hours``."""
        return self._get(AgentQuality, f"/agents/{_seg(name, 'name')}/quality?hours={int(hours)}")

    def list_aliases(self, name: str) -> list[AgentAlias]:
        return self._get(AgentAliasList, f"/agents/{_seg(name, 'name')}/aliases").aliases

    def get_alias(self, name: str, alias: str) -> AgentAlias:
        return self._get(AgentAlias, f"/agents/{_seg(name, 'name')}/aliases/{_seg(alias, 'alias')}")

    def delete_alias(self, name: str, alias: str) -> AgentAlias:
        return self.call(AgentAlias, "DELETE", f"/agents/{_seg(name, 'name')}/aliases/{_seg(alias, 'alias')}")

    def move_task(self, task_id: str, version: int) -> TaskMoved:
        """Move an answered or idle task to ``version`` of its agent (its next run runs it)."""
        return self.call(TaskMoved, "POST", f"/tasks/{_seg(task_id)}/agent", {"version": version})
