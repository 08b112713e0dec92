"""Managing a tenant's caps per end user, agent and API key (``core.caps``): write, read, list
and delete them, each with what its windows hold now. A cap is checked whole before anything is
stored (a bad one is a 4xx naming its field and writes nothing); it holds from the next claim of
each task of its scope (a running task reads its caps when it is claimed: at most a time slice
later)."""

from __future__ import annotations

from dataclasses import dataclass

from agentq.core.caps import CapLimits, CapNotFound, ScopeCap, check_name, check_scope
from agentq.storage.container import Storage


@dataclass(frozen=True)
class CapState:
    """A cap and what its windows hold now (tokens; millionths of a dollar)."""

    cap: ScopeCap
    usage: dict[str, int]


def put(store: Storage, tenant: str, scope: str, name: str, limits: CapLimits) -> CapState:
    checked = check_scope(scope)
    store.caps.put(tenant, checked, check_name(name), limits)
    return get(store, tenant, checked, name)


def get(store: Storage, tenant: str, scope: str, name: str) -> CapState:
    checked = check_scope(scope)
    cap = store.caps.get(tenant, checked, check_name(name))
    if cap is None:
        raise CapNotFound(f"no cap for {scope} {name!r}", field="name")
    return CapState(cap, store.caps.usage(tenant, checked, name))


def listing(store: Storage, tenant: str, scope: str | None = None) -> list[CapState]:
    caps = store.caps.of_tenant(tenant)
    if scope is not None:
        caps = [c for c in caps if c.scope == check_scope(scope)]
    return [CapState(c, store.caps.usage(tenant, c.scope, c.name)) for c in caps]


def delete(store: Storage, tenant: str, scope: str, name: str) -> CapState:
    """Remove a scope's caps; what they were (its windows' counters stay until they expire)."""
    state = get(store, tenant, scope, name)
    store.caps.delete(tenant, state.cap.scope, name)
    return state
