"""CDK app: one AgentqStack per environment (``cdk synth|deploy -c env=dev|staging|prod``).

Settings come from cdk.json (``environment_defaults`` deep-merged with ``environments.<env>``,
validated by infra.settings). Every synth runs cdk-nag's AwsSolutions checks: an
unacknowledged finding fails it. The account and region are the CLI's (or pinned per
environment in cdk.json); nothing here names one.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import aws_cdk as cdk
from cdk_nag import AwsSolutionsChecks

from infra.build_layers import DepsLayer
from infra.settings import resolve
from infra.stack import AgentqStack

CDK_JSON = Path(__file__).resolve().parent / "cdk.json"


def cdk_json_context() -> dict[str, Any]:
    return dict(json.loads(CDK_JSON.read_text())["context"])


def build_app(
    env_name: str | None = None,
    context: dict[str, Any] | None = None,
    *,
    outdir: str | None = None,
    deps_layer: DepsLayer | None = None,
) -> cdk.App:
    # The CLI hands cdk.json's context over itself; `python app.py` and the tests read the file.
    app = cdk.App(context={**cdk_json_context(), **(context or {})}, outdir=outdir)
    env_name = env_name or app.node.try_get_context("env") or "dev"
    environments = app.node.try_get_context("environments")
    if env_name not in environments:
        raise SystemExit(f"unknown environment {env_name!r}; cdk.json defines: {', '.join(environments)}")
    settings = resolve(environments, app.node.try_get_context("environment_defaults"), env_name)
    cdk.Validations.of(app).add_plugins(AwsSolutionsChecks(app))
    AgentqStack(
        app,
        f"agentq-{env_name}",
        env_name=env_name,
        settings=settings,
        deps_layer=deps_layer,
        env=cdk.Environment(
            account=settings.account or os.environ.get("CDK_DEFAULT_ACCOUNT"),
            region=settings.region or os.environ.get("CDK_DEFAULT_REGION"),
        ),
    )
    return app


if __name__ == "__main__":
    build_app().synth()
