"""``agentq diff TASK_A TASK_B``: two tasks side by side, so a fork from step N (another model,
an edited message) can be judged against the original: their steps, tool calls, tokens, cost
and grade, and the first step where they differ.

Read from the API only (each task's view and its trace, as ``agentq trace`` reads them): a step
is its kind and what it said or did (an LLM turn's text and the tools it called, each tool call's
name, input and output, a person's message, a grade's score), so timings, epochs and ids that
differ between any two runs never count as a difference.
"""

from __future__ import annotations

import argparse
import json
from decimal import Decimal
from typing import Any

from agentq.cli.args import add_command
from agentq.cli.output import console
from agentq.cli.target import api_client, remote


def steps_of(events: list[Any]) -> list[dict[str, Any]]:
    """The committed steps of a trace, in order, each with what makes it the same as another."""
    by_step: dict[int, dict[str, Any]] = {}
    for event in events:
        kind = event.type
        if kind == "transition" or getattr(event, "orphan", False):
            continue
        step = by_step.setdefault(event.step, {"step": event.step, "kind": None, "said": [], "tokens": 0, "cost": "0"})
        if kind == "llm_call":
            step["kind"] = "llm" if event.purpose == "turn" else "compact"
            step["said"] = [event.text, event.tool_calls]
            step["tokens"], step["cost"] = event.tokens.total, event.cost_usd
            step["what"] = f"{event.model}: {_cut(event.text)}" + (
                f" -> {', '.join(event.tool_calls)}" if event.tool_calls else ""
            )
        elif kind == "tool_call":
            step["kind"] = "tools"
            step["said"].append([event.name, event.input, event.output, event.is_error])
            step["what"] = ", ".join(f"{c[0]}" for c in step["said"])
        elif kind == "message":
            step["kind"] = "message"
            step["said"].append(event.text)
            step["what"] = f"message: {_cut(event.text)}"
        elif kind == "grade":
            step["kind"] = "grade"
            step["said"] = [event.score, event.passed]
            step["tokens"], step["cost"] = event.tokens.total, event.cost_usd
            step["what"] = f"grade {event.score} ({'passed' if event.passed else 'below the bar'})"
    return [by_step[n] for n in sorted(by_step)]


def _cut(text: str, n: int = 60) -> str:
    text = " ".join(text.split())
    return text if len(text) <= n else text[: n - 1] + "…"


def totals(view: Any, steps: list[dict[str, Any]]) -> dict[str, Any]:
    grade = view.grade
    return {
        "task_id": view.task_id,
        "status": view.status.value,
        "model": f"{view.provider}/{view.model}",
        "steps": len(steps),
        "llm_calls": sum(1 for s in steps if s["kind"] in ("llm", "compact")),
        "tool_calls": sum(len(s["said"]) for s in steps if s["kind"] == "tools"),
        "tokens_in": view.tokens.input,
        "tokens_out": view.tokens.output,
        "cost_usd": view.cost_usd,
        "grade": None if grade is None else grade.score,
        "passed": None if grade is None else grade.passed,
        "forked_from": view.forked_from,
    }


def compare(view_a: Any, events_a: list[Any], view_b: Any, events_b: list[Any]) -> dict[str, Any]:
    """The two tasks' totals, each step side by side, and the first step that differs (None:
    the same steps, in the same order)."""
    a, b = steps_of(events_a), steps_of(events_b)
    rows, diverged = [], None
    for i in range(max(len(a), len(b))):
        left, right = (a[i] if i < len(a) else None), (b[i] if i < len(b) else None)
        same = left is not None and right is not None and (left["kind"], left["said"]) == (right["kind"], right["said"])
        if not same and diverged is None:
            diverged = (left or right or {}).get("step")
        rows.append({"step": (left or right or {}).get("step"), "same": same,
                     "a": None if left is None else {k: left.get(k) for k in ("kind", "what", "tokens", "cost")},
                     "b": None if right is None else {k: right.get(k) for k in ("kind", "what", "tokens", "cost")}})  # fmt: skip
    ta, tb = totals(view_a, a), totals(view_b, b)
    delta = {
        "steps": tb["steps"] - ta["steps"],
        "tool_calls": tb["tool_calls"] - ta["tool_calls"],
        "tokens": tb["tokens_in"] + tb["tokens_out"] - ta["tokens_in"] - ta["tokens_out"],
        "cost_usd": str(Decimal(tb["cost_usd"]) - Decimal(ta["cost_usd"])),
    }
    return {"a": ta, "b": tb, "delta": delta, "diverged_at": diverged, "steps": rows}


def render(result: dict[str, Any]) -> str:
    a, b = result["a"], result["b"]
    lines = [f"{'':12} {'A':>40}  {'B':>40}"]
    for key in ("task_id", "status", "model", "steps", "llm_calls", "tool_calls", "tokens_in", "tokens_out",
                "cost_usd", "grade", "passed"):  # fmt: skip
        lines.append(f"{key:12} {a[key]!s:>40}  {b[key]!s:>40}")
    where = result["diverged_at"]
    lines.append("")
    lines.append("the same steps" if where is None else f"first difference at step {where}")
    for row in result["steps"]:
        mark = " " if row["same"] else "≠"
        left = f"{row['a']['kind']}: {row['a'].get('what') or ''}" if row["a"] else "-"
        right = f"{row['b']['kind']}: {row['b'].get('what') or ''}" if row["b"] else "-"
        lines.append(f"{mark} {row['step']:>4}  {_cut(left, 70):<70}  {_cut(right, 70)}")
    return "\n".join(lines)


def _cmd_diff(args: argparse.Namespace) -> int:
    client = api_client(args)
    views = [client.get(t) for t in (args.task_a, args.task_b)]
    traces = [list(client.iter_trace(t)) for t in (args.task_a, args.task_b)]
    result = compare(views[0], traces[0], views[1], traces[1])
    if args.json:
        print(json.dumps(result, indent=2, default=str))
    else:
        console().print(render(result), markup=False)
    return 0


def register(sub: Any) -> None:
    diff = remote(
        add_command(
            sub,
            "diff",
            "two tasks side by side: steps, tool calls, tokens, cost, grade, and the first step that differs",
            "Reads each task's view and trace (GET /tasks/{id}, /trace). A step is the same when it said and did "
            "the same (text, tool calls with their input and output, messages, a grade's score): a fork from step N "
            "is the same up to N. --json prints the comparison.",
        ),
        json_help="print the comparison as JSON",
    )
    diff.add_argument("task_a")
    diff.add_argument("task_b")
    diff.set_defaults(func=_cmd_diff)
