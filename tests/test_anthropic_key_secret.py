"""In AWS the Anthropic API key lives in Secrets Manager (the stack names the secret in
AGENTQ_ANTHROPIC_API_KEY_SECRET): a task with provider=anthropic sends that key, read through
powertools parameters from moto's Secrets Manager, to a local Messages API; a secret that
cannot be read makes the task retry, not fail, and the message names the secret."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator

import boto3
import pytest
from aws_lambda_powertools.utilities.parameters import base as parameters_base

from agentq.core.engine import Engine, EngineConfig
from agentq.core.models import TaskStatus, TaskSubmission
from agentq.core.providers.keys import SECRET_VARIABLE
from agentq.core.tools import ToolRegistry
from agentq.storage.container import Storage
from agentq_dev.moto_server import MotoServer

from tests.fake_messages_api import FakeMessagesAPI, text_reply
from tests.helpers import sent_key


@pytest.fixture
def messages_api() -> Iterator[FakeMessagesAPI]:
    with FakeMessagesAPI() as server:
        yield server


@pytest.fixture
def aws_env(moto_server: MotoServer, monkeypatch: pytest.MonkeyPatch, messages_api: FakeMessagesAPI) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto_server.endpoint_url)
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    monkeypatch.setenv("ANTHROPIC_BASE_URL", messages_api.base_url)
    # powertools keeps one provider (and its cache) per process: start each test clean
    monkeypatch.setattr(parameters_base, "DEFAULT_PROVIDERS", {})


def _secret(value: str) -> str:
    name = f"agentq/anthropic-{uuid.uuid4().hex[:8]}"
    boto3.client("secretsmanager").create_secret(Name=name, SecretString=value)
    return name


def _task(store: Storage) -> str:
    submission = TaskSubmission(goal="say hi", provider="anthropic", model="claude-sonnet-4-6")
    return store.tasks.create(submission, tenant="acme").task_id


def _engine(store: Storage, registry: ToolRegistry) -> Engine:
    return Engine(store, worker_id="w", tools=registry, config=EngineConfig(lease_seconds=5))


@pytest.mark.parametrize("stored", ["sk-ant-from-secrets", json.dumps({"ANTHROPIC_API_KEY": "sk-ant-from-secrets"})])
def test_the_key_in_the_named_secret_is_what_the_messages_api_receives(
    aws_env: None,
    store: Storage,
    registry: ToolRegistry,
    messages_api: FakeMessagesAPI,
    monkeypatch: pytest.MonkeyPatch,
    stored: str,
) -> None:
    monkeypatch.setenv(SECRET_VARIABLE, _secret(stored))
    messages_api.enqueue(text_reply("hi"))
    task_id = _task(store)
    result = _engine(store, registry).run(task_id)
    assert result.status is TaskStatus.SUCCEEDED, result.error
    assert [sent_key(r) for r in messages_api.requests] == ["sk-ant-from-secrets"]


def test_an_environment_key_wins_over_the_secret(
    aws_env: None,
    store: Storage,
    registry: ToolRegistry,
    messages_api: FakeMessagesAPI,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(SECRET_VARIABLE, _secret("sk-ant-from-secrets"))
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-from-env")
    messages_api.enqueue(text_reply("hi"))
    assert _engine(store, registry).run(_task(store)).status is TaskStatus.SUCCEEDED
    assert [sent_key(r) for r in messages_api.requests] == ["sk-ant-from-env"]


def test_a_secret_that_cannot_be_read_retries_the_task_naming_the_secret(
    aws_env: None,
    store: Storage,
    registry: ToolRegistry,
    messages_api: FakeMessagesAPI,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    name = f"agentq/missing-{uuid.uuid4().hex[:8]}"
    monkeypatch.setenv(SECRET_VARIABLE, name)
    task_id = _task(store)
    result = _engine(store, registry).run(task_id)
    assert result.outcome == "retry" and result.error is not None
    assert result.error["code"] == "api_key_secret_unreadable"
    assert (
        "cannot read the Anthropic API key from secret" in result.error["message"] and name in result.error["message"]
    )
    task = store.tasks.get(task_id)
    assert task.status is TaskStatus.RUNNING and task.lease_expires == 0 and task.inflight is None  # nothing held
    assert store.budgets.get(task_id).reserved == 0
    assert messages_api.requests == []  # no call went out without a key


@pytest.mark.parametrize(
    ("stored", "says"), [('{"token": "x"}', "without a string field ANTHROPIC_API_KEY"), (" ", "is empty")]
)
def test_a_secret_that_holds_no_key_fails_the_task_at_once_naming_the_secret(
    aws_env: None,
    store: Storage,
    registry: ToolRegistry,
    messages_api: FakeMessagesAPI,
    monkeypatch: pytest.MonkeyPatch,
    stored: str,
    says: str,
) -> None:
    name = _secret(stored)
    monkeypatch.setenv(SECRET_VARIABLE, name)
    task_id = _task(store)
    result = _engine(store, registry).run(task_id)
    assert result.status is TaskStatus.FAILED and result.error is not None
    assert result.error["code"] == "invalid_api_key_secret"
    assert says in result.error["message"] and name in result.error["message"]
    assert store.tasks.get(task_id).error == result.error
    assert store.budgets.get(task_id).reserved == 0 and messages_api.requests == []
