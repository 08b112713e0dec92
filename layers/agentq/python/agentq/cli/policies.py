"""``agentq policy put|list|show|history|test``: a tenant's policy rules (docs/POLICIES.md).

``put`` sends a Cedar file as a scope's whole rule set (the server checks it: a rule that does
not parse or validate is refused naming ``policies``, and nothing is stored); ``test`` asks the
server what the rules (the stored ones, or a file in place of a scope's) would decide for a
sample call, and runs nothing."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from agentq.cli.args import UsageError, add_command, read_text
from agentq.cli.output import dump
from agentq.cli.target import api_client, remote


def _read(value: str) -> str:
    return read_text(value, what="the rules")


def _json_arg(value: str | None, name: str) -> dict[str, Any]:
    if not value:
        return {}
    try:
        data = json.loads(value)
    except ValueError:
        raise UsageError(f"{name}: not JSON: {value[:80]!r}", field=name) from None
    if not isinstance(data, dict):
        raise UsageError(f"{name}: a JSON object, not {type(data).__name__}", field=name)
    return data


def _scope(value: str) -> str:
    """SCOPE as one segment of the request's path: ``tenant`` or ``agent:NAME``, what the API's
    route takes, refused here naming ``scope`` (empty, a space: it went into the path as typed,
    and http.client raised on the space), and encoded."""
    import re

    from agentq.api.client import _seg
    from agentq.core.policies.rules import SCOPE_PATTERN

    if not re.fullmatch(SCOPE_PATTERN, value):
        raise UsageError(f"{value!r} is no policy scope: tenant, or agent:NAME (a lowercase agent name)", field="scope")
    return _seg(value, "scope")


def _line(doc: Any) -> str:
    from agentq.cli.views import when

    rules = doc.policies.count("@id(")
    by = f"  by {doc.created_by}" if doc.created_by else ""
    return f"{doc.scope:<40} v{doc.version:<5} {when(doc.created_at)}  {rules} rule{'s' * (rules != 1)}{by}"


def _cmd_policy(args: argparse.Namespace) -> int:
    from agentq.api.client_pages import pages
    from agentq.api.models.policies import PolicyDecision, PolicyList, PolicyView, PolicyWritten

    client = api_client(args)
    command = args.policy_command
    scope = _scope(args.scope) if command in ("put", "show", "history") else ""
    if command == "put":
        answer = client.call(PolicyWritten, "PUT", f"/policies/{scope}", {"policies": _read(args.file)})
        if args.json:
            dump(answer)
            return 0
        doc = answer.policy
        what = "stored" if answer.created else "unchanged: the current version is"
        print(f"{what} {doc.scope} version {doc.version}")
        for warning in answer.warnings:
            print(f"warning: {warning}", file=sys.stderr)
        return 0
    if command in ("list", "history"):
        path = "/policies" if command == "list" else f"/policies/{scope}/history"
        read = pages(lambda cursor: client.call(PolicyList, "GET", path, query={"cursor": cursor}))
        docs = [doc for page in read for doc in page.policies]  # a history comes in pages (at most 2 MB each)
        if args.json:
            print(json.dumps([doc.model_dump(mode="json") for doc in docs], indent=2))
            return 0
        for doc in docs:
            print(_line(doc))
        if not docs:
            print("no rules (write some: agentq policy put tenant rules.cedar)", file=sys.stderr)
        return 0
    if command == "show":
        shown = client.call(PolicyView, "GET", f"/policies/{scope}", query={"version": args.version})
        if args.json:
            dump(shown)
        else:
            print(shown.policies)
        return 0
    body: dict[str, Any] = {
        "call": {"kind": args.kind, "tool": args.tool or "", "model": args.model or "",
                 "args": _json_arg(args.args, "args")},
        "principal": {"agent": args.agent or "", **_json_arg(args.principal, "principal")},
        "history": _json_arg(args.history, "history"),
    }  # fmt: skip
    if args.file:
        body["policies"] = {args.scope or "tenant": _read(args.file)}
    decided = client.call(PolicyDecision, "POST", "/policies/test", body)
    if args.json:
        dump(decided)
        return 0
    rule = f" by {decided.rule}" if decided.rule else ""
    print(f"{decided.decision}{rule}" + (f": {decided.reason}" if decided.reason else ""))
    for shadow in decided.log_only:
        print(f"  log_only {shadow.get('rule')} would {shadow.get('effect')}: {shadow.get('message')}")
    return 0


def register(sub: Any) -> None:
    policy = add_command(sub, "policy", "write, list, test or show the history of policy rules (Cedar)")
    actions = policy.add_subparsers(dest="policy_command", required=True, metavar="ACTION")
    put = remote(actions.add_parser("put", help="a scope's whole rule set from a Cedar file (a new version)",
                                    description="a scope's whole rule set from a Cedar file (a new version)"))  # fmt: skip
    put.add_argument("scope", help="tenant, or agent:NAME")
    put.add_argument("file", help="rules.cedar ('-' reads stdin)")
    remote(actions.add_parser("list", help="every scope's current rules", description="every scope's current rules"))
    show = remote(actions.add_parser("show", help="a scope's rules", description="a scope's rules (or one version)"))
    show.add_argument("scope")
    show.add_argument("--version", type=int, default=None)
    history = remote(actions.add_parser("history", help="a scope's versions", description="a scope's versions"))
    history.add_argument("scope")
    test = remote(actions.add_parser(
        "test", help="what the rules decide for a sample call (nothing runs)",
        description="what the rules (stored, or FILE in place of SCOPE's) decide for a sample call; nothing runs",
    ))  # fmt: skip
    test.add_argument("--kind", choices=("tool", "mcp", "spawn", "model"), default="tool")
    test.add_argument("--tool", help="the tool called")
    test.add_argument("--model", help="the model (a model call)")
    test.add_argument("--args", help="the call's arguments, a JSON object")
    test.add_argument("--agent", help="the task's agent")
    test.add_argument("--principal", help="more of the principal, a JSON object (user, api_key, agent_version)")
    test.add_argument("--history", help="the task's history, a JSON object (tools, task_spend_micros, ...)")
    test.add_argument("--file", help="rules to test in place of the stored ones of --scope")
    test.add_argument("--scope", help="the scope --file stands for (default: tenant)")
    policy.set_defaults(func=_cmd_policy)
