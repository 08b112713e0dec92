"""What a caller acting as one end user (a token's, ``core.endusers.Caller.bound``) may put in
the task it starts: an allow-list. A token runs an agent its tenant defined, as its user; every
field it may set is named here with why it stays within that user's own task, and any other field
(one added to ``TaskSubmission`` later included) is a 403 ``forbidden`` naming it, nothing
created. A field sent as ``null`` is set too: ``null`` would drop what the agent brings (its
callback, its quality gate, its concurrency key).

``POST /tasks`` checks a submission here (``check_user_submission``); a fork's overrides are
checked the same way (``user_fork``); the A2A and MCP servers, which build the submission of a
call themselves, pass it through ``check_user_submission`` as well, so a field they come to send
later answers to the same list.

Which version a token runs is its tenant's to route: a token names an agent by an alias
(``support@prod``), or by its bare name (its latest version) only while the agent has no alias.
Once the tenant routes its users through an alias, the bare name would run whatever version was
created last, a candidate no alias gives anyone yet (a version is created before it is
evaluated), so it is refused, naming the aliases it may name; a version by its number never is.

Why each refused field would reach past the user or the agent:

- ``agent`` unset (an inline task): it would pick its own tools, model, prompt and hosts, and no
  ``agent:NAME`` rule, agent cap or agent stop would apply to it; the agent's version fixes those.
  ``agent: NAME@N`` would pick a version the tenant retired, or step out of a canary; ``agent:
  NAME`` of an agent with an alias would step onto its newest version, released or not.
- ``memory``: a store is the tenant's, shared by every user's tasks (docs/MEMORY.md); an agent
  the tenant defined with a store brings it.
- ``workspace.allow_hosts``, ``workspace.git``: the hosts a task's shell reaches (and a clone
  contacts) are the agent's to fix; an agent with ``shell`` and no workspace of its own gets a
  default one, which a token's hosts would open to the network. ``workspace.base`` is a spawn's.
- ``concurrency``: a key's slots are the tenant's, shared by every user's tasks: its own key (or
  its agent's) with ``cancel_running`` cancelled other users' tasks, and ``skip`` told it whether
  anyone held a key.
- ``outcome``: the agent's quality gate; a token's replaced it (a bar of 0) or had a priced model
  of its choosing grade with a prompt of its own.
- ``notify``: the agent's callback, signed with the tenant's secret for the tenant's backend; a
  token's sent it to a server of its own.
- ``provider``, ``model``, ``system``, ``script``, ``fallbacks``, ``output_schema``,
  ``mcp_tools``, ``remote_agents``, ``constraints.tools``, ``constraints.tool_policies``: what
  the agent is (its model, prompt, answer's shape, tools and their policies); ``online``: an
  alias's; ``own_fields``: agentq's record, made as the agent is resolved.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from agentq.api.errors import Forbidden
from agentq.api.models import ForkRequest
from agentq.core.agents import DEFINED_BY_AGENT, parse_ref
from agentq.core.endusers import Caller
from agentq.core.models import SET_BY_AGENTQ, Constraints, TaskSubmission
from agentq.core.workspace import WorkspaceSpec

if TYPE_CHECKING:
    from agentq.storage.container import Storage

# What a token may set, and why each stays within its user's own task.
USER_FIELDS = {
    "goal": "what the user asks",
    "agent": "which of its tenant's agents runs it (required)",
    "user": "its own (Caller.acting_user refuses another)",
    "constraints": "its own task's budgets and limits (USER_CONSTRAINTS), under the caps on its user, agent and key",
    "priority": "its own task's tier, normal or low (USER_PRIORITIES): high is the tenant's to give",
    "double_texting": "what its own messages to its own task do",
    "depends_on": "its own user's tasks (control.submit: only_user)",
    "metadata": "its own labels, as its goal is its own (a callback carries them: read them as the user's)",
    "workspace": "its starting files and limits (USER_WORKSPACE)",
}
# A budget, a limit, how its own context is kept and how hard its model thinks: the user's own,
# spent against its caps. An approval's timeout and default too, as long as a timeout a token
# sets never approves (``check_user_submission``; ``control.submit.check_user_approvals``): a
# token may reject its own task's held calls, and approve only those its user may decide.
USER_CONSTRAINTS = frozenset(
    {
        "max_tokens", "max_cost_usd", "max_steps", "timeout_seconds", "max_output_tokens", "max_depth",
        "max_fanout", "approval_timeout_seconds", "approval_default", "context_threshold",
        "keep_tool_results", "economy", "compaction", "thinking_budget_tokens", "effort",
    }
)  # fmt: skip
USER_WORKSPACE = frozenset({"files", "upload", "max_bytes", "max_files"})
# The tiers a token may choose: the tenant's users share its queue (fair share is between tenants),
# so a user who could pick ``high`` would put every task of its own ahead of the other users'.
# Lowering its own task's tier takes nothing from anyone.
USER_PRIORITIES = frozenset({"normal", "low"})
# What a token's fork may change (``ForkRequest``; ``at_step`` is where it forks).
USER_FORK_FIELDS = frozenset({"constraints", "priority", "metadata"})

_AGENTS = "set by its agent: a user's token runs the agent as its tenant defined it"
WHY_NOT = {
    **dict.fromkeys((*DEFINED_BY_AGENT, "output_schema"), _AGENTS),
    "agent": "a user's token runs the agents its tenant defined: name one (agent: NAME, GET /agents lists them); "
    "an inline task would be outside the agent's rules, caps and stops",
    "agent@N": "a user's token runs one of its agent's aliases (agent: NAME@ALIAS; NAME, its latest version, while "
    "the agent has no alias), as its tenant routes its users: a version by its number would let a user pick one the "
    "tenant retired, or step out of a canary",
    "memory": "a memory store is the tenant's, shared by all its users' tasks; a user's token may not attach one "
    "(an agent the tenant defined with the store attached brings it)",
    "workspace.allow_hosts": "the hosts a task reaches are its agent's; a user's token may not name any (its "
    "starting files may be sent: workspace.files, workspace.upload)",
    "workspace.git": "the hosts a task reaches are its agent's; a user's token may not name any (its starting "
    "files may be sent: workspace.files, workspace.upload)",
    "workspace.base": "set by a spawn (a sub-agent's parent's workspace)",
    "concurrency": "a concurrency key is the tenant's, its slots shared by every user's tasks: a user's token may "
    "not name one (its agent's applies), or its task would wait on, skip on or cancel other users' tasks",
    "outcome": "an outcome is its agent's quality gate: a user's token may not replace it, lower its bar or pick "
    "the grading model and its prompt (its agent's outcome applies)",
    "notify": "a callback is its agent's, signed with the tenant's secret for the tenant's backend: a user's token "
    "may not send it elsewhere or drop it (its agent's applies)",
    **SET_BY_AGENTQ,  # an alias's online grade, the record of what a submission set itself
    "priority": "a user's token may choose normal or low: high would put its tasks ahead of its tenant's other "
    "users' (the tenant's key gives it)",
    "constraints.tools": _AGENTS,
    "constraints.tool_policies": _AGENTS,
}


def _refuse(reason: str, allowed: Iterable[str]) -> Forbidden:
    """403 naming the field ``reason`` is about (``agent@N``: ``agent``, with its own why)."""
    why = WHY_NOT.get(reason, "not a field a user's token may set")
    field = reason.partition("@")[0]
    return Forbidden(
        f"{field}: {why}; a user's token may set {', '.join(sorted(allowed))} (its agent defines the rest)",
        field=field,
    )


def check_user_submission(caller: Caller, submission: TaskSubmission, store: Storage) -> None:
    """Whether ``caller``, acting as one end user, may send ``submission``: every field it set is
    on the allow-list (``USER_FIELDS``; within ``constraints``, ``USER_CONSTRAINTS``; within
    ``workspace``, ``USER_WORKSPACE``), it names an agent (an alias, or its bare name while it has
    none: ``routed``; not a version by number) and a priority of ``USER_PRIORITIES``; else 403
    ``forbidden`` naming the
    first field that is not (``memory`` and a workspace's hosts before a missing ``agent``, then
    the submission's fields in their order, then those within ``constraints`` and ``workspace``,
    then ``priority`` and ``agent``). Its ``approval_default`` is ``reject`` if it sets one: a
    timeout that approves would decide an ask only the tenant decides on the user's say-so (403
    naming it).
    A key's caller (the whole tenant's) may send anything."""
    if not caller.bound:
        return
    sent = submission.model_fields_set
    limits = submission.constraints.model_fields_set if "constraints" in sent else set()
    workspace = submission.workspace.model_fields_set if submission.workspace is not None else set()
    named = ["memory"] if "memory" in sent else []
    named += [f"workspace.{f}" for f in ("allow_hosts", "git") if f in workspace]
    named += ["agent"] if submission.agent is None else []
    named += [f for f in TaskSubmission.model_fields if f in sent and f not in USER_FIELDS]
    named += [f"constraints.{f}" for f in Constraints.model_fields if f in limits and f not in USER_CONSTRAINTS]
    named += [f"workspace.{f}" for f in WorkspaceSpec.model_fields if f in workspace and f not in USER_WORKSPACE]
    named += ["priority"] if submission.priority not in USER_PRIORITIES else []
    named += ["agent@N"] if submission.agent is not None and isinstance(parse_ref(submission.agent)[1], int) else []
    if named:
        raise _refuse(named[0], USER_FIELDS)
    routed(store, caller.tenant, str(submission.agent))
    if "approval_default" in limits and submission.constraints.approval_default == "approve":
        raise Forbidden(
            "constraints.approval_default: a user's token may not make a timed-out approval approve: the timeout "
            "would decide, on the user's say-so, held calls only the tenant decides (a policy rule's ask, an "
            "ask_tenant tool, a cap's soft threshold); send reject, or leave it to the agent. The user approves "
            "its own task's other asks itself (POST /tasks/{id}/approve)",
            field="constraints.approval_default",
        )


def routed(store: Storage, tenant: str, ref: str) -> None:
    """A token's bare agent name (``support``, the latest version) is refused once the agent has
    an alias: the tenant routes its users through its aliases, and the latest may be a version
    none of them gives yet (403 naming ``agent``, listing the ones it may name). One query of
    the agent's aliases, made for a token's bare name only."""
    name, version = parse_ref(ref)
    if version is not None:
        return
    aliases = [f"{name}@{a.alias}" for a in store.aliases.list(tenant, name)]
    if aliases:
        raise Forbidden(
            f"agent: {name!r} is routed through its aliases: a user's token names one ({', '.join(aliases)}); its "
            "bare name is its latest version, which may be one no alias gives its users yet",
            field="agent",
        )


def user_fork(request: ForkRequest) -> None:
    """A token forks its task as its agent defined it: its overrides may change budgets, limits
    (``USER_CONSTRAINTS``), priority (``USER_PRIORITIES``) and metadata only; a new provider,
    model, script, system prompt or tool list (or anything added to ``ForkRequest`` later) would
    take the fork out of what the tenant gave the user (403 ``forbidden`` naming the field)."""
    changed = request.overrides()
    if changed.get("priority", "normal") not in USER_PRIORITIES:
        raise _refuse("priority", USER_FORK_FIELDS)
    named = [f for f in changed if f not in USER_FORK_FIELDS]
    named += [f"constraints.{f}" for f in changed.get("constraints") or {} if f not in USER_CONSTRAINTS]
    if named:
        raise Forbidden(
            f"{named[0]}: a user's token forks its task as its agent defined it; it may change budgets, "
            "limits, priority and metadata, not the provider, model, script, system prompt or tools",
            field=named[0],
        )
