"""Issue 40, part 2, per tenant: ``GET /usage/spend`` (and ``agentq spend``) sum the caller's
task trees' ledgers over a window, the usage the provider reported (known) apart from what is
counted at the holds of calls whose outcome is unknown; another tenant's trees are never in it,
and a bad window is a 422 naming ``hours`` that reads nothing."""

from __future__ import annotations

import time
from decimal import Decimal

import pytest

from agentq.api.models import SpendView
from agentq.cli.fleet import MAX_HOURS as CLI_MAX_HOURS
from agentq.cli.fleet import spend_lines
from agentq.control.spend import MAX_HOURS, tenant_spend
from agentq.core.records import BudgetDelta

from tests.storage_conformance._builders import llm_step
from tests.test_api_routes import A, Api, api

__all__ = ["api"]  # the deployment of tests/test_api_routes.py


def _tree_with(api: Api, tenant: str, *, known: int, unknown: int) -> str:
    """A root task whose ledger holds ``known`` reported tokens and a hold of ``unknown`` counted
    as spent with its outcome unknown (its worker died mid-call)."""
    task_id = api.submit(tenant=tenant)
    store = api.store
    lease, _ = store.tasks.claim(task_id, "w1", 30)  # type: ignore[misc]
    if known:
        settle = BudgetDelta(reserved=0, used=known, cost_usd=Decimal("0.001"), tokens_in=known - 1, tokens_out=1)
        store.steps.commit(lease, 1, llm_step(known - 1, 1), root_id=task_id, settle=settle)
    if unknown:
        held = store.budgets.reserve(lease, task_id, unknown, 2, until=time.time() - 1, micros=500)
        store.budgets.spend_lapsed(task_id, task_id, held)
    return task_id


def test_a_tenants_spend_is_its_trees_ledgers_known_and_unknown_apart_and_no_other_tenants(api: Api) -> None:
    _tree_with(api, A, known=120, unknown=0)
    _tree_with(api, A, known=30, unknown=400)
    _tree_with(api, "other", known=999, unknown=777)
    status, data, _ = api.call("GET", "/usage/spend?hours=1")
    assert status == 200, data
    view = SpendView.model_validate(data)
    assert (view.trees, view.known_tokens, view.unknown_tokens, view.complete) == (2, 150, 400, True)
    assert Decimal(view.known_usd) == Decimal("0.002") and Decimal(view.unknown_usd) == Decimal("0.0005")
    lines = spend_lines(view, 1)
    assert "150 tokens" in lines[1] and "400 tokens" in lines[2] and "unknown" in lines[2]
    later = tenant_spend(api.store, A, 1, now=time.time() + 2 * 3600)  # the window moved past them
    assert (later.trees, later.known_tokens, later.unknown_tokens) == (0, 0, 0)


@pytest.mark.parametrize("hours", ["0", "-1", "745", "nan", "soon", ""])
def test_a_bad_window_is_a_422_naming_hours(api: Api, hours: str) -> None:
    status, data, _ = api.call("GET", f"/usage/spend?hours={hours}")
    assert status == 422, (hours, data)
    assert "hours" in str(data["error"].get("field", "")) + str(data["error"]["message"]), data


def test_the_cli_and_the_api_bound_the_window_alike() -> None:
    assert CLI_MAX_HOURS == MAX_HOURS
