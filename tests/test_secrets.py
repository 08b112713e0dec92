"""Secrets reach a tool through its ``ToolContext`` (the environment locally, Secrets Manager
in AWS), only those the deployment grants, never through the task's input; MCP headers expand
``${secret:NAME}`` the same way."""

from __future__ import annotations

import pytest

from agentq.core.engine import Engine, EngineConfig
from agentq.core.models import TaskStatus, ToolsStep
from agentq.core.secrets import Secrets, SecretUnavailable, env_var_for
from agentq.core.tools import ToolContext, ToolRegistry, tool
from agentq.runtime import build_secrets
from agentq.storage.container import Storage

from tests.helpers import call, scripted


@tool
def read_secret(secret: str, ctx: ToolContext) -> str:
    """Says whether a secret can be read (never what it is)."""
    value = ctx.secret(secret)
    return f"{secret}: {len(value)} characters"


ENV = {
    env_var_for("stripe-key"): "sk_test_123",
    env_var_for("other-team"): "theirs",
    "AGENTQ_SECRET_NAMES": "stripe-key",
}


def test_a_tool_reads_a_granted_secret_and_is_refused_any_other(store: Storage) -> None:
    turns = [
        {"text": "", "tool_calls": [call("read_secret", secret="stripe-key"), call("read_secret", secret="other-team"),
                                    call("read_secret", secret="../../etc/passwd")]},
        {"text": "done"},
    ]  # fmt: skip
    task = store.tasks.create(scripted(turns, tools=["read_secret"]), tenant="t")
    engine = Engine(store, worker_id="w", tools=ToolRegistry([read_secret]), config=EngineConfig(lease_seconds=10),
                    secrets=Secrets.from_env(ENV))  # fmt: skip
    assert engine.run(task.task_id).status is TaskStatus.SUCCEEDED
    [granted, other, bad] = next(
        s.body.results for s in store.steps.load(task.task_id) if isinstance(s.body, ToolsStep)
    )
    assert granted.content == "stripe-key: 11 characters" and not granted.is_error
    assert other.is_error and "not one this deployment grants" in other.content
    assert bad.is_error and "not a secret name" in bad.content


def test_headers_expand_secret_references_and_a_missing_secret_is_named() -> None:
    secrets = Secrets.from_env(ENV)
    assert secrets.expand("Bearer ${secret:stripe-key}") == "Bearer sk_test_123"
    with pytest.raises(SecretUnavailable, match="AGENTQ_SECRET_NOPE"):
        Secrets.from_env({}).get("nope")
    assert build_secrets(ENV).get("stripe-key") == "sk_test_123"  # locally: the environment
