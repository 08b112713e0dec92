"""The commands that use the table and queues directly (keys, tenants, dlq, purge, worker,
run-task) when AWS's settings are missing, stale or refused, as a newcomer meets them in a shell
that exported only AGENTQ_URL, or the env of an `agentq dev` that has stopped: one line saying
what is wrong and what to export, exit 2 (settings missing) or 1 (AWS unreachable, or its error
answer, named), never a traceback (docs/CLI.md's exit codes)."""

from __future__ import annotations

import os
import subprocess
import uuid
from pathlib import Path

import pytest

from agentq_dev.moto_server import LOCAL_CREDENTIALS, MotoServer

from tests.api_support import ROOT
from tests.helpers import run_agentq


def _shell(**exported: str) -> dict[str, str]:
    """A shell with AGENTQ_URL exported and nothing of AWS: no AWS_* variable, no credentials or
    config file, no instance metadata to fall back on."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "AGENTQ_"))}
    env.update(AGENTQ_URL="http://127.0.0.1:9", AWS_CONFIG_FILE=os.devnull, AWS_SHARED_CREDENTIALS_FILE=os.devnull,
               AWS_EC2_METADATA_DISABLED="true", PYTHONPATH=str(ROOT))  # fmt: skip
    env.update(exported)
    return env


def _agentq(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return run_agentq(list(args), env=env, timeout=90, cwd=ROOT)


@pytest.mark.parametrize(
    "command",
    ["keys create --tenant acme", "keys list --tenant acme", "dlq list", "tenants usage", "purge some-task",
     "worker", "run-task some-task"],
)  # fmt: skip
def test_a_command_on_aws_without_credentials_says_what_to_export_and_exits_2(command: str) -> None:
    ran = _agentq(*command.split(), env=_shell())
    assert ran.returncode == 2, ran.stderr
    assert "Traceback" not in ran.stderr
    assert f"agentq {command.split(maxsplit=1)[0]}: this command talks to AWS directly" in ran.stderr
    assert "Unable to locate credentials" in ran.stderr and "export the env `agentq dev` printed" in ran.stderr
    assert "AWS_REGION" in ran.stderr


def test_an_aws_endpoint_that_no_longer_answers_is_named_with_what_to_do_and_exits_1() -> None:
    """The env of an `agentq dev` that has stopped: its moto's endpoint refuses connections."""
    ran = _agentq(
        "keys", "list", "--tenant", "acme", env=_shell(**LOCAL_CREDENTIALS, AWS_ENDPOINT_URL="http://127.0.0.1:9")
    )
    assert ran.returncode == 1, ran.stderr
    assert "Traceback" not in ran.stderr
    assert 'agentq keys: cannot reach AWS (Could not connect to the endpoint URL: "http://127.0.0.1:9/")' in ran.stderr
    assert "AWS_ENDPOINT_URL is http://127.0.0.1:9" in ran.stderr and "unset AWS_ENDPOINT_URL" in ran.stderr


def test_an_error_answer_of_aws_is_said_with_its_code_and_message_and_exits_1(moto_server: MotoServer) -> None:
    env = _shell(**LOCAL_CREDENTIALS, AWS_ENDPOINT_URL=moto_server.endpoint_url, AGENTQ_TABLE="no-such-table")
    ran = _agentq("keys", "list", "--tenant", "acme", env=env)
    assert ran.returncode == 1, ran.stderr
    assert "Traceback" not in ran.stderr
    assert "agentq keys: AWS refused Query: ResourceNotFoundException: Requested resource not found: " in ran.stderr
    assert "the table 'no-such-table' (AGENTQ_TABLE) is not in region us-east-1" in ran.stderr


@pytest.mark.parametrize(
    ("exported", "says"),
    [({"AGENTQ_PREFIX": "agentq-prod", "AGENTQ_TABLE": "agentq-prod-tasks"},
      "the table 'agentq-prod-tasks' (AGENTQ_TABLE) is not in region eu-west-1"),
     ({"AGENTQ_PREFIX": "agentq-prod"}, "the table 'agentq-prod-tasks' (AGENTQ_PREFIX) is not in region eu-west-1"),
     ({}, "the table 'agentq-tasks' (AGENTQ_PREFIX unset: agentq) is not in region eu-west-1")],
)  # fmt: skip
def test_a_table_that_is_not_there_is_named_with_its_variable_and_region(
    moto_server: MotoServer, exported: dict[str, str], says: str
) -> None:
    """DEPLOY.md's first-key command with a prefix or region that does not match the deployment:
    AWS's own words ("Requested resource not found") say neither which table nor which region."""
    env = _shell(**LOCAL_CREDENTIALS, AWS_ENDPOINT_URL=moto_server.endpoint_url, AWS_REGION="eu-west-1", **exported)
    ran = _agentq("keys", "create", "--tenant", "acme", env=env)
    assert ran.returncode == 1, ran.stderr
    assert "Traceback" not in ran.stderr and says in ran.stderr, ran.stderr


def test_a_queue_that_is_not_there_is_named_with_its_variable_and_region(moto_server: MotoServer) -> None:
    """`agentq dlq list` against a prefix with no queues said only AWS's NonExistentQueue."""
    env = _shell(**LOCAL_CREDENTIALS, AWS_ENDPOINT_URL=moto_server.endpoint_url, AWS_REGION="eu-west-1",
                 AGENTQ_PREFIX="agentq-prod")  # fmt: skip
    ran = _agentq("dlq", "list", env=env)
    assert ran.returncode == 1, ran.stderr
    assert "Traceback" not in ran.stderr
    assert "the queue 'agentq-prod-high-dlq' (AGENTQ_PREFIX) is not in region eu-west-1" in ran.stderr, ran.stderr


@pytest.mark.parametrize(
    ("command", "variable", "value"),
    [("dlq list", "AWS_ENDPOINT_URL", "not a url"),
     ("purge some-task", "AWS_ENDPOINT_URL", "not a url"),
     ("keys list --tenant acme", "AWS_ENDPOINT_URL", "http://[::1"),
     ("dlq list", "AWS_ENDPOINT_URL_DYNAMODB", "localhost:4566"),
     ("purge some-task", "AGENTQ_BUCKET", ""),
     ("dlq list", "AGENTQ_TABLE", ""),
     ("keys list --tenant acme", "AGENTQ_TABLE", "my table")],
)  # fmt: skip
def test_an_aws_setting_that_cannot_work_is_named_with_exit_2_before_aws_is_asked(
    command: str, variable: str, value: str
) -> None:
    """Taken as given, botocore raised a ValueError (an endpoint that is not a URL) or a
    ParamValidationError (an empty bucket name) out of main(): a traceback."""
    env = _shell(**LOCAL_CREDENTIALS, AWS_REGION="us-east-1", AWS_ENDPOINT_URL="http://127.0.0.1:9")
    ran = _agentq(*command.split(), env={**env, variable: value})
    assert ran.returncode == 2, ran.stderr
    assert "Traceback" not in ran.stderr and ran.stderr.rstrip().endswith(f"({variable})"), ran.stderr
    assert f"agentq: {variable} is " in ran.stderr


def test_an_error_that_is_neither_missing_settings_nor_aws_unreachable_nor_its_answer_keeps_its_traceback() -> None:
    """A request our code built wrong is a bug: main() re-raises it, as any other exception."""
    from botocore.exceptions import ParamValidationError

    from agentq.cli.main import aws_failure

    assert aws_failure(ParamValidationError(report="Missing required parameter")) is None
    assert aws_failure(KeyError("tenant")) is None
    from botocore.exceptions import ClientError

    def answer(code: str) -> ClientError:
        return ClientError({"Error": {"Code": code, "Message": "m"}}, "UpdateItem")

    # AWS refusing the request our code built (a malformed expression, a condition) is a bug too
    assert aws_failure(answer("ValidationException")) is None
    assert aws_failure(answer("ConditionalCheckFailedException")) is None
    # AWS answering about the settings the command ran with is said in a line
    assert aws_failure(answer("AccessDeniedException")) == ("AWS refused UpdateItem: AccessDeniedException: m", 1)
    assert aws_failure(answer("ExpiredTokenException")) is not None


@pytest.mark.parametrize(
    ("config", "exported"),
    [("[default]\nregion = eu-west-1\n", {}),
     ("[default]\nregion = us-west-2\n[profile ops]\nregion = eu-west-1\n", {"AWS_PROFILE": "ops"})],
)  # fmt: skip
def test_the_cli_takes_the_region_of_the_aws_profile_when_no_variable_names_one(
    moto_server: MotoServer, tmp_path: Path, config: str, exported: dict[str, str]
) -> None:
    """An operator's `aws configure` region (~/.aws/config, or AWS_PROFILE's) is what boto3 and
    the aws CLI use; agentq fell back to us-east-1 instead, so `agentq keys`, `dlq`, `purge` and
    `tenants` acted on another region than the deployment's (here: its table not found)."""
    import boto3

    from agentq.resources import table_definition

    table = f"t{uuid.uuid4().hex[:10]}-tasks"
    ddb = boto3.client("dynamodb", region_name="eu-west-1", endpoint_url=moto_server.endpoint_url,
                       aws_access_key_id="testing", aws_secret_access_key="testing")  # fmt: skip
    ddb.create_table(**table_definition(table))
    (tmp_path / "config").write_text(config)
    local = {k: v for k, v in LOCAL_CREDENTIALS.items() if k != "AWS_DEFAULT_REGION"}
    env = _shell(**local, AWS_ENDPOINT_URL=moto_server.endpoint_url, AGENTQ_TABLE=table,
                 AWS_CONFIG_FILE=str(tmp_path / "config"), **exported)  # fmt: skip
    ran = _agentq("keys", "list", "--tenant", "acme", env=env)
    assert ran.returncode == 0, ran.stderr


def test_a_profile_that_is_not_in_the_aws_config_is_named_with_exit_2(tmp_path: Path) -> None:
    """The region now comes from the profile when no variable names one: a profile not there is
    said as a missing setting, as botocore says it when it looks for credentials."""
    (tmp_path / "config").write_text("[default]\nregion = eu-west-1\n")
    env = _shell(**LOCAL_CREDENTIALS, AWS_CONFIG_FILE=str(tmp_path / "config"), AWS_PROFILE="nope")
    env.pop("AWS_DEFAULT_REGION")
    ran = _agentq("keys", "list", "--tenant", "acme", env=env)
    assert ran.returncode == 2, ran.stderr
    assert "Traceback" not in ran.stderr and "The config profile (nope) could not be found" in ran.stderr
