"""What AWS runs does without the development stack.

The local stack (moto and its patches, the fork server, the fleet, the demo) is the package
``agentq_dev`` in ``devstack/``; what AWS runs is ``agentq`` in ``layers/agentq/python`` (the
Lambda layer) and ``functions/`` (the handlers). Neither the Lambda layer nor the worker image
(which installs ``layers/agentq/python`` alone) has ``agentq_dev`` or moto, so nothing there may
need them: these tests import and run the runtime with both made unimportable, as they are there.
The import contract (pyproject's ``agentq-runtime-apart``) says the same of the source;
``tests/test_cdk_layers.py`` checks the layer CDK builds holds no file of the dev stack.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FUNCTIONS = ROOT / "functions"
# Importing these fails as where the layer runs: the dev stack, moto (not in layers/requirements.txt), CDK's app.
AWAY = ("agentq_dev", "moto", "infra")
# Put first on the import path, this finder answers for them as Python does for a package that is not installed.
WITHOUT_DEV_STACK = f"""
import sys

class Away:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {AWAY!r}:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
        return None

sys.meta_path.insert(0, Away())
"""
# Settings as a function has them (its handler builds its clients when imported); no call is made.
LAMBDA_ENV = {
    "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "eu-west-1",
    "AGENTQ_PREFIX": "apart", "AGENTQ_TABLE": "apart", "AGENTQ_BUCKET": "apart",
    "AGENTQ_STATE_MACHINE_ARN": "arn:aws:states:eu-west-1:123456789012:stateMachine:apart",
}  # fmt: skip

IMPORT_ALL = (
    WITHOUT_DEV_STACK
    + f"""
import importlib, json, pathlib, pkgutil
functions = pathlib.Path({str(FUNCTIONS)!r})
sys.path.insert(0, str(functions))  # /var/task in Lambda: the handlers run as api.handler, events.server, ...
import agentq
names = [m.name for m in pkgutil.walk_packages(agentq.__path__, "agentq.") if not m.name.endswith("__main__")]
names += [f"{{d.name}}.handler" for d in sorted(functions.iterdir()) if (d / "handler.py").is_file()]
names.append("events.server")
failed = {{}}
for name in names:
    try:
        importlib.import_module(name)
    except Exception as exc:
        failed[name] = f"{{type(exc).__name__}}: {{exc}}"
print(json.dumps({{"imported": sorted(names), "failed": failed}}))
"""
)

CLI = WITHOUT_DEV_STACK + "from agentq.cli.main import main\nsys.exit(main(sys.argv[1:]))\n"


def _run(code: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, **LAMBDA_ENV}
    return subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=120, check=False, cwd=ROOT, env=env
    )


def test_every_module_of_agentq_and_every_handler_imports_without_the_dev_stack() -> None:
    result = _run(IMPORT_ALL)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout.splitlines()[-1])
    assert report["failed"] == {}
    imported = set(report["imported"])
    # the whole package was walked (its outer edge included) and every function's code
    assert {"agentq.api.http_server", "agentq.api.http_guard", "agentq.cli.main", "agentq.cli.local"} <= imported
    assert {"executor.handler", "api.handler", "events.server"} <= imported


def test_the_cli_works_without_the_dev_stack_and_its_local_stack_commands_say_what_to_install() -> None:
    for args in (["--help"], ["worker", "--help"], ["dev", "--help"]):
        result = _run(CLI, *args)
        assert result.returncode == 0, (args, result.stderr)
        assert "usage: agentq" in result.stdout
    for args in (["dev"], ["demo"], ["run", "a goal"]):
        result = _run(CLI, *args)
        assert result.returncode == 2, (args, result.stdout, result.stderr)
        assert f"agentq {args[0]}: needs the development stack (the agentq_dev package)" in result.stderr
        assert "pip install -e '.[local]'" in result.stderr
        assert "Traceback" not in result.stderr
