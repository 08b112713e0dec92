"""Cold import of each Lambda handler: wall time, agentq modules and all modules it loads.

    python bench/import_time.py                  # every functions/*/handler.py, authorizer first
    python bench/import_time.py --runs 9 authorizer
    python bench/import_time.py --json
    python bench/import_time.py --floor --no-pyc-runs authorizer

Each run is a fresh interpreter (``python -c``) with the path Lambda gives a function: the
functions asset (``functions/``), then the core layer (``layers/agentq/python``), then this
interpreter's own site-packages standing in for the dependencies layer and the runtime's boto3.
The environment is the one the stack sets for that function (``infra/functions.py``:
``AGENTQ_*``, ``POWERTOOLS_*``) plus what the Lambda service sets (``AWS_REGION``,
``LAMBDA_TASK_ROOT``, ``AWS_LAMBDA_FUNCTION_NAME``, ...), with dummy credentials:
importing a handler builds AWS clients but sends no request.

Timed inside the child: ``time.perf_counter()`` around ``importlib.import_module("<name>.handler")``,
so interpreter start-up (which Lambda pays for every function alike) is left out, and the
module-level work of the handler (settings, clients, loggers) is in. Reported per handler: the
median and min/max over ``--runs`` runs, and from the last run the number of ``agentq``
modules and of all modules the import added to ``sys.modules``.

Byte code lives in a ``PYTHONPYCACHEPREFIX`` of the bench's own (nothing is written into the
tree, and ``__pycache__`` folders elsewhere are not read). Two conditions. "pyc": compiled by
a warm-up run that is not counted, the usual way to measure an import. "no pyc"
(``--no-pyc-runs``): each run gets an empty prefix, so every module is compiled from source,
third-party ones included: closer to a Lambda cold
start here, since both layers are built without byte code (``ASSET_EXCLUDES`` drops
``__pycache__``, the dependencies are installed with ``pip --no-compile``) and /opt is
read-only (the runtime's own boto3 does ship compiled, so this overstates that part).

Figures depend on this machine (2 shared cores, warm disk cache) and on this interpreter, not
Lambda's python3.12 on its own CPU share: compare handlers, and before/after, on one machine.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
FUNCTIONS_DIR = ROOT / "functions"
CORE_LAYER = ROOT / "layers" / "agentq" / "python"

# What infra/functions.py puts in every function's environment (names, not deployed values).
STACK_ENV = {
    "AGENTQ_ENV": "bench",
    "AGENTQ_PREFIX": "agentq-bench",
    "AGENTQ_TABLE": "agentq-bench-tasks",
    "AGENTQ_BUCKET": "agentq-bench-payloads",
    # Set in the stack; without it the API handler would look the machine up over the network.
    "AGENTQ_STATE_MACHINE_ARN": "arn:aws:states:us-east-1:123456789012:stateMachine:agentq-bench-fanout",
    "AGENTQ_TASK_RETENTION_DAYS": "30",
    "POWERTOOLS_METRICS_NAMESPACE": "agentq",
    "POWERTOOLS_LOG_LEVEL": "INFO",
    "POWERTOOLS_TRACER_CAPTURE_RESPONSE": "false",
}
# What the Lambda service sets, and credentials that are never used (no request is sent).
LAMBDA_ENV = {
    "AWS_REGION": "us-east-1",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_EXECUTION_ENV": "AWS_Lambda_python3.12",
    "AWS_LAMBDA_FUNCTION_MEMORY_SIZE": "256",
    "AWS_LAMBDA_FUNCTION_VERSION": "$LATEST",
    "AWS_ACCESS_KEY_ID": "bench",
    "AWS_SECRET_ACCESS_KEY": "bench",
    "AWS_SESSION_TOKEN": "bench",
}

CHILD = r"""
import importlib, json, sys, time
sys.path[:0] = {path!r}
before = set(sys.modules)
t0 = time.perf_counter()
module = importlib.import_module({module!r})
elapsed = time.perf_counter() - t0
assert callable(getattr(module, "lambda_handler"))
added = set(sys.modules) - before
print(json.dumps({{
    "seconds": elapsed,
    "modules": len(added),
    "agentq_modules": sorted(m for m in added if m == "agentq" or m.startswith("agentq.")),
}}))
"""

# The authorizer's third-party part alone: what no change to agentq can take off its cold import.
FLOOR = "(floor)"
FLOOR_CHILD = r"""
import json, sys, time
before = set(sys.modules)
t0 = time.perf_counter()
import botocore.session
from botocore.config import Config
from aws_lambda_powertools import Logger
Logger(service="agentq-authorizer")
botocore.session.get_session().create_client(
    "dynamodb", region_name="us-east-1",
    config=Config(retries={{"max_attempts": 5, "mode": "standard"}}, max_pool_connections=4),
)
elapsed = time.perf_counter() - t0
print(json.dumps({{"seconds": elapsed, "modules": len(set(sys.modules) - before), "agentq_modules": []}}))
"""


def handlers() -> list[str]:
    """Every functions/<name>/handler.py, the authorizer first."""
    names = sorted(p.parent.name for p in FUNCTIONS_DIR.glob("*/handler.py"))
    return sorted(names, key=lambda n: (n != "authorizer", n))


def child_env(name: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AGENTQ_", "POWERTOOLS_", "AWS_"))}
    env.pop("PYTHONPATH", None)  # the path is set in the child, as Lambda orders it
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # byte code goes to PYTHONPYCACHEPREFIX, never the tree
    env.update(STACK_ENV)
    env.update(LAMBDA_ENV)
    env["AWS_LAMBDA_FUNCTION_NAME"] = f"agentq-bench-{name}"
    env["POWERTOOLS_SERVICE_NAME"] = f"agentq-{name}"
    env["LAMBDA_TASK_ROOT"] = str(FUNCTIONS_DIR)
    return env


def measure_once(name: str, python: str, pycache: str) -> dict[str, Any]:
    """One fresh interpreter; byte code is read from and written to ``pycache`` only."""
    if name == FLOOR:
        script, env = FLOOR_CHILD.format(), child_env("authorizer")
    else:
        script, env = (
            CHILD.format(path=[str(FUNCTIONS_DIR), str(CORE_LAYER)], module=f"{name}.handler"),
            child_env(name),
        )
    env["PYTHONPYCACHEPREFIX"] = pycache
    proc = subprocess.run([python, "-c", script], capture_output=True, text=True, env=env, timeout=120, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"importing {name}.handler failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def measure_cold(name: str, python: str) -> dict[str, Any]:
    """Nothing compiled: an empty byte-code cache of its own."""
    with tempfile.TemporaryDirectory(prefix="agentq-pyc-") as empty:
        return measure_once(name, python, empty)


def _stats(samples: list[dict[str, Any]]) -> dict[str, float]:
    times = [s["seconds"] * 1000 for s in samples]
    return {
        "median_ms": round(statistics.median(times), 1),
        "min_ms": round(min(times), 1),
        "max_ms": round(max(times), 1),
    }


def measure(name: str, runs: int, python: str, *, no_pyc: bool) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="agentq-pyc-") as pycache:
        measure_once(name, python, pycache)  # warm-up: byte-compiles into pycache, not counted
        samples = [measure_once(name, python, pycache) for _ in range(runs)]
    last = samples[-1]
    out: dict[str, Any] = {"handler": name, "runs": runs, **_stats(samples)}
    if no_pyc:
        out["no_pyc"] = _stats([measure_cold(name, python) for _ in range(runs)])
    out.update(
        agentq_modules=len(last["agentq_modules"]), modules=last["modules"], agentq_module_names=last["agentq_modules"]
    )
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("handlers", nargs="*", help="handler folders under functions/ (default: all, authorizer first)")
    parser.add_argument("--runs", type=int, default=5, help="fresh interpreters per handler (default 5)")
    parser.add_argument("--python", default=sys.executable, help="the interpreter to run (default: this one)")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    parser.add_argument("--modules", action="store_true", help="list the agentq modules each handler loads")
    parser.add_argument("--no-pyc-runs", action="store_true", help="also time each import with nothing byte-compiled")
    parser.add_argument(
        "--floor",
        action="store_true",
        help=f"add a {FLOOR} row: botocore, one DynamoDB client and the powertools Logger, the authorizer's third-party part",
    )
    args = parser.parse_args(argv)
    names = args.handlers or handlers()
    unknown = [n for n in names if not (FUNCTIONS_DIR / n / "handler.py").is_file()]
    if unknown:
        parser.error(f"no functions/<name>/handler.py for: {', '.join(unknown)}")
    if args.floor:
        names.append(FLOOR)
    results = [measure(n, args.runs, args.python, no_pyc=args.no_pyc_runs) for n in names]
    if args.json:
        print(json.dumps({"python": sys.version.split()[0], "root": str(ROOT), "handlers": results}))
        return 0
    print(
        f"cold import of functions/<name>/handler.py, median of {args.runs} fresh interpreters (python {sys.version.split()[0]})"
    )
    extra = f" {'no-pyc median':>14}" if args.no_pyc_runs else ""
    print(f"{'handler':<12} {'median ms':>10} {'min':>7} {'max':>7}{extra} {'agentq mods':>12} {'all mods':>9}")
    for r in results:
        extra = f" {r['no_pyc']['median_ms']:>14.1f}" if args.no_pyc_runs else ""
        times = f"{r['median_ms']:>10.1f} {r['min_ms']:>7.1f} {r['max_ms']:>7.1f}{extra}"
        print(f"{r['handler']:<12} {times} {r['agentq_modules']:>12} {r['modules']:>9}")
        if args.modules:
            print("    " + " ".join(r["agentq_module_names"]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
