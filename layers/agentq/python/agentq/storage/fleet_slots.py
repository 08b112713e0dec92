"""The fleet slot: the deployment's capacity, shared among the tenants by weight.

Invariant: the tasks holding a fleet slot never number more than the fleet's capacity
(``AGENTQ_FLEET_CAPACITY``: what the executors' reserved concurrency and the workers admit).
Lowering the capacity below what runs kills nothing: the fleet admits nobody until enough have
left (``free_shards``, ``room``: the shards' sum is read with them, each shard's bound is
transactional). During a rolling deploy, processes with different capacities bound the fleet by
the larger one.

The capacity is counted in ``SHARDS`` slot items (``FLEET#<i>`` / ``RUNNING``), shard ``i``
holding its part of it (``shard_limits``), so that no single item is written by every admission
and release of the deployment: an admission reads every shard in the same BatchGetItem that
reads its tenant's item and takes a slot of a shard with room, picked at random (a
transaction that finds that shard taken meanwhile is refused, and the admission reads again).
A task is refused by the fleet only when every shard is full, so the fleet is work-conserving:
while it has room, any tenant below its hard limit runs, however much more than its share.

When the fleet is full a refused task waits on its tenant's fleet list (``FLEET#Q#<tenant>``,
the same ``WAIT#`` items as a tenant's list), and its tenant is marked waiting
(``FLEET#WAITING`` / ``TENANT#<tenant>``): the fleet's waiting tenants are one Query, never a
Scan. Each fleet slot a release frees wakes one waiter of the waiting tenant whose
``running / weight`` is lowest among those below their hard limit (``by_share``), so under
saturation each tenant's running count converges to its weight's part of the fleet. A tenant's
``weight`` (default 1) lives on its slot item beside its limit override.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

SHARDS = 4
FLEET = "FLEET"  # the deployment's fleet; a test names its own, so tests sharing a table do not share one
WAITING_TENANT = "TENANT#"
DEFAULT_WEIGHT = 1
MAX_WEIGHT = 1000


def shard_pk(index: int, fleet: str = FLEET) -> str:
    return f"{fleet}#{index}"


def queue_pk(tenant: str, fleet: str = FLEET) -> str:
    """Where ``tenant``'s tasks refused by the fleet (not by their tenant's own limit) wait."""
    return f"{fleet}#Q#{tenant}"


def waiting_pk(fleet: str = FLEET) -> str:
    """The fleet's waiting tenants (one item each: ``TENANT#<tenant>``)."""
    return f"{fleet}#WAITING"


def is_shard(pk: str) -> bool:
    name, _, index = pk.partition("#")
    return name.startswith(FLEET) and index.isdigit()


def shard_limits(capacity: int) -> list[int]:
    """Each shard's part of ``capacity`` (they add up to it; a shard may have none)."""
    return [capacity // SHARDS + (1 if i < capacity % SHARDS else 0) for i in range(SHARDS)]


def free_shards(capacity: int, running: Sequence[int]) -> list[int]:
    """The shards below their part of ``capacity``; none while the shards together hold
    ``capacity`` or more (a capacity lowered below what runs: each shard's part shrank, but a
    shard that held less than its new part must not admit while the others are still over)."""
    if sum(running) >= capacity:
        return []
    return [i for i, (n, most) in enumerate(zip(running, shard_limits(capacity), strict=True)) if n < most]


def room(capacity: int, running: Sequence[int]) -> int:
    """How many more tasks the fleet admits now: what its shards have free, and never past
    ``capacity`` in all (see ``free_shards``)."""
    free = sum(max(0, most - n) for n, most in zip(running, shard_limits(capacity), strict=True))
    return max(0, min(free, capacity - sum(running)))


def pick_shard(capacity: int, running: Sequence[int]) -> int | None:
    """A shard with room, at random (spreads the admissions' writes), or None: the fleet is full."""
    free = free_shards(capacity, running)
    return random.choice(free) if free else None


def full_shard(capacity: int, running: Sequence[int]) -> int:
    """A shard at or over its part of ``capacity``: one exists whenever no shard is free
    (``pick_shard`` is None), since the parts add up to the capacity."""
    return next(i for i, (n, most) in enumerate(zip(running, shard_limits(capacity), strict=True)) if n >= most)


def check_weight(weight: object) -> None:
    from agentq.core.errors import ValidationError

    if isinstance(weight, bool) or not isinstance(weight, int) or not DEFAULT_WEIGHT <= weight <= MAX_WEIGHT:
        raise ValidationError(
            f"weight must be a whole number from {DEFAULT_WEIGHT} to {MAX_WEIGHT} (got {weight!r})", field="weight"
        )


@dataclass(frozen=True)
class Share:
    """A waiting tenant as the fleet's wake sees it."""

    tenant: str
    running: int
    weight: int
    limit: int | None

    @property
    def below_limit(self) -> bool:
        return self.limit is None or self.running < self.limit


def by_share(shares: Sequence[Share]) -> list[Share]:
    """The waiting tenants below their hard limit, the furthest below its weight's share first
    (lowest ``running / weight``; ties in random order, so no tenant is favoured by its name)."""
    eligible = [s for s in shares if s.below_limit]
    random.shuffle(eligible)
    return sorted(eligible, key=lambda s: s.running / s.weight)
