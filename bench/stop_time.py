"""The stop button (issue 44 item 3): from the stop of a scope to the last of its running tasks stopped.

    python bench/stop_time.py                              # 1,000 running tasks of one user
    python bench/stop_time.py --tasks 200 --workers 2 --json

On a fresh local stack (moto server, ``--workers`` worker processes taking ``--tasks`` /
``--workers`` tasks each), end user ``alice`` of one tenant submits ``--tasks`` scripted tasks
that each commit a step every ``--latency`` s (a ``note_read`` call a turn, for as long as the
bench runs), and ``bob`` ``--others`` more beside them. Once every one of alice's runs (claimed
and past its first step), ``control.stops.stop`` stops user alice, as ``agentq stop --user
alice`` does, and the bench reads:

- stopped: when each task was fenced, minus the stop's start: the stop's mark on it (the
  transaction of its batch's marks returned; from that write on its worker commits nothing),
  p50 / p99 / max over the tasks (target p99 <= 5 s);
- cancelled: each task's ``finished_at`` (the move to ``cancelled`` that follows the mark, what
  status readers see) minus the stop's start, p50 / p99 / max, and when the stop returned;
- released: when the last worker let go of alice's tasks (no ``owner_worker`` left on their
  META), which waits for each turn in flight to reach its step boundary (at most ``--latency``);
- commits after: steps committed by alice's tasks after the stop returned (META's ``step`` then
  against after the release), and committed ``STEP#`` items stamped after their task's fence
  (``committed_at``, stamped before the commit's write): both must be 0;
- calls: the AWS calls the stop made (DynamoDB and SQS, by operation), and per task stopped;
- bob: how many of his tasks the stop touched (must be 0), and that they still commit.
"""

from __future__ import annotations

import argparse
import collections
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from _benchlib import BenchStack, JsonOut, fmt, log, machine, patient_clients, summary, table
from _plot import Panel, add_plot_args, plot_from_args
from agentq.control import stops
from agentq.control.submit import submit_once
from agentq.core.models import TaskStatus, TaskSubmission
from agentq.core.stops import StopScope
from agentq.runtime import build_registry
from agentq.storage import keys
from agentq.worker import WorkerConfig

TARGET_P99 = 5.0
TENANT = "stop-bench"


def submission(user: str, latency: float, turns: int) -> TaskSubmission:
    turn = {"text": "working", "latency_seconds": latency, "tool_calls": [{"name": "note_read", "input": {"key": "k"}}]}
    return TaskSubmission.model_validate(
        {
            "goal": "stop bench: a step every turn until stopped",
            "user": user,
            "provider": "scripted",
            "script": {"turns": [turn] * turns + [{"text": "done"}]},
            "constraints": {"tools": ["note_read"], "max_steps": turns + 2, "max_tokens": 50_000_000,
                            "timeout_seconds": 3600, "max_output_tokens": 64},
        }
    )  # fmt: skip


class CallCount:
    """The AWS calls the stop makes (its store's DynamoDB client, its queues' SQS client), by
    operation, a Query by its index: a count that does not depend on the machine."""

    def __init__(self, *clients: Any) -> None:
        self.counts: collections.Counter[str] = collections.Counter()
        for client in clients:
            client.meta.events.register("before-parameter-build.*.*", self._count, unique_id=f"stop-calls-{id(client)}")

    def _count(self, model: Any, params: Any = None, **_: Any) -> None:
        index = (params or {}).get("IndexName")
        self.counts[model.name + (f"[{index}]" if index else "")] += 1

    def take(self) -> dict[str, int]:
        taken = dict(sorted(self.counts.items()))
        self.counts.clear()
        return taken


def metas(store: Any, ids: list[str]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for i in range(0, len(ids), 100):
        out += store.tasks.metas(ids[i : i + 100])
    return out


def until(what: str, pred: Any, timeout: float) -> float:
    start = time.monotonic()
    while not pred():
        if time.monotonic() - start > timeout:
            raise SystemExit(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.2)
    return time.monotonic() - start


def run(args: argparse.Namespace) -> dict[str, Any]:
    per_worker = -(-(args.tasks + args.others) // args.workers)
    config = WorkerConfig(concurrency=per_worker + 4)
    stack = BenchStack(prefix=f"stop{int(time.time()) % 100000}", workers=args.workers, worker_config=config)
    stack.start()
    try:
        store, queues = patient_clients(stack)
        assert stack.settings is not None
        registry = build_registry(stack.settings)
        turns = int(args.max_seconds / args.latency) + 10
        alice, bob = submission("alice", args.latency, turns), submission("bob", args.latency, turns)

        def submit(sub: TaskSubmission) -> str:
            return submit_once(store, registry, sub, tenant=TENANT, queues=queues).task.task_id

        with ThreadPoolExecutor(16) as pool:
            ids = list(pool.map(submit, [alice] * args.tasks))
            others = list(pool.map(submit, [bob] * args.others))
        log(f"submitted {len(ids)} of alice's tasks and {len(others)} of bob's")
        started = until(
            "every task running",
            lambda: all(
                m.get("status") == "running" and int(m.get("step", 0)) >= 1 for m in metas(store, ids + others)
            ),
            args.max_seconds,
        )
        log(f"all running after {started:.1f} s; stopping user alice")
        fenced_at: dict[str, float] = {}
        mark_stopping = store.tasks.mark_stopping

        def timed_mark(task_ids: list[str], scope: str) -> list[bool]:
            marked = mark_stopping(task_ids, scope)
            now = time.time()
            fenced_at.update((task_id, now) for task_id, done in zip(task_ids, marked, strict=True) if done)
            return marked

        store.tasks.mark_stopping = timed_mark  # type: ignore[method-assign]
        calls = CallCount(store.table.client, queues.sqs)  # type: ignore[attr-defined]
        t0 = time.time()
        report = stops.stop(store, TENANT, StopScope("user", "alice"), by="bench", queues=queues)
        returned = time.time()
        stop_calls = calls.take()
        at_stop = {str(m["task_id"]): int(m["step"]) for m in metas(store, ids)}
        released = until(
            "the workers to let go of alice's tasks",
            lambda: not any(m.get("owner_worker") for m in metas(store, ids)),
            args.max_seconds,
        )
        released_s = returned - t0 + released
        after = metas(store, ids)
        cancelled = {str(m["task_id"]): float(m["finished_at"]) for m in after if m.get("status") == "cancelled"}
        # A task the mark missed (it ended, or a conflict) is fenced by its move.
        fenced = {t: min(fenced_at.get(t, at), at) for t, at in cancelled.items()}
        commits_after = sum(max(0, int(m["step"]) - at_stop[str(m["task_id"])]) for m in after)
        late_items = 0
        for task_id in ids[: args.scan]:
            items = store.table.query(keys.task_pk(task_id), prefix=keys.STEP)
            late_items += sum(
                1
                for i in items
                if int(i["number"]) <= at_stop[task_id] and float(i["committed_at"]) > fenced.get(task_id, returned)
            )
        bob_meta = metas(store, others)
        bob_touched = sum(1 for m in bob_meta if m.get("status") != "running")
        bob_steps = sum(int(m["step"]) for m in bob_meta)
        time.sleep(args.latency * 3)
        bob_moved = sum(int(m["step"]) for m in metas(store, others)) - bob_steps
        for task_id in others:  # leave nothing running
            store.tasks.transition(task_id, TaskStatus.CANCELLED, error={"code": "cancelled", "message": "bench over"})
        return {
            "bench": "stop_time",
            "machine": machine(),
            "settings": {
                "tasks": args.tasks,
                "others": args.others,
                "workers": args.workers,
                "concurrency": config.concurrency,
                "latency_s": args.latency,
            },
            "running_before_stop": args.tasks,
            "cancelled": len(report.cancelled),
            "were_running": len(report.were_running),
            "stopped_s": summary([at - t0 for at in fenced.values()]),
            "marked": len(fenced_at),
            "cancelled_s": summary([at - t0 for at in cancelled.values()]),
            "stop_returned_s": returned - t0,
            "released_s": released_s,
            "commits_after_stop": commits_after,
            "step_items_committed_after_stop": late_items,
            "step_items_scanned_tasks": min(args.scan, len(ids)),
            "stop_calls": stop_calls,
            "stop_calls_per_task": round(sum(stop_calls.values()) / max(1, len(report.cancelled)), 2),
            "bob_touched": bob_touched,
            "bob_steps_after": bob_moved,
            "target_p99_s": TARGET_P99,
        }
    finally:
        stack.stop()


def panels(result: dict[str, Any]) -> list[Panel]:
    s, c = result["stopped_s"], result["cancelled_s"]
    return [
        Panel(
            kind="bar",
            title=f"{result['running_before_stop']} running tasks of one user stopped",
            ylabel="seconds after the stop began",
            x=["p50 stopped", "p99 stopped", "last stopped", "p99 cancelled", "stop returned", "workers let go"],
            series={
                "s": [
                    s.get("p50"),
                    s.get("p99"),
                    s.get("max"),
                    c.get("p99"),
                    result["stop_returned_s"],
                    result["released_s"],
                ]
            },
            hlines={"target p99": TARGET_P99},
        )
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", type=int, default=1000, help="alice's running tasks (the scope stopped)")
    parser.add_argument("--others", type=int, default=20, help="bob's tasks beside them (never touched)")
    parser.add_argument("--workers", type=int, default=4, help="worker processes")
    parser.add_argument("--latency", type=float, default=1.0, help="seconds of each model turn")
    parser.add_argument("--scan", type=int, default=200, help="tasks whose STEP# items are read back")
    parser.add_argument("--max-seconds", type=float, default=600.0, help="give up waiting after this")
    parser.add_argument("--json", action="store_true", help="print the figures as one JSON object")
    add_plot_args(parser, "stop_time")
    args = parser.parse_args()
    with JsonOut(args.json) as out:
        result = run(args)
        s, c = result["stopped_s"], result["cancelled_s"]
        rows = [
            ("tasks stopped / running before", f"{result['cancelled']} / {result['running_before_stop']}"),
            (
                "stopped (fenced) p50 / p99 / max (s)",
                f"{fmt(s.get('p50'))} / {fmt(s.get('p99'))} / {fmt(s.get('max'))}",
            ),
            ("cancelled p50 / p99 / max (s)", f"{fmt(c.get('p50'))} / {fmt(c.get('p99'))} / {fmt(c.get('max'))}"),
            ("fenced by the mark / by the move", f"{result['marked']} / {result['cancelled'] - result['marked']}"),
            ("stop returned (s)", fmt(result["stop_returned_s"])),
            ("workers let go (s)", fmt(result["released_s"])),
            ("steps committed after the stop", result["commits_after_stop"]),
            (
                f"STEP# items stamped after their fence ({result['step_items_scanned_tasks']} tasks read)",
                result["step_items_committed_after_stop"],
            ),
            ("AWS calls of the stop, per task stopped", f"{result['stop_calls_per_task']} ({result['stop_calls']})"),
            ("bob's tasks touched / steps since", f"{result['bob_touched']} / {result['bob_steps_after']}"),
        ]
        print(table(["figure", "value"], rows), file=sys.stderr if args.json else sys.stdout)
        out.emit(result)
        plot_from_args(args, "agentq stop: time to stop a user's running tasks", panels(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
