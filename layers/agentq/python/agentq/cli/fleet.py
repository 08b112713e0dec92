"""``agentq breakers``: the fleet's circuit breakers per provider and model (``GET /breakers``),
so a person whose task says ``deferred: circuit_open`` sees which circuit, since when, and when
the next probe may go, without the worker logs or the table."""

from __future__ import annotations

import argparse
import time
from typing import Any

from agentq.cli.args import add_command
from agentq.cli.output import dump
from agentq.cli.target import api_client, remote


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
