"""Every benchmark script runs end to end on the local stack, at the smallest size that still
exercises its whole path, and its ``--json`` carries the figures its table and its plot are
drawn from.

Why in the suite: the benches are not imported by anything else, and their helpers are mostly
untyped (mypy treats the stack they drive as Any), so a change to a record type broke
``bench/resume.py`` and ``bench/fanout.py`` on every run without any check noticing. This test
times nothing; the figures are the benches' business, only their presence is checked here.
``bench/checkpoint_cost.py`` needs the ``bench`` extra (LangGraph) and is run by ``make bench``.
"""

from __future__ import annotations

import importlib
import json
import os
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import run_python

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "bench"

CASES = {
    "local_commit": ["--sizes", "0,200", "--commits", "2", "--dynamodb", "agentq"],
    "resume": ["--runs", "1"],
    "fanout": ["--sizes", "2", "--child-turns", "1", "--workers", "1"],
    "latency": ["--tasks", "4", "--paced-tasks", "4", "--workers", "1"],
    "concurrency": ["--levels", "3", "--sample-seconds", "2", "--turns", "30", "--latency", "0.5"],
    "local_api": ["--clients", "4", "--modes", "isolated,shared"],
    "moto_throughput": ["--apps", "agentq", "--tasks", "4", "--threads", "2", "--seconds", "1"],
    "import_time": ["--runs", "1", "authorizer"],
    "local_soak": ["--minutes", "0.15", "--rate", "1", "--sample-seconds", "3", "--workers", "1"],
    "agent_cost": ["--turns", "10", "--doc-bytes", "2000"],
    "outage": ["--tasks", "4", "--down-seconds", "3", "--cooldown", "1", "--modes", "on"],
    "message_cost": ["--turns", "4"],
    "grade_cost": ["--runs", "1"],
    "memory_cost": ["--sizes", "100,5000", "--stores", "3", "--searches", "1"],
    "events": ["--subscribers", "3", "--turns", "2", "--latency", "0.1"],
    "slot_calls": ["--waiting-tenants", "2"],
    "cap_calls": ["--turns", "2"],
    "policy_latency": ["--rules", "0,3", "--checks", "20"],
    "vault_cost": ["--runs", "3"],
    "a2a_delegation": ["--looks", "1"],
    "live_cost": ["--watchers", "10,100"],
    "idle_cost": ["--idle-poll-waits", "1,5", "--seconds", "3", "--workers", "1"],
    "alias_cost": ["--runs", "3"],
    "provider_calls": ["--calls", "5"],
    "eval_run": ["--items", "6", "--latency", "1"],
    "stop_time": ["--tasks", "6", "--others", "2", "--workers", "1", "--latency", "0.5", "--scan", "6"],
    "quiet_tenant": ["--roots", "1", "--children", "4", "--latency", "0.5", "--ahead", "0", "--workers", "1"],
    "fairness": ["--sizes", "8", "--b-tasks", "2", "--latency", "0.5", "--limit", "2", "--window", "2",
                 "--concurrency", "4", "--workers", "1"],
    # the coding task, its bill and the shell's overhead; not the restore part (a local stack and
    # a SIGKILL per restore: seconds each), which bench/workspace_chaos.py's case exercises
    "workspace_cost": ["--parts", "coding,shell", "--turns", "4", "--repo-mb", "0.2", "--repo-files", "12",
                       "--sizes", "0.1:10:1", "--runs", "1"],
    # a small suite of its own: one file whose tests fork moto servers through the fork server
    "suite_cpu": ["--pytest", "-q -n 0 -p no:cacheprovider tests/test_forkserver.py", "--every", "0.1"],
    "workspace_chaos": ["--cycles", "1", "--live", "1", "--turns", "2", "--workers", "2", "--pause", "1", "--lease", "1"],
}  # fmt: skip


def run_bench(name: str, args: list[str], tmp_path: Path) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    proc = run_python(  # the exit code is asserted with the stderr that explains it
        [str(BENCH / f"{name}.py"), *args, "--json", "--plot", str(tmp_path / f"{name}.png")],
        env=env,
        timeout=240,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    result: dict[str, Any] = json.loads(proc.stdout)  # --json: one object on stdout, nothing else
    return result


@pytest.fixture
def bench_module(monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.syspath_prepend(str(BENCH))
    return importlib.import_module


@pytest.mark.parametrize("name", sorted(CASES))
def test_each_bench_runs_end_to_end_and_prints_its_figures_as_json(
    name: str, tmp_path: Path, bench_module: Any
) -> None:
    result = run_bench(name, CASES[name], tmp_path)
    module = bench_module(name)
    if name == "live_cost":
        assert [e["watchers"] for e in result["by_watchers"]] == [10, 100]
        for entry in result["by_watchers"]:
            designs = entry["designs"]
            assert designs["sse-lambda"]["lambda_held"] == entry["watchers"]  # today: one execution per watcher
            assert all(designs[d]["lambda_held"] == 0 for d in ("appsync-events", "apigw-websocket", "fargate-hub"))
            assert all(d["total_usd"] > 0 for d in designs.values())
            assert designs["fargate-hub"]["publishes_per_event"] == 0  # the table's stream, no publisher
        assert set(result["seed"]) == {"lambda executors", "fargate workers", "economy batches"}
    elif name == "suite_cpu":
        assert result["returncode"] == 0 and result["forks_noted"] > 0
        kinds = {r["kind"]: r for r in result["by_kind"]}
        assert kinds["moto servers"]["processes"] > 0 and kinds["xdist workers (tests' own code)"]["processes"] > 0
        assert [r["file"] for r in result["forks_by_test_file"]] == ["tests/test_forkserver.py"]
    elif name == "idle_cost":
        short, long = result["rows"]
        # an idle tier's 5 s poll ends at most once in the 3 s window (often not at all), a 1 s poll 2-3 times
        assert long["sqs_requests_per_worker_minute"] < short["sqs_requests_per_worker_minute"]
        assert long["dollars_per_worker_month"] < short["dollars_per_worker_month"]
        assert short["calls_per_worker_minute"]["dynamodb:UpdateItem"] > 0  # the liveness, renewed all the same
    elif name == "provider_calls":
        connections = {(r["provider"], r["mode"]): r["connections"] for r in result["rows"]}
        assert connections == {
            (p, m): 5 if m == "per call" else 1 for p in ("anthropic", "openai") for m in module.MODES
        }
    elif name == "eval_run":
        assert result["tasks"] == 12 and result["lost"] == 0 and result["repeated"] == 0
        assert result["killed"]["cli_after_submissions"] == 10 and result["aws_calls"] > 0
    elif name == "local_commit":
        assert [r["filler_items"] for r in result["rows"]] == [0, 200]
        assert all(r["commit_ms"]["n"] == 2 and r["commit_ms"]["p50"] > 0 for r in result["rows"])
    elif name == "resume":
        assert result["measured"] == 1 and result["same_as_clean"] == 1 and result["errors"] == []
        assert result["resume_latency_s"]["n"] == 1
    elif name == "fanout":
        [run] = result["runs"]
        assert run["n"] == 2 and run["children_succeeded"] == 2 and run["parent_status"] == "succeeded"
        assert run["cost_usd_per_1000_children"]["total"] > 0
    elif name == "latency":
        assert [p["succeeded"] for p in result["phases"]] == [4, 4]
        assert all(p["dynamodb_calls_per_task"] > 0 for p in result["phases"])
    elif name == "concurrency":
        [level] = result["levels"]
        assert level["level"] == 3 and level["held_max"] == 3
    elif name == "moto_throughput":
        assert [r["phase"] for r in result["rows"]] == ["claims", "turns"]
        assert all(r["calls"] > 0 and r["errors"] == 0 and r["server_cpu_ms_per_call"] > 0 for r in result["rows"])
    elif name == "local_api":
        [row] = result["rows"][:1]
        assert row["errors_5xx"] == 0 and row["crossed"] == 0
    elif name == "local_soak":
        assert len(result["samples"]) >= 3 and result["rss_max_mb"] > 0 and result["tasks_submitted"] >= 5
    elif name == "message_cost":
        quiet, talked, follow_up = result["scenarios"]
        assert talked["steps"] == quiet["steps"] + 1 and follow_up["steps"] == 2  # a message step; its answer
        assert talked["extra_vs_baseline"] > 0 and follow_up["calls"].get("sqs:SendMessage") == 1
    elif name == "grade_cost":
        rows = {r["scenario"]: r for r in result["rows"]}
        assert rows["no outcome"]["grading_tokens"] == 0 and rows["code grader"]["extra_aws_calls"] > 0
        assert rows["rubric"]["grading_model_calls"] == 1 and rows["rubric, one retry"]["grading_model_calls"] == 2
        assert rows["rubric, one retry"]["grading_tokens"] > rows["rubric"]["grading_tokens"] > 0
    elif name == "agent_cost":
        off, cached, economy, compact = result["rows"]
        assert {r["status"] for r in result["rows"]} == {"succeeded"}
        assert off["per_call_input"] == cached["per_call_input"] == economy["per_call_input"], (off, cached)
        assert cached["cache_reads"] > 0 and cached["input_usd"] < off["input_usd"]
        assert (
            economy["input_usd"] == round(cached["input_usd"] / 2, 4) and economy["claims"] == economy["llm_calls"] + 1
        )
        assert all(r["ledger_equals_provider"] for r in result["rows"])
        assert compact["mode"] == "compact"
    elif name == "outage":
        [row] = result["rows"]
        assert row["succeeded"] == 4 and row["dlq_messages"] == 0 and row["calls_while_down"] > 0
    elif name == "vault_cost":
        rows = result["rows"]
        assert rows["new run, cold KMS"]["calls_per_use"] == {"dynamodb:BatchGetItem": 1, "kms:Decrypt": 1}
        assert rows["new run, cached key"]["calls_per_use"] == {"dynamodb:BatchGetItem": 1}
        # each use reads the item again (a credential deleted or rebound mid-run is not sent), with the
        # task's META (a stopped task's is not sent either), in one round trip as before; opens nothing
        assert rows["same run"]["calls_per_use"] == {"dynamodb:BatchGetItem": 1} and result["marker_scan"]["hits"] == 0
        assert rows["same run, no task read"]["calls_per_use"] == {"dynamodb:GetItem": 1}
        assert result["meta_bytes"] < 4096
    elif name == "a2a_delegation":
        rows = result["rows"]
        assert list(rows) == ["send", "look 1", "answer"] and result["messages_received"] == 1
        assert [r["outcome"] for r in rows.values()] == ["waiting", "waiting", "finished"]
    elif name == "alias_cost":
        rows = result["rows"]
        assert rows["@2"]["calls_per_submission"] == {"dynamodb:GetItem": 1}
        assert rows["@prod warm"]["calls_per_submission"] == {"dynamodb:GetItem": 1}
        assert rows["@prod cold"]["calls_per_submission"] == {"dynamodb:GetItem": 2}
        assert rows["inline"]["calls_per_submission"] == {}
    elif name == "memory_cost":
        assert [w["content_bytes"] for w in result["writes"]] == [100, 5000]
        assert result["writes"][1]["write_units_total"] > result["writes"][0]["write_units_total"] >= 8
        assert {(r["backend"], r["documents"], r["hits"]) for r in result["searches_by_size"]} == {
            ("in-memory twin", 3, 3), ("moto server", 3, 3),
        }  # fmt: skip
    elif name == "quiet_tenant":
        assert [r["scenario"] for r in result["rows"]] == ["sub-agents", "submissions"]
        assert all(r["noisy_tasks"] == 4 and r["quiet_first_claim_s"] > 0 for r in result["rows"])
    elif name == "slot_calls":
        rows = {r["scenario"]: r for r in result["rows"]}
        assert rows["unlimited tenant, no fleet"]["release"] == {"dynamodb:GetItem": 1}
        assert rows["release waking the fleet, 2 tenant(s) waiting"]["release"]["sqs:SendMessage"] == 1
        # the per-tier reserve: the same 2 calls to admit, one more item in its transaction (+2 WCU)
        tier, fleet = rows["limited tenant, fleet, tier"]["admit"], rows["limited tenant, fleet"]["admit"]
        assert {k: v for k, v in tier.items() if k.startswith("dynamodb:")} == {
            "dynamodb:BatchGetItem": 1, "dynamodb:TransactWriteItems": 1,
        }  # fmt: skip
        assert tier["items:transacted"] == fleet["items:transacted"] + 1
    elif name == "cap_calls":  # a capped scope: one conditional hold and one settle per LLM call, one read a claim
        calls = {(r["capped_scopes"], r["user_spend_rule"]): r["extra_calls"] for r in result["rows"]}
        assert calls == {(0, False): {"BatchGetItem": 1}, (1, False): {"BatchGetItem": 1, "UpdateItem": 6},
                         (2, False): {"BatchGetItem": 1, "UpdateItem": 12},
                         (3, False): {"BatchGetItem": 1, "UpdateItem": 18},
                         # a rule reading the user's spend: a GetItem a check (5: 3 model calls, 2 tool calls);
                         # an uncapped user's day counted (6 UpdateItem), a capped one's written anyway
                         (0, True): {"BatchGetItem": 1, "GetItem": 5, "UpdateItem": 6},
                         (1, True): {"BatchGetItem": 1, "GetItem": 5, "UpdateItem": 6}}  # fmt: skip
        assert result["day_item"]["end_of_day_units"] >= 1 and result["prices"]["dynamodb_wru"] > 0
    elif name == "policy_latency":
        rows = {(r["scenario"], r["rules"]): r for r in result["rows"]}
        assert rows[("cached", 3)]["aws_calls_per_check"] == {} and rows[("cached", 3)]["latency_ms"]["n"] == 20
        assert rows[("read each check", 3)]["aws_calls_per_check"] == {"dynamodb:Query": 1}
        assert rows[("tree rule", 4)]["aws_calls_per_check"] == {"dynamodb:GetItem": 1}
        assert rows[("cached", 3)]["verdicts"] == {"allow": 20}
    elif name == "events":
        [row] = result["rows"]
        assert row["subscribers_with_every_step"] == row["ended"] == 3 and row["steps"] == 5
        assert row["latency_ms"]["n"] == 15 and row["reads"] > 0
    elif name == "stop_time":
        assert result["cancelled"] == result["running_before_stop"] == 6 and result["stopped_s"]["n"] == 6
        assert result["marked"] == 6 and result["cancelled_s"]["n"] == 6
        assert result["stopped_s"]["max"] <= result["cancelled_s"]["max"]  # the mark comes before the move
        assert result["commits_after_stop"] == result["step_items_committed_after_stop"] == 0
        assert result["bob_touched"] == 0
    elif name == "fairness":
        [row] = result["rows"]
        assert row["b_claimed"] == 2 and row["a_running_max"] <= 2 and row["b_pickup_s"]["n"] == 2
        assert row["a_submit_calls_per_task"]["dynamodb:TransactWriteItems"] > 0
    elif name == "workspace_cost":
        coding, model = result["coding"], result["model"]
        assert [r["action"] for r in coding["rows"]] == ["clone", "read", "edit", "test"] and not coding["tool_errors"]
        assert coding["rows"][0]["uploaded_bytes"] > 0 and coding["rows"][1]["uploaded_bytes"] == 0
        assert coding["totals"]["s3_puts"] > 0 and coding["restore"]["gets"] > 0 and model["total_usd"] > 0
        ec2 = [r for r in model["rows"] if r["item"].startswith(("EC2 instance", "EBS gp3"))]  # the EC2 workspace tier
        assert len(ec2) == 2 and all(r["usd"] > 0 for r in ec2) and model["standing_month_usd"] > 0
        assert result["shell"]["rows"][0]["command"] == "true" and result["shell"]["scans"]
    elif name == "workspace_chaos":
        assert result["ok"] and result["figures"]["kill-resume cycles (claims that took over a run)"] >= 1
        assert result["figures"]["manifests checked"] > 0
    elif name == "import_time":
        [handler] = result["handlers"]
        assert handler["handler"] == "authorizer" and handler["median_ms"] > 0
    if hasattr(module, "panels"):  # the plot is drawn from these: they must build from the JSON
        panels = module.panels(result["rows"] if name == "local_api" else result)
        assert panels and all(p.series for p in panels)
