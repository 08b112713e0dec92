"""An evaluation's report, side by side, computed only from what its tasks recorded (each
task's view: status, result, grade, tokens, cost, steps, times), so the report can be drawn
again at any time from the same tasks and never disagrees with them.

Pass rate: the share of items that passed (``EvalItem.passed``), with a 95 % Wilson score
interval (``wilson``: unlike the normal approximation it stays inside [0, 1] and is honest at
0 % and 100 % with few items). The difference of the two pass rates gets Newcombe's hybrid
score interval (method 10 of Newcombe 1998, built from the two Wilson intervals); it treats the
two samples as independent, which is conservative for the same items run twice.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from agentq.core.evaluations import EvalItem

Z95 = 1.959963984540054


@dataclass(frozen=True)
class Outcome:
    """What one item's task recorded, as the report needs it (from ``TaskView``)."""

    task_id: str
    status: str
    result: str | None
    score: float | None
    cost_usd: Decimal
    grade_cost_usd: Decimal
    tokens_in: int
    tokens_out: int
    steps: int
    llm_steps: int
    duration_s: float | None  # first claim to the end


def wilson(passed: int, n: int, z: float = Z95) -> tuple[float, float]:
    """The Wilson score interval of ``passed`` out of ``n`` ((0, 1) when n is 0)."""
    if n == 0:
        return 0.0, 1.0
    p = passed / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    # At 0 and n the bound is exactly the rate (rounding would put it a hair past it).
    low = 0.0 if passed == 0 else max(0.0, min(p, centre - half))
    high = 1.0 if passed == n else min(1.0, max(p, centre + half))
    return low, high


def newcombe(a: tuple[int, int], b: tuple[int, int]) -> tuple[float, float]:
    """The 95 % interval of rate(b) - rate(a), each (passed, n)."""
    (pa, na), (pb, nb) = a, b
    ra, rb = (pa / na if na else 0.0), (pb / nb if nb else 0.0)
    (la, ua), (lb, ub) = wilson(pa, na), wilson(pb, nb)
    d = rb - ra
    return d - math.sqrt((rb - lb) ** 2 + (ua - ra) ** 2), d + math.sqrt((ub - rb) ** 2 + (ra - la) ** 2)


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _percentile(values: Sequence[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def side_summary(items: Sequence[EvalItem], outcomes: Mapping[str, Outcome]) -> dict[str, Any]:
    """One version's figures over the items (each item's outcome by item id)."""
    runs = [(item, outcomes[item.item_id]) for item in items]
    passed = sum(1 for item, o in runs if item.passed(o.status, o.result))
    n = len(runs)
    low, high = wilson(passed, n)
    durations = [o.duration_s for _, o in runs if o.duration_s is not None]
    cost = sum((o.cost_usd for _, o in runs), Decimal(0))
    return {
        "items": n,
        "passed": passed,
        "pass_rate": passed / n if n else 0.0,
        "pass_rate_ci95": [low, high],
        "statuses": dict(sorted(Counter(o.status for _, o in runs).items())),
        "cost_usd": str(cost),
        "cost_usd_per_item": str(cost / n) if n else "0",
        "grading_cost_usd": str(sum((o.grade_cost_usd for _, o in runs), Decimal(0))),
        "tokens_in": sum(o.tokens_in for _, o in runs),
        "tokens_out": sum(o.tokens_out for _, o in runs),
        "tokens_per_item": (sum(o.tokens_in + o.tokens_out for _, o in runs) / n) if n else 0.0,
        "steps": sum(o.steps for _, o in runs),
        "steps_per_item": (sum(o.steps for _, o in runs) / n) if n else 0.0,
        "llm_steps": sum(o.llm_steps for _, o in runs),
        "duration_s": {
            "mean": _mean(durations),
            "p50": _percentile(durations, 0.5),
            "p95": _percentile(durations, 0.95),
        },
    }


def _cell(item: EvalItem, o: Outcome) -> dict[str, Any]:
    return {
        "task_id": o.task_id,
        "status": o.status,
        "passed": item.passed(o.status, o.result),
        "score": o.score,
        "cost_usd": str(o.cost_usd),
        "tokens": o.tokens_in + o.tokens_out,
        "steps": o.steps,
        "duration_s": o.duration_s,
    }


def report(
    eval_id: str,
    agent: str,
    against: str,
    items: Sequence[EvalItem],
    a: Mapping[str, Outcome],
    b: Mapping[str, Outcome],
) -> dict[str, Any]:
    """The side-by-side report: each version's summary, the difference of their pass rates, and
    every item's two runs (``changed``: the items that passed on one version only)."""
    left, right = side_summary(items, a), side_summary(items, b)
    rows = []
    for item in items:
        ca, cb = _cell(item, a[item.item_id]), _cell(item, b[item.item_id])
        change = None if ca["passed"] == cb["passed"] else ("fixed" if cb["passed"] else "regressed")
        rows.append({"item": item.item_id, "line": item.line, "goal": item.goal[:200], "change": change,
                     "agent": ca, "against": cb})  # fmt: skip
    low, high = newcombe((left["passed"], left["items"]), (right["passed"], right["items"]))
    return {
        "evaluation": eval_id,
        "agent": agent,
        "against": against,
        "interval": "95% Wilson score interval per version; Newcombe hybrid score interval for the difference",
        "summary": {"agent": left, "against": right},
        "difference": {
            "pass_rate": right["pass_rate"] - left["pass_rate"],
            "pass_rate_ci95": [low, high],
            "cost_usd": str(Decimal(right["cost_usd"]) - Decimal(left["cost_usd"])),
            "tokens": right["tokens_in"] + right["tokens_out"] - left["tokens_in"] - left["tokens_out"],
            "steps": right["steps"] - left["steps"],
            "fixed": sum(1 for r in rows if r["change"] == "fixed"),
            "regressed": sum(1 for r in rows if r["change"] == "regressed"),
        },
        "items": rows,
    }


def render(result: Mapping[str, Any]) -> str:
    """The report as text: the two versions side by side, then the items that changed."""
    a, b = result["summary"]["agent"], result["summary"]["against"]

    def rate(s: Mapping[str, Any]) -> str:
        low, high = s["pass_rate_ci95"]
        return f"{s['pass_rate']:.1%} [{low:.1%}, {high:.1%}]"

    def secs(s: Mapping[str, Any]) -> str:
        mean = s["duration_s"]["mean"]
        return "-" if mean is None else f"{mean:.2f}"

    lines = [
        f"evaluation {result['evaluation']}: {len(result['items'])} items",
        f"{'':22} {result['agent']:>28}  {result['against']:>28}",
    ]
    for label, fa, fb in (
        ("passed", f"{a['passed']}/{a['items']}", f"{b['passed']}/{b['items']}"),
        ("pass rate (95% CI)", rate(a), rate(b)),
        ("cost $", a["cost_usd"], b["cost_usd"]),
        ("  of it grading $", a["grading_cost_usd"], b["grading_cost_usd"]),
        ("tokens in/out", f"{a['tokens_in']}/{a['tokens_out']}", f"{b['tokens_in']}/{b['tokens_out']}"),
        ("steps/item", f"{a['steps_per_item']:.2f}", f"{b['steps_per_item']:.2f}"),
        ("mean duration s", secs(a), secs(b)),
        ("statuses", _statuses(a), _statuses(b)),
    ):
        lines.append(f"{label:22} {fa:>28}  {fb:>28}")
    diff = result["difference"]
    low, high = diff["pass_rate_ci95"]
    lines.append(f"difference: {diff['pass_rate']:+.1%} [{low:+.1%}, {high:+.1%}], "
                 f"{diff['fixed']} fixed, {diff['regressed']} regressed")  # fmt: skip
    for row in result["items"]:
        if row["change"]:
            lines.append(f"  {row['change']:9} {row['item']}: {row['agent']['status']} -> {row['against']['status']}"
                         f"  ({row['goal'][:60]})")  # fmt: skip
    return "\n".join(lines)


def _statuses(summary: Mapping[str, Any]) -> str:
    return ", ".join(f"{k} {v}" for k, v in summary["statuses"].items())
