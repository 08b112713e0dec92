"""A deployment's budget defaults (cdk.json budget_defaults -> AGENTQ_DEFAULT_*): they fill
what a submission leaves out, never what it sends; a bad variable fails at start naming the
variable; the default tenant cap applies to tenants with no limits of their own."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from agentq.api.http_server import proxy_event
from agentq.control.defaults import ConfigurationError, Defaults
from agentq.core.engine import Engine, EngineConfig
from agentq.core.models import Constraints, TaskStatus, TaskSubmission
from agentq.core.tenancy import TenantLimits
from agentq.core.tools import ToolRegistry
from agentq.resources import QueueSettings, provision
from agentq.runtime import Settings, build_store, session
from agentq.storage.container import Storage
from agentq.storage.tenant_windows import TenantWindows
from agentq_dev.moto_server import MotoServer

from tests.helpers import call, run_agentq, scripted
from tests.lambda_support import FakeLambdaContext, load_handler

SUB = {"goal": "say hi", "provider": "scripted", "script": {"turns": [{"text": "hi"}]}}
DEPLOYED = {
    "AGENTQ_DEFAULT_MAX_TOKENS": "12345",
    "AGENTQ_DEFAULT_MAX_STEPS": "7",
    "AGENTQ_DEFAULT_TIMEOUT_SECONDS": "600",
}


def test_unset_variables_leave_the_core_defaults() -> None:
    defaults = Defaults.from_env({})
    submission = TaskSubmission.model_validate(SUB)
    assert defaults.apply(submission).constraints == Constraints()
    assert defaults.tenant_limits() is None and defaults.env() == {}


@pytest.mark.parametrize(
    ("variable", "value", "says"),
    [
        ("AGENTQ_DEFAULT_MAX_TOKENS", "lots", "valid integer"),
        ("AGENTQ_DEFAULT_MAX_STEPS", "0", "greater than or equal to 1"),
        ("AGENTQ_DEFAULT_TIMEOUT_SECONDS", "999999", "less than or equal to"),
        ("AGENTQ_DEFAULT_TENANT_HOURLY_TOKENS", "-5", "greater than or equal to 1"),
        ("AGENTQ_DEFAULT_TENANT_HOURLY_USD", "free", "decimal"),
        ("AGENTQ_ECONOMY_TIERS", "cheap", "should match pattern"),
    ],
)
def test_a_bad_variable_fails_naming_the_variable(variable: str, value: str, says: str) -> None:
    with pytest.raises(ConfigurationError) as err:
        Defaults.from_env({variable: value})
    assert err.value.field == variable
    assert (
        err.value.message.startswith(f"{variable}: ") and says in err.value.message and repr(value) in err.value.message
    )


def test_defaults_fill_only_the_constraints_a_submission_leaves_out() -> None:
    defaults = Defaults.from_env(DEPLOYED)
    bare = defaults.apply(TaskSubmission.model_validate(SUB))
    assert (bare.constraints.max_tokens, bare.constraints.max_steps, bare.constraints.timeout_seconds) == (
        12345,
        7,
        600,
    )
    assert bare.constraints.max_output_tokens == Constraints().max_output_tokens  # not a deployment default
    partial = defaults.apply(
        TaskSubmission.model_validate(
            {**SUB, "constraints": {"max_steps": 3, "tools": ["lookup"], "timeout_seconds": 3600}}
        )
    )
    assert (partial.constraints.max_tokens, partial.constraints.max_steps, partial.constraints.timeout_seconds) == (
        12345,
        3,
        3600,
    )
    assert partial.constraints.tools == ["lookup"]
    # a value equal to the core default is still the caller's choice, not a gap to fill
    explicit = defaults.apply(TaskSubmission.model_validate({**SUB, "constraints": {"max_tokens": 200_000}}))
    assert explicit.constraints.max_tokens == 200_000


def test_defaults_travel_to_child_processes_through_settings_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for key, value in {**DEPLOYED, "AGENTQ_DEFAULT_TENANT_HOURLY_TOKENS": "900"}.items():
        monkeypatch.setenv(key, value)
    settings = Settings.from_env()
    assert settings.defaults.tenant_limits() == TenantLimits(hourly_tokens=900)
    assert {k: v for k, v in settings.env().items() if k.startswith("AGENTQ_DEFAULT_")} == {
        **DEPLOYED,
        "AGENTQ_DEFAULT_TENANT_HOURLY_TOKENS": "900",
    }


# ------------------------------------------------------------------ through the API Lambda


@pytest.fixture(scope="module")
def api(moto_server: MotoServer) -> Iterator[tuple[Any, Storage]]:
    settings = Settings.for_prefix(f"d{uuid.uuid4().hex[:10]}", moto_server.endpoint_url)
    provision(session(settings), settings.names, endpoint_url=settings.endpoint_url, queues=QueueSettings())
    mp = pytest.MonkeyPatch()
    for key, value in {**settings.env(), **DEPLOYED}.items():
        mp.setenv(key, value)
    try:
        yield load_handler("api"), build_store(settings)
    finally:
        mp.undo()


def _post(handler: Any, body: dict[str, Any], **headers: str) -> tuple[int, dict[str, Any]]:
    event = proxy_event(
        "POST", "/tasks", {"Content-Type": "application/json", **headers}, json.dumps(body), tenant="acme"
    )
    resp = handler.lambda_handler(event, FakeLambdaContext(30))
    return resp["statusCode"], json.loads(resp["body"])


def test_the_api_gives_a_bare_submission_the_deployment_budget(api: tuple[Any, Storage]) -> None:
    handler, store = api
    status, data = _post(handler, SUB)
    assert status == 202, data
    task = store.tasks.get(data["task_id"])
    assert (task.submission.constraints.max_tokens, task.submission.constraints.max_steps) == (12345, 7)
    assert task.submission.constraints.timeout_seconds == 600
    assert store.budgets.get(task.task_id).cap == 12345  # the task's budget holds the default cap


def test_the_api_keeps_what_the_caller_sent(api: tuple[Any, Storage]) -> None:
    handler, store = api
    status, data = _post(handler, {**SUB, "constraints": {"max_tokens": 999, "max_steps": 2}})
    assert status == 202, data
    constraints = store.tasks.get(data["task_id"]).submission.constraints
    assert (constraints.max_tokens, constraints.max_steps, constraints.timeout_seconds) == (999, 2, 600)


def test_an_idempotent_retry_of_a_bare_submission_replays_the_same_task(api: tuple[Any, Storage]) -> None:
    handler, _ = api
    key = f"k-{uuid.uuid4().hex}"
    first = _post(handler, SUB, **{"Idempotency-Key": key})
    again = _post(handler, SUB, **{"Idempotency-Key": key})
    assert first[0] == again[0] == 202
    assert again[1]["task_id"] == first[1]["task_id"] and again[1]["created"] is False


# ------------------------------------------------------------------ tenant cap


def test_a_tenant_without_limits_gets_the_default_cap_and_its_own_limits_win(
    store: Storage, registry: ToolRegistry
) -> None:
    default = TenantLimits(hourly_tokens=2_000)
    windows = TenantWindows(store.table, default=default)
    assert windows.limits("nobody") == default
    windows.set_limits("vip", TenantLimits(hourly_tokens=1_000_000))
    assert windows.limits("vip") == TenantLimits(hourly_tokens=1_000_000)

    turns = [{"text": f"turn {i}", "tool_calls": [call("lookup", query=str(i), size=400)]} for i in range(8)] + [
        {"text": "done"}
    ]
    engine = Engine(
        store, worker_id="w", tools=registry, config=EngineConfig(lease_seconds=5, default_tenant_limits=default)
    )
    capped = store.tasks.create(
        scripted(turns, tools=["lookup"], max_output_tokens=300), tenant=f"new-{uuid.uuid4().hex[:6]}"
    )
    result = engine.run(capped.task_id)
    assert result.outcome == "retry" and result.error is not None and result.error["code"] == "tenant_hourly_cap"
    assert TenantWindows(store.table).usage(capped.tenant)["used"] <= 2_000

    free = store.tasks.create(scripted(turns, tools=["lookup"], max_output_tokens=300), tenant="vip")
    assert engine.run(free.task_id).status is TaskStatus.SUCCEEDED


def test_the_cli_refuses_a_bad_default_naming_the_variable_with_exit_2() -> None:
    import os

    env = {**os.environ, "AGENTQ_DEFAULT_MAX_STEPS": "many"}
    proc = run_agentq(["worker", "--concurrency", "1"], env, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.startswith("agentq: AGENTQ_DEFAULT_MAX_STEPS: ") and "Traceback" not in proc.stderr


def test_an_economy_tier_puts_its_anthropic_tasks_in_economy_unless_they_say_otherwise() -> None:
    defaults = Defaults.from_env({"AGENTQ_ECONOMY_TIERS": "low,normal"})
    low = TaskSubmission.model_validate({"goal": "g", "provider": "anthropic", "priority": "low"})
    assert defaults.apply(low).constraints.economy is True
    high = TaskSubmission.model_validate({"goal": "g", "provider": "anthropic", "priority": "high"})
    assert defaults.apply(high).constraints.economy is False
    said_no = TaskSubmission.model_validate(
        {"goal": "g", "provider": "anthropic", "priority": "low", "constraints": {"economy": False}}
    )
    assert defaults.apply(said_no).constraints.economy is False
    scripted = TaskSubmission.model_validate({"goal": "g", "script": "research", "priority": "low"})
    assert defaults.apply(scripted).constraints.economy is False  # no batch API: left as it was
