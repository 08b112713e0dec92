"""``agentq breakers``: the fleet's circuit breakers per provider and model (``GET /breakers``),
so a person whose task says ``deferred: circuit_open`` sees which circuit, since when, and when
the next probe may go, without the worker logs or the table. ``agentq spend``: what the
tenant's task trees spent over a window, known and unknown apart (``GET /usage/spend``)."""

from __future__ import annotations

import argparse
import math
import time
from decimal import Decimal
from typing import Any

from agentq.cli.args import add_command
from agentq.cli.output import dump
from agentq.cli.target import api_client, remote

MAX_HOURS = 24 * 31  # as GET /usage/spend (control.spend.MAX_HOURS)


def breaker_lines(view: Any, *, now: float) -> list[str]:
    """One line a breaker: its model, its state, and what the state means now."""
    from agentq.cli.views import secs, when

    b = view
    lines = [
        f"circuits open after {view.failures_to_open} failed calls within {view.window_seconds:g} s, "
        f"and probe after {view.cooldown_seconds:g} s"
    ]
    if not b.breakers:
        lines.append("no failures recorded: every circuit is closed")
    for one in b.breakers:
        line = f"{one.provider}/{one.model}  {one.state}"
        if one.state == "open" and one.probe_after is not None:
            due = one.probe_after - now
            line += f" since {when(one.opened_at)}; probe {'due now' if due <= 0 else 'in ' + secs(due)}"
        elif one.state == "half_open":
            line += ": a probe call is out"
        elif one.failures:
            line += f", {one.failures} failure(s) counted since {when(one.window_started_at)}"
        if one.slowed_until is not None and one.slowed_until > now:
            line += f"; slowed down (429) until {when(one.slowed_until)}"
        lines.append(line)
    return lines


def _cmd_breakers(args: argparse.Namespace) -> int:
    view = api_client(args).breakers()
    if args.json:
        dump(view)
    else:
        print("\n".join(breaker_lines(view, now=time.time())))
    return 0


def spend_lines(view: Any, hours: float) -> list[str]:
    """The window's spend: known, then unknown (with what it means), in tokens and dollars."""
    lines = [
        f"{view.trees} task tree(s) started in the last {hours:g} h"
        + (f" acting for {view.user}" if view.user else "")
        + ("" if view.complete else " (the newest 1,000; the window held more)"),
        f"known    {view.known_tokens:,} tokens  ${view.known_usd}  (reported by the provider)",
    ]
    if view.unknown_tokens or Decimal(view.unknown_usd):
        lines.append(
            f"unknown  {view.unknown_tokens:,} tokens  ${view.unknown_usd}  (calls whose outcome no worker learned, "
            "counted at their holds: at most what they were allowed)"
        )
    return lines


def _cmd_spend(args: argparse.Namespace) -> int:
    view = api_client(args).spend(args.hours, user=args.user)
    if args.json:
        dump(view)
    else:
        print("\n".join(spend_lines(view, args.hours)))
    return 0


def register(sub: Any) -> None:
    breakers = remote(
        add_command(
            sub,
            "breakers",
            "the fleet's circuit breakers per provider and model: closed, open (tasks deferred) or half-open",
            "Reads GET /breakers: each provider/model the fleet recorded a failed call or a 429 slow-down for, its "
            "circuit, the failures counted in the current window, and when an open circuit's probe may go.",
        )
    )
    breakers.set_defaults(func=_cmd_breakers)
    spend = remote(
        add_command(
            sub,
            "spend",
            "what your task trees spent over a window: known usage and, apart, the unknown",
            "Reads GET /usage/spend: the ledgers of your root tasks created in the last --hours, each with its "
            "sub-agents. Known is what the provider reported; unknown is counted at the holds of calls whose outcome "
            "no worker learned (a worker killed mid-call): at most what they were allowed.",
        )
    )
    spend.add_argument("--hours", type=_hours, default=24.0, help="the window, in hours back from now (default 24)")
    spend.add_argument("--user", metavar="USER", help="only the trees acting for this end user")
    spend.set_defaults(func=_cmd_spend)


def _hours(raw: str) -> float:
    try:
        hours = float(raw)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--hours must be a number of hours, not {raw!r}") from None
    if not (math.isfinite(hours) and 0 < hours <= MAX_HOURS):
        raise argparse.ArgumentTypeError(f"--hours must be more than 0 and at most {MAX_HOURS}")
    return hours
