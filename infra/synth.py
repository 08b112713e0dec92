"""Synthesize one environment without the CDK CLI, once, and keep what the checks need.

``synthesize(env, outdir)`` builds the app (cdk-nag included), writes the cloud assembly to
``outdir`` and records the template, the validation report and the dependencies layer's state
beside it. A second call with the same ``outdir`` (another test module, another pytest-xdist
worker sharing the directory) reads those back instead of synthesizing again; a file lock
makes concurrent callers wait for the first.

    .venv/bin/python -m infra.synth dev [OUTDIR]     # prints the template path
"""

from __future__ import annotations

import fcntl
import json
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from infra.layers import ALLOW_UNBUILT_DEPS_LAYER

RECORD = "agentq-synth.json"
# Unit synths reference assets by hash instead of copying them into the assembly.
TEST_CONTEXT = {"aws:cdk:disable-asset-staging": True, ALLOW_UNBUILT_DEPS_LAYER: True}


@dataclass(frozen=True)
class Synthesized:
    env_name: str
    stack_name: str
    outdir: Path
    template: dict[str, Any]
    validation: dict[str, Any]  # validation-report.json: cdk-nag's findings and acknowledgements
    deps_layer: dict[str, Any]  # {"path", "built", "message"}

    @property
    def template_path(self) -> Path:
        return self.outdir / f"{self.stack_name}.template.json"

    def resources(self, type_: str) -> dict[str, dict[str, Any]]:
        return {k: v for k, v in self.template["Resources"].items() if v["Type"] == type_}


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _load(outdir: Path) -> Synthesized:
    record = json.loads((outdir / RECORD).read_text())
    return Synthesized(
        env_name=record["env_name"],
        stack_name=record["stack_name"],
        outdir=outdir,
        template=json.loads((outdir / f"{record['stack_name']}.template.json").read_text()),
        validation=json.loads((outdir / "validation-report.json").read_text()),
        deps_layer=record["deps_layer"],
    )


def synthesize(env_name: str, outdir: Path, context: dict[str, Any] | None = None) -> Synthesized:
    """The synthesized ``env_name`` in ``outdir`` (synthesized now unless already there).
    Raises cdk's ValidationFailed when cdk-nag reports an unacknowledged finding."""
    outdir = Path(outdir)
    if (outdir / RECORD).exists():
        return _load(outdir)
    with _locked(outdir.parent / f".{outdir.name}.lock"):
        if (outdir / RECORD).exists():
            return _load(outdir)
        from app import build_app

        app = build_app(env_name, {**TEST_CONTEXT, **(context or {})}, outdir=str(outdir))
        stack = app.node.find_child(f"agentq-{env_name}")
        app.synth()
        layer = stack.deps_layer  # type: ignore[attr-defined]
        record = {
            "env_name": env_name,
            "stack_name": stack.stack_name,  # type: ignore[attr-defined]
            "deps_layer": {"path": str(layer.path), "built": layer.built, "message": layer.message},
        }
        (outdir / RECORD).write_text(json.dumps(record, indent=2))
    return _load(outdir)


if __name__ == "__main__":
    env = sys.argv[1] if len(sys.argv) > 1 else "dev"
    out = Path(sys.argv[2]) if len(sys.argv) > 2 else Path("cdk.out") / f"synth-{env}"
    print(synthesize(env, out).template_path)
