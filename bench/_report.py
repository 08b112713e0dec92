"""The end every bench shares, and the timing loop of the per-call cost benches.

``report``: run, stamp the machine, print the table (or, with ``--json``, the one JSON object on a
clean stdout), then draw the PNG from the same result. One function, so that the table, the JSON
and the picture of a bench are always renderings of one result dict and a bench cannot forget the
machine stamp or let a worker's output into its JSON.

``time_cases``: each case called twice to warm up, then ``runs`` times, timed and with the AWS
calls it made counted (``InProcessCounter``, every thread's botocore calls), so the per-call cost
benches (``alias_cost``, ``vault_cost``) measure their rows the same way.
"""

from __future__ import annotations

import argparse
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from _benchlib import InProcessCounter, JsonOut, machine, percentile
from _plot import Panel, plot_from_args


def report(
    args: argparse.Namespace,
    title: str,
    run: Callable[[argparse.Namespace], dict[str, Any]],
    render: Callable[[dict[str, Any]], str],
    panels: Callable[[dict[str, Any]], list[Panel]],
) -> dict[str, Any]:
    """Run the bench once and render its result three ways: table or JSON, and the PNG."""
    with JsonOut(args.json) as out:
        result = run(args)
        result["machine"] = machine()
        if args.json:
            out.emit(result)
        else:
            print(render(result))
    plot_from_args(args, title, panels(result))
    return result


@dataclass(frozen=True)
class CaseTiming:
    """One case's ``runs`` calls: their latencies and the AWS calls per call, by operation."""

    times_ms: list[float]
    calls_per_run: dict[str, float]

    @property
    def p50_ms(self) -> float:
        return _observed(self.times_ms, 50)

    @property
    def p99_ms(self) -> float:
        return _observed(self.times_ms, 99)


def time_cases(cases: Mapping[str, Callable[[], None]], runs: int, counter: InProcessCounter) -> dict[str, CaseTiming]:
    """Each case warmed up twice, then called ``runs`` times: latency and calls per call."""
    timings: dict[str, CaseTiming] = {}
    for name, call in cases.items():
        for _ in range(2):
            call()
        before = _by_operation(counter)
        times = []
        for _ in range(runs):
            started = time.perf_counter()
            call()
            times.append((time.perf_counter() - started) * 1000)
        calls = _by_operation(counter) - before
        timings[name] = CaseTiming(times, {op: n / runs for op, n in calls.items()})
    return timings


def _by_operation(counter: InProcessCounter) -> Counter[str]:
    return Counter({op: n for (_, op), n in counter.counts.items()})


def _observed(values: list[float], q: float) -> float:
    value = percentile(values, q)
    assert value is not None, "no runs"
    return value
