"""The CDK app synthesizes for every environment in cdk.json (resources come in the infra issue)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
ENVIRONMENTS = json.loads((ROOT / "cdk.json").read_text())["context"]["environments"]
os.environ.setdefault("JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION", "20")
sys.path.insert(0, str(ROOT))


@pytest.mark.parametrize("env_name", ENVIRONMENTS)
def test_every_environment_synthesizes_its_own_stack(env_name: str) -> None:
    from aws_cdk import assertions

    from app import build_app

    app = build_app(env_name, context={"aws:cdk:disable-asset-staging": True})
    stack = app.node.find_child(f"agentq-{env_name}")
    template = assertions.Template.from_stack(stack)  # type: ignore[arg-type]
    resources = template.to_json().get("Resources", {})
    assert set(resources) <= {"CDKMetadata"}  # no resources yet, and none faked


def test_an_unknown_environment_is_refused_with_the_known_ones_named() -> None:
    from app import build_app

    with pytest.raises(SystemExit, match="unknown environment 'qa'; cdk.json defines: dev, staging, prod"):
        build_app("qa")
