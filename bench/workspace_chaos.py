"""Workspaces under chaos: workers SIGKILLed at random while agents write and edit files, then
every task's files compared with what its committed steps say (issue 42's chaos run).

    python bench/workspace_chaos.py                       # until 200 kill-resume cycles (~5 min)
    python bench/workspace_chaos.py --cycles 20 --live 6 --seed 3 --json

What runs: the local stack (moto server, no API) and ``--workers`` worker processes, each task a
scripted agent of ``--turns`` turns, every turn one change to its workspace drawn at random
(seeded) from what agents do to files: ``write_file`` (a new file or over an old one),
``edit_file`` (an exact replacement), and ``shell`` commands that append a line to a journal
(the replay hazard: an append run twice is a line too many), create a file deeper down,
remove a file, move one, change its mode, make a symbolic link, remove a whole directory. Each
turn's shell call then sleeps ``--pause`` s, so a kill often lands after the change was made
and before its step committed. A chaos loop SIGKILLs a random worker holding a running task
every 0.5-2 s and starts a replacement; the other workers take its tasks over (each claim
restores the workspace of the task's last committed step); the dead worker's directories are
compared with the last committed manifests first (how many kills left uncommitted changes). New tasks are submitted to keep ``--live`` running until the
tasks' claims that took over a run in progress (``resume_count``, summed) reach ``--cycles``;
then the chaos stops and every task runs to its end.

Checked, for every task: it succeeded, no tool call failed, and for each committed tools
step, the manifest it names equals the model's state after applying, once each and in order,
the tool calls its committed LLM steps made (files by content hash and mode, links by target,
directories by path); the final state (META's) restores from the bucket byte for byte (the
restore checks every object's hash and the result against the manifest). Counted: files lost
(in the model, not in the manifest), extra (in the manifest, not in the model), different
(content, mode or target), across every committed step. Target: 0 lost or extra files in 200
kill-resume cycles.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from _benchlib import log, table  # noqa: E402
from _plot import Panel, add_plot_args  # noqa: E402
from _report import report  # noqa: E402
from agentq.control.submit import submit  # noqa: E402
from agentq.core.models import LLMStep, TaskSubmission, ToolsStep  # noqa: E402
from agentq.core.workspace import EMPTY, Manifest, WorkspaceRefused  # noqa: E402
from agentq.core.workspace_disk import scan  # noqa: E402
from agentq.core.workspace_restore import restore  # noqa: E402
from agentq.resources import QueueSettings  # noqa: E402
from agentq.runtime import build_registry  # noqa: E402
from agentq.worker import WorkerConfig  # noqa: E402
from agentq_dev.stack import LocalStack  # noqa: E402

NEW_FILE_MODE = 0o644  # write_file's new files (0666 & ~umask 022: the workers' umask)
WORDS = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi rho sigma tau".split()


# ============================================================================ the model


@dataclass
class Tree:
    """What a workspace should hold: files (content, mode), links (target), directories."""

    files: dict[str, tuple[bytes, int]] = field(default_factory=dict)
    links: dict[str, str] = field(default_factory=dict)
    dirs: set[str] = field(default_factory=set)

    def parents(self, path: str) -> None:
        parts = path.split("/")[:-1]
        self.dirs.update("/".join(parts[: i + 1]) for i in range(len(parts)))

    def apply(self, op: dict[str, Any]) -> None:
        kind = op["op"]
        if kind in ("write", "mkfile", "append"):
            self.parents(op["path"])
            old = self.files.get(op["path"])
            data = op["content"].encode()
            if kind == "append":
                data = (old[0] if old else b"") + data
            mode = op.get("mode") or (old[1] if old else NEW_FILE_MODE)
            self.files[op["path"]] = (data, mode)
        elif kind == "edit":
            data, mode = self.files[op["path"]]
            self.files[op["path"]] = (data.replace(op["old"].encode(), op["new"].encode(), 1), mode)
        elif kind == "rm":
            self.files.pop(op["path"], None)
            self.links.pop(op["path"], None)
        elif kind == "mv":
            self.parents(op["dst"])
            if op["src"] in self.files:
                self.files[op["dst"]] = self.files.pop(op["src"])
            else:
                self.links[op["dst"]] = self.links.pop(op["src"])
        elif kind == "chmod":
            data, _ = self.files[op["path"]]
            self.files[op["path"]] = (data, op["mode"])
        elif kind == "link":
            self.parents(op["path"])
            self.links[op["path"]] = op["target"]
        elif kind == "rmtree":
            prefix = op["path"] + "/"
            for table_ in (self.files, self.links):
                for p in [p for p in table_ if p.startswith(prefix)]:
                    del table_[p]
            self.dirs = {d for d in self.dirs if d != op["path"] and not d.startswith(prefix)}
        else:
            raise ValueError(kind)

    def compare(self, manifest: Manifest) -> Counter[str]:
        """lost / extra / different entries of ``manifest`` against this tree."""
        got = manifest.by_path()
        want: dict[str, tuple[str, int, str]] = {
            p: ("f", mode, hashlib.sha256(data).hexdigest()) for p, (data, mode) in self.files.items()
        }
        want |= {p: ("l", 0o777, target) for p, target in self.links.items()}
        out: Counter[str] = Counter()
        for path, (kind, mode, digest) in want.items():
            e = got.get(path)
            if e is None:
                out["lost"] += 1
            elif (e.kind, e.mode, e.digest) != (kind, mode, digest):
                out["different"] += 1
        for path, e in got.items():
            if e.kind == "d":
                out["dirs_extra"] += path not in self.dirs
            elif path not in want:
                out["extra"] += 1
        out["dirs_lost"] += sum(1 for d in self.dirs if d not in got or got[d].kind != "d")
        return out


def _text(rng: random.Random, marker: str) -> str:
    lines = [" ".join(rng.choices(WORDS, k=rng.randint(3, 12))) for _ in range(rng.randint(1, 40))]
    return f"{marker}\n" + "\n".join(lines) + "\n"


def plan_ops(rng: random.Random, turns: int, tag: str) -> list[dict[str, Any]]:
    """A valid sequence of ``turns`` changes (each checked against the model as it is drawn)."""
    tree, serial = Tree(), 0
    ops: list[dict[str, Any]] = []

    def marker() -> str:
        nonlocal serial
        serial += 1
        return f"mark-{tag}-{serial}"

    for turn in range(turns):
        op: dict[str, Any]
        files = sorted(p for p in tree.files if not p.startswith("log/"))
        dirs = sorted(d for d in tree.dirs if d.startswith("deep/") and d.count("/") == 1)
        # Appends, edits and moves twice as often: run twice on a disk that kept the first run's
        # change, they leave a trace (a line too many, an edit or a move that fails).
        choices = ["write", "append", "append", "mkfile", "link"]
        if files:
            choices += ["write", "edit", "edit", "rm", "mv", "mv", "chmod"]
        if dirs:
            choices.append("rmtree")
        kind = rng.choice(choices) if turn else "write"
        if kind == "write":
            path = rng.choice(files) if files and rng.random() < 0.3 else f"notes/n{turn}-{rng.randint(0, 99)}.md"
            op = {"op": "write", "path": path, "content": _text(rng, marker())}
        elif kind == "append":
            op = {"op": "append", "path": "log/journal.txt", "content": f"turn {turn} {marker()}\n", "mode": 0o644}
        elif kind == "mkfile":
            path = f"deep/d{rng.randint(0, 3)}/e{turn}/f.txt"
            op = {"op": "mkfile", "path": path, "content": _text(rng, marker()), "mode": 0o600}
        elif kind == "link":
            op = {"op": "link", "path": f"links/l{turn}", "target": rng.choice([*files, "../missing"])}
        elif kind == "edit":
            path = rng.choice(files)
            old = tree.files[path][0].decode().split("\n", 1)[0]
            op = {"op": "edit", "path": path, "old": old, "new": marker()}
        elif kind == "rm":
            op = {"op": "rm", "path": rng.choice(files)}
        elif kind == "mv":
            op = {"op": "mv", "src": rng.choice(files), "dst": f"moved/m{turn}.txt"}
        elif kind == "chmod":
            op = {"op": "chmod", "path": rng.choice(files), "mode": rng.choice([0o600, 0o640, 0o755, 0o700])}
        else:
            op = {"op": "rmtree", "path": rng.choice(dirs)}
        tree.apply(op)
        ops.append(op)
    return ops


def tool_call(op: dict[str, Any], pause: float) -> list[dict[str, Any]]:
    """The turn's tool calls for ``op``: a file tool and a pause, or one shell command."""
    q = shlex.quote
    sleep = {"name": "shell", "input": {"command": f"sleep {pause}"}}
    kind = op["op"]
    if kind == "write":
        return [{"name": "write_file", "input": {"path": op["path"], "content": op["content"]}}, sleep]
    if kind == "edit":
        return [{"name": "edit_file", "input": {"path": op["path"], "old_string": op["old"], "new_string": op["new"]}},
                sleep]  # fmt: skip
    path = op.get("path", "")
    parent = q(os.path.dirname(path) or ".")
    if kind in ("append", "mkfile"):
        to, mode = (">>", "644") if kind == "append" else (">", "600")
        command = f"mkdir -p {parent} && printf %s {q(op['content'])} {to} {q(path)} && chmod {mode} {q(path)}"
    elif kind == "rm":
        command = f"rm -f {q(path)}"
    elif kind == "mv":
        command = f"mkdir -p {q(os.path.dirname(op['dst']))} && mv {q(op['src'])} {q(op['dst'])}"
    elif kind == "chmod":
        command = f"chmod {oct(op['mode'])[2:]} {q(path)}"
    elif kind == "link":
        command = f"mkdir -p {parent} && ln -sfn {q(op['target'])} {q(path)}"
    else:
        command = f"rm -rf {q(path)}"
    return [{"name": "shell", "input": {"command": f"set -e; {command}; sleep {pause}"}}]


def submission(ops: list[dict[str, Any]], pause: float) -> TaskSubmission:
    turns = [{"text": f"turn {i}: {op['op']}", "tool_calls": tool_call(op, pause)} for i, op in enumerate(ops)]
    turns.append({"text": "done"})
    return TaskSubmission.model_validate(
        {"goal": "workspace chaos", "provider": "scripted", "script": {"turns": turns},
         "constraints": {"tools": ["shell", "write_file", "edit_file"], "max_steps": 4 * len(ops) + 10,
                         "max_tokens": 10_000_000, "timeout_seconds": 3600}}
    )  # fmt: skip


# ============================================================================ the check


def check_task(store: Any, task_id: str, ops: list[dict[str, Any]], pause: float, work: Path) -> dict[str, Any]:
    """The task's committed steps against the model (see the module's docstring)."""
    meta = store.tasks.get(task_id)
    planned = {}
    for op in ops:
        for call in tool_call(op, pause):
            if call["name"] != "shell" or not call["input"]["command"].startswith("sleep"):
                planned[json.dumps(call["input"], sort_keys=True)] = op
    tree, counts, calls = Tree(), Counter[str](), {}
    steps = store.steps.load(task_id)
    for record in steps:
        body = record.body
        if isinstance(body, LLMStep):
            calls = {b["id"]: b["input"] for b in body.content if b.get("type") == "tool_use"}
        elif isinstance(body, ToolsStep):
            for outcome in body.results:
                if outcome.is_error or (outcome.name == "shell" and not outcome.content.startswith("exit code 0\n")):
                    counts["tool_errors"] += 1
                    continue
                made = planned.get(json.dumps(calls[outcome.tool_use_id], sort_keys=True))
                if made is not None:
                    tree.apply(made)
            if body.workspace is not None:
                counts["manifests_checked"] += 1
                counts.update(
                    tree.compare(Manifest.from_bytes(store.workspaces.get_manifest(task_id, body.workspace.manifest)))
                )
    final = (
        Manifest.from_bytes(store.workspaces.get_manifest(task_id, meta.workspace.manifest)) if meta.workspace else None
    )
    if final is not None:
        counts.update({f"final_{k}": v for k, v in tree.compare(final).items()})
        target = work / "restored" / task_id
        restore(target, final, lambda digest: store.workspaces.get_blob(task_id, digest))  # raises if not exact
        counts["restored"] += 1
        counts["final_files"] += final.files
    return {"task": task_id, "status": meta.status.value, "resumes": meta.resume_count, "claims": meta.claim_count,
            "steps": meta.step, "counts": dict(counts)}  # fmt: skip


# ============================================================================ the run


@dataclass
class Fleet:
    stack: LocalStack
    logs: Path
    rng: random.Random
    workers: list[subprocess.Popen[bytes]] = field(default_factory=list)
    kills: int = 0

    def spawn(self) -> None:
        out = (self.logs / f"worker-{len(self.workers)}.log").open("wb")
        self.workers.append(self.stack.worker_process(stdout=out, stderr=out))

    def kill_one(self, owners: set[str]) -> int | None:
        """SIGKILL a random worker among those holding a task (``owners``: lease owners,
        ``host:pid``) and start a replacement; its pid (None: no worker holds one)."""
        pids = {int(o.rsplit(":", 1)[-1]) for o in owners if o}
        holding = [w for w in self.workers if w.poll() is None and w.pid in pids]
        if not holding:
            return None
        victim = self.rng.choice(holding)
        victim.kill()
        victim.wait()
        self.kills += 1
        self.spawn()
        return victim.pid

    def stop(self) -> None:
        for w in self.workers:
            if w.poll() is None:
                w.terminate()
        for w in self.workers:
            try:
                w.wait(timeout=30)
            except subprocess.TimeoutExpired:
                w.kill()


def left_behind(store: Any, root: Path, pid: int, seen: Counter[str]) -> None:
    """What the SIGKILLed worker ``pid`` left on disk, per task: its directory against the last
    committed step's manifest. Different: the kill landed after a change and before its step
    committed (the case the restore is for; counted as ``dirty``). Then the directory is removed
    (nothing else removes a SIGKILLed worker's directories)."""
    for directory in root.glob(f"*-{pid}/*"):
        task = store.tasks.get(directory.name.split(".")[0])
        committed = task.workspace.manifest if task.workspace is not None else EMPTY.digest
        try:
            seen["dirty" if scan(directory).digest != committed else "clean"] += 1
        except WorkspaceRefused:
            seen["unreadable"] += 1
    for base in root.glob(f"*-{pid}"):
        shutil.rmtree(base, ignore_errors=True)


def run(args: argparse.Namespace) -> dict[str, Any]:
    rng = random.Random(args.seed)
    work = Path(tempfile.mkdtemp(prefix="agentq-wschaos-"))
    began = time.monotonic()
    stack = LocalStack(
        prefix=f"wsch{os.getpid()}", workers=0, api=False, sweep_every=5.0, sweep_stale_after=30.0,
        worker_config=WorkerConfig(lease_seconds=args.lease, heartbeat_seconds=args.lease / 4, visibility_seconds=30,
                                   concurrency=args.concurrency),
        queue_settings=QueueSettings(visibility_timeout=30, max_receive_count=1000),
        extra_env={"AGENTQ_WORKSPACE_ROOT": str(work / "workspaces")},
    )  # fmt: skip
    fleet = Fleet(stack, work, random.Random(args.seed + 1))
    plans: dict[str, list[dict[str, Any]]] = {}
    stack.start()
    try:
        assert stack.settings is not None
        store, registry, queues = stack.store(), build_registry(stack.settings), stack.queues()
        for _ in range(args.workers):
            fleet.spawn()

        def launch() -> None:
            ops = plan_ops(random.Random(rng.random()), args.turns, f"t{len(plans)}")
            plans[submit(store, registry, submission(ops, args.pause), tenant="chaos", queues=queues).task_id] = ops

        for _ in range(args.live):
            launch()
        cycles, next_kill = 0, time.monotonic() + fleet.rng.uniform(0.5, 2)
        resumes: dict[str, int] = {}
        ended: set[str] = set()
        owners: set[str] = set()
        on_disk: Counter[str] = Counter()
        while cycles < args.cycles:
            if time.monotonic() >= next_kill and (pid := fleet.kill_one(owners)) is not None:
                left_behind(store, work / "workspaces", pid, on_disk)
                next_kill = time.monotonic() + fleet.rng.uniform(0.5, 2)
            time.sleep(0.2)
            owners = set()
            for t in [t for t in plans if t not in ended]:
                meta = store.tasks.get(t)
                resumes[t] = meta.resume_count
                if meta.status.terminal:
                    ended.add(t)
                elif meta.status.value == "running":
                    owners.add(meta.lease_owner or "")
            cycles = sum(resumes.values())
            for _ in range(args.live - (len(plans) - len(ended))):
                launch()
            if args.max_seconds and time.monotonic() - began > args.max_seconds:
                log(f"!! stopped at {cycles} cycles: --max-seconds {args.max_seconds} passed")
                break
        log(f"{cycles} kill-resume cycles after {fleet.kills} kills, {len(plans)} tasks; draining")
        deadline = time.monotonic() + args.drain_seconds
        while time.monotonic() < deadline and not all(store.tasks.get(t).status.terminal for t in plans):
            time.sleep(0.5)
        checked = [check_task(store, t, ops, args.pause, work) for t, ops in plans.items()]
    finally:
        fleet.stop()
        stack.stop()
    tracebacks = sum(p.read_text(errors="replace").count("Traceback") for p in work.glob("worker-*.log"))
    totals: Counter[str] = Counter()
    for c in checked:
        totals.update(c["counts"])
    statuses = Counter(c["status"] for c in checked)
    resumes = sum(c["resumes"] for c in checked)
    invariants = {
        "every task succeeded": statuses == Counter({"succeeded": len(checked)}),
        "no tool call failed": totals["tool_errors"] == 0,
        "0 files lost (every committed step)": totals["lost"] == 0 and totals["final_lost"] == 0,
        "0 extra files (every committed step)": totals["extra"] == 0 and totals["final_extra"] == 0,
        "0 files different (content, mode, target)": totals["different"] == 0 and totals["final_different"] == 0,
        "directories as the steps say": not any(totals[k] for k in ("dirs_lost", "dirs_extra")),
        "every final state restores byte for byte": totals["restored"] == sum(1 for c in checked if c["steps"]),
        "no worker traceback": tracebacks == 0,
    }
    figures = {
        "tasks": len(checked), "by status": dict(statuses), "kills": fleet.kills,
        "kill-resume cycles (claims that took over a run)": resumes,
        "killed runs that had changed files their step never committed": on_disk["dirty"],
        "killed runs with nothing uncommitted on disk": on_disk["clean"],
        "claims": sum(c["claims"] for c in checked), "steps committed": sum(c["steps"] for c in checked),
        "manifests checked": totals["manifests_checked"], "final files checked": totals["final_files"],
        "lost": totals["lost"] + totals["final_lost"], "extra": totals["extra"] + totals["final_extra"],
        "different": totals["different"] + totals["final_different"], "tool errors": totals["tool_errors"],
        "wall seconds": round(time.monotonic() - began, 1), "worker logs": str(work),
    }  # fmt: skip
    return {"ok": all(invariants.values()), "invariants": invariants, "figures": figures,
            "resumes_per_task": sorted(c["resumes"] for c in checked),
            "settings": {k: v for k, v in vars(args).items() if k not in ("json", "plot", "no_plot")}}  # fmt: skip


def render(result: dict[str, Any]) -> str:
    rows = [[name, "ok" if held else "BROKEN"] for name, held in result["invariants"].items()]
    figures = [[name, json.dumps(v) if isinstance(v, dict) else v] for name, v in result["figures"].items()]
    return table(["invariant", ""], rows) + "\n\n" + table(["figure", "value"], figures)


def panels(result: dict[str, Any]) -> list[Panel]:
    per = Counter(result["resumes_per_task"])
    f = result["figures"]
    return [
        Panel("bar", "kill-resume cycles per task", "tasks", [str(k) for k in sorted(per)], {"tasks": [per[k] for k in sorted(per)]},
              xlabel="claims that took the task over"),
        Panel("bar", "files against the committed steps", "count", ["lost", "extra", "different"],
              {"files": [f["lost"], f["extra"], f["different"]]}),
    ]  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cycles", type=int, default=200, help="kill-resume cycles to reach before the chaos stops")
    ap.add_argument("--workers", type=int, default=3)
    ap.add_argument("--concurrency", type=int, default=8, help="tasks per worker")
    ap.add_argument("--live", type=int, default=12, help="tasks kept running")
    ap.add_argument("--turns", type=int, default=12, help="changes per task")
    ap.add_argument("--pause", type=float, default=1.0, help="seconds each turn's shell call sleeps after its change")
    ap.add_argument("--lease", type=float, default=2.0)
    ap.add_argument("--drain-seconds", type=float, default=300)
    ap.add_argument("--max-seconds", type=float, default=0, help="stop the chaos after this long whatever the cycles")
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--json", action="store_true")
    add_plot_args(ap, "workspace_chaos")
    args = ap.parse_args(argv)
    result = report(args, "agentq workspaces under SIGKILL", run, render, panels)
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
