"""``agentq stop|resume --user U | --agent NAME | --key K | --tenant T`` and ``agentq stops``: the
stop button (docs/API.md#stopping-a-scope). ``stop`` cancels every running and queued task of
the scope, sub-agents included, and the server refuses new work in it (423) until ``resume``."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from agentq.cli.args import UsageError, add_command
from agentq.cli.output import dump
from agentq.cli.target import api_client, remote

KINDS = ("user", "agent", "key", "tenant")


def _scope(args: argparse.Namespace) -> dict[str, str]:
    named = {k: getattr(args, k) for k in KINDS if getattr(args, k) is not None}
    if len(named) != 1:
        raise UsageError("name exactly one scope: --user, --agent, --key or --tenant", field="scope")
    return named


def _line(stop: Any) -> str:
    from agentq.cli.views import when

    by = f" by {stop.by}" if stop.by else ""
    why = f": {stop.reason}" if stop.reason else ""
    return f"{stop.kind:<7} {stop.value:<40} stopped {when(stop.stopped_at)}{by}{why}"


def _cmd_stop(args: argparse.Namespace) -> int:
    from agentq.api.models.stops import StopResult

    answer = api_client(args).call(StopResult, "POST", "/stops", {**_scope(args), "reason": args.reason or ""})
    if args.json:
        dump(answer)
        return 0
    stop = answer.stop
    again = "" if answer.created else " (already stopped: swept again)"
    print(f"stopped {stop.kind} {stop.value}{again}: {len(answer.cancelled)} tasks cancelled, "
          f"{len(answer.were_running)} of them running")  # fmt: skip
    print(f"new tasks of it are refused until: agentq resume --{stop.kind} {stop.value}", file=sys.stderr)
    return 0


def _cmd_resume(args: argparse.Namespace) -> int:
    from agentq.api.models.stops import ResumeResult

    answer = api_client(args).call(ResumeResult, "POST", "/stops/resume", _scope(args))
    if args.json:
        dump(answer)
        return 0
    print(f"resumed {answer.resumed.kind} {answer.resumed.value}")
    return 0


def _cmd_stops(args: argparse.Namespace) -> int:
    from agentq.api.models.stops import StopList

    stops = api_client(args).call(StopList, "GET", "/stops").stops
    if args.json:
        print(json.dumps([stop.model_dump(mode="json") for stop in stops], indent=2))
        return 0
    for stop in stops:
        print(_line(stop))
    if not stops:
        print("nothing is stopped", file=sys.stderr)
    return 0


def _scope_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--user", help="an end user of the tenant")
    parser.add_argument("--agent", help="an agent's name (every version)")
    parser.add_argument("--key", help="an API key id (key_...): the tasks submitted with it")
    parser.add_argument("--tenant", help="the whole tenant (the key's own)")


def register(sub: Any) -> None:
    stop = remote(add_command(sub, "stop", "cancel every task of a user, agent, key or the tenant, and refuse new "
                              "ones until resumed"))  # fmt: skip
    _scope_args(stop)
    stop.add_argument("--reason", help="why (kept with the stop and in each cancelled task's error)")
    stop.set_defaults(func=_cmd_stop)
    resume = remote(add_command(sub, "resume", "accept new tasks of a stopped scope again"))
    _scope_args(resume)
    resume.set_defaults(func=_cmd_resume)
    stops = remote(add_command(sub, "stops", "the stopped scopes of the tenant"))
    stops.set_defaults(func=_cmd_stops)
