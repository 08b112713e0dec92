"""Cold import of each Lambda handler: wall time, agentq modules and all modules it loads.

    python bench/import_time.py                  # every functions/*/handler.py, authorizer first
    python bench/import_time.py --runs 9 authorizer
    python bench/import_time.py --json
    python bench/import_time.py --floor --no-pyc-runs authorizer
    python bench/import_time.py --first-call --floor --runs 15 authorizer

Each run is a fresh interpreter (``python -c``) with the path Lambda gives a function: the
functions asset (``functions/``), then the core layer (``layers/agentq/python``), then this
interpreter's own site-packages standing in for the dependencies layer and the runtime's boto3.
The environment is the one the stack sets for that function (``infra/functions.common_env``:
``AGENTQ_*``, ``POWERTOOLS_*``) plus what the Lambda service sets (``AWS_REGION``,
``LAMBDA_TASK_ROOT``, ``AWS_LAMBDA_FUNCTION_NAME``, ...), with dummy credentials:
importing a handler builds AWS clients but sends no request.

Timed inside the child: ``time.perf_counter()`` (and, as "cpu", ``time.process_time()``)
around ``importlib.import_module("<name>.handler")``, so interpreter start-up (which Lambda
pays for every function alike) is left out, and the module-level work of the handler
(settings, clients, loggers) is in. Reported per handler: the
median and min/max over ``--runs`` runs, and from the last run the number of ``agentq``
modules and of all modules the import added to ``sys.modules``.

``--first-call`` (the authorizer only) also times, in the same fresh interpreter, the first
``lambda_handler`` call after the import: a valid key's lookup against a table on a local moto
server (started and provisioned by the bench, the key made with ``agentq keys create``), then a
second call. A cold start pays the import and the first call together, so a cost moved from
one to the other (a client built on first use) shows up in "import + 1st"; the second call is
the request itself (a GetItem to localhost), which the first one pays too. With ``--floor`` the
floor row makes the same first GetItem with its bare client.

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

from _plot import Panel, add_plot_args, plot_from_args

ROOT = Path(__file__).resolve().parent.parent
FUNCTIONS_DIR = ROOT / "functions"
CORE_LAYER = ROOT / "layers" / "agentq" / "python"

# What infra/functions.common_env puts in every function's environment (names, not deployed values).
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
t0, c0 = time.perf_counter(), time.process_time()
module = importlib.import_module({module!r})
elapsed, cpu = time.perf_counter() - t0, time.process_time() - c0
assert callable(getattr(module, "lambda_handler"))
added = set(sys.modules) - before
calls, call_cpu = [], []
for _ in range({calls}):
    t1, c1 = time.perf_counter(), time.process_time()
    answer = module.lambda_handler({{"type": "TOKEN", "authorizationToken": {token!r}, "methodArn": {arn!r}}}, None)
    calls.append(time.perf_counter() - t1)
    call_cpu.append(time.process_time() - c1)
    assert answer["context"]["tenant"] == {tenant!r}, answer
called = set(sys.modules) - before - added
print(json.dumps({{
    "seconds": elapsed,
    "cpu": cpu,
    "calls": calls,
    "call_cpu": call_cpu,
    "call_packages": sorted({{m.split(".")[0] for m in called}}),
    "modules": len(added),
    "agentq_modules": sorted(m for m in added if m == "agentq" or m.startswith("agentq.")),
}}))
"""

# The authorizer's third-party part alone: what no change to agentq can take off its cold import.
FLOOR = "(floor)"
FLOOR_CHILD = r"""
import json, sys, time
before = set(sys.modules)
t0, c0 = time.perf_counter(), time.process_time()
import botocore.session
from botocore.config import Config
from aws_lambda_powertools import Logger
Logger(service="agentq-authorizer")
ddb = botocore.session.get_session().create_client(
    "dynamodb", region_name="us-east-1",
    config=Config(retries={{"max_attempts": 5, "mode": "standard"}}, max_pool_connections=4),
)
elapsed, cpu = time.perf_counter() - t0, time.process_time() - c0
calls, call_cpu = [], []
for _ in range({calls}):
    t1, c1 = time.perf_counter(), time.process_time()
    ddb.get_item(TableName={table!r}, Key={{"pk": {{"S": "APIKEY#none"}}, "sk": {{"S": "META"}}}}, ConsistentRead=True)
    calls.append(time.perf_counter() - t1)
    call_cpu.append(time.process_time() - c1)
print(json.dumps({{"seconds": elapsed, "cpu": cpu, "calls": calls, "call_cpu": call_cpu,
                  "modules": len(set(sys.modules) - before), "agentq_modules": []}}))
"""

FIRST_CALL_TENANT = "bench"
METHOD_ARN = "arn:aws:execute-api:us-east-1:123456789012:abc123/prod/GET/tasks"


class FirstCall:
    """A local moto server with the stack's table and one API key: what the authorizer's first
    call reads. The server runs until ``close``; nothing else is left behind."""

    def __init__(self, python: str) -> None:
        sys.path.insert(0, str(CORE_LAYER))  # the agentq of the tree under measurement
        import boto3

        from agentq.resources import ResourceNames, provision
        from agentq.runtime import Settings
        from agentq_dev.moto_server import MotoServer

        self.server = MotoServer().start()
        try:
            settings = Settings.for_prefix(STACK_ENV["AGENTQ_PREFIX"], self.server.endpoint_url)
            assert settings.table == STACK_ENV["AGENTQ_TABLE"], settings.table
            env = {**child_env("authorizer"), **settings.env(), "PYTHONPATH": str(CORE_LAYER)}
            dummy = boto3.session.Session(  # moto's credentials, whatever this shell holds
                aws_access_key_id=LAMBDA_ENV["AWS_ACCESS_KEY_ID"],
                aws_secret_access_key=LAMBDA_ENV["AWS_SECRET_ACCESS_KEY"],
                region_name=LAMBDA_ENV["AWS_REGION"],
            )
            provision(dummy, ResourceNames.for_prefix(settings.prefix), endpoint_url=self.server.endpoint_url)
            made = subprocess.run(
                [python, "-m", "agentq", "keys", "create", "--tenant", FIRST_CALL_TENANT],
                capture_output=True, text=True, env=env, timeout=120, check=False,
            )  # fmt: skip
            if made.returncode != 0:
                raise RuntimeError(f"agentq keys create failed:\n{made.stderr[-3000:]}")
            self.token = made.stdout.strip().splitlines()[-1]
        except BaseException:
            self.server.stop()
            raise

    @property
    def endpoint_url(self) -> str:
        return str(self.server.endpoint_url)

    def close(self) -> None:
        self.server.stop()


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


def measure_once(name: str, python: str, pycache: str, first_call: FirstCall | None = None) -> dict[str, Any]:
    """One fresh interpreter; byte code is read from and written to ``pycache`` only. With
    ``first_call``, two calls of the handler (or of the floor's client) follow the import."""
    calls = 2 if first_call is not None else 0
    if name == FLOOR:
        script, env = FLOOR_CHILD.format(calls=calls, table=STACK_ENV["AGENTQ_TABLE"]), child_env("authorizer")
    else:
        script, env = (
            CHILD.format(
                path=[str(FUNCTIONS_DIR), str(CORE_LAYER)],
                module=f"{name}.handler",
                calls=calls,
                token=f"Bearer {first_call.token}" if first_call else "",
                arn=METHOD_ARN,
                tenant=FIRST_CALL_TENANT,
            ),
            child_env(name),
        )
    if first_call is not None:
        env["AWS_ENDPOINT_URL"] = first_call.endpoint_url
    env["PYTHONPYCACHEPREFIX"] = pycache
    proc = subprocess.run([python, "-c", script], capture_output=True, text=True, env=env, timeout=120, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"importing {name}.handler failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def measure_cold(name: str, python: str, first_call: FirstCall | None = None) -> dict[str, Any]:
    """Nothing compiled: an empty byte-code cache of its own."""
    with tempfile.TemporaryDirectory(prefix="agentq-pyc-") as empty:
        return measure_once(name, python, empty, first_call)


def _stats(samples: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians over the runs: of the import and, where calls were made, of the import plus the
    first call (summed per run, then the median) and of the second call alone. ``cpu_median_ms``
    is the child's CPU time (``time.process_time``): on a machine shared with other work it
    moves less than the wall time, and it leaves out the wait for the server's answer."""
    times = [s["seconds"] * 1000 for s in samples]
    out: dict[str, Any] = {
        "median_ms": round(statistics.median(times), 1),
        "min_ms": round(min(times), 1),
        "max_ms": round(max(times), 1),
        "cpu_median_ms": round(statistics.median(s["cpu"] * 1000 for s in samples), 1),
    }
    if samples[0].get("calls"):
        first = [(s["seconds"] + s["calls"][0]) * 1000 for s in samples]
        out["import_and_first_call"] = {
            "median_ms": round(statistics.median(first), 1),
            "min_ms": round(min(first), 1),
            "max_ms": round(max(first), 1),
            "cpu_median_ms": round(statistics.median((s["cpu"] + s["call_cpu"][0]) * 1000 for s in samples), 1),
        }
        out["second_call_median_ms"] = round(statistics.median(s["calls"][1] * 1000 for s in samples), 1)
    return out


def measure(name: str, runs: int, python: str, *, no_pyc: bool, first_call: FirstCall | None = None) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="agentq-pyc-") as pycache:
        measure_once(name, python, pycache, first_call)  # warm-up: byte-compiles into pycache, not counted
        samples = [measure_once(name, python, pycache, first_call) for _ in range(runs)]
    last = samples[-1]
    out: dict[str, Any] = {"handler": name, "runs": runs, **_stats(samples)}
    if no_pyc:
        out["no_pyc"] = _stats([measure_cold(name, python, first_call) for _ in range(runs)])
    out.update(
        agentq_modules=len(last["agentq_modules"]), modules=last["modules"], agentq_module_names=last["agentq_modules"]
    )
    if "call_packages" in last:
        out["first_call_loaded_packages"] = last["call_packages"]
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
    parser.add_argument(
        "--first-call",
        action="store_true",
        help="also time the first and second lambda_handler call after the import (authorizer only; a local moto server)",
    )
    add_plot_args(parser, "import_time")
    args = parser.parse_args(argv)
    names = args.handlers or handlers()
    unknown = [n for n in names if not (FUNCTIONS_DIR / n / "handler.py").is_file()]
    if unknown:
        parser.error(f"no functions/<name>/handler.py for: {', '.join(unknown)}")
    if args.first_call and names != ["authorizer"]:
        parser.error("--first-call measures the authorizer only: name it alone")
    if args.floor:
        names.append(FLOOR)
    first_call = FirstCall(args.python) if args.first_call else None
    try:
        results = [measure(n, args.runs, args.python, no_pyc=args.no_pyc_runs, first_call=first_call) for n in names]
    finally:
        if first_call is not None:
            first_call.close()
    series = {"wall median": [r["median_ms"] for r in results], "cpu median": [r["cpu_median_ms"] for r in results]}
    if args.first_call:
        series["import + 1st call"] = [r.get("import_and_first_call", {}).get("median_ms") for r in results]
    plot_from_args(
        args,
        f"cold import of each Lambda handler, median of {args.runs} fresh interpreters",
        [Panel("bar", "import time", "ms", [r["handler"] for r in results], series)],
    )
    if args.json:
        print(json.dumps({"python": sys.version.split()[0], "root": str(ROOT), "handlers": results}))
        return 0
    print(
        f"cold import of functions/<name>/handler.py, median of {args.runs} fresh interpreters (python {sys.version.split()[0]})"
    )
    extra = f" {'no-pyc median':>14}" if args.no_pyc_runs else ""
    if args.first_call:
        extra += f" {'import+1st':>11} {'min':>7} {'cpu':>7} {'2nd call':>9}"
        extra += f" {'no-pyc i+1st':>13}" if args.no_pyc_runs else ""
    header = f"{'handler':<12} {'median ms':>10} {'min':>7} {'max':>7} {'cpu':>7}"
    print(f"{header}{extra} {'agentq mods':>12} {'all mods':>9}")
    for r in results:
        extra = f" {r['no_pyc']['median_ms']:>14.1f}" if args.no_pyc_runs else ""
        if args.first_call:
            first = r["import_and_first_call"]
            extra += f" {first['median_ms']:>11.1f} {first['min_ms']:>7.1f} {first['cpu_median_ms']:>7.1f}"
            extra += f" {r['second_call_median_ms']:>9.1f}"
            if args.no_pyc_runs:
                extra += f" {r['no_pyc']['import_and_first_call']['median_ms']:>13.1f}"
        times = f"{r['median_ms']:>10.1f} {r['min_ms']:>7.1f} {r['max_ms']:>7.1f} {r['cpu_median_ms']:>7.1f}{extra}"
        print(f"{r['handler']:<12} {times} {r['agentq_modules']:>12} {r['modules']:>9}")
        if args.modules:
            print("    " + " ".join(r["agentq_module_names"]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
