"""PNG plots of the benchmark figures, drawn from the same result dict the table is printed from.

Why from the result dict and not a second measurement: the picture and the table must never
disagree, so a plot is only another rendering of what the bench already returns (and of what
``--json`` prints).

matplotlib is in the ``bench`` extra (``make .venv/.bench-installed``), not in the dev install
CI uses: without it a bench still prints its table and says in one stderr line that no plot was
drawn. Every bench takes ``--plot PATH`` (default ``bench/out/<bench>.png``, gitignored) and
``--no-plot``. The pictures in docs/BENCHMARKS.md are copies of such runs, with their commands.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

OUT_DIR = Path(__file__).resolve().parent / "out"


@dataclass
class Panel:
    """One chart of a figure.

    ``bar``: one group of bars per label in ``x``, one bar per series.
    ``line``: one line per series over the numeric ``x``.
    A value of None is a figure the run did not produce (drawn as a gap, never as zero).
    """

    kind: Literal["bar", "line"]
    title: str
    ylabel: str
    x: Sequence[str | float]
    series: Mapping[str, Sequence[float | None]]
    xlabel: str = ""
    logx: bool = False
    logy: bool = False
    hlines: Mapping[str, float] = field(default_factory=dict)  # label -> y (a target, a limit)


def add_plot_args(parser: argparse.ArgumentParser, bench: str) -> None:
    parser.add_argument(
        "--plot",
        type=Path,
        default=OUT_DIR / f"{bench}.png",
        help=f"where to write the PNG (default bench/out/{bench}.png; needs matplotlib: the bench extra)",
    )
    parser.add_argument("--no-plot", action="store_true", help="draw no PNG")


def plot_from_args(args: argparse.Namespace, title: str, panels: list[Panel]) -> Path | None:
    """Draw unless ``--no-plot``; says on stderr where the PNG went, or why there is none."""
    if args.no_plot:
        return None
    path = draw(Path(args.plot), title, panels)
    if path is None:
        print("no plot: matplotlib is not installed (make .venv/.bench-installed)", file=sys.stderr)
    else:
        print(f"plot: {path}", file=sys.stderr)
    return path


def draw(path: Path, title: str, panels: list[Panel]) -> Path | None:
    """Write ``panels`` side by side into one PNG at ``path``; None without matplotlib."""
    if importlib.util.find_spec("matplotlib") is None:
        return None
    import matplotlib

    matplotlib.use("Agg")  # no display on servers and in CI
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(panels), figsize=(5.2 * len(panels), 4.2), squeeze=False)
    for ax, panel in zip(axes[0], panels, strict=True):
        if panel.kind == "bar":
            _bars(ax, panel)
        else:
            _lines(ax, panel)
        for label, y in panel.hlines.items():
            ax.axhline(y, color="#b22222", linestyle="--", linewidth=1, label=label)
        ax.set_title(panel.title, fontsize=10)
        ax.set_ylabel(panel.ylabel)
        if panel.xlabel:
            ax.set_xlabel(panel.xlabel)
        if panel.logy:
            ax.set_yscale("log")
        else:
            ax.set_ylim(bottom=0)  # a y axis that starts at zero: small wobbles look small
        ax.grid(True, axis="y", alpha=0.3)
        if len(panel.series) > 1 or panel.hlines:
            ax.legend(fontsize=8)
    fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _bars(ax: Any, panel: Panel) -> None:
    labels = [str(x) for x in panel.x]
    width = 0.8 / max(1, len(panel.series))
    for i, (name, values) in enumerate(panel.series.items()):
        offsets = [j + (i - (len(panel.series) - 1) / 2) * width for j in range(len(labels))]
        heights = [float("nan") if v is None else v for v in values]
        ax.bar(offsets, heights, width=width, label=name)
    ax.set_xticks(range(len(labels)), labels, fontsize=8)


def _lines(ax: Any, panel: Panel) -> None:
    xs = [float(x) for x in panel.x]
    for name, values in panel.series.items():
        points = [(x, v) for x, v in zip(xs, values, strict=True) if v is not None]
        ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=name)
    if panel.logx:
        ax.set_xscale("symlog", linthresh=max(1.0, min((x for x in xs if x > 0), default=1.0)))
    if len(xs) <= 12:  # a few levels: label each; a time series keeps matplotlib's ticks
        ax.set_xticks(xs, [f"{x:,.0f}" for x in xs], fontsize=8)
