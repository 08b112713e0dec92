"""cdk.json's ``live``: what serves the watchers of tasks, and its limits (infra/hub.py, infra/events.py)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator

# DynamoDB Streams: "no more than two processes at most should be reading from the same streams
# shard at the same time" (more are throttled). The reaper's event source mapping is one
# (infra/background.py), so the hub has one server: every server reads every shard.
STREAM_READERS = 2
MAX_HUB_TASKS = STREAM_READERS - 1  # the reaper's mapping


class LiveSettings(BaseModel):
    """Watchers of tasks (docs/ARCHITECTURE.md, invariant 10, "Live events at scale"). Whatever
    serves them has limits of its own, so a flood of watchers cannot take the executors'
    concurrency or the steps' table capacity: the API's SSE route (the ``events`` function) has a
    reserved concurrency of its own, and the events hub (``hub``: ``agentq.hub`` on Fargate behind
    a load balancer, infra/hub.py) runs on capacity of its own, reads the table only per change,
    writes nothing, and caps the streams a tenant and a user hold open."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    sse_reserved_concurrency: int = Field(
        20, ge=1, description="SSE streams on the API's route open at once, all tenants: the events function's"
    )
    hub: bool = Field(False, description="run the events hub (needs hub_domain and hub_certificate_arn)")
    hub_domain: str | None = Field(None, description="the hub's DNS name (a CNAME to its load balancer, yours)")
    hub_certificate_arn: str | None = Field(None, description="an ACM certificate for hub_domain, this region")
    hub_tasks: int = Field(
        1,
        ge=1,
        description="hub servers: one (each reads every shard of the table's stream, as the reaper does, and "
        "DynamoDB Streams throttles more than two readers of a shard)",
    )
    hub_cpu: int = Field(1024, description="Fargate CPU units per hub server")
    hub_memory_mb: int = Field(2048, ge=512)
    streams_per_tenant: int = Field(2000, ge=1, description="streams a tenant may hold open on the hub, all servers")
    streams_per_user: int = Field(20, ge=1, description="streams a token's user may hold open on the hub, all servers")

    @model_validator(mode="after")
    def _hub_needs_https(self) -> LiveSettings:
        if self.hub and not (self.hub_domain and self.hub_certificate_arn):
            raise ValueError("live.hub needs live.hub_domain and live.hub_certificate_arn (watchers send their keys)")
        if self.hub_tasks > MAX_HUB_TASKS:
            raise ValueError(
                f"live.hub_tasks must be at most {MAX_HUB_TASKS}: every hub server reads every shard of the table's "
                f"stream, the reaper's event source mapping reads them too, and DynamoDB Streams throttles more "
                f"than {STREAM_READERS} readers of a shard"
            )
        return self
