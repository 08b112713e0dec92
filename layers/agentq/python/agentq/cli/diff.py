"""``agentq diff TASK_A TASK_B``: two tasks side by side, so a fork from step N (another model,
an edited message) can be judged against the original: their steps, tool calls, tokens, cost
and grade, and the first step where they differ.

The comparison is the API's (``GET /tasks/{id}/compare/{other_id}``, computed by
``agentq.api.run_diff``, as the console's compare page shows it): this command only prints it,
so there is one diff. A step is the same when it said and did the same, so timings, epochs and
ids that differ between any two runs never count as a difference.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from agentq.api.models import TaskComparison
from agentq.cli.args import add_command
from agentq.cli.output import console
from agentq.cli.target import api_client, remote

FACTS = ("task_id", "status", "model", "steps", "llm_calls", "tool_calls", "tokens_in", "tokens_out", "cost_usd",
         "grade", "passed")  # fmt: skip


def _cut(text: str, n: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= n else text[: n - 1] + "…"


def render(result: TaskComparison) -> str:
    a, b = result.a.model_dump(), result.b.model_dump()
    lines = [f"{'':12} {'A':>40}  {'B':>40}"]
    lines.extend(f"{key:12} {a[key]!s:>40}  {b[key]!s:>40}" for key in FACTS)
    where = result.diverged_at
    lines.append("")
    lines.append("the same steps" if where is None else f"first difference at step {where}")
    for row in result.steps:
        mark = " " if row.same else "≠"
        left = f"{row.a.kind}: {row.a.what or ''}" if row.a else "-"
        right = f"{row.b.kind}: {row.b.what or ''}" if row.b else "-"
        lines.append(f"{mark} {row.step!s:>4}  {_cut(left, 70):<70}  {_cut(right, 70)}")
    if not result.complete:
        lines.append("(only the first steps of each task were compared)")
    return "\n".join(lines)


def _cmd_diff(args: argparse.Namespace) -> int:
    result = api_client(args).compare(args.task_a, args.task_b)
    if args.json:
        print(json.dumps(result.model_dump(mode="json"), indent=2))
    else:
        console().print(render(result), markup=False)
    return 0


def register(sub: Any) -> None:
    diff = remote(
        add_command(
            sub,
            "diff",
            "two tasks side by side: steps, tool calls, tokens, cost, grade, and the first step that differs",
            "The API's comparison (GET /tasks/{id}/compare/{other_id}). A step is the same when it said and did "
            "the same (text, tool calls with their input and output, messages, a grade's score): a fork from step N "
            "is the same up to N. --json prints the comparison.",
        ),
        json_help="print the comparison as JSON",
    )
    diff.add_argument("task_a")
    diff.add_argument("task_b")
    diff.set_defaults(func=_cmd_diff)
