"""The PNG of an evaluation's report (``agentq eval run --plot``), drawn from the report dict
itself, so the picture and the JSON never disagree: pass rate with its 95 % interval, cost,
tokens and steps per item, and the run duration, one bar per version.

matplotlib is not a dependency of agentq (the Lambda layer and the worker image do without
it): installed (``pip install matplotlib``, or the ``bench`` extra) it draws; absent, ``draw``
answers why there is no picture and the report stands without it.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping
from pathlib import Path
from typing import Any


def draw(result: Mapping[str, Any], path: Path) -> Path | str:
    """The PNG's path, or the sentence saying why none was drawn."""
    if importlib.util.find_spec("matplotlib") is None:
        return "no PNG drawn: matplotlib is not installed (pip install matplotlib)"
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sides = [result["summary"]["agent"], result["summary"]["against"]]
    names = [result["agent"], result["against"]]
    colours = ["#7f8c8d", "#2e86c1"]
    fig, axes = plt.subplots(1, 4, figsize=(14, 3.6))
    rates = [s["pass_rate"] for s in sides]
    errors = [[r - s["pass_rate_ci95"][0] for r, s in zip(rates, sides, strict=True)],
              [s["pass_rate_ci95"][1] - r for r, s in zip(rates, sides, strict=True)]]  # fmt: skip
    axes[0].bar(names, rates, yerr=errors, capsize=6, color=colours)
    axes[0].set_ylim(0, 1)
    axes[0].set_title("pass rate (95% Wilson CI)")
    for ax, title, values in (
        (axes[1], "cost per item ($)", [float(s["cost_usd_per_item"]) for s in sides]),
        (axes[2], "tokens per item", [s["tokens_per_item"] for s in sides]),
        (axes[3], "mean duration (s)", [s["duration_s"]["mean"] or 0.0 for s in sides]),
    ):
        ax.bar(names, values, color=colours)
        ax.set_title(title)
    diff = result["difference"]
    fig.suptitle(
        f"evaluation {result['evaluation']}: {sides[0]['items']} items; "
        f"{diff['fixed']} fixed, {diff['regressed']} regressed"
    )
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
