"""Routing tasks with a workspace to the pool of queues whose hosts can run their sandbox (the EC2
tier, docs/SANDBOX.md "Where it runs in AWS"), on moto server's SQS and DynamoDB.

- A submission with a workspace (its ``workspace``, or a workspace tool among its tools) is sent
  to ``{prefix}-workspace-{tier}`` when the deployment has that pool, every other one to the
  default ``{prefix}-{tier}``; without the pool (the local stack) everything goes where it went.
- A message of such a task that reaches a runner of another pool (a wake, a sweep, a fan-out's
  child: the paths that send to the sender's own pool) is forwarded, body and tier unchanged,
  before anything of the task runs there: it is never claimed by a runner without the sandbox.
- A pool name that is not a queue-name part stops the process, naming the variable.
"""

from __future__ import annotations

import itertools
import json
from typing import Any

import pytest

from agentq.control.defaults import ConfigurationError
from agentq.control.submit import submit
from agentq.core.engine import Engine, EngineConfig
from agentq.core.models import TaskSubmission
from agentq.queueing.queues import POOL_VARIABLE, WORKSPACE_POOL, TaskMessage, TaskQueues
from agentq.resources import TIERS, QueueSettings, provision_queues
from agentq.runtime import Settings, build_dispatcher, build_registry, build_store, client

from tests.helpers import deployment, scripted

SHAPES: dict[str, dict[str, Any]] = {
    "a workspace tool": {"tools": ["shell"], "workspace": None},
    "each file tool": {"tools": ["read_file", "list_files"], "workspace": None},
    "a workspace spec": {"tools": [], "workspace": {"files": []}},
    "none": {"tools": ["lookup"], "workspace": None},
}


def _submission(shape: str, priority: str) -> TaskSubmission:
    spec = SHAPES[shape]
    sub = scripted([{"text": "done"}], tools=spec["tools"])
    update: dict[str, Any] = {"priority": priority}
    if spec["workspace"] is not None:
        update["workspace"] = TaskSubmission.model_validate(
            {"goal": "g", "script": "first_task", "workspace": spec["workspace"]}
        ).workspace
    return sub.model_copy(update=update)


@pytest.fixture
def pooled(moto_server: Any) -> Settings:
    settings: Settings = deployment(moto_server)
    provision_queues(client(settings, "sqs"), settings.names, QueueSettings(), pool=WORKSPACE_POOL)
    return settings


def _bodies(queues: TaskQueues, tier: str, pool: str | None) -> list[dict[str, Any]]:
    url = queues.url(tier, pool)
    got = queues.sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=0, VisibilityTimeout=0)
    return [json.loads(m["Body"]) for m in got.get("Messages", [])]


def _queues(settings: Settings, *, pool: str | None, workspace_pool: str | None) -> TaskQueues:
    return TaskQueues(client(settings, "sqs"), settings.names, pool=pool, workspace_pool=workspace_pool)


def test_a_submission_with_a_workspace_goes_to_the_workspace_pool_and_any_other_to_the_default_one(
    pooled: Settings,
) -> None:
    store, registry = build_store(pooled), build_registry(pooled)
    api = _queues(pooled, pool=None, workspace_pool=WORKSPACE_POOL)  # what the API builds in AWS with the EC2 tier
    sent: dict[tuple[str, str], str] = {}
    for shape, tier in itertools.product(SHAPES, TIERS):
        sent[(shape, tier)] = submit(store, registry, _submission(shape, tier), tenant="t", queues=api).task_id
    for tier in TIERS:
        workspace = {b["task_id"] for b in _bodies(api, tier, WORKSPACE_POOL)}
        default = {b["task_id"] for b in _bodies(api, tier, None)}
        assert workspace == {sent[(s, tier)] for s in SHAPES if s != "none"}, tier
        assert default == {sent[("none", tier)]}, tier


def test_without_a_workspace_pool_every_submission_goes_to_the_default_queues(pooled: Settings) -> None:
    store, registry = build_store(pooled), build_registry(pooled)
    local = _queues(pooled, pool=None, workspace_pool=None)
    ids = {submit(store, registry, _submission(s, "normal"), tenant="t", queues=local).task_id for s in SHAPES}
    assert {b["task_id"] for b in _bodies(local, "normal", None)} == ids
    assert _bodies(local, "normal", WORKSPACE_POOL) == []


def _dispatch(settings: Settings, queues: TaskQueues, body: str, tier: str) -> Any:
    store = build_store(settings)
    engine = Engine(
        store, worker_id="default-pool", tools=build_registry(settings), config=EngineConfig(lease_seconds=30)
    )
    return build_dispatcher(engine, store, queues, max_receive_count=5).handle(body, tier=tier, receive_count=1)


@pytest.mark.parametrize("kind", ["run", "continue", "wake", "swept", "recovered"])
def test_a_workspace_task_reaching_a_runner_of_another_pool_is_forwarded_unclaimed(pooled: Settings, kind: str) -> None:
    store = build_store(pooled)
    executor = _queues(pooled, pool=None, workspace_pool=WORKSPACE_POOL)  # the Lambda executor's, the Fargate worker's
    for tier, shape in itertools.product(TIERS, [s for s in SHAPES if s != "none"]):
        task = store.tasks.create(_submission(shape, tier), tenant="acme")
        body = TaskMessage(task_id=task.task_id, kind=kind).model_dump_json()  # type: ignore[arg-type]
        action = _dispatch(pooled, executor, body, tier)
        assert action.kind == "delete" and "forwarded to the workspace pool" in action.reason
        meta = store.tasks.get(task.task_id)
        assert meta.lease_epoch == 0 and meta.claim_count == 0  # nothing of it ran here
        (forwarded,) = [b for b in _bodies(executor, tier, WORKSPACE_POOL) if b["task_id"] == task.task_id]
        assert forwarded == json.loads(TaskMessage.model_validate_json(body).model_dump_json(exclude_defaults=True))


def test_a_task_without_a_workspace_and_any_task_on_the_workspace_pool_run_where_they_are(pooled: Settings) -> None:
    store = build_store(pooled)
    plain = store.tasks.create(_submission("none", "normal"), tenant="t")
    executor = _queues(pooled, pool=None, workspace_pool=WORKSPACE_POOL)
    assert _dispatch(pooled, executor, TaskMessage(task_id=plain.task_id).model_dump_json(), "normal").kind == "delete"
    assert store.tasks.get(plain.task_id).claim_count == 1
    ec2 = _queues(pooled, pool=WORKSPACE_POOL, workspace_pool=WORKSPACE_POOL)  # the EC2 tier's worker
    for shape in SHAPES:
        task = store.tasks.create(_submission(shape, "normal"), tenant="t")
        _dispatch(pooled, ec2, TaskMessage(task_id=task.task_id).model_dump_json(), "normal")
        assert store.tasks.get(task.task_id).claim_count == 1, shape
    assert all(_bodies(executor, t, WORKSPACE_POOL) == [] for t in TIERS)  # nothing was forwarded


@pytest.mark.parametrize("value", ["Workspace", "work space", "-x", "a/b", "ws_1", "1ws"])
def test_a_pool_name_that_cannot_be_part_of_a_queue_name_stops_the_process_naming_the_variable(
    monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    monkeypatch.setenv(POOL_VARIABLE, value)
    with pytest.raises(ConfigurationError) as caught:
        Settings.from_env()
    assert caught.value.field == POOL_VARIABLE and POOL_VARIABLE in caught.value.message


def test_a_pool_name_is_read_from_the_environment_and_handed_to_a_child_worker(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(POOL_VARIABLE, WORKSPACE_POOL)
    monkeypatch.setenv("AGENTQ_WORKSPACE_POOL", WORKSPACE_POOL)
    settings = Settings.from_env()
    assert (settings.queue_pool, settings.workspace_pool) == (WORKSPACE_POOL, WORKSPACE_POOL)
    assert settings.env()[POOL_VARIABLE] == WORKSPACE_POOL
