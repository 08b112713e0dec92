"""Invariant 4's money: a call is charged by the model the reply names where its hold covers
that model, and where it does not (a gateway or router answering in another model than asked),
at the dearer of that model's price and the asked one's, whole: the ledger never says less than
may have been billed, and a warning says by how much the cap was passed. Through the real
``openai`` SDK against the local Chat Completions server, the engine on the in-memory store.

The hold is priced on the task's models (``_holds._price``: its own, or with fallbacks the
dearest of them); the settlement used to be priced on whatever model the reply named, without
a word (``_llm_call.call_cost``), and a cheaper one named was charged less than the model asked.
"""

from __future__ import annotations

import logging
from typing import Any

import pytest

from agentq.core.engine import Engine, EngineConfig
from agentq.core.models import TaskSubmission, Usage
from agentq.core.pricing import load_price_table, micros
from agentq.core.tools import ToolRegistry
from agentq.storage.container import Storage

from tests.fake_model_servers import FakeChatCompletions, chat_completion

STORAGE = "memory"
MINI, FULL, NANO = "gpt-4.1-mini", "gpt-4.1", "gpt-4.1-nano"
USAGE = Usage(input_tokens=30, output_tokens=64)  # what each reply below reports


def _answered_as(
    store: Storage, registry: ToolRegistry, monkeypatch: pytest.MonkeyPatch, model: str,
    money: float | None = None, fallback: str | None = None,
) -> Any:  # fmt: skip
    """The budget of a task asking gpt-4.1-mini (with a money cap of ``money``, a fallback
    model), answered by a server whose reply names ``model``."""
    monkeypatch.setenv("AGENTQ_PROVIDER_RETRY", '{"base_delay": 0.0, "max_delay": 0.0, "max_attempts": 1}')
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    constraints = {"tools": [], "max_output_tokens": 64, "max_tokens": 20_000}
    body = {"goal": "say done", "provider": "openai", "model": MINI, "constraints": constraints,
            "fallbacks": [{"provider": "openai", "model": fallback}] if fallback else []}  # fmt: skip
    if money is not None:
        constraints["max_cost_usd"] = money
    with FakeChatCompletions() as server:
        monkeypatch.setenv("OPENAI_BASE_URL", server.openai_base_url)
        server.enqueue(chat_completion("done", model=model, prompt_tokens=30, completion_tokens=64))
        task_id = store.tasks.create(TaskSubmission.model_validate(body), tenant="t").task_id
        Engine(store, worker_id="w", tools=registry, config=EngineConfig(lease_seconds=5)).run(task_id)
        assert [r.body["model"] for r in server.requests] == [MINI]
    return store.budgets.get(task_id)


def _cost(model: str) -> int:
    return micros(load_price_table().cost(model, USAGE))


def _substitution_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "a model the task did not name" in r.getMessage()]


def test_a_reply_that_names_a_dearer_model_past_the_hold_is_charged_that_price_whole_and_said_to_pass_the_cap(
    store: Storage, registry: ToolRegistry, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Charged gpt-4.1's price (the gateway may bill the model it used), never clamped to the
    hold: the ledger says what may have been billed, and the next hold is refused. A warning
    names both models and what was charged past the hold."""
    caplog.set_level(logging.WARNING, logger="agentq.engine")
    budget = _answered_as(store, registry, monkeypatch, FULL, money=0.0002)
    assert budget.used_micros == _cost(FULL) > budget.cap_micros == 200
    assert budget.available_micros < 0  # no further hold fits: the task stops spending
    (warning,) = _substitution_warnings(caplog)
    assert f"'{MINI}'" in warning and f"'{FULL}'" in warning and "past the call's hold" in warning


def test_a_reply_that_names_a_dearer_model_within_the_hold_is_charged_that_models_price(
    store: Storage, registry: ToolRegistry, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Where the hold covers it (here sized on the task's fallback, gpt-4o, dearer than
    gpt-4.1 in every rate), the dearer price is charged whole: the ledger says what a gateway
    billing the model it used would bill."""
    caplog.set_level(logging.WARNING, logger="agentq.engine")
    budget = _answered_as(store, registry, monkeypatch, FULL, fallback="gpt-4o")
    assert budget.used_micros == _cost(FULL) and len(_substitution_warnings(caplog)) == 1


def test_a_reply_that_names_a_cheaper_model_the_task_did_not_name_is_charged_the_model_asked(
    store: Storage, registry: ToolRegistry, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The gateway may bill the model asked for: the dearer of the two is charged, never less."""
    caplog.set_level(logging.WARNING, logger="agentq.engine")
    budget = _answered_as(store, registry, monkeypatch, NANO)
    assert budget.used_micros == _cost(MINI) > _cost(NANO)
    assert len(_substitution_warnings(caplog)) == 1


@pytest.mark.parametrize("answered", [MINI, f"{MINI}-2025-04-14", f"openai/{MINI}"])
def test_a_reply_that_names_the_model_asked_or_its_dated_id_is_charged_its_price_without_a_word(
    store: Storage, registry: ToolRegistry, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
    answered: str,
) -> None:  # fmt: skip
    caplog.set_level(logging.WARNING, logger="agentq.engine")
    budget = _answered_as(store, registry, monkeypatch, answered, money=0.0002)
    assert budget.used_micros == _cost(MINI) and _substitution_warnings(caplog) == []


def test_a_reply_that_names_one_of_the_tasks_fallbacks_is_charged_that_fallbacks_price(
    store: Storage, registry: ToolRegistry, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A model the task named (its fallback) is what its hold was sized on: its own price, whole,
    even where a router in front of the server took the fallback itself."""
    caplog.set_level(logging.WARNING, logger="agentq.engine")
    budget = _answered_as(store, registry, monkeypatch, FULL, fallback=FULL)
    assert budget.used_micros == _cost(FULL) and _substitution_warnings(caplog) == []
