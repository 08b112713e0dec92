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

from agentq.control.operations import owned_task
from agentq.control.validation import check_outcome, check_submission, parse_submission
from agentq.core.agents import DEFINED_BY_AGENT, AgentVersion, parse_ref, resolved_fields
from agentq.core.aliases import AgentAlias, AliasSpec, pick, sampled, split_key
from agentq.core.errors import IllegalTransition, ValidationError
from agentq.core.models import OnlineGrade, TaskStatus
from agentq.core.tools import ToolRegistry
from agentq.storage.agents import AgentNotFound
from agentq.storage.container import Storage
from agentq.storage.task_pins import TaskBusy, repin

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


def set_alias(store: Storage, tools: ToolRegistry, tenant: str, name: str, alias: str, spec: AliasSpec) -> AgentAlias:
    """Point ``alias`` (``storage.agent_aliases``), its online grade checked first as a
    submission's outcome is, against each version it names (the grading model defaults to the
    version's): an unknown grader, an unpriced model, a scripted one without a script is a 422
    naming the ``online.grade`` field, and nothing is written."""
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
    return store.aliases.set(tenant, name, alias, spec)


def move_task(store: Storage, tools: ToolRegistry, task_id: str, version: int, *, tenant: str) -> tuple[str, str]:
    """Pin ``task_id`` to ``version`` of its agent from its next run on; (before, after) refs.

    What the version defines (provider, model, system, script, tools and their policies,
    fallbacks, MCP tools, output schema) replaces the old version's; the task's own constraints,
    budget, workspace and conversation stay. Only an answered or idle task moves (409 otherwise):
    a run in flight is never changed under its worker."""
    task = owned_task(store, task_id, tenant)
    if task.submission.agent is None:
        raise ValidationError(f"task {task_id} runs no agent definition: there is no version to move", field="task_id")
    name, _ = parse_ref(task.submission.agent)
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
    old = task.submission
    drop = {*DEFINED_BY_AGENT, "agent", "output_schema", "constraints", "workspace"}
    sent = old.model_dump(exclude=drop, exclude_none=True)
    sent["constraints"] = old.constraints.model_dump(exclude={"tools", "tool_policies"}, exclude_none=True)
    fields = resolved_fields(target, sent)
    if old.workspace is not None:  # the task's files are where they are: its workspace stays
        fields["workspace"] = old.workspace.model_dump(exclude_none=True)
    moved = parse_submission(fields)
    check_submission(moved, tools)
    try:
        repin(store.table, task_id, moved, before=task.submission.agent, statuses=MOVABLE)
    except TaskBusy:
        raise IllegalTransition(
            f"task {task_id} started running again; move it when it is answered or idle", field="task_id"
        ) from None
    return task.submission.agent, target.ref
