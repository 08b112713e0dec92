"""A stop: every task of one scope of a tenant (an end user, an agent, an API key, or the whole
tenant) cancelled at once, and no new one started in it until it is resumed.

Pure: what a scope is, which tasks it covers, and the error a refused submission gets. The
storage (``storage.stops``), the stop itself (``control.stops``) and where each path checks
(submission, follow-up, the dispatcher's claim) live elsewhere; ARCHITECTURE invariant 17 says
why that order keeps any step of a stopped scope from committing after the stop returns.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, get_args

from agentq.core.endusers import USER_PATTERN, USER_RULE
from agentq.core.errors import AgentqError, ValidationError

if TYPE_CHECKING:
    from agentq.core.models import Task

ScopeKind = Literal["tenant", "user", "agent", "key"]
KINDS: tuple[str, ...] = get_args(ScopeKind)
MAX_REASON_CHARS = 500

# What each kind's value may be: the names as the rest of agentq spells them.
_AGENT = r"^[a-z0-9][a-z0-9_-]{0,63}$"  # core.agents.NAME_PATTERN
_KEY = r"^key_[0-9a-f]{16}$"  # storage.api_keys.KEY_ID_PATTERN
_TENANT = r"^[A-Za-z0-9._-]{1,64}$"  # storage.api_keys.TENANT_PATTERN
VALUE_PATTERNS: dict[str, str] = {"tenant": _TENANT, "user": USER_PATTERN, "agent": _AGENT, "key": _KEY}
# Each kind's value in words: what a refusal says (``scope`` here; the API's 422 for a field of
# that pattern, api.errors.PATTERN_RULES and FIELD_RULES), where the pattern would be a regex to decode.
# An agent's name is also the shape of a memory store's and a credential's (the same pattern):
# NAME_RULE is that shape's words, true of every field of it.
NAME_RULE = "1-64 lowercase letters, digits, '-' and '_'"
SCOPE_RULES = {
    "tenant": "1-64 letters, digits, '.', '_' or '-'",
    "user": USER_RULE,
    "agent": f"an agent's name: {NAME_RULE}",
    "key": "an API key's id (key_ and 16 hex digits, as agentq keys list shows it)",
}


@dataclass(frozen=True)
class StopScope:
    kind: str
    value: str

    def __str__(self) -> str:
        return f"{self.kind} {self.value!r}"

    def covers(self, task: Task) -> bool:
        """Whether ``task`` (of the stop's tenant) belongs to this scope."""
        if self.kind == "tenant":
            return task.tenant == self.value
        if self.kind == "user":
            return task.user == self.value
        if self.kind == "agent":
            return agent_name(task.submission.agent) == self.value
        return task.key_id == self.value


@dataclass(frozen=True)
class StopRecord:
    """A stored stop: until it is resumed, its scope's tasks are refused and cancelled."""

    tenant: str
    scope: StopScope
    stopped_at: float
    by: str | None = None
    reason: str = ""


def agent_name(ref: str | None) -> str | None:
    """The agent a submission names, without its pinned version (``name@3``)."""
    return None if ref is None else ref.partition("@")[0]


def parse_scope(fields: dict[str, str | None]) -> StopScope:
    """The one scope named by ``fields`` (kind -> value; None: not named), or a
    ``ValidationError`` naming the field: an unknown kind, an empty or malformed value, none,
    or more than one."""
    named = {k: v for k, v in fields.items() if v is not None}
    for kind in named:
        if kind not in KINDS:
            raise ValidationError(f"{kind}: unknown scope; name one of {', '.join(KINDS)}", field=kind)
    if not named:
        raise ValidationError(f"scope: name exactly one of {', '.join(KINDS)}", field="scope")
    if len(named) > 1:
        both = " and ".join(named)
        raise ValidationError(f"scope: name exactly one of {', '.join(KINDS)}, not {both}", field=list(named)[1])
    kind, value = next(iter(named.items()))
    if not value:
        raise ValidationError(f"{kind}: must not be empty", field=kind)
    if re.fullmatch(VALUE_PATTERNS[kind][1:-1], value) is None:
        raise ValidationError(f"{kind}: {SCOPE_RULES[kind]}", field=kind)
    return StopScope(kind, value)


def stop_covering(stops: list[StopRecord], task: Task) -> StopRecord | None:
    """The first of a tenant's ``stops`` whose scope covers ``task``."""
    return next((s for s in stops if s.tenant == task.tenant and s.scope.covers(task)), None)


def stop_for(stops: list[StopRecord], *, user: str | None, agent: str | None, key_id: str | None) -> StopRecord | None:
    """The first of a tenant's ``stops`` covering a new task of that user, agent and key."""
    wanted = {("tenant", None), ("user", user), ("agent", agent_name(agent)), ("key", key_id)}
    for s in stops:
        if s.scope.kind == "tenant" or (s.scope.kind, s.scope.value) in wanted:
            return s
    return None


class ScopeNotYours(AgentqError):
    """A stop or resume of a scope the caller's tenant does not own: another tenant (403)."""

    code = "forbidden"


class StopNotFound(AgentqError):
    """A resume of a scope that is not stopped (404)."""

    code = "stop_not_found"


class ScopeStopped(AgentqError):
    """A submission (or follow-up, or schedule's fire) in a stopped scope: 423, the body naming
    the scope (``field`` is its kind, ``details`` its value) until ``agentq resume``."""

    code = "scope_stopped"

    def __init__(self, stop: StopRecord) -> None:
        super().__init__(
            f"{stop.scope} of tenant {stop.tenant!r} is stopped: nothing new starts in it until it is resumed "
            f"(agentq resume --{stop.scope.kind} {stop.scope.value})",
            field=stop.scope.kind,
            scope={"kind": stop.scope.kind, "value": stop.scope.value},
        )
        self.stop = stop

    def to_dict(self) -> dict[str, object]:
        return {**super().to_dict(), "scope": self.details["scope"]}


def check_open(stops: list[StopRecord], *, user: str | None, agent: str | None, key_id: str | None) -> None:
    """Raise ``ScopeStopped`` when one of ``stops`` covers a new task of that user, agent and key."""
    stop = stop_for(stops, user=user, agent=agent, key_id=key_id)
    if stop is not None:
        raise ScopeStopped(stop)
