"""Each provider declares what it supports (``core/providers/features.py``); a constraint that
does not apply to the task's provider (or, for per-model features, its model) is refused at
submission and at agent registration, naming the field, with nothing stored; what does apply is
accepted. The README and docs/MODEL_CALLS.md show the same table the code enforces."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from agentq.control.agents import create_agent
from agentq.control.submit import submit
from agentq.core.errors import ValidationError
from agentq.core.providers.features import feature_table
from agentq.core.tools import ToolRegistry
from agentq.storage.container import Storage
from agentq.storage.memory import MemoryTable

STORAGE = "memory"
ROOT = Path(__file__).resolve().parent.parent
NOVA = "us.amazon.nova-lite-v1:0"
CLAUDE_ON_CONVERSE = "us.anthropic.claude-sonnet-4-5-20250929-v1:0"


def body(provider: str, model: str, **constraints: Any) -> dict[str, Any]:
    return {"goal": "g", "provider": provider, "model": model, "constraints": constraints}


REFUSED = [
    ("openai", "gpt-4.1", {"economy": True}, "constraints.economy"),
    ("openai", "gpt-4.1", {"compaction": "native"}, "constraints.compaction"),
    ("openai", "gpt-4.1", {"thinking_budget_tokens": 2048, "max_output_tokens": 8192},
     "constraints.thinking_budget_tokens"),
    ("openai", "gpt-4.1", {"effort": "high"}, "constraints.effort"),
    ("bedrock-converse", NOVA, {"thinking_budget_tokens": 2048, "max_output_tokens": 8192},
     "constraints.thinking_budget_tokens"),
    ("bedrock-converse", CLAUDE_ON_CONVERSE, {"effort": "low"}, "constraints.effort"),
    ("bedrock-converse", NOVA, {"economy": True}, "constraints.economy"),
    ("bedrock", "claude-sonnet-4-5", {"compaction": "native"}, "constraints.compaction"),
]  # fmt: skip


@pytest.mark.parametrize(("provider", "model", "constraints", "field"), REFUSED)
def test_a_constraint_the_provider_cannot_honour_is_refused_naming_it_and_nothing_is_stored(
    provider: str, model: str, constraints: dict[str, Any], field: str, store: Storage, registry: ToolRegistry
) -> None:
    with pytest.raises(ValidationError) as refused:
        submit(store, registry, body(provider, model, **constraints), tenant="t")
    assert refused.value.field == field and refused.value.message.startswith(field + ": ")
    assert isinstance(store.table, MemoryTable) and store.table.items() == []


@pytest.mark.parametrize(
    ("provider", "model", "constraints"),
    [("bedrock-converse", CLAUDE_ON_CONVERSE, {"thinking_budget_tokens": 2048, "max_output_tokens": 8192}),
     ("bedrock-converse", NOVA, {"compaction": "summary"}),
     ("openai", "gpt-4.1-mini", {"compaction": "summary"}),
     ("anthropic", "claude-sonnet-4-5", {"economy": True, "compaction": "native", "effort": "high"})],
)  # fmt: skip
def test_what_the_provider_supports_is_accepted(
    provider: str, model: str, constraints: dict[str, Any], store: Storage, registry: ToolRegistry
) -> None:
    task = submit(store, registry, body(provider, model, **constraints), tenant="t")
    assert task.submission.provider == provider


def test_an_agent_version_asking_for_thinking_on_a_model_without_it_is_not_created(
    store: Storage, registry: ToolRegistry
) -> None:
    spec = {"name": "nova-thinker", "provider": "bedrock-converse", "model": NOVA,
            "constraints": {"thinking_budget_tokens": 2048}}  # fmt: skip
    with pytest.raises(ValidationError) as refused:
        create_agent(store, registry, spec, tenant="t")
    assert refused.value.field == "constraints.thinking_budget_tokens"
    agent, created = create_agent(store, registry, {**spec, "model": CLAUDE_ON_CONVERSE}, tenant="t")
    assert created and agent.version == 1


def test_the_readme_and_the_model_calls_page_show_the_table_the_code_enforces() -> None:
    table = feature_table()
    for page in ("README.md", "docs/MODEL_CALLS.md"):
        assert table in (ROOT / page).read_text(), f"{page}: the provider table differs from core/providers/features.py"
