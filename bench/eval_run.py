"""An offline evaluation of N items x 2 versions on the local stack with the scripted provider,
with the CLI and a worker SIGKILLed mid-run: how long it takes, what AWS calls it makes, and
that the re-run loses and repeats nothing.

    python bench/eval_run.py                      # 200 items x 2 versions, 2 workers
    python bench/eval_run.py --items 50 --json

What runs: a local stack (moto server, the HTTP API with auth in this process, worker
processes counting their AWS calls: ``bench/_counting_worker.py``), two versions of a
scripted agent, and a dataset whose items come in three kinds (an exact answer only version 2
gives; a ``@grader``, ``tests.effect_tools.says_done``; a rubric a scripted grading model
scores below the bar). ``agentq eval run`` is a real process: it is SIGKILLed once it said it
submitted half of the tasks; a worker holding one of the evaluation's running tasks is
SIGKILLed and replaced; then ``agentq eval run ... --resume EVAL_ID`` runs to its report.

Figures: the wall time from the first start to the report, and the re-run's alone; the AWS
calls of the workers and of this process (the API, the sweeper), per task; lost (an item and
version with no task) and repeated (more than one task, or a task with more than one
committed answer) counted from the table; the report's pass rates.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from _benchlib import BenchStack, InProcessCounter, log, table  # noqa: E402
from _plot import Panel, add_plot_args  # noqa: E402
from _report import report  # noqa: E402
from agentq.core.evaluations import META_EVAL, META_ITEM, META_VERSION  # noqa: E402
from agentq.worker import WorkerConfig  # noqa: E402

GRADE_LOW = '{"score": 0.2, "feedback": "not good enough"}'


def _http(url: str, key: str, method: str, path: str, body: Any = None) -> Any:
    import urllib.request

    req = urllib.request.Request(url + path, data=json.dumps(body).encode() if body is not None else None,
                                 method=method, headers={"Content-Type": "application/json",
                                                         "Authorization": f"Bearer {key}"})  # fmt: skip
    with urllib.request.urlopen(req, timeout=60) as resp:
        return json.loads(resp.read())


def dataset(path: Path, n: int) -> None:
    rows = []
    for i in range(n):
        row: dict[str, Any] = {"id": f"item-{i}", "goal": f"question {i}"}
        if i % 3 == 0:
            row["expected"] = "DONE v2"
        elif i % 3 == 1:
            row["outcome"] = {"grader": "says_done", "max_attempts": 1}
        else:
            row["outcome"] = {"rubric": "Is it right?", "max_attempts": 1, "script": {"turns": [{"text": GRADE_LOW}]}}
        rows.append(json.dumps(row))
    path.write_text("\n".join(rows) + "\n")


def eval_tasks(store: Any, url: str, key: str, eval_id: str) -> list[dict[str, Any]]:
    tasks, cursor = [], None
    while True:
        page = _http(
            url,
            key,
            "GET",
            f"/tasks?limit=100&metadata={META_EVAL}={eval_id}" + (f"&cursor={cursor}" if cursor else ""),
        )
        tasks += page["tasks"]
        cursor = page.get("next_cursor")
        if not cursor:
            return tasks


def kill_a_worker(stack: Any, url: str, key: str, eval_id: str, still: Any, until_all_ended: bool) -> str | None:
    """SIGKILL a worker that holds one of the evaluation's running tasks, and start another: the
    task's id; None when none did while ``still()`` (and, ``until_all_ended``, some task had
    not ended: a re-run's first tasks are the ended ones it re-attaches to)."""
    store = stack.store()  # one: each call of stack.store() builds its clients anew
    while still():
        metas = []
        for listed in eval_tasks(store, url, key, eval_id):
            meta = store.tasks.get(listed["task_id"])  # read just before the kill: a list read first goes stale
            metas.append(meta)
            proc = stack.worker_by_id(meta.lease_owner) if meta.status.value == "running" and meta.lease_owner else None
            if proc is not None and proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
                proc.wait()
                stack.spawn_worker()
                log(f"worker {proc.pid} SIGKILLed holding {meta.task_id}")
                return str(meta.task_id)
        if until_all_ended and all(m.status.terminal for m in metas):
            return None  # everything submitted has ended: no worker holds one
        time.sleep(0.05)
    return None


def run(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    counter = InProcessCounter().install()
    stack = BenchStack(
        prefix=f"evalb{uuid.uuid4().hex[:6]}", workers=args.workers, auth=True,
        worker_config=WorkerConfig(lease_seconds=3.0, heartbeat_seconds=1.0),
        tool_modules=("agentq.core.tools.examples", "tests.effect_tools"),
        extra_env={"AGENTQ_TEST_LEDGER": str(workdir / "ledger.jsonl"),
                   "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH", "")]))},
    )  # fmt: skip
    stack.start()
    try:
        assert stack.api_server is not None
        url, key = stack.api_server.url, stack.create_api_key("bench")
        name = f"support-{uuid.uuid4().hex[:6]}"
        for tag in ("v1", "v2"):
            _http(url, key, "POST", "/agents", {"name": name, "provider": "scripted", "system": tag, "script": {
                "turns": [{"text": f"DONE {tag}", "latency_seconds": args.latency}]}})  # fmt: skip
        path = workdir / "dataset.jsonl"
        dataset(path, args.items)
        env = {**stack.env(), "AGENTQ_URL": url, "AGENTQ_API_KEY": key, "PYTHONPATH": str(ROOT)}
        cmd = [sys.executable, "-m", "agentq", "eval", "run", str(path), "--agent", f"{name}@1",
               "--against", f"{name}@2", "--no-plot", "--report", str(workdir / "report.json")]  # fmt: skip
        total = 2 * args.items
        kill_after = (total // 2) // 10 * 10 or 10
        stack.wait_polling()
        before = stack.worker_calls() + counter.snapshot("other")
        started = time.monotonic()
        cli = subprocess.Popen(cmd, env=env, stderr=subprocess.PIPE, text=True, cwd=workdir)
        assert cli.stderr is not None
        eval_id = ""
        for line in cli.stderr:
            if "evaluation " in line and not eval_id:
                eval_id = line.split("evaluation ")[1].split(":")[0]
            if f"submitted {kill_after}/" in line:
                break
        cli.send_signal(signal.SIGKILL)
        cli.wait()
        killed_cli_at = time.monotonic() - started
        log(f"eval {eval_id}: CLI killed after {kill_after} submissions, {killed_cli_at:.1f}s")
        # A worker holding one of the evaluation's running tasks is SIGKILLed: now if one is
        # running, else while the re-run's tasks run.
        killed_worker = kill_a_worker(stack, url, key, eval_id, still=lambda: True, until_all_ended=True)
        submitted_at_kill = len(eval_tasks(stack.store(), url, key, eval_id))
        rerun_started = time.monotonic()
        with open(workdir / "rerun.err", "w") as err:
            proc = subprocess.Popen([*cmd, "--resume", eval_id, "--json"], env=env, stdout=subprocess.PIPE,
                                    stderr=err, text=True, cwd=workdir)  # fmt: skip
            if not killed_worker:
                killed_worker = kill_a_worker(
                    stack, url, key, eval_id, still=lambda: proc.poll() is None, until_all_ended=False
                )
            out, _ = proc.communicate(timeout=3600)
        finished = time.monotonic()
        if proc.returncode != 0:
            raise RuntimeError(f"the re-run failed: {(workdir / 'rerun.err').read_text()[-3000:]}")
        report = json.loads(out)
        calls = stack.worker_calls() + counter.snapshot("other")
        calls.subtract(before)
        tasks = eval_tasks(stack.store(), url, key, eval_id)
        pairs = Counter((t["metadata"][META_ITEM], t["metadata"][META_VERSION]) for t in tasks)
        wanted = {(f"item-{i}", f"{name}@{v}") for i in range(args.items) for v in (1, 2)}
        store = stack.store()
        metas = [store.tasks.get(t["task_id"]) for t in tasks]
        answers = [m.llm_steps for m in metas]
        resumed = sum(m.resume_count for m in metas)
        victim_claims = store.tasks.get(killed_worker).claim_count if killed_worker else 0
    finally:
        counter.uninstall()
        stack.stop()
    aws = {op: n for op, n in sorted(calls.items()) if n > 0}
    summary = report["summary"]
    return {
        "items": args.items,
        "tasks": len(tasks),
        "workers": args.workers,
        "latency_s": args.latency,
        "killed": {
            "cli_after_submissions": kill_after,
            "cli_at_s": round(killed_cli_at, 2),
            "submitted_at_kill": submitted_at_kill,
            "worker": killed_worker is not None,
            "its_task_claims": victim_claims,
            "tasks_resumed": resumed,
        },
        "wall_s": round(finished - started, 2),
        "rerun_s": round(finished - rerun_started, 2),
        "report_wall_s": report["wall_s"],
        "lost": len(wanted - set(pairs)),
        "repeated": sum(n - 1 for n in pairs.values()) + sum(1 for a in answers if a != 1),
        "aws_calls": sum(aws.values()),
        "aws_calls_per_task": round(sum(aws.values()) / max(1, len(tasks)), 1),
        "aws_by_op": aws,
        "pass_rate": {"v1": summary["agent"]["pass_rate"], "v2": summary["against"]["pass_rate"]},
        "pass_rate_ci95": {"v1": summary["agent"]["pass_rate_ci95"], "v2": summary["against"]["pass_rate_ci95"]},
    }


def render(r: dict[str, Any]) -> str:
    k = r["killed"]
    rows = [
        ("items x versions", f"{r['items']} x 2 = {r['tasks']} tasks"),
        ("CLI SIGKILLed", f"after {k['cli_after_submissions']} submissions ({k['cli_at_s']} s)"),
        (
            "worker SIGKILLed",
            f"{'yes' if k['worker'] else 'no running task found'}; its task claimed {k['its_task_claims']} times; "
            f"tasks resumed {k['tasks_resumed']}",
        ),
        ("wall time, first start to report", f"{r['wall_s']} s"),
        ("re-run (--resume) to report", f"{r['rerun_s']} s"),
        ("AWS calls (workers + API)", f"{r['aws_calls']} ({r['aws_calls_per_task']} a task)"),
        ("lost / repeated", f"{r['lost']} / {r['repeated']}"),
        ("pass rate v1 / v2", f"{r['pass_rate']['v1']:.1%} / {r['pass_rate']['v2']:.1%}"),
    ]
    top = sorted(r["aws_by_op"].items(), key=lambda kv: -kv[1])[:8]
    return table(["figure", "value"], rows) + "\n\n" + table(["AWS call", "count"], top)


def panels(r: dict[str, Any]) -> list[Panel]:
    top = sorted(r["aws_by_op"].items(), key=lambda kv: -kv[1])[:6]
    return [
        Panel("bar", "time (s)", "seconds", ["first start to report", "re-run to report"],
              {"s": [r["wall_s"], r["rerun_s"]]}),
        Panel("bar", "AWS calls per task", "calls", [op for op, _ in top],
              {"calls": [n / max(1, r["tasks"]) for _, n in top]}),
        Panel("bar", "lost and repeated (must be 0)", "items", ["lost", "repeated"],
              {"n": [r["lost"], r["repeated"]]}),
    ]  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--items", type=int, default=200, help="dataset items (each runs on 2 versions)")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--latency", type=float, default=0.5, help="the scripted model's latency a turn, seconds")
    ap.add_argument("--workdir", type=Path, default=Path("bench/out/eval_run"))
    ap.add_argument("--json", action="store_true")
    add_plot_args(ap, "eval_run")
    args = ap.parse_args(argv)
    args.workdir.mkdir(parents=True, exist_ok=True)
    result = report(args, "agentq: an evaluation killed mid-run and resumed",
                    lambda a: run(a, a.workdir.resolve()), render, panels)  # fmt: skip
    return 0 if result["lost"] == 0 and result["repeated"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
