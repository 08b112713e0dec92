"""``agentq agents alias set|list|show|delete``: an agent's aliases (``core.aliases``); ``agentq
agents move TASK VERSION``: a task to another version of its agent.

``agentq agents alias set support prod 7 --canary 8:10%`` sends 90% of new ``support@prod``
tasks to version 7 and 10% to 8; ``agentq agents alias set support prod 7`` rolls it back.
``--sample 0.1 --rubric "..."`` (or ``--grader NAME``) grades a tenth of its new tasks online, and
``agentq agents quality support`` shows each version's pass rate and cost per hour.
"""

from __future__ import annotations

import argparse
import re
import time
from typing import TYPE_CHECKING, Any

from agentq.cli.args import UsageError
from agentq.cli.output import dump
from agentq.cli.target import api_client, remote

if TYPE_CHECKING:
    from agentq.core.aliases import AgentAlias

_CANARY = re.compile(r"([1-9][0-9]{0,8}):([0-9]{1,3})%?")


def parse_canary(value: str) -> tuple[int, int]:
    """``8:10%`` (or ``8:10``) -> (8, 10): version 8 takes 10% of new tasks."""
    found = _CANARY.fullmatch(value.strip())
    if found is None:
        raise UsageError(f"--canary: {value!r} is not VERSION:PERCENT, e.g. 8:10%", field="canary")
    version, weight = int(found.group(1)), int(found.group(2))
    if not 1 <= weight <= 99:
        raise UsageError(f"--canary: {weight}% is out of range; a canary takes 1-99%", field="canary")
    return version, weight


def online_of(args: argparse.Namespace) -> dict[str, Any] | None:
    """``--sample RATE`` with ``--rubric``/``--grader``/``--bar`` as the alias's ``online`` (the
    server checks them and names a bad field)."""
    if args.sample is None:
        if args.rubric is not None or args.grader is not None or args.bar is not None:
            raise UsageError("--rubric, --grader and --bar grade the tasks --sample picks: give --sample RATE",
                             field="sample")  # fmt: skip
        return None
    try:
        rate = float(args.sample)
    except ValueError:
        raise UsageError(f"--sample: {args.sample!r} is not a number from 0 to 1", field="sample") from None
    grade: dict[str, Any] = {}
    for key in ("rubric", "grader", "bar"):
        if getattr(args, key) is not None:
            grade[key] = getattr(args, key)
    return {"rate": rate, "grade": grade}


def alias_line(alias: AgentAlias) -> str:
    split = " + ".join(f"v{t.version} {t.weight}%" for t in alias.versions)
    online = f"  grading {alias.online.rate:.0%} online" if alias.online is not None else ""
    return f"{alias.agent}@{alias.alias:<16} -> {split}  (revision {alias.revision}){online}"


def cmd_quality(args: argparse.Namespace) -> int:
    report = api_client(args).agent_quality(args.name, args.hours)
    if args.json:
        dump(report)
        return 0
    if not report.buckets:
        print(f"{args.name}: no online grades in the last {args.hours} hour(s)")
        return 0
    print(f"{'hour (UTC)':<17} {'version':>7} {'graded':>6} {'passed':>6} {'errors':>6} {'unanswered':>10} "
          f"{'pass rate':>9} {'cost/task $':>11} {'grading $':>10}")  # fmt: skip
    for b in report.buckets:
        rate = "-" if b.pass_rate is None else f"{b.pass_rate:.0%}"
        each = "-" if b.mean_task_cost_usd is None else f"{b.mean_task_cost_usd:.4f}"
        hour = time.strftime("%Y-%m-%d %H:00", time.gmtime(b.start))
        print(f"{hour:<17} {'v' + str(b.version):>7} {b.graded:>6} {b.passed:>6} {b.errors:>6} {b.unanswered:>10} "
              f"{rate:>9} {each:>11} {b.grade_cost_usd:>10.4f}")  # fmt: skip
    return 0


def cmd_alias(args: argparse.Namespace) -> int:
    client = api_client(args)
    command = args.alias_command
    if command == "set":
        canary = parse_canary(args.canary) if args.canary else None
        alias = client.set_alias(
            args.name, args.alias, args.version, canary, online_of(args), expected_revision=args.expected_revision
        )
    elif command == "show":
        alias = client.get_alias(args.name, args.alias)
    elif command == "delete":
        alias = client.delete_alias(args.name, args.alias)
    else:
        aliases = client.list_aliases(args.name)
        if args.json:
            dump({"agent": args.name, "aliases": [a.model_dump(mode="json") for a in aliases]})
        for a in [] if args.json else aliases:
            print(alias_line(a))
        return 0
    if args.json:
        dump(alias)
    else:
        print(("deleted " if command == "delete" else "") + alias_line(alias))
    return 0


def cmd_move(args: argparse.Namespace) -> int:
    moved = api_client(args).move_task(args.task_id, args.version)
    if args.json:
        dump(moved)
    else:
        print(f"{moved.task_id}: {moved.previous} -> {moved.agent} (from its next run)")
    return 0


def register(agents_sub: Any) -> None:
    alias = agents_sub.add_parser(
        "alias",
        help="name a version (prod, canary, ...), split it with a canary, move it back",
        description="aliases of an agent: `agentq submit --agent NAME@ALIAS` runs the version it points at",
    )
    alias_sub = alias.add_subparsers(dest="alias_command", required=True, metavar="ACTION")
    set_ = remote(
        alias_sub.add_parser(
            "set",
            help="point an alias at a version (with --canary, split it); rollback is setting it back",
            description="point NAME@ALIAS at VERSION (one atomic write, in effect for the next task); tasks already "
            "submitted keep their version",
        )
    )
    set_.add_argument("name", help="the agent's name")
    set_.add_argument("alias", help="the alias: a lowercase letter, then letters, digits, '-', '_'")
    set_.add_argument("version", type=int, help="the version new tasks get")
    set_.add_argument("--canary", metavar="VERSION:PERCENT", help="send PERCENT of new tasks to VERSION, e.g. 8:10%%")
    set_.add_argument(
        "--expected-revision",
        type=int,
        metavar="N",
        help="move it only if it is still at revision N (as `alias show` read it; 0: only if it does not exist)",
    )
    set_.add_argument(
        "--sample", metavar="RATE", help="grade this fraction (0-1) of new tasks online; without it, none"
    )
    set_.add_argument("--rubric", help="what a good answer is, for a model to grade sampled answers against")
    set_.add_argument("--grader", help="a @grader function of the deployment's tool modules to grade them with")
    set_.add_argument("--bar", type=float, help="the lowest passing score, 0-1 (default 0.8)")
    quality = remote(
        agents_sub.add_parser(
            "quality",
            help="each version's pass rate and cost per hour, from its aliases' online grades",
            description="what online evaluation graded (agentq agents alias set ... --sample RATE), per version and "
            "hour: one query of counters",
        )
    )
    quality.add_argument("name", help="the agent's name")
    quality.add_argument("--hours", type=int, default=48, help="the last N hours (default 48, at most 744)")
    listing = remote(alias_sub.add_parser("list", help="an agent's aliases", description="an agent's aliases"))
    listing.add_argument("name", help="the agent's name")
    for action, text in (("show", "one alias"), ("delete", "delete an alias (tasks keep their versions)")):
        one = remote(alias_sub.add_parser(action, help=text, description=text))
        one.add_argument("name", help="the agent's name")
        one.add_argument("alias")
    move = remote(
        agents_sub.add_parser(
            "move",
            help="move an answered or idle task to another version of its agent",
            description="a task keeps the version it started on (aliases moved since change nothing for it); this "
            "moves it, from its next run (a follow-up), and logs agent.moved on its stream",
        )
    )
    move.add_argument("task_id")
    move.add_argument("version", type=int, help="a version of the task's agent")
