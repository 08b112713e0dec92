"""An alias at submission, and moving a task to another version of its agent.

A submission of ``name@alias`` reads the alias once, picks its version for this task
(``core.aliases.pick``) and is resolved as ``name@N`` would be (``control.agents``): the task
pins N. Moving the alias later changes nothing for it; its owner may move it explicitly
(``move_task``), which is logged on its event stream as ``agent.moved``.

An alias with online evaluation (``core.aliases.OnlineEval``) samples the task at the same read:
a sampled task carries the alias's grade (``TaskSubmission.online``), so the choice is made once
and a retry or a resume keeps it. ``set_alias`` checks that grade before anything is written.
"""

from __future__ import annotations

from collections.abc import Callable

from pydantic import BaseModel

from agentq.control.defaults import CONSTRAINT_FIELDS, Defaults
from agentq.control.memory import check_attachments
from agentq.control.operations import owned_task
from agentq.control.validation import check_outcome, check_submission, parse_submission
from agentq.core.agents import (
    DEFINED_BY_AGENT,
    DEFINED_CONSTRAINTS,
    SUPPLIED_BY_AGENT,
    AgentVersion,
    parse_ref,
    resolved_fields,
)
from agentq.core.aliases import AgentAlias, AliasSpec, pick, sampled, split_key
from agentq.core.errors import IllegalTransition, ValidationError
from agentq.core.models import Constraints, OnlineGrade, TaskStatus, TaskSubmission
from agentq.core.tools import ToolRegistry
from agentq.storage.agents import AgentNotFound
from agentq.storage.container import Storage
from agentq.storage.task_pins import SubmissionReplaced, TaskBusy, repin

# A task no worker holds and none will claim until someone writes to it: answered, or
# interrupted and waiting for its person. Its next run (a follow-up) runs the new version.
MOVABLE = (TaskStatus.SUCCEEDED, TaskStatus.IDLE)


def aliased_version(
    store: Storage, tenant: str, name: str, alias: str, *, task_id: str | None, user: str | None
) -> AgentVersion:
    """The version ``alias`` of agent ``name`` gives a task (``aliased``)."""
    return aliased(store, tenant, name, alias, task_id=task_id, user=user)[0]


def aliased(
    store: Storage, tenant: str, name: str, alias: str, *, task_id: str | None, user: str | None
) -> tuple[AgentVersion, OnlineGrade | None]:
    """The version ``alias`` of agent ``name`` gives a task, and the online grade it samples the
    task for (None: not sampled): one read of the alias (never cached, so a move takes effect
    at once, in every process), the version from the store's cache of immutable versions."""
    found = store.aliases.get(tenant, name, alias)
    key = split_key(task_id or "", user)
    version = store.aliases.version(tenant, name, pick(found, tenant=tenant, agent=name, key=key))
    online = found.online
    if online is None or task_id is None or not sampled(tenant, name, alias, task_id, online.rate):
        return version, None
    return version, OnlineGrade(alias=alias, grade=online.grade)


def set_alias(
    store: Storage,
    tools: ToolRegistry,
    tenant: str,
    name: str,
    alias: str,
    spec: AliasSpec,
    *,
    expected_revision: int | None = None,
) -> AgentAlias:
    """Point ``alias`` (``storage.agent_aliases``; only from ``expected_revision`` when given),
    its online grade checked first as a submission's outcome is, against each version it names
    (the grading model defaults to the version's): an unknown grader, an unpriced model, a
    scripted one without a script is a 422 naming the ``online.grade`` field, and nothing is
    written."""
    if spec.online is not None:
        for i, target in enumerate(spec.versions):
            try:
                version = store.aliases.version(tenant, name, target.version)
            except AgentNotFound:
                raise ValidationError(
                    f"versions[{i}].version: agent {name!r} has no version {target.version}",
                    field=f"versions[{i}].version",
                ) from None
            check_outcome(spec.online.grade, version.provider, version.model, tools, prefix="online.grade")
    return store.aliases.set(tenant, name, alias, spec, expected_revision=expected_revision)


def move_task(
    store: Storage, tools: ToolRegistry, task_id: str, version: int, *, tenant: str, defaults: Defaults | None = None
) -> tuple[str, str]:
    """Pin ``task_id`` to ``version`` of its agent from its next run on; (before, after) refs.

    The task is resolved again as its request would be on the new version: what the version
    defines (provider, model, system, script, tools and their policies, fallbacks, MCP tools,
    remote agents) and what it gives its tasks unless they set it themselves (outcome, notify,
    concurrency, output schema, memory, constraint defaults) come from the new version, and the
    deployment's ``defaults`` fill what neither sets; what the submitter set itself
    (``_own_fields``) stays, as do its goal, user, metadata, priority, budget
    (``constraints.max_tokens``: META's, already spent against), workspace (its files are where
    they are; a task that had none gets none of the version's) and conversation. A task moved
    keeping the old version's outcome was graded by a gate its version no longer had. Only an
    answered or idle task moves (409 otherwise): a run in flight is never changed under its worker."""
    task = owned_task(store, task_id, tenant)
    old, read = store.tasks.submission_read(task_id)  # what the move is made from, and written over
    if old.agent is None:
        raise ValidationError(f"task {task_id} runs no agent definition: there is no version to move", field="task_id")
    name, was = parse_ref(old.agent)
    try:
        target = store.agents.get(tenant, name, version)
    except AgentNotFound:
        raise ValidationError(f"version: agent {name!r} has no version {version}", field="version") from None
    if task.status not in MOVABLE:
        raise IllegalTransition(
            f"task {task_id} is {task.status.value}: a task moves to another version when it is answered or idle "
            "(interrupt it first)",
            field="task_id",
        )
    own = _own_fields(old, lambda: _version_was(store, tenant, name, was), defaults)
    sent = old.model_dump(exclude={*DEFINED_BY_AGENT, *SUPPLIED_BY_AGENT, "agent", "constraints", "memory",
                                   "own_fields", "overridden"}, exclude_none=True)  # fmt: skip
    for field in SUPPLIED_BY_AGENT:
        if field in own and field != "workspace":
            value = getattr(old, field)
            sent[field] = value if not isinstance(value, BaseModel) else value.model_dump(exclude_none=True)
    mine = old.constraints.model_dump(exclude_none=True)
    sent["constraints"] = {k: v for k, v in mine.items() if f"constraints.{k}" in own}
    sent["memory"] = [a.model_dump(exclude_none=True) for a in old.memory if f"memory.{a.store}" in own]
    fields = resolved_fields(target, sent)
    fields["own_fields"] = sorted(own)
    fields["constraints"]["max_tokens"] = old.constraints.max_tokens
    # The task's files are where they are: its workspace stays as it was, none included. A new
    # version's start (a repository, an upload) would be files at a step its history ran without.
    if old.workspace is not None:
        fields["workspace"] = old.workspace.model_dump(exclude_none=True)
    else:
        fields.pop("workspace", None)
    moved = parse_submission(fields)
    if defaults is not None:
        moved = defaults.apply(moved)
    check_submission(moved, tools)
    check_attachments(store, moved.memory, tenant=tenant)
    try:
        repin(store.table, task_id, moved, before=old.agent, statuses=MOVABLE, read=read)
    except TaskBusy:
        raise IllegalTransition(
            f"task {task_id} started running again; move it when it is answered or idle", field="task_id"
        ) from None
    except SubmissionReplaced:
        raise IllegalTransition(
            f"task {task_id}'s submission changed while it moved (another move); move it again",
            field="task_id",
        ) from None
    return old.agent, target.ref


def _version_was(store: Storage, tenant: str, name: str, version: int | str | None) -> AgentVersion | None:
    """The version a task ran (its ``agent`` is pinned, name@N), None if it cannot be read."""
    try:
        return store.agents.get(tenant, name, version) if isinstance(version, int) else None
    except AgentNotFound:
        return None


def _own_fields(
    old: TaskSubmission, version_was: Callable[[], AgentVersion | None], defaults: Defaults | None
) -> set[str]:
    """What of the fields a version also gives its tasks ``old``'s submitter set itself: as
    recorded when it was resolved (``TaskSubmission.own_fields``). A task resolved before that
    record was kept has none: then a field whose value the version it ran (``version_was``)
    gave, or for a constraint that version left unset the deployment's or agentq's default, is
    taken as not its own, and any other value as its own (so a value its submitter sent equal
    to the version's follows the move, and a deployment default changed since stays)."""
    if old.own_fields is not None:
        return set(old.own_fields)
    was = version_was()
    if was is None:  # nothing to tell them apart by: every value it has stays, as before the record
        mine = old.constraints.model_dump(exclude={*DEFINED_CONSTRAINTS}, exclude_none=True)
        return {*(f for f in SUPPLIED_BY_AGENT if getattr(old, f) is not None),
                *(f"constraints.{k}" for k in mine), *(f"memory.{a.store}" for a in old.memory)}  # fmt: skip
    own = {f for f in SUPPLIED_BY_AGENT if f != "workspace" and getattr(old, f) not in (None, getattr(was, f))}
    given = {a.store: a for a in was.memory}
    own |= {f"memory.{a.store}" for a in old.memory if given.get(a.store) != a}
    version_defaults = was.constraints.model_dump(exclude_none=True)
    usual = Constraints().model_dump()
    deployment = {k: getattr(defaults, k) for k in CONSTRAINT_FIELDS} if defaults is not None else {}
    for field, value in old.constraints.model_dump(exclude={*DEFINED_CONSTRAINTS}).items():
        if field in version_defaults:
            its = value != version_defaults[field]
        else:
            its = value not in (usual.get(field), deployment.get(field, usual.get(field)))
        if its:
            own.add(f"constraints.{field}")
    return own
