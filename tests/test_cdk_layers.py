"""The Lambda code is complete: each handler imports with nothing on its path but the
functions asset, the two layers, and what the Python runtime itself provides (boto3). And the
core layer is only what AWS runs: the layer CDK builds holds agentq and no file of the
development stack (``devstack/agentq_dev``: moto's patches, the fork server, the demo).

The deployed dependencies layer is built for Lambda (cp312, manylinux, the stack's
architecture) and cannot be imported by this interpreter, so this builds the same
requirements for this machine's Python and platform and imports the handlers against it, the
way Lambda orders the path: function code, then layers, then the runtime.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import threading
import tomllib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import aws_cdk as cdk
import pytest
from packaging.requirements import Requirement

from infra import build_layers
from infra.build_layers import CORE_LAYER_DIR, PLATFORMS, REQUIREMENTS, build_deps_layer
from infra.events import SERVER_MODULE
from infra.functions import FUNCTIONS_DIR, HANDLERS
from infra.layers import core_layer
from infra.settings import resolve

RUNTIME_PROVIDED = ("boto3", "botocore", "s3transfer", "jmespath", "dateutil", "urllib3", "six")
# Base dependencies the deps layer leaves out: the Lambda runtime has boto3; rich is the CLI's.
NOT_IN_LAYER = {"boto3": "provided by the Lambda runtime", "rich": "the CLI's tables and watch view only"}
LAMBDA_ENV = {
    "AGENTQ_PREFIX": "agentq-layers-test",
    "AGENTQ_TABLE": "agentq-layers-test-tasks",
    "AGENTQ_BUCKET": "agentq-layers-test-payloads",
    "AGENTQ_STATE_MACHINE_ARN": "arn:aws:states:us-east-1:000000000000:stateMachine:agentq-layers-test-fanout",
    "AWS_REGION": "us-east-1",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "POWERTOOLS_METRICS_NAMESPACE": "agentq",
}


@pytest.fixture(scope="module")
def local_deps_layer() -> Path:
    arch = "x86_64" if platform.machine() in ("x86_64", "AMD64") else "arm64"
    if arch not in PLATFORMS or sys.platform != "linux":
        pytest.skip(f"no manylinux wheels for {sys.platform}/{platform.machine()}")
    layer = build_deps_layer(arch, python_version=f"{sys.version_info.major}.{sys.version_info.minor}")
    if not layer.built:
        pytest.skip(f"handler import check skipped: {layer.message}")
    return layer.path / "python"


def _runtime_dir(tmp_path: Path) -> Path:
    """Stand-in for the Lambda runtime's own site-packages: boto3 and its dependencies."""
    runtime = tmp_path / "runtime"
    runtime.mkdir()
    for name in RUNTIME_PROVIDED:
        module = __import__(name)
        source = Path(module.__file__)  # type: ignore[arg-type]
        source = source.parent if source.name == "__init__.py" else source
        (runtime / source.name).symlink_to(source)
    return runtime


@pytest.mark.parametrize("function", sorted(HANDLERS))
def test_handler_imports_with_only_the_layers_and_the_runtime(
    function: str, local_deps_layer: Path, tmp_path: Path
) -> None:
    module, _, attr = HANDLERS[function].rpartition(".")
    if HANDLERS[function].endswith(".sh"):  # a startup script (infra/events.py): the server module it runs
        module, attr = SERVER_MODULE, "main"
    path = [str(FUNCTIONS_DIR), str(CORE_LAYER_DIR / "python"), str(local_deps_layer), str(_runtime_dir(tmp_path))]
    script = (
        "import importlib, json, sys\n"
        f"sys.path[:0] = {json.dumps(path)}\n"
        f"handler = getattr(importlib.import_module({module!r}), {attr!r})\n"
        "assert callable(handler)\n"
        "outside = sorted({m.__file__.split('/site-packages/')[0] for m in list(sys.modules.values())\n"
        "                  if getattr(m, '__file__', None) and '/site-packages/' in m.__file__})\n"
        "print(json.dumps(outside))\n"
    )
    env = {"PATH": os.environ.get("PATH", ""), **LAMBDA_ENV}
    # -I -S: no user site, no site-packages: only the paths above and the standard library.
    proc = subprocess.run(
        [sys.executable, "-I", "-S", "-c", script], capture_output=True, text=True, env=env, timeout=120, check=False
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == [], "imported something from an installed site-packages"


def _name(req: Requirement) -> str:
    return req.name.lower().replace("_", "-")


def test_the_layer_pins_exactly_the_base_dependencies() -> None:
    """layers/requirements.txt and pyproject's base dependencies (what installing agentq
    brings) name the same packages with the same extras, each pin inside pyproject's range."""
    pyproject = tomllib.loads((REQUIREMENTS.parent.parent / "pyproject.toml").read_text())
    base = {_name(r): r for r in map(Requirement, pyproject["project"]["dependencies"])}
    lines = [line.split("#", 1)[0].strip() for line in REQUIREMENTS.read_text().splitlines()]
    layer = {_name(r): r for r in map(Requirement, filter(None, lines))}
    assert set(layer) == set(base) - set(NOT_IN_LAYER)
    for name, pinned in layer.items():
        (spec,) = pinned.specifier
        assert spec.operator == "==", f"{name}: pin an exact version in the layer"
        assert base[name].specifier.contains(spec.version), (
            f"{name}=={spec.version} outside pyproject's {base[name].specifier}"
        )
        assert pinned.extras == base[name].extras, name


def test_two_builders_of_one_layer_at_once_run_pip_once_and_both_get_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two xdist workers (or two synths) that need a layer not yet cached: the second waits for
    the first's build instead of running the same pip install beside it. The stand-in pip gives
    a second concurrent install a second to show up; without the lock it does, within ms."""
    monkeypatch.setenv("AGENTQ_LAYER_CACHE", str(tmp_path / "cache"))
    running, installs, second_started = [0], [0], threading.Event()
    guard = threading.Lock()

    def pip(command: list[str], timeout: float) -> None:
        with guard:
            running[0] += 1
            installs[0] += 1
            if running[0] > 1:
                second_started.set()
        second_started.wait(timeout=1.0)
        target = Path(command[command.index("--target") + 1])
        (target / "pkg").mkdir(parents=True)
        with guard:
            running[0] -= 1

    monkeypatch.setattr(build_layers, "_pip", pip)
    with ThreadPoolExecutor(2) as pool:
        layers = list(pool.map(lambda _: build_deps_layer("arm64"), range(2)))
    assert installs[0] == 1 and not second_started.is_set()
    assert [layer.built for layer in layers] == [True, True]
    assert layers[0].path == layers[1].path and (layers[0].path / "python" / "pkg").is_dir()


ROOT = Path(__file__).resolve().parent.parent
DEV_STACK = ROOT / "devstack" / "agentq_dev"


def _staged_core_layer(outdir: Path) -> Path:
    """The core layer's asset as CDK stages it (what a deploy zips and uploads)."""
    context = json.loads((ROOT / "cdk.json").read_text())["context"]
    app = cdk.App(outdir=str(outdir))
    stack = cdk.Stack(app, "CoreLayerOnly")
    core_layer(stack, resolve(context["environments"], context.get("environment_defaults"), "dev"))
    template = app.synth().get_stack_by_name("CoreLayerOnly").template
    (layer,) = [r for r in template["Resources"].values() if r["Type"] == "AWS::Lambda::LayerVersion"]
    staged = outdir / f"asset.{layer['Properties']['Content']['S3Key'].removesuffix('.zip')}"
    assert staged.is_dir(), staged
    return staged


def _imports_moto(path: Path) -> bool:
    return any(line.lstrip().startswith(("import moto", "from moto")) for line in path.read_text().splitlines())


@pytest.mark.xdist_group("cdk")  # a cdk.App: with the other tests that load the jsii runtime (test_cdk_stack)
def test_the_core_layer_cdk_builds_is_agentq_alone_with_no_file_of_the_dev_stack(tmp_path: Path) -> None:
    staged = _staged_core_layer(tmp_path / "cdk.out")
    files = {p.relative_to(staged).as_posix() for p in staged.rglob("*") if p.is_file()}
    assert {"python/agentq/__init__.py", "python/agentq/api/http_server.py"} <= files  # the events function's
    assert {f.split("/")[1] for f in files} == {"agentq"}, "the layer holds one package"
    # No module of the dev stack, under whatever name (moto_server, moto_app and its patches, forkserver, demo, ...)
    dev_modules = {p.read_bytes(): p.name for p in DEV_STACK.glob("*.py") if p.name != "__init__.py"}
    assert len(dev_modules) >= 15
    assert (
        sorted(
            f"{f} is {dev_modules[(staged / f).read_bytes()]}"
            for f in files
            if (staged / f).read_bytes() in dev_modules
        )
        == []
    )
    assert sorted(f for f in files if f.endswith(".py") and _imports_moto(staged / f)) == []
