"""Setting a tenant's running limit and a submission's concurrency key: bad input gets a precise
error naming the field (a 422 from the API, a CLI message and exit code 2) and changes nothing;
what ``GET /usage`` and ``agentq tenants usage`` show."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from werkzeug.test import Client

from agentq.api.app import build_app
from agentq.api.http_server import wsgi_app
from agentq.cli.main import main
from agentq.control.defaults import Defaults
from agentq.control.submit import submit_once
from agentq.core.tools import ToolRegistry
from agentq.runtime import Settings, build_queues
from agentq.storage.container import Storage
from agentq_dev.moto_server import LOCAL_CREDENTIALS, MotoServer

from tests.api_support import SCRIPTED, ApiStack
from tests.helpers import deployment, scripted

Cli = Callable[..., tuple[int, str, str]]


@pytest.fixture
def agentq(settings: Settings, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> Cli:
    for name, value in {**LOCAL_CREDENTIALS, **settings.env()}.items():
        monkeypatch.setenv(name, value)

    def run(*args: str) -> tuple[int, str, str]:
        capsys.readouterr()
        code = main(list(args))
        out, err = capsys.readouterr()
        return code, out, err

    return run


@pytest.fixture
def tenant(store: Storage) -> str:
    """A tenant of the test's own, known to the deployment (it has an API key): the CLI refuses
    a limit for a tenant it does not know."""
    name = f"acme-{uuid.uuid4().hex[:6]}"
    store.api_keys.create(name)
    return name


def test_a_tenants_limit_is_set_and_cleared_from_the_cli_and_its_usage_shown(
    agentq: Cli, store: Storage, tenant: str
) -> None:
    code, out, _ = agentq("tenants", "limit", tenant, "--max-running", "3")
    assert code == 0 and f"{tenant}  running 0  waiting 0  max_running 3" in out
    assert store.slots.limit(tenant) == 3
    code, out, _ = agentq("tenants", "usage", tenant, "--json")
    assert code == 0 and json.loads(out) == [{"tenant": tenant, "running": 0, "waiting": 0, "limit": 3, "weight": 1}]
    code, out, _ = agentq("tenants", "limit", tenant, "--clear")
    assert code == 0 and "max_running unlimited" in out and store.slots.limit(tenant) is None


def test_a_limit_below_one_or_an_unknown_tenant_is_refused_naming_the_field_and_writes_nothing(
    agentq: Cli, store: Storage, tenant: str
) -> None:
    code, _, err = agentq("tenants", "limit", tenant, "--max-running", "0")
    assert code == 2 and "max_running must be at least 1 (got 0) (max_running)" in err
    code, _, err = agentq("tenants", "limit", "nobody-" + tenant, "--max-running", "5")
    assert code == 2 and f"unknown tenant 'nobody-{tenant}'" in err and "(tenant)" in err
    assert store.slots.limit(tenant) is None and store.slots.limit("nobody-" + tenant) is None


def test_a_weight_is_set_from_the_cli_and_a_bad_one_is_refused_naming_the_field_and_changes_nothing(
    agentq: Cli, store: Storage, tenant: str
) -> None:
    code, out, _ = agentq("tenants", "limit", tenant, "--weight", "3")
    assert code == 0 and f"{tenant}  running 0  waiting 0  max_running unlimited  weight 3" in out
    code, _, err = agentq("tenants", "limit", tenant, "--weight", "0")
    assert code == 2 and "weight must be a whole number from 1 to 1000 (got 0) (weight)" in err
    code, _, err = agentq("tenants", "limit", tenant, "--max-running", "4", "--weight", "1001")
    assert code == 2 and "(weight)" in err
    assert store.slots.limit(tenant) is None  # the good limit beside a bad weight was not written either
    with pytest.raises(SystemExit) as parsed:
        agentq("tenants", "limit", tenant, "--weight", "1.5")
    assert parsed.value.code == 2  # argparse: "argument --weight: invalid int value: '1.5'"
    assert store.slots.usage(tenant).weight == 3
    code, out, _ = agentq("tenants", "limit", tenant, "--clear-weight")
    assert code == 0 and "weight 1" in out


def test_tenants_usage_without_a_tenant_lists_every_tenant_as_the_operators_view_does(
    agentq: Cli, store: Storage, tenant: str
) -> None:
    store.slots.set_limit(tenant, 2)
    code, out, _ = agentq("tenants", "usage", "--json")
    assert code == 0 and {"tenant": tenant, "running": 0, "waiting": 0, "limit": 2, "weight": 1} in json.loads(out)


@pytest.mark.parametrize(
    ("concurrency", "field"),
    [
        ({"key": "k" * 129}, "concurrency.key"),
        ({"key": "customer-42", "limit": 0}, "concurrency.limit"),
        ({"key": "customer-42", "on_conflict": "wait"}, "concurrency.on_conflict"),
    ],
)
def test_a_bad_concurrency_key_is_a_422_naming_the_field_and_submits_nothing(
    api_stack: ApiStack, concurrency: dict[str, object], field: str
) -> None:
    _, before, _ = api_stack.http("GET", "/tasks?limit=100")
    status, data, _ = api_stack.http("POST", "/tasks", {**SCRIPTED, "concurrency": concurrency})
    assert status == 422 and data["error"]["code"] == "validation_error" and data["error"]["field"] == field, data
    _, after, _ = api_stack.http("GET", "/tasks?limit=100")
    # No task submitted (the ids; an earlier test's task of this tenant may still be running on).
    assert [t["task_id"] for t in after["tasks"]] == [t["task_id"] for t in before["tasks"]]


def _counts(usage: Any) -> dict[str, Any]:
    """``GET /usage`` without its end users' rows and caps (tests/test_end_user_reach.py and
    tests/test_caps_api.py have those): the tenant's running and waiting counts and its limit."""
    return {k: v for k, v in dict(usage).items() if k not in ("users", "users_since", "users_complete", "caps")}


def test_the_caller_sees_its_running_and_waiting_counts_and_its_limit(api_stack: ApiStack) -> None:
    status, data, _ = api_stack.http("GET", "/usage")
    assert status == 200 and _counts(data) == {
        "tenant": "team-a",
        "running": 0,
        "waiting": 0,
        "max_running": None,
        "weight": 1,
        "operator": False,
    }, data
    assert api_stack.http("GET", "/usage", key=None)[0] == 401


def test_an_operator_key_reads_every_tenants_usage_and_a_tenant_key_gets_a_403_saying_why(
    api_stack: ApiStack,
) -> None:
    limited = f"limited-{uuid.uuid4().hex[:8]}"
    api_stack.stack.store().slots.set_limit(limited, 3)
    operator = api_stack.stack.create_api_key("ops", operator=True)
    assert api_stack.http("GET", "/usage", key=operator)[1]["operator"] is True
    status, data, _ = api_stack.http("GET", "/usage/tenants", key=operator)
    assert (
        status == 200
        and {"tenant": limited, "running": 0, "waiting": 0, "max_running": 3, "weight": 1} in data["tenants"]
    )
    status, data, _ = api_stack.http("GET", "/usage/tenants")
    assert status == 403 and data["error"]["code"] == "forbidden", data
    assert "operator" in data["error"]["message"]
    assert api_stack.http("GET", "/usage/tenants", key=None)[0] == 401


def test_under_a_fleet_capacity_usage_counts_an_unlimited_tenants_running_task_and_its_fleet_waiter(
    moto_server: MotoServer, store: Storage, registry: ToolRegistry
) -> None:
    """With a fleet capacity every tenant's running tasks are counted (the fleet's shares are
    weighed by them), an unlimited tenant's too: ``GET /usage`` shows them and the task waiting
    for the full fleet, and ``GET /usage/tenants`` lists the tenant. The cancel route's slots
    know the capacity too: cancelling the admitted task gives its fleet slot to the waiter."""
    tenant = f"fleet-{uuid.uuid4().hex[:6]}"
    defaults = Defaults(fleet_capacity=1)
    queues = build_queues(deployment(moto_server))
    first, second = (
        submit_once(store, registry, scripted([{"text": "done"}]), tenant=tenant, queues=queues, defaults=defaults)
        for _ in range(2)
    )
    admitted, parked = (store.tasks.get(s.task.task_id) for s in (first, second))
    assert admitted.slots and not parked.slots  # the second waits: the fleet is full
    app = build_app(store, registry, queues, defaults=defaults)
    client = Client(wsgi_app(app.resolve, authorizer=lambda _: {"tenant": tenant, "operator": True}))
    counted = {"tenant": tenant, "running": 1, "waiting": 1, "max_running": None, "weight": 1}
    assert _counts(client.get("/usage").json) == {**counted, "operator": True}
    assert counted in client.get("/usage/tenants").json["tenants"]  # type: ignore[index]
    assert client.post(f"/tasks/{admitted.task_id}/cancel").status_code == 200
    assert _counts(client.get("/usage").json) == {**counted, "running": 0, "waiting": 0, "operator": True}  # woken


def test_a_weight_and_clear_weight_together_or_a_limit_and_clear_together_are_refused_and_write_nothing(
    agentq: Cli, store: Storage, tenant: str
) -> None:
    with pytest.raises(SystemExit) as refused:  # argparse's usage error
        agentq("tenants", "limit", tenant, "--weight", "3", "--clear-weight")
    assert refused.value.code == 2
    with pytest.raises(SystemExit) as refused:
        agentq("tenants", "limit", tenant, "--max-running", "3", "--clear")
    assert refused.value.code == 2
    assert store.slots.usage(tenant).weight == 1 and store.slots.limit(tenant) is None
