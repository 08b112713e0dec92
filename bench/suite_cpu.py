"""Where the test suite's CPU goes: by kind of process and by the test that started it.

    python bench/suite_cpu.py                                   # make test, whole
    python bench/suite_cpu.py --pytest "-n 0 tests/test_forkserver.py" --json

``make test`` is CPU-bound on two cores (the cores stay busy for the whole run), so its time is
its CPU over two, and the way to a shorter suite is less CPU. This runs the suite (``make test``,
or ``pytest`` with the arguments ``--pytest`` gives) while a thread reads every process's CPU from
/proc every ``--every`` s, and the fork server (``agentq_dev.forkserver``, which starts the
suite's moto servers, workers, API processes and racers) notes each fork's command and the
test that asked for it (``AGENTQ_FORK_LOG``): a fork's /proc shows only the fork server's
command line and environment. It prints the CPU seconds by kind (xdist workers: the tests'
own code; moto servers; agentq processes; Chromium; node (the CDK's jsii); the rest) and the
forks' CPU by test file, counting only the suite's processes (those under the command, by the
parents seen, and the forks noted for it, under them too); with the whole machine's busy CPU beside them, what no sample saw (processes
shorter than a sample, orphans, and other work on the machine) is their difference.

A process started before the suite counts only what it spent during it. A process that forks
without the fork server (pytest's xdist workers, Chromium, node) is counted by its command line.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from _benchlib import log, table
from _plot import Panel, add_plot_args
from _report import report
from agentq_dev import forkserver

ROOT = Path(__file__).resolve().parent.parent
TICK = os.sysconf("SC_CLK_TCK")
KINDS = (
    "xdist workers (tests' own code)",
    "moto servers",
    "agentq processes",
    "chromium",
    "node (jsii)",
    "fork server, forks not noted",
    "other",
)


def _busy_seconds() -> float:
    """The machine's busy CPU seconds since boot (every core: /proc/stat's first line less idle)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:8]]
    return (sum(fields) - fields[3] - fields[4]) / TICK


class Sampler(threading.Thread):
    """Every process's own CPU (user + system), first and last seen, by pid and start time."""

    def __init__(self, every: float) -> None:
        super().__init__(daemon=True)
        self.every = every
        self.seen: dict[str, dict[str, Any]] = {}
        self.stopping = threading.Event()

    def run(self) -> None:
        while not self.stopping.is_set():
            self.sample()
            self.stopping.wait(self.every)
        self.sample()

    def sample(self) -> None:
        for name in os.listdir("/proc"):
            if not name.isdigit():
                continue
            try:
                stat = Path(f"/proc/{name}/stat").read_text()
                rest = stat[stat.rindex(")") + 2 :].split()
                cpu = (int(rest[11]) + int(rest[12])) / TICK
                key = f"{name}:{rest[19]}"
                if key in self.seen:
                    self.seen[key]["cpu"] = max(self.seen[key]["cpu"], cpu)
                    continue
                cmd = Path(f"/proc/{name}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                self.seen[key] = {"pid": int(name), "ppid": int(rest[1]), "cmd": cmd[:300], "cpu0": cpu, "cpu": cpu}
            except (OSError, ValueError, IndexError):
                continue  # ended between the listing and the read


def _descends(pid: int, roots: set[int], parent: dict[int, int]) -> bool:
    """Whether ``pid`` is one of ``roots`` or under one, by the parents seen when each was first seen."""
    for _ in range(64):
        if pid in roots:
            return True
        if pid not in parent or pid <= 1:
            return False
        pid = parent[pid]
    return False


def kind_of(cmd: str, fork: dict[str, Any] | None) -> str:
    argv = " ".join(fork["argv"]) if fork else cmd
    if "xdist" in argv or "pytest" in argv or "import atexit" in argv:  # execnet's bootstrap: an xdist worker
        return KINDS[0]
    if "moto_app" in argv:
        return KINDS[1]
    if re.search(r"-m agentq(\s|$)|agentq\.|tests\.(api_process|racer)", argv):
        return KINDS[2]
    if "chrom" in cmd or "headless_shell" in cmd:
        return KINDS[3]
    if cmd.startswith("node") or "/node " in cmd or "jsii" in cmd:
        return KINDS[4]
    if fork is None and "agentq_dev.forkserver" in cmd:
        return KINDS[5]
    return KINDS[6]


def measure(args: argparse.Namespace) -> dict[str, Any]:
    forks_path = Path(tempfile.mkdtemp(prefix="agentq-suite-cpu-")) / "forks.jsonl"
    command = [sys.executable, "-m", "pytest", *shlex.split(args.pytest)] if args.pytest else ["make", "test"]
    # The suite's fork server notes its forks in this file (the requester's AGENTQ_FORK_LOG). Run
    # under another suite (tests/test_bench_scripts.py), the suite uses that suite's fork server
    # rather than start one of its own (~6 CPU-s of imports): the forks it notes are the suite's
    # processes too, though not under the command.
    env = {k: v for k, v in os.environ.items() if k != "PYTEST_XDIST_WORKER"}
    env[forkserver.FORK_LOG] = str(forks_path)
    sampler = Sampler(args.every)
    busy0, started = _busy_seconds(), time.monotonic()
    sampler.start()
    with subprocess.Popen(
        command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    ) as proc:
        output, _ = proc.communicate()
    sampler.stopping.set()
    sampler.join()
    wall, busy = time.monotonic() - started, _busy_seconds() - busy0
    log(output[-2000:])
    forks = {}
    if forks_path.exists():
        for line in forks_path.read_text().splitlines():
            note = json.loads(line)
            forks[note["pid"]] = note
    by_kind: dict[str, float] = defaultdict(float)
    by_file: dict[str, float] = defaultdict(float)
    processes: dict[str, int] = defaultdict(int)
    fork_cmd = "agentq_dev.forkserver"
    parent = {seen["pid"]: seen["ppid"] for seen in sampler.seen.values()}
    roots = {proc.pid, *forks}
    for seen in sampler.seen.values():
        if not _descends(seen["pid"], roots, parent):
            continue  # the rest of the machine: counted in its busy CPU only
        spent = seen["cpu"] - seen["cpu0"]
        fork = forks.get(seen["pid"]) if fork_cmd in seen["cmd"] else None
        kind = kind_of(seen["cmd"], fork)
        by_kind[kind] += spent
        processes[kind] += 1
        if fork is not None and kind != KINDS[0]:  # an xdist worker runs every file's tests
            by_file[fork["test"].split("::")[0] or "(started before any test)"] += spent
    files = sorted(by_file.items(), key=lambda kv: -kv[1])[: args.files]
    return {
        "bench": "suite_cpu",
        "command": " ".join(command),
        "returncode": proc.returncode,
        "wall_s": round(wall, 1),
        "machine_busy_cpu_s": round(busy, 1),
        "sampled_cpu_s": round(sum(by_kind.values()), 1),
        "by_kind": [{"kind": k, "cpu_s": round(by_kind[k], 1), "processes": processes[k]} for k in KINDS],
        "forks_by_test_file": [{"file": f, "cpu_s": round(s, 1)} for f, s in files],
        "forks_noted": len(forks),
    }


def render(result: dict[str, Any]) -> str:
    head = (
        f"{result['command']}: exit {result['returncode']}, {result['wall_s']} s, the machine busy "
        f"{result['machine_busy_cpu_s']} CPU-s, {result['sampled_cpu_s']} of them seen in the suite's processes"
    )
    kinds = table(["kind", "CPU-s", "processes"], [[r["kind"], r["cpu_s"], r["processes"]] for r in result["by_kind"]])
    files = table(
        ["test file (forks it started)", "CPU-s"], [[r["file"], r["cpu_s"]] for r in result["forks_by_test_file"]]
    )
    return f"{head}\n\n{kinds}\n\n{files}"


def panels(result: dict[str, Any]) -> list[Panel]:
    return [
        Panel("bar", "CPU by kind of process", "CPU-s", [r["kind"] for r in result["by_kind"]],
              {"CPU-s": [r["cpu_s"] for r in result["by_kind"]]}),
        Panel("bar", "forks' CPU by the test file that started them", "CPU-s",
              [r["file"].removeprefix("tests/") for r in result["forks_by_test_file"]],
              {"CPU-s": [r["cpu_s"] for r in result["forks_by_test_file"]]}),
    ]  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--pytest", default=None, help="run pytest with these arguments (one string) instead of make test"
    )
    parser.add_argument("--every", type=float, default=0.3, help="seconds between samples of /proc")
    parser.add_argument("--files", type=int, default=25, help="test files listed, the costliest first")
    parser.add_argument("--json", action="store_true")
    add_plot_args(parser, "suite_cpu")
    args = parser.parse_args()
    result = report(args, "Where make test's CPU goes", measure, render, panels)
    if result["returncode"] != 0:
        sys.exit(f"the suite failed (exit {result['returncode']}): the figures are of a failed run")


if __name__ == "__main__":
    main()
