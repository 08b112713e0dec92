"""What a task's workspace costs: bytes and AWS calls per step, the restore after a SIGKILL, a
shell command's overhead, and a coding task's bill (issue 42's "Measured" paragraph).

    python bench/workspace_cost.py                       # all four parts (~15 min on 2 cores)
    python bench/workspace_cost.py --parts coding --repo-mb 100 --turns 50 --json
    python bench/workspace_cost.py --parts restore --sizes 10:1000:100,200:20000:10

Four parts (``--parts``):

- ``coding``: a scripted coding agent of ``--turns`` tool turns (default 50: 50 tools steps and
  51 LLM steps) in this process (the engine, the storage and the workspace tools exactly as a
  worker runs them, on the project's moto server), over a repository of ``--repo-mb`` MB:
  turn 1 "clones" it (a shell command writes ``--repo-files`` source files, then ``git init``,
  ``add``, ``commit``: the worktree is three quarters of the size, ``.git`` the rest), then the
  turns cycle through what a coding agent does: read a file, edit one (``edit_file``), run the
  tests (a shell command that writes a 10 KB report), search, write a new test file,
  ``git commit``, ``git status``. Every botocore call is metered (``bench/_aws_meter.py``) and
  attributed to its turn. Per changed step: the bytes changed (files whose content is new or
  different: the least a file-level store must send), the bytes edited (within each changed
  file, what differs once the common prefix and suffix are set aside: what a byte-level delta
  would send), the content bytes uploaded (PutObject bodies under ``workspace/blobs/``), the
  manifest's bytes, the extra calls. Then the final state is restored from the bucket once,
  metered (the cost of a claim). Target: uploaded <= 1.1 x changed, plus the manifest.
- ``restore``: restore after a SIGKILL on the local stack, per ``--sizes`` (``MB:FILES:RESTORES``,
  default ``10:1000:100,200:20000:10``): two worker processes (``bench/_counting_worker.py``,
  which times ``Workspaces.open`` in the worker); one task writes the files (incompressible,
  in a tree of 100 files a directory) in its first turn, and its second turn's shell command
  writes a stamp and sleeps. The bench SIGKILLs the worker running it, starts a replacement,
  and the other worker takes the task over, restores, re-runs the command; once the new stamp
  is there, the next kill; ``RESTORES`` times. Per restore: ``Workspaces.open`` (fetch every
  object, write, verify against the manifest), the claim to the command's start (the step
  load, the restore, the sandbox's start), the kill to the claim (the liveness detection,
  bench/resume.py's figure). Target: p99 <= 5 s at 10 MB / 1,000 files.
- ``shell``: a command through ``WorkspaceSandbox.shell`` (bubblewrap: namespaces, seccomp, the
  mounts, the supervisor) against ``bash -c`` run directly in the same directory; and the scan a
  tools step makes when nothing changed, per ``--sizes`` (its per-step cost on a big workspace).
- ``model``: the dollars of the coding part in the deployed design, computed from its measured
  calls and bytes at list prices (``--prices``): S3 requests, storage for ``--retention-days``,
  transfer, DynamoDB request units; per claim (a resume restores the whole workspace again).
  The deployed design is the EC2 workspace tier (docs/SANDBOX.md, infra/workspace_tier.py):
  the task's share of an instance (``--instance-hour-key``, its root volume ``--root-gb``) for
  ``--task-minutes`` of wall clock (an assumption: the bench's scripted turns take no model
  time) among ``--tasks-per-instance`` tasks; and, apart, what the tier costs standing
  (``--min-instances`` instances, their volumes, the NAT gateway) per month whatever runs.

Machine-independent: calls, bytes, request units, dollars. Times are this machine's and
moto's.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from _aws_meter import AwsMeter, Call  # noqa: E402
from _benchlib import BenchStack, JsonOut, fmt, log, machine, summary, table  # noqa: E402
from _plot import Panel, add_plot_args, plot_from_args  # noqa: E402
from _prices import as_json, quote  # noqa: E402
from _prices import rate as usd  # noqa: E402
from agentq.core.engine import Engine, EngineConfig  # noqa: E402
from agentq.core.engine import _workspace as engine_workspace  # noqa: E402
from agentq.core.models import LLMStep, TaskSubmission, ToolsStep  # noqa: E402
from agentq.core.providers import LLMRequest, LLMResponse, default_provider_factory  # noqa: E402
from agentq.core.tools import default_registry  # noqa: E402
from agentq.core.workspace import EMPTY, Manifest  # noqa: E402
from agentq.core.workspace_disk import ScanCache, scan  # noqa: E402
from agentq.core.workspace_restore import restore  # noqa: E402
from agentq.resources import QueueSettings, provision  # noqa: E402
from agentq.runtime import Settings, build_store, session  # noqa: E402
from agentq.sandbox.workspace import WorkspaceSandbox  # noqa: E402
from agentq.worker import WorkerConfig  # noqa: E402
from agentq_dev.moto_server import LOCAL_CREDENTIALS, MotoServer  # noqa: E402

TARGET_UPLOAD_RATIO = 1.1
TARGET_RESTORE_P99 = 5.0
# Prices: bench/_prices.py, the one table every bench reads. Transfer between S3 and a worker in
# the bucket's region is free; a download to the internet is data_out_gb.
PRICE_KEYS = ("s3_put", "s3_get", "s3_gb_month", "dynamodb_wru", "dynamodb_rru", "data_out_gb",
              "ec2_m7g_large_hour", "ebs_gp3_gb_month", "nat_gateway_hour")  # fmt: skip
HOURS_A_MONTH = 730
GIT_ENV = (
    "export GIT_AUTHOR_NAME=agent GIT_AUTHOR_EMAIL=agent@example.com GIT_COMMITTER_NAME=agent "
    "GIT_COMMITTER_EMAIL=agent@example.com GIT_AUTHOR_DATE='2026-01-01T00:00:00Z' "
    "GIT_COMMITTER_DATE='2026-01-01T00:00:00Z' PYTHONDONTWRITEBYTECODE=1; "
)


def _env() -> None:
    for key, value in LOCAL_CREDENTIALS.items():
        os.environ.setdefault(key, value)


# ============================================================================ the coding task

# Source files of pseudo-words (so git compresses them about as it does code), each with one
# line ``VALUE_<i> = 0`` for the agent to edit, 50 to a directory.
REPO_SCRIPT = """python3 - <<'PY'
import os, random
files, total = {files}, {worktree}
rng = random.Random(7)
words = ["".join(rng.choice("abcdefghijklmnopqrstuvwxyz_") for _ in range(rng.randint(3, 10))) for _ in range(4096)]
each = total // files
for i in range(files):
    d = f"src/pkg{{i // 50:03d}}"
    os.makedirs(d, exist_ok=True)
    line_words = rng.choices(words, k=max(1, each // 7))
    lines = [" ".join(line_words[j:j + 9]) for j in range(0, len(line_words), 9)]
    text = f"VALUE_{{i}} = 0\\n" + "\\n".join("# " + l for l in lines) + "\\n"
    open(f"{{d}}/mod_{{i:05d}}.py", "w").write(text[:max(each, 16)])
PY
git init -q && git add -A && git commit -qm 'the repository' && du -sk . | cut -f1"""

ACTIONS = ("read", "edit", "test", "search", "write", "commit", "status")


def source(i: int) -> str:
    return f"src/pkg{i // 50:03d}/mod_{i:05d}.py"


def coding_turn(turn: int, files: int) -> tuple[str, dict[str, Any]]:
    """Turn ``turn`` (2..) of the coding agent: its action and its tool call."""
    action = ACTIONS[(turn - 2) % len(ACTIONS)]
    k = (turn * 7) % files
    calls = {
        "read": {"name": "read_file", "input": {"path": source(k), "max_lines": 40}},
        "edit": {"name": "edit_file", "input": {"path": source(turn % files), "old_string": f"VALUE_{turn % files} = 0\n",
                                                "new_string": f"VALUE_{turn % files} = {turn}\n"}},
        "test": {"name": "shell", "input": {"command": f"mkdir -p reports && seq 1 400 | sed 's/^/test_case_/; "
                                            f"s/$/ ... ok (run {turn})/' > reports/test-report.txt && tail -1 reports/test-report.txt"}},
        "search": {"name": "search_files", "input": {"pattern": f"VALUE_{k} =", "path": "src", "max_results": 5}},
        "write": {"name": "write_file", "input": {"path": f"tests/test_turn_{turn:03d}.py", "content": "".join(
            f"def test_case_{turn}_{j}():\n    assert {j} + {turn} == {j + turn}\n\n" for j in range(30))}},
        "commit": {"name": "shell", "input": {"command": f"{GIT_ENV}git add -A && git commit -qm 'turn {turn}' && git log --oneline | head -1"}},
        "status": {"name": "shell", "input": {"command": f"{GIT_ENV}git status --short | head -5; git log --oneline | wc -l"}},
    }  # fmt: skip
    return action, calls[action]


def coding_submission(turns: int, repo_mb: float, files: int) -> tuple[TaskSubmission, list[str]]:
    worktree = int(repo_mb * 1024 * 1024 * 0.75)
    clone = {"name": "shell", "input": {"command": GIT_ENV + REPO_SCRIPT.format(files=files, worktree=worktree),
                                        "timeout_seconds": 600}}  # fmt: skip
    script: list[dict[str, Any]] = [{"text": "cloning", "tool_calls": [clone]}]
    actions = ["clone"]
    for turn in range(2, turns + 1):
        action, call = coding_turn(turn, files)
        actions.append(action)
        script.append({"text": f"turn {turn}: {action}", "tool_calls": [call]})
    script.append({"text": "done: the tests pass"})
    sub = TaskSubmission.model_validate(
        {"goal": "workspace cost: a coding task", "provider": "scripted", "script": {"turns": script},
         "constraints": {"tools": ["shell", "read_file", "edit_file", "write_file", "search_files"],
                         "max_steps": 4 * turns + 10, "max_tokens": 100_000_000, "timeout_seconds": 7200}}
    )  # fmt: skip
    return sub, actions


class Turns:
    """The scripted provider, moving the meter's phase to the turn it answers."""

    name = "scripted"

    def __init__(self, sub: TaskSubmission, meter: AwsMeter) -> None:
        self.inner, self.meter, self.calls = default_provider_factory(sub), meter, 0

    def complete(self, request: LLMRequest) -> LLMResponse:
        self.calls += 1
        self.meter.phase = self.calls
        return self.inner.complete(request)


def edited(old: bytes, new: bytes) -> int:
    """Bytes that differ between two versions, once their common prefix and suffix are set aside."""
    prefix = 0
    limit = min(len(old), len(new))
    while prefix < limit and old[prefix] == new[prefix]:
        prefix += 1
    suffix = 0
    while suffix < limit - prefix and old[-1 - suffix] == new[-1 - suffix]:
        suffix += 1
    return max(len(old), len(new)) - prefix - suffix


def step_changes(store: Any, task_id: str, before: Manifest, after: Manifest) -> dict[str, int]:
    was = {e.path: e for e in before.entries if e.kind == "f"}
    changed = changed_bytes = edited_bytes = 0
    for e in after.entries:
        if e.kind != "f" or (e.path in was and was[e.path].digest == e.digest):
            continue
        changed += 1
        changed_bytes += e.size
        if e.path not in was:  # a new file: all of it is new
            edited_bytes += e.size
            continue
        old = store.workspaces.get_blob(task_id, was[e.path].digest)
        edited_bytes += edited(old, store.workspaces.get_blob(task_id, e.digest))
    removed = sum(1 for p in was if p not in after.by_path())
    return {"files_changed": changed, "files_removed": removed, "changed_bytes": changed_bytes,
            "edited_bytes": edited_bytes}  # fmt: skip


def run_coding(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    _env()
    with MotoServer() as server:
        settings = Settings.for_prefix(f"wc{uuid.uuid4().hex[:8]}", server.endpoint_url)
        provision(session(settings), settings.names, endpoint_url=settings.endpoint_url, queues=QueueSettings())
        store = build_store(settings)
        meter = AwsMeter(side_dynamodb=session(settings).client("dynamodb", endpoint_url=settings.endpoint_url))
        meter.phase = 0
        sub, actions = coding_submission(args.turns, args.repo_mb, args.repo_files)
        task = store.tasks.create(sub, tenant="bench")
        provider = Turns(sub, meter)
        engine = Engine(store, worker_id="bench", tools=default_registry(), providers=lambda s: provider,
                        config=EngineConfig(lease_seconds=600, workspace_root=str(work / "coding")))  # fmt: skip
        checkpoint_seconds: dict[int, float] = {}
        original = engine_workspace.Workspaces.checkpoint

        def timed(self: Any, s: Any) -> Any:
            began = time.perf_counter()
            try:
                return original(self, s)
            finally:
                checkpoint_seconds[meter.phase] = time.perf_counter() - began

        engine_workspace.Workspaces.checkpoint = timed  # type: ignore[method-assign]
        meter.install()
        began = time.perf_counter()
        try:
            outcome = engine.run(task.task_id)
        finally:
            meter.uninstall()
            engine_workspace.Workspaces.checkpoint = original  # type: ignore[method-assign]
        seconds = time.perf_counter() - began
        meta = store.tasks.get(task.task_id)
        log(f"coding task: {meta.status.value} in {seconds:.1f}s ({outcome.outcome})")
        assert meta.status.value == "succeeded", (meta.status, meta.error)
        records = store.steps.load(task.task_id)
        tools = [r for r in records if isinstance(r.body, ToolsStep)]
        errors = [o.content[:200] for r in tools for o in r.body.results if o.is_error]  # type: ignore[union-attr]
        rows: list[dict[str, Any]] = []
        previous = EMPTY
        for turn, record in enumerate(tools, start=1):
            body = record.body
            assert isinstance(body, ToolsStep)
            calls = meter.of(turn)
            ws = [c for c in calls if c.what in ("blob", "manifest")]
            row: dict[str, Any] = {
                "turn": turn, "action": actions[turn - 1], "changed": body.workspace is not None,
                "files": 0, "files_changed": 0, "files_removed": 0, "changed_bytes": 0, "edited_bytes": 0,
                "uploaded_bytes": sum(c.sent for c in ws if c.what == "blob" and not c.failed),
                "manifest_bytes": sum(c.sent for c in ws if c.what == "manifest"),
                "blob_puts": sum(1 for c in ws if c.what == "blob"),
                "blob_puts_refused": sum(1 for c in ws if c.what == "blob" and c.failed),
                "manifest_puts": sum(1 for c in ws if c.what == "manifest"),
                "dynamodb_calls": sum(1 for c in calls if c.op.startswith("dynamodb:")),
                "other_s3_calls": sum(1 for c in calls if c.op.startswith("s3:") and c.what == "payload"),
                "wru": sum(c.wru for c in calls), "rru": sum(c.rru for c in calls),
                "checkpoint_ms": round(checkpoint_seconds.get(turn, 0.0) * 1000, 1),
            }  # fmt: skip
            if body.workspace is not None:
                manifest = Manifest.from_bytes(store.workspaces.get_manifest(task.task_id, body.workspace.manifest))
                row |= step_changes(store, task.task_id, previous, manifest)
                row["files"], row["workspace_bytes"] = manifest.files, manifest.total_bytes
                assert body.workspace.uploaded_bytes == row["uploaded_bytes"], (turn, body.workspace, row)
                previous = manifest
            changed_bytes = row["changed_bytes"]
            row["ratio_changed"] = round(row["uploaded_bytes"] / changed_bytes, 3) if changed_bytes else None
            row["ratio_edited"] = round(row["uploaded_bytes"] / row["edited_bytes"], 1) if row["edited_bytes"] else None
            rows.append(row)
        llm_steps = sum(1 for r in records if isinstance(r.body, LLMStep))
        everything = list(meter.calls)
        # The claim's cost: the final state restored from the bucket, as a takeover restores it.
        meter.phase = "restore"
        meter.install()
        began = time.perf_counter()
        try:
            restore(work / "restored", previous, lambda digest: store.workspaces.get_blob(task.task_id, digest))
            store.workspaces.get_manifest(task.task_id, previous.digest)
        finally:
            meter.uninstall()
        restore_seconds = time.perf_counter() - began
        restored = meter.of("restore")
    return {
        "turns": args.turns, "llm_steps": llm_steps, "tools_steps": len(tools), "seconds": round(seconds, 1),
        "repo_files": args.repo_files, "workspace_bytes": previous.total_bytes, "workspace_files": previous.files,
        "manifest_bytes": len(previous.to_bytes()), "tool_errors": errors, "rows": rows,
        "totals": totals(everything, rows),
        "restore": {"seconds": round(restore_seconds, 2), "gets": len(restored),
                    "bytes": sum(c.received for c in restored), "files": previous.files},
    }  # fmt: skip


def totals(calls: list[Call], rows: list[dict[str, Any]]) -> dict[str, Any]:
    changed = [r for r in rows if r["changed"]]
    after_clone = [r for r in changed if r["turn"] > 1]
    by_op = Counter(c.op for c in calls)
    steady = [r["dynamodb_calls"] for r in rows[1:]]
    return {
        "calls_by_op": dict(sorted(by_op.items())),
        "s3_puts": sum(1 for c in calls if c.op == "s3:PutObject"),
        "s3_gets": sum(1 for c in calls if c.op == "s3:GetObject"),
        "s3_put_bytes": sum(c.sent for c in calls),
        "wru": sum(c.wru for c in calls), "rru": sum(c.rru for c in calls),
        "changed_steps": len(changed),
        "uploaded_bytes": sum(r["uploaded_bytes"] for r in rows),
        "changed_bytes": sum(r["changed_bytes"] for r in rows),
        "edited_bytes": sum(r["edited_bytes"] for r in rows),
        "manifest_bytes": sum(r["manifest_bytes"] for r in rows),
        "ratio_changed_max": max((r["ratio_changed"] for r in changed if r["ratio_changed"] is not None), default=None),
        "ratio_changed_after_clone": _ratio(after_clone, "changed_bytes"),
        "ratio_edited_after_clone": _ratio(after_clone, "edited_bytes"),
        "dynamodb_calls_changed_step": sorted({r["dynamodb_calls"] for r in changed if r["turn"] > 1}),
        "dynamodb_calls_unchanged_step": sorted({r["dynamodb_calls"] for r in rows if not r["changed"]}),
        "dynamodb_calls_per_turn_p50": sorted(steady)[len(steady) // 2] if steady else None,
    }  # fmt: skip


def _ratio(rows: list[dict[str, Any]], what: str) -> float | None:
    base = sum(r[what] for r in rows)
    return round(sum(r["uploaded_bytes"] for r in rows) / base, 2) if base else None


# ================================================================== the cost model (computed)


def cost_model(coding: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    """Dollars of the coding task in the deployed design, from its measured calls and bytes.

    Deployed design (docs/SANDBOX.md): the worker that holds the task runs on EC2 in the
    bucket's region, so S3 transfer to and from it is free; every claim (the first, and each
    takeover after a worker dies) restores the whole workspace: one GET per distinct file."""
    t = coding["totals"]
    stored = t["uploaded_bytes"] + t["manifest_bytes"]
    gb = 1024**3
    rows = [
        ("S3 PUT (content + manifests)", t["s3_puts"], usd("s3_put") * t["s3_puts"]),
        ("S3 GET (the first claim's restore)", coding["restore"]["gets"],
         usd("s3_get") * coding["restore"]["gets"]),
        (f"S3 storage, {stored / 1e6:.1f} MB for {args.retention_days} days", stored,
         usd("s3_gb_month") * stored / gb * args.retention_days / 30),
        ("transfer to/from S3 (same region)", t["s3_put_bytes"] + coding["restore"]["bytes"], 0.0),
        ("DynamoDB write units (whole task)", t["wru"], usd("dynamodb_wru") * t["wru"]),
        ("DynamoDB read units (whole task)", t["rru"], usd("dynamodb_rru") * t["rru"]),
    ]  # fmt: skip
    # The EC2 workspace tier: the task's share of an instance and its volume while it runs.
    hours = args.task_minutes / 60
    share = hours / args.tasks_per_instance
    rows += [
        (f"EC2 instance, {args.task_minutes:g} min / {args.tasks_per_instance} tasks an instance (instance-hours)",
         round(share, 4), usd(args.instance_hour_key) * share),
        (f"EBS gp3 root volume, {args.root_gb} GB for that share (GB-months)",
         round(args.root_gb * share / HOURS_A_MONTH, 6), usd("ebs_gp3_gb_month") * args.root_gb * share / HOURS_A_MONTH),
    ]  # fmt: skip
    total = sum(r[2] for r in rows)
    per_resume = usd("s3_get") * coding["restore"]["gets"]
    download = usd("data_out_gb") * coding["workspace_bytes"] / gb
    standing = [
        (f"{args.min_instances} instance(s) always on", usd(args.instance_hour_key) * HOURS_A_MONTH * args.min_instances),
        (f"their {args.root_gb} GB gp3 root volumes", usd("ebs_gp3_gb_month") * args.root_gb * args.min_instances),
        ("the workers' NAT gateway (shared with the Fargate worker)", usd("nat_gateway_hour") * HOURS_A_MONTH),
    ]  # fmt: skip
    return {
        "rows": [{"item": a, "quantity": b, "usd": round(c, 6)} for a, b, c in rows],
        "total_usd": round(total, 6),
        "per_resume_usd": round(per_resume, 6),
        "download_to_internet_usd": round(download, 6),
        "standing_month": [{"item": a, "usd": round(c, 2)} for a, c in standing],
        "standing_month_usd": round(sum(c for _, c in standing), 2),
        "assumed": {"task_minutes": args.task_minutes, "tasks_per_instance": args.tasks_per_instance,
                    "instance": args.instance_hour_key, "root_gb": args.root_gb, "min_instances": args.min_instances},
        "prices": as_json(*PRICE_KEYS),
    }  # fmt: skip


# ============================================================================ restore on SIGKILL

FILES_SCRIPT = """python3 - <<'PY'
import os, random
files, total = {files}, {size}
rng = random.Random(11)
for i in range(files):
    d = f"data/d{{i // 100:04d}}"
    os.makedirs(d, exist_ok=True)
    open(f"{{d}}/f{{i:06d}}.bin", "wb").write(rng.randbytes(total // files))
PY
du -sk data | cut -f1"""


def restore_submission(mb: float, files: int) -> TaskSubmission:
    size = int(mb * 1024 * 1024)
    turns = [
        {"text": "writing the files", "tool_calls": [
            {"name": "shell", "input": {"command": FILES_SCRIPT.format(files=files, size=size), "timeout_seconds": 600}}]},
        {"text": "working", "tool_calls": [
            {"name": "shell", "input": {"command": "date +%s.%N > .started && sleep 590", "timeout_seconds": 600}}]},
        {"text": "done"},
    ]  # fmt: skip
    return TaskSubmission.model_validate(
        {"goal": "workspace cost: restores", "provider": "scripted", "script": {"turns": turns},
         "constraints": {"tools": ["shell"], "max_steps": 20, "max_tokens": 1_000_000, "timeout_seconds": 7200}}
    )  # fmt: skip


def _timings(times: Path, task_id: str) -> list[dict[str, Any]]:
    out = []
    for path in times.glob("*.jsonl"):
        for line in path.read_text().splitlines():
            with contextlib.suppress(ValueError):
                entry = json.loads(line)
                if entry.get("task") == task_id:
                    out.append(entry)
    return sorted(out, key=lambda e: e["at"])


def _wait(what: str, predicate: Any, timeout: float) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise TimeoutError(f"{what}: not within {timeout:.0f}s")


def run_restore_size(mb: float, files: int, restores: int, args: argparse.Namespace, work: Path) -> dict[str, Any]:
    root, times = work / f"restore-{mb:g}" / "root", work / f"restore-{mb:g}" / "times"
    root.mkdir(parents=True)
    times.mkdir(parents=True)
    stack = BenchStack(
        prefix=f"wr{os.getpid()}", workers=2, api=False, sweep_every=None,
        worker_config=WorkerConfig(lease_seconds=args.lease, heartbeat_seconds=args.lease / 4, visibility_seconds=30,
                                   concurrency=2),
        queue_settings=QueueSettings(visibility_timeout=30, max_receive_count=1000),
        extra_env={"AGENTQ_WORKSPACE_ROOT": str(root), "AGENTQ_BENCH_WORKSPACE_TIMES": str(times)},
    )  # fmt: skip
    samples: list[dict[str, Any]] = []
    with stack:
        from agentq.control.submit import submit
        from agentq.runtime import build_registry

        assert stack.settings is not None
        store = stack.store()
        stack.wait_polling()
        task = submit(store, build_registry(stack.settings), restore_submission(mb, files), tenant="bench",
                      queues=stack.queues())  # fmt: skip
        tid = task.task_id
        began, killed_at = time.monotonic(), 0.0
        first = _wait("the first checkpoint", lambda: [e for e in _timings(times, tid) if e["op"] == "checkpoint"], 900)
        log(f"  {mb:g} MB / {files} files written and checkpointed ({first[0]['seconds']:.1f}s to checkpoint), "
            f"{time.monotonic() - began:.0f}s after the submit")  # fmt: skip
        for i in range(restores + 1):
            opened = _wait(
                "the restore", lambda n=i + 1: [e for e in _timings(times, tid) if e["op"] == "open"][n - 1 :], 600
            )
            stamp = Path(opened[0]["directory"]) / ".started"
            entry = opened[0]
            started = float(_wait("the command's start", lambda f=stamp: f.exists() and f.read_text().strip(), 600))
            meta = store.tasks.get(tid)
            if i > 0:  # the first open restored nothing: the task had no files yet
                assert meta.last_claimed_at is not None and entry["bytes"] > 0, (meta, entry)
                samples.append({
                    "restore_s": entry["seconds"], "claim_to_command_s": started - meta.last_claimed_at,
                    "kill_to_claim_s": meta.last_claimed_at - killed_at, "files": entry["files"], "bytes": entry["bytes"],
                })  # fmt: skip
                log(
                    f"  restore {i}/{restores}: {entry['seconds']:.2f}s ({entry['files']} files, "
                    f"{entry['bytes'] / 1e6:.1f} MB); claim to command {started - meta.last_claimed_at:.2f}s"
                )
            if i == restores:
                break
            victim = stack.worker_by_id(meta.lease_owner or "")
            assert victim is not None, meta.lease_owner
            os.kill(victim.pid, signal.SIGKILL)
            killed_at = time.time()
            victim.wait()
            # Nothing removes a SIGKILLed worker's directory; the bench does, to keep the disk.
            for dead in root.glob(f"*-{victim.pid}"):
                shutil.rmtree(dead, ignore_errors=True)
            stack.spawn_worker()
        for proc in stack.alive():  # the task sleeps in its command: no drain to wait for
            proc.kill()
            proc.wait()
    shutil.rmtree(root, ignore_errors=True)
    return {
        "mb": mb, "files": files, "restores": len(samples),
        "restore_s": summary([s["restore_s"] for s in samples]),
        "claim_to_command_s": summary([s["claim_to_command_s"] for s in samples]),
        "kill_to_claim_s": summary([s["kill_to_claim_s"] for s in samples]),
        "first_checkpoint_s": round(first[0]["seconds"], 2),
    }  # fmt: skip


# ============================================================================ shell overhead


def _p(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[max(0, min(len(ordered) - 1, math.ceil(q / 100 * len(ordered)) - 1))]


def run_shell(args: argparse.Namespace, work: Path, sizes: list[tuple[float, int, int]]) -> dict[str, Any]:
    directory = work / "shell"
    directory.mkdir()
    for i in range(20):
        (directory / f"f{i}.py").write_text(f"x = {i}\n")
    env = {"PATH": "/usr/bin:/bin", "HOME": str(work), **{k: v for k, v in os.environ.items() if k.startswith("LANG")}}
    subprocess.run(["bash", "-c", f"{GIT_ENV}git init -q && git add -A && git commit -qm init"], cwd=directory,
                   check=True, env=env)  # fmt: skip
    sandbox = WorkspaceSandbox()
    # A root worker's sandbox is uid 65534 outside and is given the directory (docs/SANDBOX.md), and
    # git run directly by root refuses a repository another user owns unless told it is safe.
    env |= {"GIT_CONFIG_COUNT": "1", "GIT_CONFIG_KEY_0": "safe.directory", "GIT_CONFIG_VALUE_0": str(directory)}
    commands = {"true": "true", "git status": "git status --short", "python3 -c pass": "python3 -c pass",
                "ls -laR": "ls -laR > /dev/null"}  # fmt: skip
    rows = []
    for name, command in commands.items():
        direct, sandboxed = [], []
        for i in range(args.runs + 2):
            began = time.perf_counter()
            done = subprocess.run(["bash", "-c", command], cwd=directory, env=env, capture_output=True, check=False)
            d = time.perf_counter() - began
            began = time.perf_counter()
            result = sandbox.shell(directory, command, 30)
            s = time.perf_counter() - began
            assert done.returncode == 0 and result.exit_code == 0, (command, done.stderr, result.stderr)
            if i >= 2:  # two warm-up runs
                direct.append(d * 1000)
                sandboxed.append(s * 1000)
        rows.append({"command": name, "direct_p50_ms": round(_p(direct, 50), 1), "direct_p90_ms": round(_p(direct, 90), 1),
                     "sandbox_p50_ms": round(_p(sandboxed, 50), 1), "sandbox_p90_ms": round(_p(sandboxed, 90), 1),
                     "overhead_p50_ms": round(_p(sandboxed, 50) - _p(direct, 50), 1)})  # fmt: skip
    scans = []
    for mb, files, _ in sizes:
        target = work / f"scan-{mb:g}"
        rng = random.Random(3)
        for i in range(files):
            folder = target / f"d{i // 100:04d}"
            folder.mkdir(parents=True, exist_ok=True)
            (folder / f"f{i:06d}.bin").write_bytes(rng.randbytes(int(mb * 1024 * 1024) // files))
        cache = ScanCache()
        began = time.perf_counter()
        cold = scan(target, cache)
        cold_s = time.perf_counter() - began
        warm = []
        for _ in range(max(3, args.runs // 3)):
            began = time.perf_counter()
            assert scan(target, cache).digest == cold.digest
            warm.append((time.perf_counter() - began) * 1000)
        scans.append({"mb": mb, "files": files, "first_scan_ms": round(cold_s * 1000, 1),
                      "unchanged_scan_p50_ms": round(_p(warm, 50), 1), "unchanged_scan_p90_ms": round(_p(warm, 90), 1),
                      "manifest_bytes": len(cold.to_bytes())})  # fmt: skip
        shutil.rmtree(target)
    return {"runs": args.runs, "rows": rows, "scans": scans}


# ============================================================================ output


def render(result: dict[str, Any]) -> str:
    out: list[str] = []
    coding = result.get("coding")
    if coding:
        t = coding["totals"]
        out.append(f"coding task: {coding['turns']} tool turns ({coding['tools_steps']} tools steps, "
                   f"{coding['llm_steps']} LLM steps), workspace {coding['workspace_bytes'] / 1e6:.1f} MB in "
                   f"{coding['workspace_files']:,} files (repository: {coding['repo_files']:,} source files + .git), "
                   f"{coding['seconds']}s")  # fmt: skip
        headers = ["turn", "action", "files chg", "changed B", "edited B", "uploaded B", "manifest B", "up/changed",
                   "up/edited", "PUTs", "DDB calls", "WRU", "ckpt ms"]  # fmt: skip
        rows = [[r["turn"], r["action"], r["files_changed"], f"{r['changed_bytes']:,}", f"{r['edited_bytes']:,}",
                 f"{r['uploaded_bytes']:,}", f"{r['manifest_bytes']:,}", fmt(r["ratio_changed"], 2),
                 fmt(r["ratio_edited"], 1), r["blob_puts"] + r["manifest_puts"], r["dynamodb_calls"], r["wru"],
                 fmt(r["checkpoint_ms"], 1)] for r in coding["rows"]]  # fmt: skip
        out.append(table(headers, rows))
        out.append(
            f"totals: uploaded {t['uploaded_bytes']:,} B of content for {t['changed_bytes']:,} B changed "
            f"(after the clone: {fmt(t['ratio_changed_after_clone'], 2)}x the bytes changed, "
            f"{fmt(t['ratio_edited_after_clone'], 1)}x the bytes edited; worst step {fmt(t['ratio_changed_max'], 2)}x; "
            f"target <= {TARGET_UPLOAD_RATIO}x changed) + {t['manifest_bytes']:,} B of manifests "
            f"({coding['manifest_bytes']:,} B each at the end) in {t['changed_steps']} changed steps; "
            f"DynamoDB calls per changed step {t['dynamodb_calls_changed_step']}, per unchanged step "
            f"{t['dynamodb_calls_unchanged_step']}; calls {t['calls_by_op']}")  # fmt: skip
        r = coding["restore"]
        out.append(f"a claim's restore of the final state: {r['gets']} GETs, {r['bytes']:,} B, {r['seconds']}s "
                   f"(in this process, from moto)")  # fmt: skip
        if coding["tool_errors"]:
            out.append(f"!! tool errors: {coding['tool_errors']}")
    model = result.get("model")
    if model:
        out.append("\nthe coding task's bill in the deployed design (computed from the measured calls and bytes):")
        out.append(table(["item", "quantity", "USD"],
                         [[r["item"], f"{r['quantity']:,}", f"{r['usd']:.6f}"] for r in model["rows"]]))  # fmt: skip
        out.append(f"total ${model['total_usd']:.4f}; each resume adds ${model['per_resume_usd']:.6f} of GETs; "
                   f"downloading the final workspace to a laptop ${model['download_to_internet_usd']:.4f}")  # fmt: skip
        out.append("the EC2 workspace tier standing, per month: " + "; ".join(
            f"{r['item']} ${r['usd']:.2f}" for r in model["standing_month"]) + f"; ${model['standing_month_usd']:.2f}")  # fmt: skip
        out.append(f"prices: {quote(*PRICE_KEYS)}")
    restores = result.get("restore")
    if restores:
        headers = ["workspace", "restores", "restore p50 s", "p99 s", "max s", "claim->command p50", "p99",
                   "kill->claim p50", "first checkpoint s"]  # fmt: skip
        rows = [[f"{r['mb']:g} MB / {r['files']:,} files", r["restores"], fmt(r["restore_s"]["p50"], 2),
                 fmt(r["restore_s"]["p99"], 2), fmt(r["restore_s"]["max"], 2), fmt(r["claim_to_command_s"]["p50"], 2),
                 fmt(r["claim_to_command_s"]["p99"], 2), fmt(r["kill_to_claim_s"]["p50"], 2),
                 fmt(r["first_checkpoint_s"], 1)] for r in restores]  # fmt: skip
        out.append("\nrestore after a SIGKILL (local stack; target p99 <= 5 s at 10 MB / 1,000 files):")
        out.append(table(headers, rows))
    shell = result.get("shell")
    if shell:
        out.append(f"\na shell command, sandboxed vs direct ({shell['runs']} runs each, after 2 warm-ups):")
        out.append(table(["command", "direct p50 ms", "p90", "sandbox p50 ms", "p90", "overhead p50 ms"],
                         [[r["command"], r["direct_p50_ms"], r["direct_p90_ms"], r["sandbox_p50_ms"],
                           r["sandbox_p90_ms"], r["overhead_p50_ms"]] for r in shell["rows"]]))  # fmt: skip
        out.append(table(["workspace", "first scan ms", "unchanged scan p50 ms", "p90", "manifest B"],
                         [[f"{s['mb']:g} MB / {s['files']:,} files", s["first_scan_ms"], s["unchanged_scan_p50_ms"],
                           s["unchanged_scan_p90_ms"], f"{s['manifest_bytes']:,}"] for s in shell["scans"]]))  # fmt: skip
    return "\n".join(out)


def panels(result: dict[str, Any]) -> list[Panel]:
    out: list[Panel] = []
    coding = result.get("coding")
    if coding:
        rows = [r for r in coding["rows"] if r["changed"] and r["turn"] > 1]
        out.append(Panel("bar", "bytes per changed step (after the clone)", "KB", [f"{r['turn']}" for r in rows], {
            "changed": [r["changed_bytes"] / 1024 for r in rows], "uploaded": [r["uploaded_bytes"] / 1024 for r in rows],
            "manifest": [r["manifest_bytes"] / 1024 for r in rows]}, xlabel="turn", logy=True))  # fmt: skip
    if result.get("restore"):
        names = [f"{r['mb']:g} MB/{r['files']:,}" for r in result["restore"]]
        out.append(Panel("bar", "restore after SIGKILL", "s", names, {
            q: [r["restore_s"][q] for r in result["restore"]] for q in ("p50", "p99")},
            hlines={"target p99 (10 MB)": TARGET_RESTORE_P99}))  # fmt: skip
    if result.get("shell"):
        rows = result["shell"]["rows"]
        out.append(
            Panel(
                "bar",
                "a shell command",
                "ms p50",
                [r["command"] for r in rows],
                {"direct": [r["direct_p50_ms"] for r in rows], "sandboxed": [r["sandbox_p50_ms"] for r in rows]},
            )
        )
    return out


def parse_sizes(text: str) -> list[tuple[float, int, int]]:
    out = []
    for part in text.split(","):
        mb, files, restores = part.split(":")
        out.append((float(mb), int(files), int(restores)))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--parts", default="coding,model,restore,shell", help="coding,model,restore,shell")
    ap.add_argument("--turns", type=int, default=50, help="tool turns of the coding task (the first clones)")
    ap.add_argument("--repo-mb", type=float, default=100.0, help="the repository's size (worktree + .git)")
    ap.add_argument("--repo-files", type=int, default=2000, help="source files in the repository")
    ap.add_argument("--sizes", type=parse_sizes, default=parse_sizes("10:1000:100,200:20000:10"),
                    help="restore and scan sizes, MB:FILES:RESTORES,...")  # fmt: skip
    ap.add_argument("--lease", type=float, default=2.0, help="the workers' lease in the restore part")
    ap.add_argument("--runs", type=int, default=30, help="runs of each shell command")
    ap.add_argument("--retention-days", type=int, default=30, help="how long the task's content is kept")
    ap.add_argument(
        "--task-minutes",
        type=float,
        default=25.0,
        help="the coding task's wall clock in production (model turns included), for its instance share",
    )
    ap.add_argument("--tasks-per-instance", type=int, default=16, help="workspace.ec2.concurrency")
    ap.add_argument(
        "--instance-hour-key", default="ec2_m7g_large_hour", help="the instance's price in bench/_prices.py"
    )
    ap.add_argument("--root-gb", type=int, default=100, help="workspace.ec2.root_volume_gb")
    ap.add_argument("--min-instances", type=int, default=1, help="workspace.ec2.min_instances, for the standing cost")
    ap.add_argument("--json", action="store_true")
    add_plot_args(ap, "workspace_cost")
    args = ap.parse_args(argv)
    parts = set(args.parts.split(","))
    work = Path(tempfile.mkdtemp(prefix="agentq-wscost-"))
    result: dict[str, Any] = {"parts": sorted(parts)}
    try:
        with JsonOut(args.json) as out:
            result["machine"] = machine()
            if "coding" in parts or "model" in parts:
                result["coding"] = run_coding(args, work)
                result["model"] = cost_model(result["coding"], args)
            if "restore" in parts:
                result["restore"] = [run_restore_size(mb, files, n, args, work) for mb, files, n in args.sizes]
            if "shell" in parts:
                result["shell"] = run_shell(args, work, args.sizes)
            result["loadavg_at_end"] = [round(x, 2) for x in os.getloadavg()]
            if args.json:
                out.emit(result)
            else:
                print(render(result))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    plot_from_args(args, "agentq: what a task's workspace costs", panels(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
