"""``GET /usage``: the caller's running and waiting tasks against its running limit (the
console shows them above the task list; ``storage.running_slots`` counts them, in the
deployment's slots: ``Defaults.running_slots``), and its usage of the last 24 hours by end user
(``control.spend.spend_by_user``): a key reads every user of its tenant, a token its own row; and
the caps per scope with what their windows hold (``control.caps``; a token: its own user's).
``GET /usage/spend``: what its task trees spent over a window, known and unknown apart
(``control.spend``).
``GET /usage/tenants``: the same as ``GET /usage`` for every tenant, for an operator's key only (403 otherwise:
a tenant sees no other tenant, not even its name).
``GET /breakers``: the circuit breakers the fleet shares per provider and model (``core.flow``,
``storage.flow``): fleet health, not a tenant's data, so every key reads it; it is what tells
a person why a task says ``deferred: circuit_open``."""

from __future__ import annotations

import time
from typing import Annotated

from aws_lambda_powertools.event_handler.openapi.params import Query

from agentq.api.errors import Forbidden, responses
from agentq.api.models import (
    BreakersView,
    BreakerView,
    CallerUsage,
    SpendView,
    TenantsUsage,
    TenantUsage,
    UserUsage,
)
from agentq.api.routes.caps import view as caps_view
from agentq.api.routes.common import ApiDeps, Router, user_query
from agentq.control import caps
from agentq.control.spend import MAX_HOURS, spend_by_user, tenant_spend

USERS_WINDOW_HOURS = 24
# The users' window starts on a whole minute: ``users_since`` is the minute 24 hours before the
# current one, and the rows count the trees created since then (24 hours and up to 59 s).
# Read off the clock to the microsecond, it changed the answer, and so its ETag, on every call:
# GET /usage never answered 304, though nothing in it had changed (docs/API.md: an unchanged
# answer is a 304). On a whole minute, the answer stays byte-identical while its counts do
# (a console polling every few seconds gets 304s) and ``users_since`` still says exactly which
# trees the rows count; the window moves a minute at a time, and its answer with it. Leaving
# ``users_since`` out of the tag instead would let a 304 confirm a window start the server no
# longer means, and the tag would no longer be the hash of the bytes sent (api/conditional.py).
USERS_WINDOW_STEP = 60  # seconds


def router(deps: ApiDeps) -> Router:
    routes = Router()

    @routes.get(
        "/usage",
        summary="This tenant's running and waiting tasks",
        description="Tasks holding one of the tenant's running slots, tasks waiting for one (counted up to "
        "1,000), and the limit (the tenant's override or the deployment's default; null: unlimited). Without a "
        "fleet capacity a tenant without a limit holds no slots: its running count is 0; with one, every tenant's "
        "running tasks are counted. `users`: the last 24 hours' usage by end user (a key reads every user of its "
        "tenant; a token acting as a user reads only its own row). `caps`: the caps per end user, agent and API key with "
        "what each window holds now (a token: its own user's only).",
        operation_id="getUsage",
        tags=["tasks"],
        responses=responses(200, CallerUsage),
    )
    def usage() -> CallerUsage:
        caller = deps.caller()
        now = deps.defaults.running_slots(deps.store).usage(caller.tenant)
        minute = time.time() // USERS_WINDOW_STEP * USERS_WINDOW_STEP
        rows, complete = spend_by_user(deps.store, caller.tenant, USERS_WINDOW_HOURS, user=caller.user, now=minute)
        users = [
            UserUsage(
                user=r.user, trees=r.trees, running=r.running, known_tokens=r.known_tokens,
                unknown_tokens=r.unknown_tokens, known_usd=str(r.known_usd), unknown_usd=str(r.unknown_usd),
            )
            for r in rows
        ]  # fmt: skip
        capped = caps.listing(deps.store, caller.tenant, "user" if caller.user else None)
        return CallerUsage(
            tenant=now.tenant,
            running=now.running,
            waiting=now.waiting,
            max_running=now.limit,
            weight=now.weight,
            operator=caller.operator,
            users=users,
            users_since=minute - USERS_WINDOW_HOURS * 3600,
            users_complete=complete,
            caps=[
                caps_view(c)
                for c in capped
                if caller.user is None or (c.cap.scope, c.cap.name) == ("user", caller.user)
            ],
        )

    @routes.get(
        "/usage/spend",
        summary="What this tenant's task trees spent over a window, known and unknown apart",
        description="The ledgers of the tenant's root tasks created in the last `hours` (default 24, at most 744), "
        "each with its sub-agents: the usage the provider reported (known) and the tokens counted at the holds of "
        "calls whose outcome is unknown. Read on demand: two batch reads per hundred trees, at most 1,000 trees "
        "(`complete` says whether the window held more).",
        operation_id="getSpend",
        tags=["tasks"],
        responses=responses(200, SpendView, 403, 422),
    )
    def spend(
        hours: Annotated[float, Query(gt=0, le=MAX_HOURS, description="the window, in hours back from now")] = 24,
        user: Annotated[
            str | None,
            user_query(
                "only the trees acting for this end user; a caller acting as a user (a token's) "
                "reads only its own, with or without it"
            ),
        ] = None,
    ) -> SpendView:
        caller = deps.caller()
        user = caller.reads_for(user, "the spend")  # a token's user never reads the tenant's or another's
        got = tenant_spend(deps.store, caller.tenant, hours, user=user)
        return SpendView(
            since=got.since, user=user, trees=got.trees, known_tokens=got.known_tokens,
            unknown_tokens=got.unknown_tokens, known_usd=str(got.known_usd), unknown_usd=str(got.unknown_usd),
            complete=got.complete,
        )  # fmt: skip

    @routes.get(
        "/usage/tenants",
        summary="Every tenant's running and waiting tasks (operator keys only)",
        description="For each tenant holding running slots or with a limit of its own (an unlimited tenant "
        "holds none, unless the deployment has a fleet capacity): running, waiting (counted up to 1,000 each) and "
        "the limit. Only a key created with "
        "`agentq keys create --operator` may read it; any other key is answered 403 (forbidden).",
        operation_id="listTenantsUsage",
        tags=["tasks"],
        responses=responses(200, TenantsUsage, 403),
    )
    def tenants_usage() -> TenantsUsage:
        if not deps.operator():
            raise Forbidden("only an operator's key reads every tenant's usage (agentq keys create --operator)")
        slots = deps.defaults.running_slots(deps.store)
        return TenantsUsage(
            tenants=[
                TenantUsage(tenant=u.tenant, running=u.running, waiting=u.waiting, max_running=u.limit, weight=u.weight)
                for u in slots.all_usage()
            ]
        )

    @routes.get(
        "/breakers",
        summary="The fleet's circuit breakers, per provider and model",
        description="Each provider/model the fleet has recorded a failed call or a 429 slow-down for: its circuit "
        "(closed, open, half_open), the failures counted in the current window, when it opened and when a probe "
        "may go, and any slow-down. While a model's circuit is open its tasks are deferred (their `retry` says "
        "circuit_open), or sent to a fallback. Shared by every tenant: any key may read it.",
        operation_id="listBreakers",
        tags=["tasks"],
        responses=responses(200, BreakersView),
    )
    def breakers() -> BreakersView:
        flow = deps.store.flow
        listed = [
            BreakerView(
                provider=b.key.partition("/")[0],
                model=b.key.partition("/")[2],
                state=b.state,  # type: ignore[arg-type]
                failures=b.failures,
                window_started_at=b.window_started_at,
                opened_at=b.opened_at,
                probe_after=b.probe_after,
                slowed_until=b.slowed_until,
            )
            for b in flow.breakers()
        ]
        settings = flow.settings.breaker
        return BreakersView(
            breakers=listed, failures_to_open=settings.failures, window_seconds=settings.window_seconds,
            cooldown_seconds=settings.cooldown_seconds,
        )  # fmt: skip

    return routes
