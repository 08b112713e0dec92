"""``GET /usage``: the caller's running and waiting tasks against its running limit (the
console shows them above the task list; ``storage.running_slots`` counts them)."""

from __future__ import annotations

from agentq.api.errors import responses
from agentq.api.models import TenantUsage
from agentq.api.routes.common import ApiDeps, Router


def router(deps: ApiDeps) -> Router:
    routes = Router()

    @routes.get(
        "/usage",
        summary="This tenant's running and waiting tasks",
        description="Tasks holding one of the tenant's running slots, tasks waiting for one (counted up to "
        "1,000), and the limit (the tenant's override or the deployment's default; null: unlimited). A tenant "
        "without a limit holds no slots: its running count is 0.",
        operation_id="getUsage",
        tags=["tasks"],
        responses=responses(200, TenantUsage),
    )
    def usage() -> TenantUsage:
        now = deps.store.slots.with_default(deps.defaults.tenant_max_running).usage(deps.tenant())
        return TenantUsage(tenant=now.tenant, running=now.running, waiting=now.waiting, max_running=now.limit)

    return routes
