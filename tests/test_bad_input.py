"""Invariant 7: each invalid field of a submission gets a precise error and writes nothing.

Validation is the control plane's own, so this runs on the in-memory twin of the table, where
"nothing written" is every item of the table (a scan of DynamoDB's, before)."""

from __future__ import annotations

from typing import Any

import pytest

from agentq.control.submit import submit
from agentq.core.errors import ValidationError
from agentq.core.tools import ToolRegistry
from agentq.storage.container import Storage
from agentq.storage.memory import MemoryTable

VALID: dict[str, Any] = {
    "goal": "summarise the report",
    "provider": "scripted",
    "script": {"turns": [{"text": "done"}]},
    "constraints": {"max_tokens": 1000, "max_steps": 5, "timeout_seconds": 60, "tools": ["lookup"]},
    "priority": "high",
    "metadata": {"team": "growth"},
}


# The engine's own behaviour needs no AWS. ``store`` and ``registry`` (tests/conftest.py) are the in-memory twin's;
# tests that race processes or use queues ask for ``settings`` and build their own.
STORAGE = "memory"


def _items(store: Storage) -> list[dict[str, Any]]:
    """Every item of the table."""
    assert isinstance(store.table, MemoryTable), type(store.table)
    return store.table.items()


def _with(path: str, value: Any) -> dict[str, Any]:
    body = {**VALID, "constraints": dict(VALID["constraints"]), "script": {"turns": [{"text": "done"}]}}
    target = body
    *parents, leaf = path.split(".")
    for part in parents:
        target = target[part]
    if value is _DELETE:
        del target[leaf]
    else:
        target[leaf] = value
    return body


_DELETE = object()

CASES = [
    ("goal", "", "goal"),
    ("goal", "x" * 20_001, "goal"),
    ("goal", _DELETE, "goal"),
    ("goal", 42, "goal"),
    ("provider", "vertex", "provider"),
    ("model", "", "model"),
    ("priority", "urgent", "priority"),
    ("constraints.max_tokens", 0, "constraints.max_tokens"),
    ("constraints.max_tokens", -5, "constraints.max_tokens"),
    ("constraints.max_tokens", "lots", "constraints.max_tokens"),
    ("constraints.max_steps", 0, "constraints.max_steps"),
    ("constraints.timeout_seconds", 86_401, "constraints.timeout_seconds"),
    ("constraints.timeout_seconds", 0, "constraints.timeout_seconds"),
    ("constraints.tools", "lookup", "constraints.tools"),
    ("constraints.tools", ["lookup", "lookup"], "constraints.tools"),
    ("constraints.tools", ["lookup", "rm_rf"], "constraints.tools[1]"),
    ("constraints.surprise", 1, "constraints.surprise"),
    ("metadata", {"k": 1}, "metadata.k"),
    ("colour", "blue", "colour"),
    ("script", None, "script"),
    ("script", "no-such-script", "script"),
    ("script", {"turns": []}, "script"),
]


@pytest.mark.parametrize(("path", "value", "field"), CASES, ids=[f"{p}={str(v)[:20]}" for p, v, _ in CASES])
def test_each_invalid_field_is_named_and_nothing_is_written(
    path: str, value: Any, field: str, store: Storage, registry: ToolRegistry
) -> None:
    with pytest.raises(ValidationError) as err:
        submit(store, registry, _with(path, value), tenant="t")
    assert err.value.field is not None and err.value.field.startswith(field.split("[", maxsplit=1)[0])
    assert field in (err.value.field, "script")
    assert err.value.message.startswith(err.value.field + ": ")
    assert _items(store) == []


def test_a_non_object_submission_is_refused(store: Storage, registry: ToolRegistry) -> None:
    with pytest.raises(ValidationError) as err:
        submit(store, registry, ["goal"], tenant="t")
    assert err.value.field == "body"
    assert _items(store) == []


def test_a_valid_submission_writes_the_task_and_its_budget_together(store: Storage, registry: ToolRegistry) -> None:
    task = submit(store, registry, VALID, tenant="t")
    keys = {(i["pk"], i["sk"]) for i in _items(store)}
    assert keys == {(f"TASK#{task.task_id}", "META"), (f"TASK#{task.task_id}", "META#SUBMISSION")}  # budget on META
    assert store.budgets.get(task.task_id).cap == 1000


def test_the_error_message_names_the_available_tools(store: Storage, registry: ToolRegistry) -> None:
    with pytest.raises(ValidationError) as err:
        submit(store, registry, _with("constraints.tools", ["nope"]), tenant="t")
    assert "unknown tool 'nope'" in err.value.message and "python_exec" in err.value.message


def test_a_model_with_no_price_is_refused_rather_than_charged_nothing(store: Storage, registry: ToolRegistry) -> None:
    body = {"goal": "g", "provider": "anthropic", "model": "claude-nova-9"}
    with pytest.raises(ValidationError) as err:
        submit(store, registry, body, tenant="t")
    assert err.value.field == "model"
    assert err.value.message.startswith("model: no price for 'claude-nova-9'") and "AGENTQ_PRICES" in err.value.message
    assert _items(store) == []
    # dated and Bedrock ids of a priced model are priced by its key
    for model in ("claude-sonnet-4-5-20250929", "us.anthropic.claude-haiku-4-5-20251001-v1:0"):
        submit(store, registry, {**body, "model": model}, tenant="t")


def test_a_model_the_deployment_prices_is_accepted(
    store: Storage, registry: ToolRegistry, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AGENTQ_PRICES", '{"claude-nova-9": {"input_per_mtok": "2", "output_per_mtok": "8"}}')
    task = submit(store, registry, {"goal": "g", "provider": "anthropic", "model": "claude-nova-9"}, tenant="t")
    assert task.submission.model == "claude-nova-9"
