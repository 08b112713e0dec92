"""How many event streams a tenant, and a user of it, may hold open on one server.

Why: a server of event streams (the events hub, ``agentq dev``) holds a thread and a socket per
open stream. Without a cap, one tenant (or one user's runaway page) opening thousands would take
what every other tenant's watchers need; the agents themselves never depend on it (the hub runs
apart from the executors and only reads the table), but their owners would stop seeing them.
So each server counts the streams it holds by tenant and by a token's user, and refuses one past
either cap before it sends a byte: 429 ``too_many_streams`` naming the cap, with the JSON pages
(``GET /tasks/{id}/events`` without ``Accept: text/event-stream``) still served. An API key's
streams count for its tenant only; a token's for its tenant and its user.

The cap is per server: a deployment's hub of ``n`` tasks admits up to ``n`` times it per tenant
(``infra/hub.py`` divides the configured figure by the task count).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

from agentq.core.endusers import Caller
from agentq.core.errors import AgentqError


class TooManyStreams(AgentqError):
    code = "too_many_streams"


class StreamCaps:
    def __init__(self, per_tenant: int, per_user: int) -> None:
        if per_tenant < 1 or per_user < 1:
            raise ValueError("stream caps are at least 1")
        self.per_tenant = per_tenant
        self.per_user = per_user
        self.lock = threading.Lock()
        self.tenants: dict[str, int] = {}
        self.users: dict[tuple[str, str], int] = {}
        self.refused = 0

    @contextmanager
    def hold(self, caller: Caller) -> Iterator[None]:
        """One open stream of ``caller`` for the ``with`` block; ``TooManyStreams`` past a cap."""
        user = (caller.tenant, caller.user) if caller.user else None
        with self.lock:
            if self.tenants.get(caller.tenant, 0) >= self.per_tenant:
                self.refused += 1
                raise TooManyStreams(
                    f"tenant {caller.tenant} holds {self.per_tenant} open event streams on this server, its cap: "
                    "close one, or read GET /tasks/{id}/events as JSON pages (no Accept: text/event-stream)"
                )
            if user is not None and self.users.get(user, 0) >= self.per_user:
                self.refused += 1
                raise TooManyStreams(
                    f"user {caller.user} holds {self.per_user} open event streams on this server, its cap: close "
                    "one, or read GET /tasks/{id}/events as JSON pages (no Accept: text/event-stream)"
                )
            self.tenants[caller.tenant] = self.tenants.get(caller.tenant, 0) + 1
            if user is not None:
                self.users[user] = self.users.get(user, 0) + 1
        try:
            yield
        finally:
            with self.lock:
                self.tenants[caller.tenant] -= 1
                if not self.tenants[caller.tenant]:
                    del self.tenants[caller.tenant]
                if user is not None:
                    self.users[user] -= 1
                    if not self.users[user]:
                        del self.users[user]

    def open_streams(self, tenant: str) -> int:
        with self.lock:
            return self.tenants.get(tenant, 0)
