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

An alias may also evaluate online (``OnlineEval``): a fraction ``rate`` of the tasks submitted
through it is sampled, by a hash of the task id (``sampled``: a retry or a resume of the task
makes the same choice, and the choice is made once, at submission, and kept on the task), and
each sampled task's answer is graded once against the alias's rubric and/or grader. The grade
observes: it never changes how the task ends nor makes it answer again; it is counted for the
version the task ran (``storage.quality``), which is how a canary is compared with its stable
version before it takes all the traffic.
"""

from __future__ import annotations

import hashlib
import re
from typing import Annotated

from pydantic import Field, field_validator

from agentq.core.errors import ValidationError
from agentq.core.models import OutcomeSpec, StrictModel

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


class OnlineEval(StrictModel):
    """Online evaluation of an alias: the share of its new tasks sampled for grading, and how."""

    rate: float = Field(ge=0, le=1, description="the fraction of new tasks graded, 0 to 1 (by a hash of the task id)")
    grade: OutcomeSpec = Field(
        description="the rubric and/or @grader a sampled task's answer is graded with, and its bar (never retried: "
        "max_attempts is not taken)"
    )

    @field_validator("rate", mode="before")
    @classmethod
    def _a_number(cls, value: object) -> object:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ValueError("the rate is a number from 0 to 1")
        return value

    @field_validator("grade")
    @classmethod
    def _observes(cls, grade: OutcomeSpec) -> OutcomeSpec:
        if "max_attempts" in grade.model_fields_set and grade.max_attempts != 1:
            raise ValueError("max_attempts: online grading observes: a sampled task never answers again for it")
        return grade.model_copy(update={"max_attempts": 1})


class AliasSpec(StrictModel):
    """What ``PUT /agents/{name}/aliases/{alias}`` takes: where the alias points from now on."""

    versions: Targets
    online: OnlineEval | None = Field(
        default=None, description="grade a sampled fraction of the alias's new tasks (none: no online evaluation)"
    )

    @field_validator("versions")
    @classmethod
    def _weights(cls, targets: list[AliasTarget]) -> list[AliasTarget]:
        total = sum(t.weight for t in targets)
        if total != BUCKETS:
            raise ValueError(f"the weights sum to {total}; they must sum to 100")
        if len({t.version for t in targets}) != len(targets):
            raise ValueError("a version is named twice; an alias splits between two different versions")
        return targets


class AliasRequest(AliasSpec):
    """The body of ``PUT /agents/{name}/aliases/{alias}``: where it points, and, to move it only
    from what the caller read (a canary bump, a rollback), the revision it read."""

    expected_revision: int | None = Field(
        default=None,
        strict=True,
        ge=0,
        le=999_999_999,
        description="move it only if it is still at this revision (0: only if it does not exist yet); else 409 "
        "alias_conflict naming expected_revision, nothing written. Without it, the move is made on top of "
        "whatever the alias is",
    )


class AgentAlias(AliasSpec):
    """An alias as stored and as the API returns it."""

    agent: str = Field(description="the agent's name")
    alias: str
    revision: int = Field(description="1 when created, one more at each move: each revision is one move's")
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


SAMPLE_SPACE = 2**64


def sampled(tenant: str, agent: str, alias: str, task_id: str, rate: float) -> bool:
    """Whether an alias evaluating ``rate`` of its tasks grades ``task_id``: a hash of the task id
    (and the tenant, agent and alias) read as a number in [0, 1), below ``rate``. The same task,
    the same answer in every process; over many tasks, a fraction ``rate`` of them."""
    digest = hashlib.sha256(f"online\x00{tenant}\x00{agent}\x00{alias}\x00{task_id}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / SAMPLE_SPACE < rate
