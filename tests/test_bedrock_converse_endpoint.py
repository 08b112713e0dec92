"""Where ``bedrock-converse`` calls go (issue 39, item 6): under ``agentq dev`` the stack's
``AWS_ENDPOINT_URL`` (moto) covers every service, so a Converse call went to moto, got its HTML
500, was retried 25 times, opened the circuit, and ``--wait`` printed the page 25 times.

Now the Converse client takes ``AWS_ENDPOINT_URL_BEDROCK_RUNTIME`` or Bedrock's own endpoint,
never the global one, and a process that has the global one and not the Bedrock one (the local
stack's workers) refuses the call at once, naming the variable to set. No AWS is reachable from
here: what is checked is where the real boto3 client points, what reaches a local Converse
server, and what a person sees on the real local stack.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from agentq.core.errors import ProviderError
from agentq.core.providers import LLMRequest
from agentq.core.providers.bedrock_converse import BedrockConverseProvider
from agentq.core.providers.retry import RetryPolicy

from tests.api_support import ApiStack
from tests.fake_model_servers import FakeConverse, Sleeps, converse_reply
from tests.helpers import run_agentq

NOVA = "us.amazon.nova-pro-v1:0"
ENDPOINT_VARIABLES = ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_BEDROCK_RUNTIME")


@pytest.fixture
def dev_environment(api_stack: ApiStack, monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, str]]:
    """This process's AWS settings as the local stack gives its workers (``LocalStack.env``)."""
    env = api_stack.stack.env()
    assert env.get("AWS_ENDPOINT_URL") and "AWS_ENDPOINT_URL_BEDROCK_RUNTIME" not in env
    for name, value in env.items():
        if name.startswith("AWS_"):
            monkeypatch.setenv(name, value)
    monkeypatch.delenv("AWS_ENDPOINT_URL_BEDROCK_RUNTIME", raising=False)
    yield env


def converse(**kwargs: object) -> BedrockConverseProvider:
    return BedrockConverseProvider(region="us-east-1", retry=RetryPolicy(max_attempts=1), sleep=Sleeps(), **kwargs)  # type: ignore[arg-type]


def request() -> LLMRequest:
    return LLMRequest(model=NOVA, messages=[{"role": "user", "content": "hi"}], max_tokens=64)


def test_under_the_local_stacks_environment_a_converse_call_is_refused_naming_the_bedrock_endpoint(
    dev_environment: dict[str, str],
) -> None:
    with pytest.raises(ProviderError) as refused:
        converse().complete(request())
    error = refused.value
    assert (error.code, error.retryable) == ("bedrock_endpoint_unset", False)
    assert "AWS_ENDPOINT_URL_BEDROCK_RUNTIME" in error.message and dev_environment["AWS_ENDPOINT_URL"] in error.message


def test_with_its_own_variable_set_the_converse_client_calls_that_endpoint_and_never_the_global_one(
    dev_environment: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    with FakeConverse() as bedrock, FakeConverse() as everything_else:
        monkeypatch.setenv("AWS_ENDPOINT_URL", everything_else.base_url)  # a recording stand-in for moto
        monkeypatch.setenv("AWS_ENDPOINT_URL_BEDROCK_RUNTIME", bedrock.base_url)
        bedrock.enqueue(converse_reply("hello"))
        provider = converse()
        answer = provider.complete(request())
    assert provider._client.meta.endpoint_url == bedrock.base_url
    assert answer.content == [{"type": "text", "text": "hello"}]
    assert [r.model for r in bedrock.requests] == [NOVA] and everything_else.requests == []


def test_without_any_endpoint_variable_the_converse_client_targets_bedrock_even_if_the_config_file_names_another(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A deployment: Bedrock's regional endpoint, whatever endpoint the shared config file gives
    every service (botocore would apply it; it is meant for agentq's own services)."""
    config = tmp_path / "config"
    config.write_text("[default]\nendpoint_url = http://127.0.0.1:9\nregion = us-east-1\n")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(config))
    for name in ENDPOINT_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    assert converse()._client.meta.endpoint_url == "https://bedrock-runtime.us-east-1.amazonaws.com"


def test_a_converse_task_submitted_to_the_local_stack_fails_once_with_a_message_naming_the_variable(
    api_stack: ApiStack,
) -> None:
    """What a person sees: ``agentq submit --provider bedrock-converse --wait`` against ``agentq
    dev`` ends ``failed`` at its first attempt, saying what to set; no page, no retries."""
    ran = run_agentq(
        ["submit", "hello", "--provider", "bedrock-converse", "--model", NOVA, "--wait"], api_stack.cli_env(),
        timeout=120,
    )  # fmt: skip
    said = ran.stdout + ran.stderr
    assert ran.returncode != 0 and "AWS_ENDPOINT_URL_BEDROCK_RUNTIME" in said, said
    assert "<" not in said and "attempt" not in said, said  # no page, no retry shown
    task_id = said.split("submitted ", 1)[1].split()[0]
    view = api_stack.until(task_id, lambda v: v["status"] == "failed")
    assert view["error"]["code"] == "bedrock_endpoint_unset" and view["retry"] is None, view
