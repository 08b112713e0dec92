"""A fork never makes a call its source asked for a second time (ARCHITECTURE 3): a fork at the
model's turn that asked for tool calls would make them again under its own task id, where
neither the source's effect records nor its idempotency keys could stop them. Such an
``at_step`` is refused, naming the step that keeps their results and the one that asks the model
again; every other step forks, and its copied calls are never made again.

On the in-memory twin with the real engine and the ledger tool of tests/effect_tools.py (the
API's 422: tests/test_api_routes.py; the CLI's exit code: tests/test_cli.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from agentq.control import operations as control
from agentq.core.engine import Engine, EngineConfig
from agentq.core.errors import ValidationError
from agentq.core.models import LLMStep, TaskStatus, TaskSubmission
from agentq.core.tools import ToolRegistry, idempotency_key_for
from agentq.storage.container import Storage

from tests.helpers import call, scripted

STORAGE = "memory"
# Steps: 1 asks for two calls, 2 makes them, 3 asks for one, 4 makes it, 5 answers.
TURNS = [
    {
        "text": "pay and look",
        "tool_calls": [call("charge_card", amount_cents=700, memo="a"), call("lookup", query="x")],
    },
    {"text": "pay again", "tool_calls": [call("charge_card", amount_cents=300, memo="b")]},
    {"text": "done"},
]


class _Queues:
    """Stands in for TaskQueues: a fork is enqueued; here the test runs it itself."""

    def send(self, *_: Any, **__: Any) -> None:
        return None


def _run(store: Storage, registry: ToolRegistry, task_id: str) -> TaskStatus | None:
    return Engine(store, worker_id="w", tools=registry, config=EngineConfig(lease_seconds=30)).run(task_id).status


def _charges(ledger: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in ledger.read_text().splitlines()] if ledger.exists() else []


def _asked(store: Storage, task_id: str, after: int) -> set[str]:
    """The idempotency keys of the charges ``task_id``'s own turns asked for (past its copied steps)."""
    return {
        idempotency_key_for(task_id, use["id"])
        for record in store.steps.load(task_id)[after:]
        if isinstance(record.body, LLMStep)
        for use in record.body.tool_uses()
        if use["name"] == "charge_card"
    }


def test_a_fork_at_any_step_never_makes_a_call_its_source_asked_for_again(
    store: Storage, registry: ToolRegistry, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every step of a source whose turns ask for a side effect, a read-only call, and both:
    a fork at a turn that asked for calls is refused (422 ``at_step``), naming both steps to
    fork at instead, and creates nothing; a fork at any other step runs to its end, and the
    ledger holds each charge once, made by the task whose own turn asked for it."""
    ledger = tmp_path / "ledger.jsonl"
    monkeypatch.setenv("AGENTQ_TEST_LEDGER", str(ledger))
    source = store.tasks.create(scripted(TURNS, tools=["charge_card", "lookup"]), tenant="acme")
    assert _run(store, registry, source.task_id) is TaskStatus.SUCCEEDED
    steps = store.steps.load(source.task_id)
    made = {source.task_id: _asked(store, source.task_id, 0)}
    refused = []
    for at in range(len(steps) + 1):  # every step, the answer included
        before = store.table.items()  # type: ignore[attr-defined]
        try:
            fork = control.fork(store, registry, _Queues(), source.task_id, at_step=at, tenant="acme")  # type: ignore[arg-type]
        except ValidationError as exc:
            assert exc.field == "at_step"
            assert f"at_step {at} is the model's turn asking for tool calls" in exc.message
            assert f"fork at step {at + 1} to keep their results, or at step {at - 1} to ask" in exc.message
            assert store.table.items() == before  # type: ignore[attr-defined]
            refused.append(at)
            continue
        assert _run(store, registry, fork.task_id) is TaskStatus.SUCCEEDED  # never left running
        if at == len(steps):  # at the answer: it ends with it, and nothing of it runs again
            assert store.tasks.get(fork.task_id).result == store.tasks.get(source.task_id).result == "done"
            assert store.steps.committed(fork.task_id) == at
        made[fork.task_id] = _asked(store, fork.task_id, at)
    keys = [c["key"] for c in _charges(ledger)]
    assert sorted(keys) == sorted(k for asked in made.values() for k in asked), "a charge made twice, or by a copy"
    assert len(set(keys)) == len(keys)
    asking = [r.number for r in steps if isinstance(r.body, LLMStep) and r.body.tool_uses()]
    assert refused == asking == [1, 3]


@pytest.mark.parametrize("checked_by", ["output_schema", "outcome"])
def test_a_fork_at_an_answer_something_still_checks_runs_to_its_end(
    store: Storage, registry: ToolRegistry, checked_by: str
) -> None:
    """An answer a schema or an outcome still checks is not the end of the fork's run: it asks
    again (a schema) or grades it (an outcome), and ends, never left ``running``."""
    body = scripted([{"text": '{"a": 1}'}, {"text": '{"a": 2}'}]).model_dump(mode="json")
    if checked_by == "output_schema":
        body["output_schema"] = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    source = store.tasks.create(TaskSubmission.model_validate(body), tenant="acme")
    assert _run(store, registry, source.task_id) is TaskStatus.SUCCEEDED
    grade = {"turns": [{"text": '{"score": 1, "feedback": ""}'}]}
    overrides = {"outcome": {"rubric": "The answer is a JSON object.", "script": grade}}
    fork = control.fork(store, registry, _Queues(), source.task_id, at_step=1, tenant="acme",  # type: ignore[arg-type]
                        overrides=overrides if checked_by == "outcome" else None)  # fmt: skip
    assert _run(store, registry, fork.task_id) is not None
    assert store.tasks.get(fork.task_id).status.terminal


def test_a_fork_at_a_turn_whose_calls_the_source_has_not_made_is_refused_naming_the_step_before(
    store: Storage, registry: ToolRegistry, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A source paused on a person's decision has committed the turn asking for its calls and
    not their results: a fork there would make them beside the source (which makes them once
    approved), so it is refused too, naming the step that asks the model again; the same holds
    once the source is cancelled (its calls may have begun). Nothing is created either time."""
    monkeypatch.setenv("AGENTQ_TEST_LEDGER", str(tmp_path / "ledger.jsonl"))
    turns = [{"text": "", "tool_calls": [call("request_approval", question="pay?"),
                                         call("charge_card", amount_cents=900, memo="c")]}, {"text": "done"}]  # fmt: skip
    source = store.tasks.create(scripted(turns, tools=["request_approval", "charge_card"]), tenant="acme")
    assert _run(store, registry, source.task_id) is TaskStatus.PAUSED
    for status in (TaskStatus.PAUSED, TaskStatus.CANCELLED):
        if status is TaskStatus.CANCELLED:
            control.cancel(store, source.task_id)
        assert store.tasks.get(source.task_id).status is status
        before = store.table.items()  # type: ignore[attr-defined]
        with pytest.raises(ValidationError) as exc:
            control.fork(store, registry, _Queues(), source.task_id, at_step=1, tenant="acme")  # type: ignore[arg-type]
        assert exc.value.field == "at_step" and exc.value.message == (
            "at_step 1 is the model's turn asking for tool calls (request_approval, charge_card), whose results the "
            "source has not committed: a fork from it could make them a second time; fork at step 0 to ask the "
            "model again"
        )
        assert store.table.items() == before  # type: ignore[attr-defined]
    assert not (tmp_path / "ledger.jsonl").exists()


def test_the_store_never_writes_a_fork_that_ends_on_a_turn_asking_for_calls(
    store: Storage, registry: ToolRegistry, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``Tasks.fork`` is the backstop of ``control.fork``'s check: given such steps it raises
    before it writes anything."""
    monkeypatch.setenv("AGENTQ_TEST_LEDGER", str(tmp_path / "ledger.jsonl"))
    source = store.tasks.create(scripted(TURNS, tools=["charge_card", "lookup"]), tenant="acme")
    assert _run(store, registry, source.task_id) is TaskStatus.SUCCEEDED
    steps, before = store.steps.load(source.task_id), store.table.items()  # type: ignore[attr-defined]
    for upto in (1, 3):
        with pytest.raises(ValueError, match=f"a fork cannot end on step {upto}: its tool calls would be made again"):
            store.tasks.fork(source, TaskSubmission.model_validate(source.submission.model_dump()), steps[:upto],
                             tenant="acme")  # fmt: skip
    assert store.table.items() == before  # type: ignore[attr-defined]


def test_a_fork_at_an_answer_cut_off_at_the_output_limit_ends_failed_as_its_source_did(
    store: Storage, registry: ToolRegistry
) -> None:
    """A fork at the model's answer ends as that answer ended its source: one cut off at
    ``max_tokens`` failed the source (``output_truncated``), so the fork that copies it fails
    too, with no result; ended ``succeeded``, its dependents and callback took the cut text for
    an answer. A whole answer still ends the fork ``succeeded`` with it."""
    cut = store.tasks.create(scripted([{"text": "word " * 400}], max_output_tokens=16), tenant="acme")
    _run(store, registry, cut.task_id)
    assert (store.tasks.get(cut.task_id).error or {}).get("code") == "output_truncated"
    fork = control.fork(store, registry, _Queues(), cut.task_id, at_step=1, tenant="acme")  # type: ignore[arg-type]
    assert _run(store, registry, fork.task_id) is TaskStatus.FAILED
    ended = store.tasks.get(fork.task_id)
    assert ended.error is not None and ended.error["code"] == "output_truncated" and ended.result is None
    whole = store.tasks.create(scripted([{"text": "a whole answer"}]), tenant="acme")
    _run(store, registry, whole.task_id)
    fork = control.fork(store, registry, _Queues(), whole.task_id, at_step=1, tenant="acme")  # type: ignore[arg-type]
    assert _run(store, registry, fork.task_id) is TaskStatus.SUCCEEDED
    assert store.tasks.get(fork.task_id).result == "a whole answer"
