"""Aliases of an agent: a name (``prod``, ``canary``, any) that points at one version, or splits
new tasks by weight between two (a canary), so shipping a version and rolling it back is moving
a pointer, never editing what a running task runs.

A submission names one as ``support@prod``. It is resolved once, at submission, to a version,
and the task pins that version (``agent: "support@7"``) with the fields copied from it
(``core.agents``): its follow-ups, resumes and retries run 7 whatever the alias says later. A
schedule keeps the name it was given, so each of its fires resolves the alias anew.

Which version a task gets under a split is a pure function of a key: the task's end user when it
has one (a person sees one version across their tasks), else its task id; a hash of the tenant,
the agent and that key picks a bucket 0-99, and the targets take consecutive ranges of buckets in
their order. So the same key always gets the same version for the same weights, and raising a
canary's weight only moves keys onto it (the buckets it had stay its own). An alias name starts
with a letter, a version number with a digit: ``support@7`` and ``support@prod`` never collide.
"""

from __future__ import annotations

import hashlib
import re
from typing import Annotated

from pydantic import Field, field_validator

from agentq.core.errors import ValidationError
from agentq.core.models import StrictModel

ALIAS_PATTERN = r"^[a-z][a-z0-9_-]{0,31}$"
BUCKETS = 100
MAX_TARGETS = 2


class AliasTarget(StrictModel):
    """One version an alias sends new tasks to, and the share of them (percent)."""

    version: int = Field(strict=True, ge=1, le=999_999_999, description="a version of the agent")
    weight: int = Field(strict=True, ge=1, le=100, description="percent of new tasks, 1-100")


Targets = Annotated[
    list[AliasTarget],
    Field(
        min_length=1,
        max_length=MAX_TARGETS,
        description="one version (weight 100), or two whose weights sum to 100: the first is the stable one, "
        "the second the canary",
    ),
]


class AliasSpec(StrictModel):
    """What ``PUT /agents/{name}/aliases/{alias}`` takes: where the alias points from now on."""

    versions: Targets

    @field_validator("versions")
    @classmethod
    def _weights(cls, targets: list[AliasTarget]) -> list[AliasTarget]:
        total = sum(t.weight for t in targets)
        if total != BUCKETS:
            raise ValueError(f"the weights sum to {total}; they must sum to 100")
        if len({t.version for t in targets}) != len(targets):
            raise ValueError("a version is named twice; an alias splits between two different versions")
        return targets


class AgentAlias(AliasSpec):
    """An alias as stored and as the API returns it."""

    agent: str = Field(description="the agent's name")
    alias: str
    revision: int = Field(description="1 when created, one more at each move")
    updated_at: float


def check_alias_name(alias: str, *, field: str = "alias") -> str:
    if not re.fullmatch(ALIAS_PATTERN, alias):
        raise ValidationError(
            f"{field}: {alias!r} is not an alias name: a lowercase letter, then up to 31 lowercase letters, "
            "digits, '-' or '_' (a number names a version, not an alias)",
            field=field,
        )
    return alias


def bucket(tenant: str, agent: str, key: str) -> int:
    """The bucket (0-99) of ``key`` for ``agent`` of ``tenant``: the same inputs, the same bucket,
    in every process (a hash, never Python's salted ``hash``)."""
    digest = hashlib.sha256(f"{tenant}\x00{agent}\x00{key}".encode()).digest()
    return int.from_bytes(digest[:8], "big") % BUCKETS


def pick(alias: AliasSpec, *, tenant: str, agent: str, key: str) -> int:
    """The version ``alias`` gives the task whose split key is ``key`` (see the module)."""
    at = bucket(tenant, agent, key)
    edge = 0
    for target in alias.versions:
        edge += target.weight
        if at < edge:
            return target.version
    return alias.versions[-1].version  # unreachable: the weights sum to BUCKETS


def split_key(task_id: str, user: str | None) -> str:
    """What a split is sticky to: the end user when the task acts for one, else the task."""
    return f"user:{user}" if user is not None else f"task:{task_id}"
