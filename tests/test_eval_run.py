"""``agentq eval run`` with real processes on a local stack of its own (moto server, HTTP API with
auth, worker processes): a dataset runs through two agent versions as ordinary tasks, graded,
reported side by side with numbers equal to what the tasks recorded; the CLI SIGKILLed after
it submitted some items and a worker SIGKILLed holding a task, the same command run again
re-attaches: every item ran exactly once per version. Bad datasets and missing versions are
errors naming the line and field, with nothing submitted."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import uuid
from collections import Counter
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from agentq.control.submit import submit_once
from agentq.core.agents import AgentSpec
from agentq.core.errors import ValidationError
from agentq.core.evaluation_report import newcombe, wilson
from agentq.core.evaluations import META_EVAL, META_ITEM, META_VERSION, parse_dataset
from agentq.core.models import MAX_JSON_DEPTH
from agentq.core.tools import ToolRegistry
from agentq.storage.container import Storage
from agentq.worker import WorkerConfig
from agentq_dev.stack import LocalStack

from tests.api_support import ROOT, ApiStack
from tests.helpers import agentq_process, call, run_agentq, wait_for

GRADE_LOW = '{"score": 0.2, "feedback": "not good enough"}'


@pytest.fixture(scope="module")
def eval_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ApiStack]:
    """A stack of this module's own: its workers are killed here."""
    ledger = tmp_path_factory.mktemp("eval-ledger") / "ledger.jsonl"
    gates = tmp_path_factory.mktemp("eval-gates")
    stack = LocalStack(
        prefix=f"eval{uuid.uuid4().hex[:8]}",
        workers=2,
        auth=True,
        worker_config=WorkerConfig(lease_seconds=3.0, heartbeat_seconds=1.0),
        tool_modules=("agentq.core.tools.examples", "tests.effect_tools", "tests.gate_tools"),
        extra_env={
            "AGENTQ_TEST_LEDGER": str(ledger),
            "AGENTQ_TEST_GATE_DIR": str(gates),
            "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH", "")])),
        },
    ).start()
    try:
        assert stack.api_server is not None
        yield ApiStack(stack=stack, url=stack.api_server.url, key=stack.create_api_key("evals"), other_key="")
    finally:
        stack.stop()


def _agent(api: ApiStack, name: str, tag: str, latency: float, gate: str | None = None) -> None:
    """A version answering ``DONE <tag>``; with a ``gate``, it first calls ``hold`` (tests/gate_tools.py)
    and so runs until the test opens that gate."""
    turns: list[dict[str, Any]] = [{"text": f"DONE {tag}", "latency_seconds": latency}]
    if gate is not None:
        turns.insert(0, {"text": "", "tool_calls": [call("hold", label=gate)]})
    status, body, _ = api.http("POST", "/agents", {"name": name, "provider": "scripted", "system": tag,
                                                   "script": {"turns": turns}, "tools": ["hold"] if gate else []})  # fmt: skip
    assert status == 201, body


def _dataset(path: Path, n: int) -> list[dict[str, Any]]:
    """Three kinds of item in turn: an exact answer only version 2 gives, a @grader both pass,
    a rubric the (scripted) grading model scores below the bar for both."""
    rows: list[dict[str, Any]] = []
    for i in range(n):
        row: dict[str, Any] = {"id": f"item-{i}", "goal": f"question {i}"}
        if i % 3 == 0:
            row["expected"] = "DONE v2"
        elif i % 3 == 1:
            row["outcome"] = {"grader": "says_done", "max_attempts": 1}
        else:
            row["outcome"] = {"rubric": "Is it right?", "max_attempts": 1, "script": {"turns": [{"text": GRADE_LOW}]}}
        rows.append(row)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return rows


def _setup(
    api: ApiStack, tmp_path: Path, n: int, latency: float = 0.0, gate: str | None = None
) -> tuple[str, Path, list[dict[str, Any]]]:
    name = f"support-{uuid.uuid4().hex[:8]}"
    _agent(api, name, "v1", latency, gate)
    _agent(api, name, "v2", latency, gate)
    path = tmp_path / "dataset.jsonl"
    return name, path, _dataset(path, n)


def _tasks_of(api: ApiStack, eval_id: str) -> list[dict[str, Any]]:
    """Every task of the tenant carrying the evaluation's id (the API's metadata filter)."""
    found, cursor = [], None
    while True:
        query = f"/tasks?limit=100&metadata={META_EVAL}={eval_id}" + (f"&cursor={cursor}" if cursor else "")
        status, page, _ = api.http("GET", query)
        assert status == 200, page
        found += page["tasks"]
        cursor = page.get("next_cursor")
        if not cursor:
            return found


def _run(api: ApiStack, tmp_path: Path, name: str, path: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    args = ["eval", "run", str(path), "--agent", f"{name}@1", "--against", f"{name}@2", "--poll", "0.2",
            "--report", str(tmp_path / "report.json"), "--plot", str(tmp_path / "report.png"), *extra]  # fmt: skip
    return run_agentq(args, env=api.cli_env(), timeout=240, cwd=tmp_path)


def _assert_report_is_the_tasks(api: ApiStack, report: dict[str, Any], n: int) -> None:
    """Each row's figures are its task's as recorded in the table, not the API: its status and
    steps from its META, its cost and tokens its whole tree's (the root's budget, sub-agents
    folded in); and the totals are their sums."""
    store = api.stack.store()
    for side in ("agent", "against"):
        cost, tokens, steps = Decimal(0), 0, 0
        for row in report["items"]:
            cell = row[side]
            task = store.tasks.get(cell["task_id"])
            tree = store.budgets.get(task.budget_id)
            assert cell["status"] == task.status.value
            assert Decimal(cell["cost_usd"]) == tree.cost_usd
            assert cell["tokens"] == tree.tokens_in + tree.tokens_out
            assert cell["steps"] == task.step
            cost, tokens, steps = cost + Decimal(cell["cost_usd"]), tokens + cell["tokens"], steps + cell["steps"]
        summary = report["summary"][side]
        assert summary["items"] == n and Decimal(summary["cost_usd"]) == cost
        assert summary["tokens_in"] + summary["tokens_out"] == tokens and summary["steps"] == steps
        assert summary["passed"] == sum(1 for r in report["items"] if r[side]["passed"])


def _assert_once_per_version(
    api: ApiStack, eval_id: str, name: str, rows: list[dict[str, Any]], llm_steps: int = 1
) -> None:
    tasks = _tasks_of(api, eval_id)
    pairs = Counter((t["metadata"][META_ITEM], t["metadata"][META_VERSION]) for t in tasks)
    expected = {(r["id"], f"{name}@{v}") for r in rows for v in (1, 2)}
    assert set(pairs) == expected and set(pairs.values()) == {1}, pairs
    store = api.stack.store()
    for task in tasks:  # and each ran its script once: one committed LLM step a turn
        assert store.tasks.get(task["task_id"]).llm_steps == llm_steps


def _graded_items_not_passed(store: Any, report: dict[str, Any], rows: list[dict[str, Any]]) -> list[Any]:
    """The items both versions should have passed (the @grader ones) that one did not, with
    their tasks' status, error and claims: what a failure of the pass count needs to be read."""
    graded = {r["id"] for r in rows if "grader" in r.get("outcome", {})}
    missed = []
    for row in report["items"]:
        for side in ("agent", "against"):
            if row["item"] in graded and not row[side]["passed"]:
                task = store.tasks.get(row[side]["task_id"])
                missed.append((row["item"], side, task.status.value, task.error, task.claim_count))
    return missed


def test_a_dataset_runs_through_both_versions_and_the_report_is_what_the_tasks_recorded(
    eval_stack: ApiStack, tmp_path: Path
) -> None:
    name, path, rows = _setup(eval_stack, tmp_path, 9)
    first = _run(eval_stack, tmp_path, name, path, "--json", "--fail-under", "0.9")
    assert first.returncode == 1, first.stderr[-3000:]  # v2 passes 6 of 9: under 90 %
    report = json.loads(first.stdout)
    assert report == json.loads((tmp_path / "report.json").read_text())
    a, b = report["summary"]["agent"], report["summary"]["against"]
    assert (a["passed"], b["passed"]) == (3, 6)  # the graded ones; the exact answer only for v2
    assert a["statuses"] == b["statuses"] == {"failed_outcome": 3, "succeeded": 6}
    assert b["pass_rate_ci95"] == list(wilson(6, 9))
    assert report["difference"]["fixed"] == 3 and report["difference"]["regressed"] == 0
    assert [r["change"] for r in report["items"]] == ["fixed", None, None] * 3
    assert Decimal(a["grading_cost_usd"]) >= 0
    _assert_report_is_the_tasks(eval_stack, report, 9)
    _assert_once_per_version(eval_stack, report["evaluation"], name, rows)
    if importlib.util.find_spec("matplotlib") is not None:
        assert (tmp_path / "report.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    else:  # not a dependency of agentq: said, and the report stands without it
        assert "no PNG drawn: matplotlib is not installed" in first.stderr and not (tmp_path / "report.png").exists()

    again = _run(eval_stack, tmp_path, name, path, "--fail-under", "60%")  # the same command: re-attaches
    assert again.returncode == 0, again.stderr[-3000:]
    assert "submitted 18/18 (0 new)" in again.stderr
    assert json.loads((tmp_path / "report.json").read_text())["items"] == report["items"]
    _assert_once_per_version(eval_stack, report["evaluation"], name, rows)


def test_an_items_cost_and_tokens_are_what_its_whole_task_tree_spent_its_sub_agents_included(
    eval_stack: ApiStack, tmp_path: Path
) -> None:
    """v2 hands the work to two sub-agents (spawn_subagents) and answers DONE: what an item cost
    on v2 is what its task tree spent, the root's calls and its sub-agents', not the root's own
    only (reported $0.024480 and 5,040 tokens of a tree's $0.042216 and 8,280): otherwise the
    version that delegates looks cheaper than it is."""
    name = f"delegates-{uuid.uuid4().hex[:8]}"
    long = "a long answer that costs tokens " * 20
    children = [{"goal": f"part {i}", "script": {"turns": [{"text": long}]}} for i in range(2)]
    versions = [
        {"name": name, "provider": "scripted", "script": {"turns": [{"text": "DONE"}]}},
        {"name": name, "provider": "scripted", "tools": ["spawn_subagents"], "script": {"turns": [
            {"text": "splitting", "tool_calls": [call("spawn_subagents", subagents=children)]}, {"text": "DONE"}]}},
    ]  # fmt: skip
    for body in versions:
        status, made, _ = eval_stack.http("POST", "/agents", body)
        assert status == 201, made
    path = tmp_path / "cases.jsonl"
    path.write_text("".join(json.dumps({"id": f"i{i}", "goal": f"q{i}", "expected": "DONE"}) + "\n" for i in range(2)))
    done = _run(eval_stack, tmp_path, name, path, "--json", "--no-plot")
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout)
    _assert_report_is_the_tasks(eval_stack, report, 2)
    store = eval_stack.stack.store()
    for row in report["items"]:
        root = store.tasks.get(row["against"]["task_id"])
        kids = [store.tasks.get(t) for t in eval_stack.http("GET", f"/tasks/{root.task_id}")[1]["children"]["task_ids"]]
        assert len(kids) == 2 and all(k.status.value == "succeeded" for k in kids)
        tree, own = [root, *kids], root.tokens_in + root.tokens_out
        assert row["against"]["tokens"] == sum(t.tokens_in + t.tokens_out for t in tree) > own
        assert Decimal(row["against"]["cost_usd"]) == sum((Decimal(str(t.cost_usd)) for t in tree), Decimal(0))


def _lines_until(proc: subprocess.Popen[str], marker: str) -> list[str]:
    """The process's stderr lines up to the first that holds ``marker`` (an observable event)."""
    assert proc.stderr is not None
    seen = []
    for line in proc.stderr:
        seen.append(line)
        if marker in line:
            return seen
    raise AssertionError(f"{marker!r} never said; stderr: {''.join(seen)[-3000:]}")


def test_the_cli_and_a_worker_killed_mid_run_and_the_rerun_loses_and_repeats_nothing(
    eval_stack: ApiStack, tmp_path: Path
) -> None:
    n = 30
    gate = f"eval-{uuid.uuid4().hex[:8]}"  # every task of both versions runs until it opens: caught running
    name, path, rows = _setup(eval_stack, tmp_path, n, gate=gate)
    args = ["eval", "run", str(path), "--agent", f"{name}@1", "--against", f"{name}@2", "--poll", "0.2",
            "--submitters", "1", "--no-plot", "--report", str(tmp_path / "report.json")]  # fmt: skip
    cli = agentq_process(args, env=eval_stack.cli_env(), stderr=subprocess.PIPE, stdout=subprocess.PIPE,
                         text=True, cwd=tmp_path)  # fmt: skip
    try:
        said = _lines_until(cli, "submitted 20/60")
        cli.send_signal(signal.SIGKILL)
        assert cli.wait(timeout=30) == -signal.SIGKILL
    finally:
        if cli.poll() is None:
            cli.kill()
    eval_id = next(x for x in said if "agentq eval: evaluation " in x).split("evaluation ")[1].split(":")[0]
    store = eval_stack.stack.store()

    def a_running_worker() -> tuple[Any, str] | None:
        for task in _tasks_of(eval_stack, eval_id):
            meta = store.tasks.get(task["task_id"])
            if meta.status.value != "running" or not meta.lease_owner:
                continue
            proc = eval_stack.stack.worker_by_id(meta.lease_owner)
            if proc is not None and proc.poll() is None:
                return proc, meta.task_id
        return None

    worker, held = wait_for(a_running_worker, timeout=60, what="a worker running one of the evaluation's tasks")
    worker.send_signal(signal.SIGKILL)
    worker.wait(timeout=30)
    eval_stack.stack.processes.remove(worker)
    eval_stack.stack.spawn_worker()
    (Path(eval_stack.stack.extra_env["AGENTQ_TEST_GATE_DIR"]) / gate).touch()  # the held tasks go on
    submitted_before = len(_tasks_of(eval_stack, eval_id))
    assert 20 <= submitted_before < 2 * n

    rerun = run_agentq([*args, "--resume", eval_id, "--json"], env=eval_stack.cli_env(), timeout=300, cwd=tmp_path)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert f"submitted {2 * n}/{2 * n} ({2 * n - submitted_before} new)" in rerun.stderr
    report = json.loads(rerun.stdout)
    assert report["evaluation"] == eval_id
    passed = (report["summary"]["agent"]["passed"], report["summary"]["against"]["passed"])
    assert passed == (n // 3, 2 * n // 3), _graded_items_not_passed(store, report, rows)
    _assert_once_per_version(eval_stack, eval_id, name, rows, llm_steps=2)  # the hold's turn, then the answer
    _assert_report_is_the_tasks(eval_stack, report, n)
    assert store.tasks.get(held).claim_count >= 2  # the killed worker's task was taken over, and ran once
    ledger = Path(eval_stack.stack.extra_env["AGENTQ_TEST_LEDGER"])
    graded = Counter(json.loads(line)["task_id"] for line in ledger.read_text().splitlines())
    ours = {r[side]["task_id"] for r in report["items"] if r["item"] in {x["id"] for x in rows[1::3]}
            for side in ("agent", "against")}  # fmt: skip
    assert {t: graded[t] for t in ours} == dict.fromkeys(ours, 1)  # each @grader ran once a task


BAD_LINES = {
    "not json": ("{goal: 1}", "json"),
    "an array": ("[1, 2]", "json"),
    "no goal": ('{"id": "x"}', "goal"),
    "an empty goal": ('{"goal": "  "}', "goal"),
    "a goal that is a number": ('{"goal": 3}', "goal"),
    "an unknown field": ('{"goal": "g", "colour": "red"}', "colour"),
    "inputs not an object": ('{"goal": "g", "inputs": [1]}', "inputs"),
    "inputs naming the provider": ('{"goal": "g", "inputs": {"provider": "openai"}}', "inputs.provider"),
    "a bad input field": (
        '{"goal": "g", "inputs": {"constraints": {"max_steps": -1}}}',
        "inputs.constraints.max_steps",
    ),
    "an outcome without a judge": ('{"goal": "g", "outcome": {"bar": 0.5}}', "outcome"),
    "a rubric and an outcome": ('{"goal": "g", "rubric": "r", "outcome": {"rubric": "r"}}', "rubric"),
    "an expected number": ('{"goal": "g", "expected": 4}', "expected"),
    "a repeated id": ('{"goal": "g", "id": "a"}', "id"),
}


@pytest.mark.parametrize("case", sorted(BAD_LINES))
@pytest.mark.parametrize("at", [1, 2, 4])
def test_a_bad_dataset_line_is_an_error_naming_its_line_and_field(case: str, at: int) -> None:
    good = [json.dumps({"goal": f"g{i}", "id": "a" if i == 0 else f"i{i}"}) for i in range(4)]
    lines = [*good[: at - 1], BAD_LINES[case][0], *good[at - 1 :]]
    if case == "a repeated id" and at == 1:
        lines[0], lines[1] = lines[1], lines[0]  # the first "a" is the good line's
        at = 2
    with pytest.raises(ValidationError) as raised:
        parse_dataset("\n".join(lines))
    field = BAD_LINES[case][1]
    assert raised.value.field == f"dataset:{at}:{field}", raised.value.message
    assert raised.value.message.startswith(f"dataset line {at}: {field}:")


def _nested(levels: int) -> str:
    return "[" * levels + "]" * levels


def test_a_line_nested_deeper_than_the_api_accepts_is_an_error_naming_its_line_never_a_traceback(
    tmp_path: Path,
) -> None:
    """Past Python's JSON parser (~1,000 levels) a line raised RecursionError out of the CLI; a
    line the parser reads but the API's body guard refuses (``MAX_JSON_DEPTH``) was sent, after
    the lines before it, and one near the parser's limit could not be encoded. Each is refused
    before anything is sent, naming the line and the field; as deep as the API accepts is an item."""
    schema = 'output_schema": {"a": '  # the body's depth: output_schema 1, a 2, its lists 2..N+1
    fine = '{"goal": "y", "inputs": {"' + schema + _nested(MAX_JSON_DEPTH - 1) + "}}}"
    assert parse_dataset(fine)[0].inputs["output_schema"]["a"]
    for line, field in (('{"goal": "y", "inputs": {"metadata": ' + _nested(5000) + "}}", "json"),
                        ('{"goal": "y", "inputs": {"' + schema + _nested(MAX_JSON_DEPTH) + "}}}", "inputs.output_schema"),
                        ('{"goal": "y", "inputs": {"' + schema + _nested(900) + "}}}", "inputs.output_schema"),
                        ('{"goal": "y", "outcome": {"rubric": "r", "x": ' + _nested(5000) + "}}", "json")):  # fmt: skip
        with pytest.raises(ValidationError) as raised:
            parse_dataset('{"goal": "x"}\n' + line + "\n")
        assert raised.value.field == f"dataset:2:{field}", raised.value.message
        assert f"nests deeper than {MAX_JSON_DEPTH} levels" in raised.value.message
    path = tmp_path / "deep.jsonl"
    path.write_text('{"goal": "x"}\n{"goal": "y", "inputs": {"metadata": ' + _nested(5000) + "}}\n")
    ran = run_agentq(["eval", "run", str(path), "--agent", "s@1", "--against", "s@2", "--url", "http://127.0.0.1:9",
                      "--api-key", "k"], env=dict(os.environ), timeout=60, cwd=tmp_path)  # fmt: skip
    assert ran.returncode == 2 and "Traceback" not in ran.stderr, ran.stderr
    assert "agentq: dataset line 2: json: nests deeper than" in ran.stderr, ran.stderr


# Every input the API refuses from any submission naming an agent, with a value the submission
# model takes (what is refused is the field): the version's fields and constraints, and an alias's.
REFUSED_INPUTS: dict[str, dict[str, Any]] = {
    "provider": {"provider": "anthropic"},
    "model": {"model": "claude-haiku-4-5"},
    "system": {"system": "be brief"},
    "script": {"script": "echo"},
    "fallbacks": {"fallbacks": []},
    "mcp_tools": {"mcp_tools": []},
    "remote_agents": {"remote_agents": []},
    "constraints.tools": {"constraints": {"tools": []}},
    "constraints.tool_policies": {"constraints": {"tool_policies": {}}},
    "online": {"online": {"alias": "prod", "grade": {"grader": "says_done"}}},
    "own_fields": {"own_fields": ["outcome"]},
    "overridden": {"overridden": ["model"]},
}


@pytest.mark.parametrize("field", sorted(REFUSED_INPUTS))
def test_an_input_the_api_refuses_for_every_agent_is_refused_before_anything_is_submitted(
    store: Storage, registry: ToolRegistry, field: str
) -> None:
    """The local check knew provider, model, system and script only: a line setting a constraint's
    tools, fallbacks, MCP tools, remote agents or an online grade passed it, and the API refused
    it only as it was submitted, after the lines before it. Both sides name the same field (the
    local list is built from the API's: core.agents, core.models.SET_BY_AGENTQ)."""
    line = {"goal": "g", "inputs": REFUSED_INPUTS[field]}
    with pytest.raises(ValidationError) as local:
        parse_dataset(json.dumps(line) + "\n")
    assert local.value.field == f"dataset:1:inputs.{field}", local.value.message
    name = f"support-{uuid.uuid4().hex[:8]}"
    store.agents.create("t", AgentSpec.model_validate({"name": name, "provider": "scripted", "script": "echo"}))
    body = {**REFUSED_INPUTS[field], "goal": "g", "agent": f"{name}@1"}
    with pytest.raises(ValidationError) as api:
        submit_once(store, registry, body, tenant="t")
    assert api.value.field == field, api.value.message


def test_a_bad_dataset_or_a_missing_version_submits_nothing(eval_stack: ApiStack, tmp_path: Path) -> None:
    name, path, _ = _setup(eval_stack, tmp_path, 3)
    before = eval_stack.http("GET", "/tasks?limit=100")[1]["tasks"]
    path.write_text(path.read_text() + '{"goal": "fine"}\n{"id": "no goal"}\n')
    bad = _run(eval_stack, tmp_path, name, path)
    assert bad.returncode == 2 and "dataset line 5: goal: required" in bad.stderr, bad.stderr
    _, path, _ = _setup(eval_stack, tmp_path, 3)
    for against, said in ((f"{name}@9", f"against: agent {name} has no version 9 (its latest is 2)"),
                          ("nobody@1", "against: there is no agent named 'nobody'"),
                          (f"{name}@prod", "against: an agent version, name@N")):  # fmt: skip
        missing = run_agentq(["eval", "run", str(path), "--agent", f"{name}@1", "--against", against],
                             env=eval_stack.cli_env(), timeout=60, cwd=tmp_path)  # fmt: skip
        assert missing.returncode == 2 and said in missing.stderr, missing.stderr
    assert eval_stack.http("GET", "/tasks?limit=100")[1]["tasks"] == before


def test_an_item_only_the_api_refuses_is_an_error_naming_its_line_and_offers_nothing_to_re_attach(
    eval_stack: ApiStack, tmp_path: Path
) -> None:
    """A rubric with no script of its own, for an agent whose model is scripted: only the API knows
    the agent's model, so the line is checked as it is submitted; it is named as a client-side
    check's is, and with nothing submitted there is no evaluation to resume."""
    name, path, _ = _setup(eval_stack, tmp_path, 1)
    before = eval_stack.http("GET", "/tasks?limit=100")[1]["tasks"]
    path.write_text(json.dumps({"id": "graded", "goal": "g", "rubric": "Is it right?"}) + "\n")
    bad = _run(eval_stack, tmp_path, name, path)
    assert bad.returncode == 2, bad.stderr
    assert "agentq: dataset line 1 (item 'graded'), on " in bad.stderr and "outcome.script" in bad.stderr, bad.stderr
    assert "--resume" not in bad.stderr, bad.stderr
    assert eval_stack.http("GET", "/tasks?limit=100")[1]["tasks"] == before


def _evaluation_of(stderr: str) -> str:
    """The evaluation id the CLI's first line says."""
    return stderr.split("agentq eval: evaluation ", 1)[1].split(":", 1)[0]


@pytest.mark.parametrize("submitters", [1, 4])
def test_a_line_the_api_refuses_stops_the_lines_after_it_being_submitted_and_offers_to_resume(
    eval_stack: ApiStack, tmp_path: Path, submitters: int
) -> None:
    """A run that failed must not go on submitting (and running, and paying for) the lines after
    the refused one: leaving the submitters' pool waited for every queued job, and 38 of 40 tasks
    were still submitted after line 2 was refused. With one submitter exactly the line before it
    was; with four, at most the jobs already in flight. Those stay, and the error offers to
    re-attach to them."""
    name, path, _ = _setup(eval_stack, tmp_path, 1)
    rows: list[dict[str, Any]] = [{"id": f"item-{i}", "goal": f"question {i}"} for i in range(20)]
    rows[1]["rubric"] = "Is it right?"  # graded by a scripted model with no script: only the API knows the model
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    bad = _run(eval_stack, tmp_path, name, path, "--submitters", str(submitters))
    assert bad.returncode == 2, bad.stderr[-3000:]
    eval_id = _evaluation_of(bad.stderr)
    said = bad.stderr.strip().splitlines()[-1]
    assert said.startswith(f"agentq: dataset line 2 (item 'item-1'), on {name}@") and "outcome.script" in said, said
    submitted = Counter((t["metadata"][META_ITEM], t["metadata"][META_VERSION]) for t in _tasks_of(eval_stack, eval_id))
    if submitters == 1:
        assert submitted == {("item-0", f"{name}@1"): 1, ("item-0", f"{name}@2"): 1}
    else:  # the jobs queued behind line 2 (item-1): at most the three other submitters' in flight
        assert {item for item, _ in submitted} <= {"item-0", "item-2", "item-3", "item-4", "item-5"}, submitted
    stays = f"the {sum(submitted.values())} of 40 tasks submitted stay (fix the line and run with --resume {eval_id} "
    assert stays in said, said


def test_a_line_edited_since_its_evaluation_submitted_it_exits_1_naming_the_line(
    eval_stack: ApiStack, tmp_path: Path
) -> None:
    """docs/AGENTS.md: a line edited since is refused (exit 1, naming the line), never run again
    under the same id. The API's 409 was turned into a usage error: exit 2, as for a bad line."""
    name, path, rows = _setup(eval_stack, tmp_path, 3)
    first = _run(eval_stack, tmp_path, name, path, "--no-plot")
    assert first.returncode == 0, first.stderr[-3000:]
    eval_id = _evaluation_of(first.stderr)
    rows[1]["goal"] = "question 1, reworded"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    edited = _run(eval_stack, tmp_path, name, path, "--no-plot", "--resume", eval_id, "--submitters", "1")
    assert edited.returncode == 1, edited.stderr[-3000:]
    said = edited.stderr.strip().splitlines()[-1]
    assert said.startswith(f"agentq: dataset line 2 (item 'item-1'): evaluation {eval_id} submitted this item to "
                           f"{name}@1 with another request (the line changed since)"), said  # fmt: skip
    assert said.endswith("the 2 of 6 tasks submitted stay (dataset:2)"), said  # re-attached; no --resume offered
    _assert_once_per_version(eval_stack, eval_id, name, [{**r, "goal": "?"} for r in rows])


def test_the_wilson_interval_holds_its_rate_inside_zero_and_one_for_every_count() -> None:
    for n in range(1, 60):
        for passed in range(n + 1):
            low, high = wilson(passed, n)
            assert 0 <= low <= passed / n <= high <= 1
            d_low, d_high = newcombe((passed, n), (n - passed, n))
            assert -1 <= d_low <= (n - 2 * passed) / n <= d_high <= 1
    low, high = wilson(8, 10)  # the textbook value: 0.490 to 0.943
    assert (round(low, 3), round(high, 3)) == (0.490, 0.943)


@pytest.mark.parametrize(
    ("option", "value", "said"),
    [("--poll", "-1", "must be a number of seconds above 0, not -1"),
     ("--poll", "0", "must be a number of seconds above 0, not 0"),
     ("--timeout", "-5", "must be a number of seconds above 0, not -5"),
     ("--timeout", "nan", "must be a number of seconds above 0, not nan"),
     ("--submitters", "-2", "must be >= 1, not -2"),
     ("--submitters", "0", "must be >= 1, not 0")],
)  # fmt: skip
def test_a_negative_poll_timeout_or_submitters_is_refused_naming_the_option(
    tmp_path: Path, option: str, value: str, said: str
) -> None:
    """Refused as the arguments are parsed (exit 2 naming the option), before anything is sent: a
    negative --poll was taken, every item was submitted and paid for, and the wait then died with
    a traceback (``ValueError: sleep length must be non-negative``); --submitters -2 ran as 1
    without a word. The API here is nowhere: a request sent would exit 1, "cannot reach"."""
    dataset = tmp_path / "cases.jsonl"
    dataset.write_text('{"goal": "g"}\n')
    env = {**os.environ, "AGENTQ_URL": "http://127.0.0.1:9", "AGENTQ_API_KEY": "k"}
    done = run_agentq(["eval", "run", str(dataset), "--agent", "a@1", "--against", "a@2", option, value],
                      env=env, timeout=60, cwd=tmp_path)  # fmt: skip
    assert done.returncode == 2, (done.returncode, done.stderr[-1500:])
    assert f"argument {option}: {said}" in done.stderr and "Traceback" not in done.stderr, done.stderr[-1500:]
