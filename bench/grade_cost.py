"""What grading an answer against its outcome costs: AWS calls, the grading model's calls,
tokens and dollars, and the time from the answer to the task's end.

    python bench/grade_cost.py                  # 5 runs of each scenario
    python bench/grade_cost.py --runs 20 --json

Each scenario runs one scripted task in this process against the project's moto server (the
engine and the storage exactly as a worker runs them), every botocore call metered
(``bench/_aws_meter.py``: DynamoDB request units, S3 requests, priced from ``bench/_prices.py``):

- ``no outcome``: the task answers; the baseline;
- ``code grader``: the same answer, checked by a ``@grader`` function (``tests.effect_tools.says_done``);
- ``rubric``: graded by a (scripted) grading model: its tokens and dollars are the ledger's,
  priced by agentq's model price table like the agent's own calls;
- ``rubric, one retry``: graded below the bar once, the feedback sent back, answered again and
  graded again;
- ``online rubric (sampled)``: no outcome, but its alias's online evaluation sampled the task
  (``TaskSubmission.online``, as ``control.aliases`` sets it): the same rubric grades the answer
  once and the grade is counted in the version's hourly bucket (``storage.quality``: one
  TransactWriteItems of the bucket and its marker). Its baseline is ``agent@1, not sampled``, the
  same task of an agent version that its alias did not sample: no grading, no count (a task
  naming an agent version costs its claim a read of that agent's caps, whether sampled or not).

The overhead is each scenario less the baseline. Grading time is from the answer's commit to
the task's end (the grade's effect record, the judges, the grade step's commit); a real grading
model adds its own latency, which the scripted one does not have.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from _aws_meter import AwsMeter  # noqa: E402
from _benchlib import log, summary, table  # noqa: E402
from _plot import Panel, add_plot_args  # noqa: E402
from _prices import rate  # noqa: E402
from _report import report  # noqa: E402
from agentq.core.engine import Engine, EngineConfig  # noqa: E402
from agentq.core.models import GradeStep, LLMStep, TaskSubmission  # noqa: E402
from agentq.resources import QueueSettings, provision  # noqa: E402
from agentq.runtime import Settings, build_registry, build_store, session  # noqa: E402
from agentq_dev.moto_server import LOCAL_CREDENTIALS, MotoServer  # noqa: E402

GRADE_PASS = '{"score": 1, "feedback": ""}'
GRADE_LOW = '{"score": 0.3, "feedback": "Say DONE, and say which invoice is the largest."}'
RUBRIC = {"rubric": "Says DONE and names the largest invoice.", "script": {"turns": [{"text": GRADE_PASS}]}}
SCENARIOS: dict[str, tuple[list[str], dict[str, Any] | None]] = {
    "no outcome": (["DONE: invoice 7 is the largest"], None),
    "code grader": (["DONE: invoice 7 is the largest"], {"grader": "says_done"}),
    "rubric": (["DONE: invoice 7 is the largest"], {"rubric": "Says DONE and names the largest invoice.",
                                                     "script": {"turns": [{"text": GRADE_PASS}]}}),
    "rubric, one retry": (["invoice 7", "DONE: invoice 7 is the largest"],
                          {"rubric": "Says DONE and names the largest invoice.",
                           "script": {"turns": [{"text": GRADE_LOW}, {"text": GRADE_PASS}]}}),
    "agent@1, not sampled": (["DONE: invoice 7 is the largest"], {"online": None}),
    "online rubric (sampled)": (["DONE: invoice 7 is the largest"], {"online": {"alias": "prod", "grade": RUBRIC}}),
}  # fmt: skip


def submission(turns: list[str], outcome: dict[str, Any] | None) -> TaskSubmission:
    body: dict[str, Any] = {"goal": "Which invoice is the largest? Say DONE when you know.", "provider": "scripted",
                            "script": {"turns": [{"text": t} for t in turns]}}  # fmt: skip
    if outcome is not None and "online" in outcome:  # a task of an agent version; sampled: graded, counted
        body["agent"] = "invoices@1"
        if outcome["online"] is not None:
            body["online"] = outcome["online"]
    elif outcome is not None:
        body["outcome"] = outcome
    return TaskSubmission.model_validate(body)


def aws_usd(calls: list[Any]) -> float:
    return float(
        sum(c.wru for c in calls) * rate("dynamodb_wru")
        + sum(c.rru for c in calls) * rate("dynamodb_rru")
        + sum(1 for c in calls if c.op == "s3:PutObject") * rate("s3_put")
        + sum(1 for c in calls if c.op == "s3:GetObject") * rate("s3_get")
    )


def run(args: argparse.Namespace) -> dict[str, Any]:
    for key, value in LOCAL_CREDENTIALS.items():
        os.environ.setdefault(key, value)
    os.environ.setdefault("AGENTQ_TEST_LEDGER", str(Path(args.ledger).resolve()))
    rows: list[dict[str, Any]] = []
    with MotoServer() as server:
        settings = Settings.for_prefix(f"gc{uuid.uuid4().hex[:8]}", server.endpoint_url,
                                       tool_modules=("tests.effect_tools",))  # fmt: skip
        provision(session(settings), settings.names, endpoint_url=settings.endpoint_url, queues=QueueSettings())
        store, tools = build_store(settings), build_registry(settings)
        engine = Engine(store, worker_id="bench", tools=tools, config=EngineConfig(lease_seconds=30))
        meter = AwsMeter(side_dynamodb=session(settings).client("dynamodb", endpoint_url=settings.endpoint_url))
        meter.install()
        try:
            for name, (turns, outcome) in SCENARIOS.items():
                calls, aws, grading_tokens, grading_usd, grading_ms, total_ms, model_calls = [], [], [], [], [], [], []
                for i in range(args.runs):
                    task = store.tasks.create(submission(turns, outcome), tenant="bench")
                    meter.phase = (name, i)
                    began = time.perf_counter()
                    engine.run(task.task_id)
                    total_ms.append((time.perf_counter() - began) * 1000)
                    meter.phase = None
                    metered = meter.of((name, i))
                    calls.append(len(metered))
                    aws.append(aws_usd(metered))
                    steps = store.steps.load(task.task_id)
                    ended = store.tasks.get(task.task_id)
                    graded = [s.body for s in steps if isinstance(s.body, GradeStep)]
                    grading_tokens.append(sum(g.usage.total for g in graded))
                    grading_usd.append(float(sum(g.cost_usd for g in graded)))
                    model_calls.append(sum(1 for g in graded for c in g.checks if c.kind == "rubric"))
                    answers = [s for s in steps if isinstance(s.body, LLMStep)]
                    answered_at = answers[-1].committed_at
                    grading_ms.append(((ended.finished_at or answered_at) - answered_at) * 1000)
                    assert ended.status.value == "succeeded", (name, ended.status, ended.error)
                rows.append({
                    "scenario": name, "runs": args.runs, "aws_calls": summary(calls)["p50"],
                    "aws_usd_per_1000": round(summary(aws)["p50"] * 1000, 4),
                    "grading_model_calls": model_calls[0], "grading_tokens": grading_tokens[0],
                    "grading_usd_per_1000": round(grading_usd[0] * 1000, 4),
                    "answer_to_end_ms": summary(grading_ms), "run_ms": summary(total_ms),
                })  # fmt: skip
                log(f"{name}: {rows[-1]['aws_calls']} AWS calls, {grading_tokens[0]} grading tokens")
        finally:
            meter.uninstall()
    base = rows[0]
    for row in rows:
        row["extra_aws_calls"] = row["aws_calls"] - base["aws_calls"]
        row["extra_aws_usd_per_1000"] = round(row["aws_usd_per_1000"] - base["aws_usd_per_1000"], 4)
        row["extra_answer_to_end_ms_p50"] = round(row["answer_to_end_ms"]["p50"] - base["answer_to_end_ms"]["p50"], 2)
    return {"runs": args.runs, "rows": rows}


def render(result: dict[str, Any]) -> str:
    headers = ["scenario", "AWS calls", "+ calls", "AWS $/1000", "+ AWS $/1000", "grading calls", "grading tokens",
               "grading $/1000", "answer->end ms p50", "+ ms p50"]  # fmt: skip
    rows = [[r["scenario"], r["aws_calls"], r["extra_aws_calls"], r["aws_usd_per_1000"], r["extra_aws_usd_per_1000"],
             r["grading_model_calls"], r["grading_tokens"], r["grading_usd_per_1000"],
             round(r["answer_to_end_ms"]["p50"], 2), r["extra_answer_to_end_ms_p50"]] for r in result["rows"]]  # fmt: skip
    return table(headers, rows) + (
        f"\n({result['runs']} runs a scenario on the moto server; '+' = less the no-outcome baseline; grading $ by "
        "agentq's model price table (the scripted grader is priced as the task's model); AWS $ from bench/_prices.py)"
    )


def panels(result: dict[str, Any]) -> list[Panel]:
    names = [r["scenario"] for r in result["rows"]]
    return [
        Panel(kind="bar", title="AWS calls a task", ylabel="calls", x=names,
              series={"calls": [r["aws_calls"] for r in result["rows"]]}),
        Panel(kind="bar", title="grading model tokens a task", ylabel="tokens", x=names,
              series={"tokens": [r["grading_tokens"] for r in result["rows"]]}),
        Panel(kind="bar", title="answer to end (p50)", ylabel="ms", x=names,
              series={"p50": [r["answer_to_end_ms"]["p50"] for r in result["rows"]]}),
    ]  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=5, help="runs of each scenario")
    ap.add_argument("--ledger", default="grade_cost_ledger.jsonl", help="where the code grader writes its runs")
    ap.add_argument("--json", action="store_true")
    add_plot_args(ap, "grade_cost")
    args = ap.parse_args(argv)
    report(args, "agentq: what grading an answer costs", run, render, panels)
    return 0


if __name__ == "__main__":
    sys.exit(main())
