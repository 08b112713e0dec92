"""``agentq vault ...``: the vault's credentials through the API (docs/VAULTS.md). ``put`` reads
the value from stdin (or the environment variable ``--value-env`` names), never from the command
line, where a shell's history and ``ps`` would keep it; ``list`` shows names, hosts and dates;
nothing shows a value."""

from __future__ import annotations

import argparse
import getpass
import os
import sys
from typing import Any

from agentq.cli.args import UsageError, add_command
from agentq.cli.output import dump
from agentq.cli.target import api_client, remote


def _value(args: argparse.Namespace) -> str:
    if args.value_env:
        value = os.environ.get(args.value_env)
        if value is None:
            raise UsageError(f"${args.value_env} is not set", field="value-env")
        return value
    if sys.stdin.isatty():
        return getpass.getpass(f"value of {args.name}: ")
    return sys.stdin.read().rstrip("\r\n")


def _cmd_vault(args: argparse.Namespace) -> int:
    from agentq.cli.views import when

    client = api_client(args)
    out: Any
    if args.vault_command == "put":
        out = client.put_credential(
            args.name, _value(args), hosts=args.host or [], user=args.user, kind=args.kind.replace("-", "_"),
            header=args.header, username=args.username,
        )  # fmt: skip
        text = [f"stored {out.name} ({out.kind}) for {out.user or 'the tenant'}, sent only to {', '.join(out.hosts)}"]
    elif args.vault_command == "list":
        out = client.list_credentials(args.user)
        text = [f"{c.name}  {c.kind}  {', '.join(c.hosts)}  updated {when(c.updated_at)}" for c in out]
        text = text or [f"(no credentials for {args.user or 'the tenant'})"]
    else:
        out = client.delete_credential(args.name, args.user)
        text = [f"deleted {out.name} of {out.user or 'the tenant'}"]
    if args.json:
        dump([item.model_dump(mode="json") for item in out] if isinstance(out, list) else out)
    else:
        print("\n".join(text))
    return 0


def register(sub: Any) -> None:
    vault = add_command(sub, "vault", "credentials tasks use for their end user, never shown to the model")
    actions = vault.add_subparsers(dest="vault_command", required=True, metavar="ACTION")

    def action(name: str, help: str) -> argparse.ArgumentParser:
        parser = remote(actions.add_parser(name, help=help, description=help))
        parser.add_argument("--user", help="the end user it belongs to (default: the tenant's own)")
        return parser

    put = action("put", "write a credential (value from stdin or --value-env; never readable back)")
    put.add_argument("name", help="lowercase letters, digits, - and _ (e.g. github)")
    put.add_argument("--host", action="append", help="a host it may be sent to (repeat): host, host:port, *.domain")
    put.add_argument("--kind", choices=["bearer", "api-key", "basic"], default="bearer")
    put.add_argument("--header", help="api-key: the header that carries it (default X-Api-Key)")
    put.add_argument("--username", help="basic: the username (the value is the password)")
    put.add_argument("--value-env", metavar="VAR", help="read the value from this environment variable")
    action("list", "credentials' names, kinds, hosts and dates")
    delete = action("delete", "delete a credential")
    delete.add_argument("name")
    vault.set_defaults(func=_cmd_vault)
