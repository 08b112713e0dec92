"""The tier slot: a tenant's running tasks of one tier, under the tier's fair limit.

Invariant: where a tier's capacity is known (``AGENTQ_TIER_CAPACITY``: in AWS, each tier's event
source maximum concurrency, ``executor.tier_max_concurrency``), a tenant's running tasks of that
tier never number more than ``control.defaults.fair_limit`` of it: the fleet's rule, per tier.
Each tier's event source runs at most its own capacity, below the fleet's, so the fleet's
reserve alone does not keep a tier from filling: one tenant's burst in ``normal`` could hold
every ``normal`` invocation while under its tenant limit, and a quiet tenant's ``normal`` task,
served first by the SQS fair queue, would wait for one of those turns to end.

The slot is one more slot item, ``TIER#<tenant>#<tier>`` / ``RUNNING``, taken and given back
exactly as a tenant's and a concurrency key's are (``storage.running_slots``): in the admission's
transaction (conditional on ``running < limit``), in the release's, named in META's ``slots``;
a refused task parks on its ``WAIT#`` list and each release wakes one waiter per slot it freed.
Its limit is the deployment's (``tier_limits``, known to every process that admits), never
stored on the item. Only tasks that run on the tier's runners take it: a task with a workspace
in a deployment with a workspace pool (the EC2 tier) runs on that pool's hosts, not on the
tier's event source (``queueing.fairness.FairShare`` decides). Work-conserving: the reserve is
per tenant, so a second tenant takes it, and a lone tenant runs the tier's capacity less its
reserve (one slot of a tier of up to 20).
"""

from __future__ import annotations

PREFIX = "TIER#"


def tier_pk(tenant: str, tier: str) -> str:
    return f"{PREFIX}{tenant}#{tier}"


def is_tier_pk(pk: str) -> bool:
    return pk.startswith(PREFIX)


def tier_of(pk: str) -> str:
    """The tier of a tier slot's partition (a tier's name holds no ``#``; a tenant's may)."""
    return pk.rsplit("#", 1)[1]
