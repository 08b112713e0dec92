"""``agentq caps ...``: caps per end user, agent and API key through the API (``core.caps``,
docs/POLICIES.md): ``set`` replaces a scope's caps, ``list`` shows them with what each window
holds now, ``delete`` removes them."""

from __future__ import annotations

import argparse
from typing import Any

from agentq.cli.args import add_command
from agentq.cli.output import dump
from agentq.cli.target import api_client, remote

FIELDS = ("hourly_tokens", "hourly_usd", "daily_tokens", "daily_usd",
          "soft_hourly_tokens", "soft_hourly_usd", "soft_daily_tokens", "soft_daily_usd")  # fmt: skip


def _line(cap: Any) -> str:
    limits = cap.limits.model_dump(exclude_none=True)
    caps = ", ".join(f"{k}={v}" for k, v in limits.items())
    return (f"{cap.scope:<5} {cap.name:<24} {caps}  (this hour: {cap.hour.tokens} tokens ${cap.hour.usd}; "
            f"today: {cap.day.tokens} tokens ${cap.day.usd})")  # fmt: skip


def _cmd_caps(args: argparse.Namespace) -> int:
    from agentq.api.client_caps import delete_cap, list_caps, put_cap

    client = api_client(args)
    out: Any
    if args.caps_command == "set":
        out = put_cap(client, args.scope, args.name, {f: getattr(args, f) for f in FIELDS})
        text = [_line(out)]
    elif args.caps_command == "list":
        out = list_caps(client, args.scope)
        text = [_line(c) for c in out] or ["(no caps)"]
    else:
        out = delete_cap(client, args.scope, args.name)
        text = [f"deleted the caps of {out.scope} {out.name}"]
    if args.json:
        dump({"caps": [c.model_dump(mode="json") for c in out]} if isinstance(out, list) else out)
    else:
        print("\n".join(text))
    return 0


def register(sub: Any) -> None:
    caps = add_command(sub, "caps", "token and dollar caps per end user, agent and API key (hour, day, soft)")
    actions = caps.add_subparsers(dest="caps_command", required=True, metavar="ACTION")
    put = remote(actions.add_parser("set", help="replace a scope's caps", description="replace a scope's caps"))
    put.add_argument("scope", help="user, agent or key")
    put.add_argument("name", help="the end user, the agent's name or the API key's id")
    for field in FIELDS:
        kind = int if field.endswith("tokens") else str
        put.add_argument(f"--{field.replace('_', '-')}", dest=field, type=kind, metavar="N" if kind is int else "USD")
    listing = remote(actions.add_parser("list", help="the caps, with what each window holds now"))
    listing.add_argument("--scope", help="only user, agent or key caps")
    delete = remote(actions.add_parser("delete", help="remove a scope's caps"))
    delete.add_argument("scope")
    delete.add_argument("name")
    caps.set_defaults(func=_cmd_caps)
