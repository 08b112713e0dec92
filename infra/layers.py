"""The Lambda layers every function runs on: agentq itself, its dependencies, and your tools.

- ``CoreLayer``: ``layers/agentq`` as it is (``python/agentq``): what AWS runs and nothing else;
  the development stack (``agentq_dev``: moto, its patches, the fork server, the demo) lives in
  ``devstack/``, outside it (``tests/test_cdk_layers.py`` lists the layer CDK builds);
- ``DepsLayer``: ``layers/requirements.txt`` as manylinux wheels (``infra/build_layers.py``);
- ``UserCodeLayer``: ``user_code`` in cdk.json (its package and requirements), when set.

A dependencies or user layer that pip could not build is an empty placeholder: a synth refuses
it unless the context says the synth is a test (``ALLOW_UNBUILT_DEPS_LAYER``), so nothing empty
is ever deployed. The layers are built for one runtime, ``RUNTIME``.
"""

from __future__ import annotations

from dataclasses import dataclass

from aws_cdk import aws_lambda as lambda_
from constructs import Construct

from infra.build_layers import CORE_LAYER_DIR, ROOT, DepsLayer, build_user_layer
from infra.settings import EnvironmentSettings

ALLOW_UNBUILT_DEPS_LAYER = "agentq:allow-unbuilt-deps-layer"
RUNTIME = lambda_.Runtime.PYTHON_3_12  # the layers are built for cp312 (infra/build_layers.py)
# What no asset ships: bytecode, the editable install's metadata, the folders' READMEs.
ASSET_EXCLUDES = ["**/__pycache__", "**/*.pyc", "*.egg-info", "README.md"]
BUILT_MARKER_EXCLUDES = [".agentq-layer-complete"]  # build_layers' completion marker


@dataclass
class Layers:
    core: lambda_.LayerVersion
    deps: lambda_.LayerVersion
    user_code: lambda_.LayerVersion | None

    @property
    def tools(self) -> list[lambda_.ILayerVersion]:
        """The layers of the functions that load your tools (executor, API)."""
        return [self.user_code] if self.user_code is not None else []


def architecture(cfg: EnvironmentSettings) -> lambda_.Architecture:
    return lambda_.Architecture.ARM_64 if cfg.architecture == "arm64" else lambda_.Architecture.X86_64


def require_built(scope: Construct, layer: DepsLayer, what: str) -> DepsLayer:
    """``layer``, unless it is a placeholder in a synth that is not a test (then RuntimeError with pip's error)."""
    if not layer.built and not scope.node.try_get_context(ALLOW_UNBUILT_DEPS_LAYER):
        raise RuntimeError(f"{layer.message}. {what}")
    return layer


def user_code_layer(scope: Construct, cfg: EnvironmentSettings) -> DepsLayer | None:
    """Your tools' layer (``user_code``: paths relative to cdk.json, i.e. the project root)."""
    user = cfg.user_code
    if user is None:
        return None
    requirements = ROOT / user.requirements if user.requirements else None
    if requirements is not None and not requirements.is_file():
        raise ValueError(f"user_code.requirements: {requirements} is not a file")
    layer = build_user_layer(ROOT / user.package_dir, requirements, cfg.architecture)
    return require_built(scope, layer, "The user code layer must be built before a deployable synth.")


def core_layer_code() -> lambda_.Code:
    """The core layer's asset: ``layers/agentq`` without bytecode or build metadata."""
    return lambda_.Code.from_asset(str(CORE_LAYER_DIR), exclude=ASSET_EXCLUDES)


def core_layer(scope: Construct, cfg: EnvironmentSettings) -> lambda_.LayerVersion:
    return lambda_.LayerVersion(
        scope,
        "CoreLayer",
        code=core_layer_code(),
        compatible_runtimes=[RUNTIME],
        compatible_architectures=[architecture(cfg)],
        description="agentq core library (layers/agentq/python)",
    )


def build_layers(scope: Construct, cfg: EnvironmentSettings, deps: DepsLayer, user: DepsLayer | None) -> Layers:
    arch = architecture(cfg)
    core = core_layer(scope, cfg)
    deps_layer = lambda_.LayerVersion(
        scope,
        "DepsLayer",
        code=lambda_.Code.from_asset(str(deps.path), exclude=BUILT_MARKER_EXCLUDES),
        compatible_runtimes=[RUNTIME],
        compatible_architectures=[arch],
        description="agentq third-party dependencies (layers/requirements.txt, manylinux wheels)",
    )
    user_layer = (
        lambda_.LayerVersion(
            scope,
            "UserCodeLayer",
            code=lambda_.Code.from_asset(str(user.path), exclude=BUILT_MARKER_EXCLUDES),
            compatible_runtimes=[RUNTIME],
            compatible_architectures=[arch],
            description="your tools (user_code.package_dir and its requirements)",
        )
        if user is not None
        else None
    )
    return Layers(core=core, deps=deps_layer, user_code=user_layer)
