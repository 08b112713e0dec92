"""``GET /usage``: the caller's running and waiting tasks against its running limit (the
console shows them above the task list; ``storage.running_slots`` counts them, in the
deployment's slots: ``Defaults.running_slots``).
``GET /usage/tenants``: the same for every tenant, for an operator's key only (403 otherwise:
a tenant sees no other tenant, not even its name)."""

from __future__ import annotations

from agentq.api.errors import Forbidden, responses
from agentq.api.models import CallerUsage, TenantsUsage, TenantUsage
from agentq.api.routes.common import ApiDeps, Router


def router(deps: ApiDeps) -> Router:
    routes = Router()

    @routes.get(
        "/usage",
        summary="This tenant's running and waiting tasks",
        description="Tasks holding one of the tenant's running slots, tasks waiting for one (counted up to "
        "1,000), and the limit (the tenant's override or the deployment's default; null: unlimited). Without a "
        "fleet capacity a tenant without a limit holds no slots: its running count is 0; with one, every tenant's "
        "running tasks are counted.",
        operation_id="getUsage",
        tags=["tasks"],
        responses=responses(200, CallerUsage),
    )
    def usage() -> CallerUsage:
        now = deps.defaults.running_slots(deps.store).usage(deps.tenant())
        return CallerUsage(
            tenant=now.tenant,
            running=now.running,
            waiting=now.waiting,
            max_running=now.limit,
            weight=now.weight,
            operator=deps.operator(),
        )

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

    return routes
