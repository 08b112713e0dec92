"""CDK app: one AgentqStack per environment (``cdk synth -c env=dev|staging|prod``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import aws_cdk as cdk

from infra.stack import AgentqStack

CDK_JSON = Path(__file__).resolve().parent / "cdk.json"


def build_app(env_name: str | None = None, context: dict[str, Any] | None = None) -> cdk.App:
    app = cdk.App(context=context)
    env_name = env_name or app.node.try_get_context("env") or "dev"
    # The CLI passes cdk.json's context; `python3 app.py` and tests read the file themselves.
    environments = app.node.try_get_context("environments") or json.loads(CDK_JSON.read_text())["context"]["environments"]
    if env_name not in environments:
        raise SystemExit(f"unknown environment {env_name!r}; cdk.json defines: {', '.join(environments)}")
    AgentqStack(app, f"agentq-{env_name}", env_name=env_name, settings=environments[env_name])
    return app


if __name__ == "__main__":
    build_app().synth()
