"""``python -m tests.racer_pool MODULE ARGVS_JSON``: imports MODULE once, then forks one racer
process per argv, each running MODULE as ``__main__`` with that argv and stdin/stdout pipes of
its own (tests/racers.py's protocol: it prints ``ready``, waits for a line, races, prints a JSON
report as its last line).

Why a pool: every racer is still a process of its own with its own boto3 client and connections,
racing the others against moto server as separate machines would against DynamoDB; forking them
from one process that has already imported agentq and boto3 saves each of them the interpreter's
start and those imports (~0.5 CPU-s a racer, twenty racers a race), and the parse of botocore's
data for their clients (~0.05 CPU-s a racer): the pool is itself forked from the test process's
fork server (tests/racers.py), which parsed it (``agentq_dev.forkserver.WARM_CLIENTS``).

To its caller the pool speaks the same protocol as one racer: ``ready`` once every racer is set,
then it waits for a line, passes the gun to all of them at once, and prints
``{"reports": [...], "failed": [...]}`` (each racer's last line, in order; the argvs of the racers
that exited with an error, whose tracebacks went to stderr)."""

from __future__ import annotations

import importlib
import json
import os
import runpy
import sys
import traceback


def _racer(module: str, argv: list[str], stdin_fd: int, stdout_fd: int) -> None:
    """In the forked child: stdin and stdout are its own pipes, then MODULE runs as a script."""
    os.dup2(stdin_fd, 0)
    os.dup2(stdout_fd, 1)
    sys.argv = [module, *argv]
    code = 0
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    except SystemExit as exit_:
        code = exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 1)
    except BaseException:  # any failure is the racer's report: its traceback, exit 1
        traceback.print_exc()
        code = 1
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
    os._exit(code)


def main(module: str, argvs: list[list[str]]) -> int:
    importlib.import_module(module)  # the imports every racer shares, done once before the forks
    children: list[tuple[int, int, int]] = []  # pid, the racer's stdin (to write), its stdout (to read)
    for argv in argvs:
        in_read, in_write = os.pipe()
        out_read, out_write = os.pipe()
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            os.close(in_write)
            os.close(out_read)
            for _, theirs_in, theirs_out in children:
                os.close(theirs_in)
                os.close(theirs_out)
            _racer(module, argv, in_read, out_write)
        os.close(in_read)
        os.close(out_write)
        children.append((pid, in_write, out_read))
    outputs = [os.fdopen(out_fd, "r") for _, _, out_fd in children]
    failed: list[list[str]] = []
    for argv, out in zip(argvs, outputs, strict=True):  # every racer is up and set before the gun
        if out.readline().strip() != "ready":
            failed.append(argv)
    if failed:
        for pid, in_fd, _ in children:
            os.close(in_fd)
            os.kill(pid, 9)
        print(json.dumps({"reports": [], "failed": failed}), flush=True)
        return 1
    print("ready", flush=True)
    sys.stdin.readline()
    for _, in_fd, _ in children:
        os.write(in_fd, b"go\n")
    reports: list[object] = []
    for argv, out, (pid, in_fd, _) in zip(argvs, outputs, children, strict=True):
        lines = out.read().strip().splitlines()
        os.close(in_fd)
        _, status = os.waitpid(pid, 0)
        if os.waitstatus_to_exitcode(status) != 0 or not lines:
            failed.append(argv)
            reports.append(None)
        else:
            reports.append(json.loads(lines[-1]))
    print(json.dumps({"reports": reports, "failed": failed}), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], json.loads(sys.argv[2])))
