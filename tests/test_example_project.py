"""The example project (examples/shop): its own tool package, an agent definition and the
cdk.json settings that deploy it. Synthesized with those settings, the stack bundles the code
into a layer of its own (and the worker image), and the settings reach the functions; on the
local stack, the same files run end to end through the CLI, against a Messages API server
driven by the real ``anthropic`` SDK."""

from __future__ import annotations

import json
import os
import subprocess
import uuid
from pathlib import Path
from typing import Any

import pytest

os.environ.setdefault("JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION", "20")

from agentq_dev.stack import LocalStack
from infra.synth import Synthesized, synthesize

from tests.fake_messages_api import FakeMessagesAPI, anthropic_env, text_reply, tool_use_reply
from tests.helpers import run_agentq, wait_for

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "shop"
CONTEXT = json.loads((ROOT / "cdk.json").read_text())["context"]
ORDERS_TABLE = "arn:aws:dynamodb:eu-west-1:123456789012:table/shop-orders"


@pytest.fixture(scope="module")
def shop_synth(tmp_path_factory: pytest.TempPathFactory) -> Synthesized:
    """dev with the example's user_code (plus a statement its tools would need) and the Fargate
    worker built from the repo's Dockerfile."""
    envs = CONTEXT["environments"]
    dev = json.loads(json.dumps(envs["dev"]))
    dev.update(json.loads((EXAMPLE / "cdk-settings.json").read_text()))
    dev["user_code"]["iam_statements"] = [
        {"sid": "ShopOrders", "actions": ["dynamodb:GetItem"], "resources": [ORDERS_TABLE]}
    ]
    dev["worker"] = {"enabled": True, "min_tasks": 0, "max_tasks": 2}
    return synthesize("dev", tmp_path_factory.mktemp("shop") / "synth", context={"environments": {**envs, "dev": dev}})


def _function(synth: Synthesized, name: str) -> dict[str, Any]:
    [fn] = [r for r in synth.resources("AWS::Lambda::Function").values()
            if r["Properties"].get("FunctionName") == f"agentq-dev-{name}"]  # fmt: skip
    return fn


def _policy_statements(synth: Synthesized, role_prefix: str) -> list[dict[str, Any]]:
    statements = []
    for policy in synth.resources("AWS::IAM::Policy").values():
        roles = [r.get("Ref", "") for r in policy["Properties"]["Roles"]]
        if any(r.startswith(role_prefix) for r in roles):
            statements += policy["Properties"]["PolicyDocument"]["Statement"]
    return statements


@pytest.mark.xdist_group("cdk")  # a synth: with the other tests that load the jsii runtime (test_cdk_stack)
def test_the_example_synthesizes_with_its_code_in_a_layer_and_its_settings_on_the_functions(
    shop_synth: Synthesized,
) -> None:
    assets = json.loads((shop_synth.outdir / f"{shop_synth.stack_name}.assets.json").read_text())
    layer_dirs = [Path(f["source"]["path"]) for f in assets["files"].values() if "user-" in f["source"]["path"]]
    [layer_dir] = layer_dirs
    assert (layer_dir / "python" / "shop_tools" / "__init__.py").read_text() == (
        EXAMPLE / "src" / "shop_tools" / "__init__.py"
    ).read_text()
    [user_layer] = [
        lid for lid, r in shop_synth.resources("AWS::Lambda::LayerVersion").items() if lid.startswith("UserCodeLayer")
    ]
    for name in ("executor", "api"):
        fn = _function(shop_synth, name)["Properties"]
        assert {"Ref": user_layer} in fn["Layers"], name
        env = fn["Environment"]["Variables"]
        assert env["AGENTQ_TOOL_MODULES"] == "shop_tools" and env["AGENTQ_SECRET_NAMES"] == "shop-api-key"
        assert env["AGENTQ_SECRETS_BACKEND"] == "secretsmanager"
    assert {"Ref": user_layer} not in _function(shop_synth, "authorizer")["Properties"]["Layers"]

    executor = _policy_statements(shop_synth, "ExecutorFunctionRole")
    orders = [s for s in executor if s.get("Sid") == "ShopOrders"]
    assert orders and orders[0]["Action"] == "dynamodb:GetItem" and orders[0]["Resource"] == ORDERS_TABLE
    secrets = [s for s in executor if s.get("Sid") == "UserCodeSecrets"]
    assert secrets and "secret:shop-api-key-??????" in json.dumps(secrets[0]["Resource"])
    api = _policy_statements(shop_synth, "ApiFunctionRole")
    assert not [s for s in api if s.get("Sid") == "ShopOrders"]  # the API validates tools, never runs them

    [image] = assets["dockerImages"].values()
    assert image["source"]["dockerFile"] == "Dockerfile" and image["source"]["directory"] == str(ROOT)
    assert image["source"]["dockerBuildArgs"] == {
        "USER_CODE_DIR": "examples/shop/src",
        "USER_REQUIREMENTS": "examples/shop/requirements.txt",
    }
    [task_def] = shop_synth.resources("AWS::ECS::TaskDefinition").values()
    worker_env = {e["Name"]: e["Value"] for e in task_def["Properties"]["ContainerDefinitions"][0]["Environment"]}
    assert worker_env["AGENTQ_TOOL_MODULES"] == "shop_tools"
    worker = _policy_statements(shop_synth, "WorkerTaskTaskRole")
    assert [s for s in worker if s.get("Sid") == "ShopOrders"]


def test_a_bad_user_code_setting_fails_the_synth_naming_it() -> None:
    from infra.settings import resolve

    envs = CONTEXT["environments"]
    for user_code, message in [
        ({"package_dir": "examples/shop/src", "tool_modules": ["shop tools"]}, "is not a module name"),
        ({"package_dir": "x", "tool_modules": ["m"], "iam_statements": [{"actions": ["s3:GetObject"], "resources": ["*"]}]}, "not '*'"),
        ({"package_dir": "x", "tool_modules": ["m"], "mcp_servers": {"files": {"command": ["files-mcp"]}}}, "give url"),
    ]:  # fmt: skip
        dev = {**envs["dev"], "user_code": user_code}
        with pytest.raises(ValueError, match=message):
            resolve({**envs, "dev": dev}, CONTEXT.get("environment_defaults"), "dev")


def test_the_example_runs_end_to_end_on_the_local_stack_through_the_cli(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.syspath_prepend(str(EXAMPLE / "src"))  # the API's process loads the tools too, as `agentq dev` does
    ledger = tmp_path / "refunds.jsonl"
    with FakeMessagesAPI() as model:
        model.enqueue(
            tool_use_reply("lookup_order", {"order_id": "17"}, text="Let me look the order up."),
            tool_use_reply("refund_order", {"order_id": "17", "amount_cents": 4200, "reason": "never arrived"}),
            text_reply("Refunded order 17 in full (4200 cents)."),
        )
        with LocalStack(
            prefix=f"shop{uuid.uuid4().hex[:8]}",
            workers=1,
            tool_modules=("shop_tools",),
            extra_env={
                "PYTHONPATH": os.pathsep.join([str(EXAMPLE / "src"), str(ROOT)]),
                **anthropic_env(model, "sk-ant-local"),
                "AGENTQ_SECRET_NAMES": "shop-api-key",
                "AGENTQ_SECRET_SHOP_API_KEY": "shop-secret",
                "SHOP_REFUND_LEDGER": str(ledger),
            },
        ) as stack:
            assert stack.api_server is not None
            env = stack.env(AGENTQ_URL=stack.api_server.url)

            def agentq(*args: str) -> subprocess.CompletedProcess[str]:
                return run_agentq(list(args), env=env, timeout=120, cwd=ROOT)

            created = agentq("agents", "create", "-f", str(EXAMPLE / "agent.yaml"))
            assert created.returncode == 0 and created.stdout.strip() == "refunds@1", created.stderr
            submitted = agentq("submit", "--agent", "refunds", "Order 17 never arrived; please refund it.")
            assert submitted.returncode == 0, submitted.stderr
            task_id = submitted.stdout.strip()
            store = stack.store()
            wait_for(
                lambda: store.tasks.get(task_id).status.value == "paused", timeout=60, what="the refund's approval"
            )
            assert not ledger.exists()  # asked, not run
            shown = agentq("status", task_id)
            assert "refund_order" in shown.stdout and "4200" in shown.stdout, shown.stdout
            approved = agentq("approve", task_id, "--note", "checked with the courier")
            assert approved.returncode == 0, approved.stderr
            result = agentq("result", task_id, "--wait")
            assert result.returncode == 0 and result.stdout.strip() == "Refunded order 17 in full (4200 cents).", (
                result.stderr
            )

    [refund] = [json.loads(line) for line in ledger.read_text().splitlines()]
    assert refund["order_id"] == "17" and refund["amount_cents"] == 4200 and refund["authenticated"]
    sent = model.requests[0].body
    [system] = sent["system"]  # one text block, with the prompt cache's breakpoint
    assert system["text"].startswith("You handle refund requests") and sent["model"] == "claude-sonnet-4-6"
    assert system["cache_control"] == {"type": "ephemeral", "ttl": "1h"}  # refunds wait for a person: an hour
    assert [t["name"] for t in sent["tools"]] == ["lookup_order", "refund_order"]
