"""What a tenant keeps on the API besides tasks: agent definitions (versioned) and schedules.
Both are written from a YAML or JSON file the command reads, since the API cannot."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agentq.cli.args import UsageError, add_command, read_yaml
from agentq.cli.output import dump
from agentq.cli.submit import load_script
from agentq.cli.target import api_client, remote

if TYPE_CHECKING:
    from agentq.api.models import AgentVersion


def _read_agent_file(value: str) -> dict[str, Any]:
    """An agent definition from YAML or JSON ('-': stdin). A ``script`` naming a file beside it
    is read here and sent inline, since the API cannot read the caller's files."""
    body = read_yaml(value, what="the agent definition")  # JSON is YAML
    if not isinstance(body, dict):
        raise UsageError(f"{value} must hold a mapping (name, model, tools, ...)", field="file")
    script = body.get("script")
    if isinstance(script, str) and value != "-" and (Path(value).parent / script).is_file():
        body["script"] = load_script(str(Path(value).parent / script))
    return body


def agent_block(agent: AgentVersion) -> list[str]:
    """``agentq agents show``: the version, its model, its tools with their policies, and its
    MCP servers with the tools pinned from each when the version was created (what its tasks
    are offered, whatever the server lists now)."""
    from agentq.cli.views import cut, when

    policies = agent.tool_policies

    def with_policy(name: str) -> str:
        return f"{name} ({policies[name]})" if name in policies else name

    lines = [f"{agent.ref}  created {when(agent.created_at)}"]
    if agent.description:
        lines.append(f"  {agent.description}")
    lines.append(f"  provider {agent.provider}, model {agent.model}")
    lines.append(f"  tools: {', '.join(with_policy(t) for t in agent.tools) or '(none)'}")
    for server in agent.mcp_servers:
        pins = [p for p in agent.mcp_tools if p.server == server.name]
        chosen = "all its tools" if server.tools is None else "only " + ", ".join(server.tools)
        lines.append(f"  mcp server {server.name} ({chosen}): {len(pins)} tool(s) pinned")
        for pin in pins:
            hint = "read-only" if pin.read_only else "runs at most once"
            lines.append(f"    {with_policy(pin.qualified)}  {hint}  {cut(pin.description, 80)}".rstrip())
    limits = agent.constraints.model_dump(exclude_none=True)
    if limits:
        lines.append("  defaults: " + ", ".join(f"{k}={v}" for k, v in limits.items()))
    if agent.system:
        lines.append("  system: " + agent.system if len(agent.system) < 200 else f"  system: {agent.system[:200]}...")
    return lines


def _cmd_schedules(args: argparse.Namespace) -> int:
    from agentq.cli.views import when

    client = api_client(args)
    if args.schedules_command == "create":
        body = read_yaml(args.file, what="the schedule")
        schedule = client.create_schedule(body)
        if args.json:
            dump(schedule)
        else:
            print(f"{schedule.name}: {schedule.expression}; next fire {when(schedule.next_fire_at)}")
        return 0
    if args.schedules_command == "delete":
        deleted = client.delete_schedule(args.name)
        print(f"deleted {deleted.name}")
        return 0
    schedules = client.list_schedules()
    if args.json:
        dump(schedules)
        return 0
    for s in schedules:
        failed = f" failed {s.failed}" if s.failed else ""
        print(f"{s.name:<24} {s.expression:<28} overlap {s.overlap:<5} fired {s.fired} skipped {s.skipped}{failed} "
              f"next {when(s.next_fire_at)} last {s.last_task_id or '-'}")  # fmt: skip
        if s.last_error:  # its submission is refused at each fire until its owner fixes the cause
            print(f"  last fire refused: {s.last_error}")
    if not schedules:
        print("no schedules (create one: agentq schedules create -f schedule.yaml)", file=sys.stderr)
    return 0


def _cmd_agents(args: argparse.Namespace) -> int:
    from agentq.cli.views import when

    if args.agents_command in ("alias", "move", "quality"):
        from agentq.cli.aliases import cmd_alias, cmd_move, cmd_quality

        command = {"alias": cmd_alias, "move": cmd_move, "quality": cmd_quality}[args.agents_command]
        return command(args)
    client = api_client(args)
    if args.agents_command == "create":
        created = client.create_agent(_read_agent_file(args.file))
        if args.json:
            dump(created)
        else:
            agent = created.agent
            what = "created" if created.created else "unchanged, the latest version is"
            print(agent.ref)
            print(f"{what} {agent.ref} ({len(agent.tools)} tools, model {agent.model}); "
                  f"submit with: agentq submit --agent {agent.name} \"...\"", file=sys.stderr)  # fmt: skip
        return 0
    if args.agents_command == "show":
        agent = client.get_agent(args.agent)
        if args.json:
            dump(agent)
            return 0
        print("\n".join(agent_block(agent)))
        return 0
    if args.agents_command == "versions":
        versions = client.agent_versions(args.name)
        if args.json:
            print(json.dumps([v.model_dump(mode="json") for v in versions], indent=2))
        for v in [] if args.json else versions:
            print(f"{v.ref:<40} {when(v.created_at)}  {v.model}  {len(v.tools)} tools")
        return 0
    agents = client.list_agents()
    if args.json:
        print(json.dumps([a.model_dump(mode="json") for a in agents], indent=2))
        return 0
    for a in agents:
        print(f"{a.name:<32} v{a.latest_version:<5} {when(a.updated_at)}  {a.description or ''}".rstrip())
    if not agents:
        print("no agents (create one: agentq agents create -f agent.yaml)", file=sys.stderr)
    return 0


def register(sub: Any) -> None:
    agents = add_command(
        sub, "agents", "create, list or show agent definitions (versioned: model, system, tools, policies)"
    )
    agents_sub = agents.add_subparsers(dest="agents_command", required=True, metavar="ACTION")
    agents_create = remote(
        agents_sub.add_parser(
            "create",
            help="the next version of an agent from a YAML or JSON file (unchanged: nothing is created)",
            description="the next version of an agent from a YAML or JSON file (unchanged: nothing is created)",
        )
    )
    agents_create.add_argument("-f", "--file", required=True, help="agent.yaml or agent.json ('-' reads stdin)")
    remote(agents_sub.add_parser("list", help="your agents with their latest version", description="your agents"))
    agents_show = remote(
        agents_sub.add_parser("show", help="one version (default: the latest)", description="one version of an agent")
    )
    agents_show.add_argument("agent", help="NAME or NAME@VERSION")
    agents_versions = remote(
        agents_sub.add_parser("versions", help="every version, newest first", description="every version of an agent")
    )
    agents_versions.add_argument("name", help="the agent's name")
    from agentq.cli.aliases import register as register_aliases

    register_aliases(agents_sub)
    agents.set_defaults(func=_cmd_agents)

    schedules = add_command(sub, "schedules", "create, list or delete schedules (a cron or rate expression and a task)")
    schedules_sub = schedules.add_subparsers(dest="schedules_command", required=True, metavar="ACTION")
    schedules_create = remote(
        schedules_sub.add_parser(
            "create", help="create or replace a schedule from a YAML or JSON file",
            description="create or replace a schedule: name, expression (cron(...) or rate(...)), submission, overlap",
        )
    )  # fmt: skip
    schedules_create.add_argument(
        "-f", "--file", required=True, help="schedule.yaml or schedule.json ('-' reads stdin)"
    )
    remote(schedules_sub.add_parser("list", help="your schedules", description="your schedules"))
    schedules_delete = remote(schedules_sub.add_parser("delete", help="delete one", description="delete a schedule"))
    schedules_delete.add_argument("name")
    schedules.set_defaults(func=_cmd_schedules)
