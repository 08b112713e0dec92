"""Invariant 6: a 300-step conversation with 50 KB tool outputs keeps every DynamoDB item
far under 400 KB, and payloads over the threshold go to the payload store (S3) behind a pointer.

The item layout is the engine's and the repositories', so this runs on the in-memory twin,
which keeps items in DynamoDB's wire form and refuses one over 400 KB as DynamoDB does."""

from __future__ import annotations

from agentq.core.engine import Engine, EngineConfig
from agentq.core.models import TaskStatus
from agentq.core.tools import ToolRegistry
from agentq.storage.container import Storage

from tests.helpers import call, scripted

DDB_ITEM_LIMIT = 400 * 1024


# The engine's own behaviour needs no AWS. ``store`` and ``registry`` (tests/conftest.py) are the in-memory twin's;
# tests that race processes or use queues ask for ``settings`` and build their own.
STORAGE = "memory"


def _item_bytes(item: dict) -> int:  # type: ignore[type-arg]
    """DynamoDB's item size: attribute names plus values (strings as UTF-8, numbers ~21 B)."""
    size = 0
    for name, value in item.items():
        size += len(name.encode())
        ((kind, raw),) = value.items()
        if kind == "S":
            size += len(raw.encode())
        elif kind == "N":
            size += 21
        else:
            size += len(str(raw).encode())
    return size


def test_300_steps_of_50kb_tool_outputs_keep_every_item_bounded(store: Storage, registry: ToolRegistry) -> None:
    turns = [{"text": f"step {i}", "tool_calls": [call("lookup", query=str(i), size=50_000)]} for i in range(150)]
    turns.append({"text": "finished"})
    task = store.tasks.create(scripted(turns, tools=["lookup"], max_tokens=900_000_000, max_steps=200), tenant="t")
    meta_before = _item_bytes(next(i for i in store.steps.raw_items(task.task_id) if i["sk"]["S"] == "META"))
    result = Engine(store, worker_id="w", tools=registry, config=EngineConfig(lease_seconds=60)).run(task.task_id)
    assert result.status is TaskStatus.SUCCEEDED
    items = store.steps.raw_items(task.task_id)
    steps = [i for i in items if i["sk"]["S"].startswith("STEP#")]
    assert len(steps) == 301
    sizes = [_item_bytes(i) for i in items]
    assert max(sizes) < 100 * 1024  # 50 KB outputs inline, with room to spare
    assert max(sizes) < DDB_ITEM_LIMIT
    # The META item does not grow with the history (300 steps add only counters and a result).
    meta = next(i for i in items if i["sk"]["S"] == "META")
    assert _item_bytes(meta) - meta_before < 1024


def test_a_payload_over_the_threshold_goes_to_s3_behind_a_pointer(store: Storage, registry: ToolRegistry) -> None:
    turns = [
        {"text": "big", "tool_calls": [call("lookup", query="a", size=50_000), call("lookup", query="b", size=50_000)]},
        {"text": "done"},
    ]
    task = store.tasks.create(scripted(turns, tools=["lookup"]), tenant="t")
    Engine(store, worker_id="w", tools=registry).run(task.task_id)
    items = {i["sk"]["S"]: i for i in store.steps.raw_items(task.task_id)}
    tools_item = items["STEP#000002"]
    assert "ref" in tools_item and "body" not in tools_item  # 100 KB of results: offloaded
    assert _item_bytes(tools_item) < 1024
    step = store.steps.load(task.task_id)[1].body
    assert [len(r.content) for r in step.results] == [50_000, 50_000]  # type: ignore[union-attr]
