"""The CDK stack of every environment in cdk.json: what it declares, checked where it matters.

Each environment is synthesized once (infra.synth, shared by the modules and xdist workers of
a run through a locked directory) with cdk-nag's AwsSolutions checks on, then checked with
aws_cdk.assertions, cfn-lint, and plain reads of the template.

Every test that starts the CDK's jsii runtime (a synth, an ``assertions.Template``, a
``cdk.App``) is in one xdist group, ``CDK_GROUP``, so one worker runs them all: the runtime
costs ~7 CPU-s to load aws-cdk-lib into in each process that uses it, a synth ~2 once it is
loaded. Spread over the workers of ``make test`` (one module each), three or four workers
loaded it, and each synthesized what the others waited for on the lock.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

os.environ.setdefault("JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION", "20")

from aws_cdk import assertions
from aws_cdk.assertions import Match

from agentq.control.defaults import Defaults, fair_limit
from agentq.control.retention import ttl_removal_pattern
from agentq.core.models import TaskSubmission
from agentq.observe import names
from agentq.queueing.queues import WORKSPACE_POOL, pooled
from agentq.queueing.webhooks import DELIVERY_MARGIN_SECONDS
from agentq.resources import (
    FAULT_RECEIVES,
    GSI_LIVE,
    GSI_OWNER,
    GSI_TENANT_LIVE,
    PAYLOAD_PREFIX,
    TABLE_ATTRIBUTES,
    TABLE_GSIS,
    TABLE_KEY_SCHEMA,
    TABLE_STREAM_VIEW_TYPE,
    TIERS,
    TTL_ATTRIBUTE,
    WEBHOOK_BATCH_SIZE,
    WEBHOOK_TIMEOUT_SECONDS,
    WEBHOOK_VISIBILITY_SECONDS,
    fanout_definition,
)
from agentq.storage.keys import api_key_id_key, task_pk
from agentq.storage.workers import WORKERS_PK
from infra.events import ADAPTER_ACCOUNT
from infra.sandbox import VPC_ACCESS_ACTIONS
from infra.settings import EnvironmentSettings, resolve
from infra.synth import Synthesized, synthesize

ROOT = Path(__file__).resolve().parent.parent
CDK_CONTEXT = json.loads((ROOT / "cdk.json").read_text())["context"]
ENVIRONMENTS = CDK_CONTEXT["environments"]
WORKER_IMAGE = "123456789012.dkr.ecr.eu-west-1.amazonaws.com/agentq-worker:1.0"
ANTHROPIC_SECRET = "agentq/dev/anthropic-api-key"
OPENAI_SECRET = "agentq/dev/vllm-api-key"
OPENAI_BASE_URL = "https://vllm.internal.example.com/v1"
# A deployment naming its models: a model in this region, a cross-region profile, an ARN as is.
BEDROCK_MODELS = [
    "amazon.nova-pro-v1:0",
    "us.meta.llama3-3-70b-instruct-v1:0",
    "arn:aws:bedrock:eu-west-1:123456789012:application-inference-profile/a1b2c3d4",
]
# The only actions allowed on Resource "*": AWS offers no resource-level permission for them.
STAR_ONLY_ACTIONS = {
    "xray:PutTraceSegments", "xray:PutTelemetryRecords", "xray:GetSamplingRules", "xray:GetSamplingTargets",
    "logs:CreateLogDelivery", "logs:GetLogDelivery", "logs:UpdateLogDelivery", "logs:DeleteLogDelivery",
    "logs:ListLogDeliveries", "logs:PutResourcePolicy", "logs:DescribeResourcePolicies", "logs:DescribeLogGroups",
    "ecr:GetAuthorizationToken",
    "dynamodb:ListStreams",  # what a stream event source mapping needs besides the stream's own actions
    *VPC_ACCESS_ACTIONS,  # Lambda attaching the sandbox function to its (dead-end) subnets
}  # fmt: skip
FUNCTIONS = ("executor", "api", "authorizer", "reaper")
# One worker for every test that loads the jsii runtime (see above): tests/xdist_scheduling.py.
CDK_GROUP = pytest.mark.xdist_group("cdk")
pytestmark = CDK_GROUP
ONCALL = "oncall@example.com"
OIDC = {"issuer": "https://login.example.com/", "audience": "agentq-api", "tenant_claim": "https://example.com/org",
        "user_claim": "sub"}  # fmt: skip


# cfn-lint as a module of this interpreter (the package ships no __main__), with one check off:
# W3005, "dependency already enforced by a GetAtt". aws-cdk-lib itself writes a DependsOn on its
# role into every Lambda function (ours and its custom resources' providers), whose Role property
# already GetAtts that role's Arn: redundant, harmless, and not in our code to drop.
CFN_LINT = [sys.executable, "-c", "import sys; from cfnlint.runner import main; sys.argv[0] = 'cfn-lint'; main()",
            "--ignore-checks", "W3005"]  # fmt: skip


def settings_of(env_name: str) -> EnvironmentSettings:
    return resolve(ENVIRONMENTS, CDK_CONTEXT.get("environment_defaults"), env_name)


def _worker_context() -> dict[str, Any]:
    """dev with the optional Fargate worker switched on, and every model and tracing option set."""
    dev = json.loads(json.dumps(ENVIRONMENTS["dev"]))
    dev["worker"] = {"enabled": True, "image": WORKER_IMAGE, "min_tasks": 1, "max_tasks": 6}
    dev["anthropic_api_key_secret"] = ANTHROPIC_SECRET
    # the models and traces a platform team configures (tests/test_cdk_model_access.py)
    dev.update(openai_api_key_secret=OPENAI_SECRET, openai_base_url=OPENAI_BASE_URL, bedrock_models=BEDROCK_MODELS)
    dev["tracing"] = {"exporter": "adot"}
    dev["oidc"] = OIDC  # end users' tokens (docs/DEPLOY.md#end-users-an-oidc-issuer)
    dev["alarms"] = {**dev.get("alarms", {}), "dlq_messages": 3, "emails": [ONCALL]}  # what no shipped one sets
    return {"environments": {**ENVIRONMENTS, "dev": dev}}


@pytest.fixture(scope="session")
def synth_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where this run's synths go, each made by the first test that asks for it. Under
    pytest-xdist the workers share it (their basetemps have one parent, and the run has one
    id): with ``--dist loadgroup`` one worker runs the ``cdk`` group and makes them all; with
    other distributions, a worker that wants a synth another is making waits on its lock."""
    run = os.environ.get("PYTEST_XDIST_TESTRUNUID")
    base = tmp_path_factory.getbasetemp()
    root = base.parent / f"agentq-cdk-{run}" if run else base / "agentq-cdk"
    root.mkdir(exist_ok=True)
    return root


@pytest.fixture(scope="module", params=list(ENVIRONMENTS))
def synth(request: pytest.FixtureRequest, synth_root: Path) -> Synthesized:
    return synthesize(request.param, synth_root / request.param)


@pytest.fixture(scope="module")
def template(synth: Synthesized) -> assertions.Template:
    return assertions.Template.from_json(synth.template)


@pytest.fixture(scope="module")
def worker_synth(synth_root: Path) -> Synthesized:
    return synthesize("dev", synth_root / "dev-worker", context=_worker_context())


def _one(synth: Synthesized, type_: str, **match: Any) -> tuple[str, dict[str, Any]]:
    found = [
        (lid, r) for lid, r in synth.resources(type_).items()
        if all(r["Properties"].get(k) == v for k, v in match.items())
    ]  # fmt: skip
    assert len(found) == 1, f"expected one {type_} with {match}, found {len(found)}"
    return found[0]


def _function(synth: Synthesized, name: str) -> tuple[str, dict[str, Any]]:
    return _one(synth, "AWS::Lambda::Function", FunctionName=f"{settings_of(synth.env_name).prefix}-{name}")


def _queue_ids(synth: Synthesized) -> dict[str, str]:
    """Queue name -> logical id."""
    return {r["Properties"]["QueueName"]: lid for lid, r in synth.resources("AWS::SQS::Queue").items()}


# -- the app ---------------------------------------------------------------------------------


def test_every_environment_synthesizes_its_own_stack(synth: Synthesized) -> None:
    cfg = settings_of(synth.env_name)
    assert synth.stack_name == f"agentq-{synth.env_name}"
    names = {r["Properties"].get("TableName") for r in synth.resources("AWS::DynamoDB::Table").values()}
    assert names == {cfg.names.table}


def test_an_unknown_environment_is_refused_with_the_known_ones_named() -> None:
    from app import build_app

    with pytest.raises(SystemExit, match=r"unknown environment 'qa'; cdk\.json defines: dev, staging, prod"):
        build_app("qa")


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ({"executor": {"reserved_concurrency": 4}}, "tier_max_concurrency adds up past executor.reserved_concurrency"),
        ({"executor": {"lease_seconds": 90}}, "lease_seconds must be below executor.visibility_seconds"),
        ({"payload_expiration_days": 45}, "payload_expiration_days was removed"),  # an older cdk.json's
        ({"user_code": {"package_dir": "src", "tool_modules": []}}, "tool_modules"),
        ({"worker": {"heartbeat_seconds": 60}}, "heartbeat_seconds < lease_seconds < visibility_seconds"),
        ({"log_retention_days": 10}, "log_retention_days must be one of"),
        ({"executor": {"tier_max_concurrency": {"urgent": 2}}}, "must name exactly the tiers"),
        ({"budget_defaults": {"fleet_capacity": 7}}, "budget_defaults.fleet_capacity (7) is more than the fleet runs"),
        ({"oidc": {"issuer": "http://login.example.com/", "audience": "a"}}, "oidc.issuer"),
        ({"oidc": {"issuer": "https://login.example.com/"}}, "oidc.audience"),
        ({"event_bus": "arn:aws:sqs:eu-west-1:123456789012:central"}, "event_bus"),  # not a bus's ARN
        ({"event_bus": "my bus"}, "event_bus"),
        ({"alarms": {"emails": ["oncall.example.com"]}}, "alarms.emails.0"),
    ],
)
def test_inconsistent_settings_fail_with_the_field_named(override: dict[str, Any], message: str) -> None:
    from pydantic import ValidationError

    from infra.settings import deep_merge

    envs = {"dev": deep_merge(ENVIRONMENTS["dev"], override)}
    with pytest.raises(ValidationError, match=re.escape(message)):
        resolve(envs, CDK_CONTEXT.get("environment_defaults"), "dev")


def test_deploy_md_states_the_event_bus_default_the_settings_apply() -> None:
    default = EnvironmentSettings.model_fields["event_bus"].default
    assert f"`event_bus` `{default}`" in (ROOT / "docs" / "DEPLOY.md").read_text()


def test_an_event_bus_given_by_arn_is_granted_as_that_bus_and_sent_to_by_it() -> None:
    """``event_bus`` may name a central bus by its ARN (perhaps another account's): PutEvents is
    granted on that ARN, not on ``...:event-bus/arn:aws:events:...``, which denied every event."""
    from infra.access import event_bus_arn, event_bus_name
    from infra.settings import deep_merge

    arn = "arn:aws:events:eu-west-1:123456789012:event-bus/central"
    cfg = resolve(
        {"dev": deep_merge(ENVIRONMENTS["dev"], {"event_bus": arn})}, CDK_CONTEXT.get("environment_defaults"), "dev"
    )
    assert event_bus_arn(cfg) == arn and event_bus_name(cfg) == arn  # PutEvents' EventBusName takes an ARN


def test_no_account_or_region_is_hard_coded(synth: Synthesized) -> None:
    cfg = settings_of(synth.env_name)
    assert cfg.account is None and cfg.region is None
    # the Lambda Web Adapter's public layers are published from AWS's account, not ours (infra/events.py)
    text = json.dumps(synth.template).replace(f":{ADAPTER_ACCOUNT}:layer:", ":ADAPTER:layer:")
    assert not re.search(r"[:/\"]\d{12}[:/.\"]", text), "an account id in the template"
    assert not re.search(
        r"\b(?:us|eu|ap|sa|ca|me|af|il|mx)-(?:north|south|east|west|central|northeast|southeast)-\d\b", text
    )


# -- state: table, bucket, queues ------------------------------------------------------------


def test_table_is_on_demand_encrypted_recoverable_with_ttl_and_the_api_index(
    synth: Synthesized, template: assertions.Template
) -> None:
    cfg = settings_of(synth.env_name)
    template.has_resource(
        "AWS::DynamoDB::Table",
        {
            "Properties": {
                "TableName": cfg.names.table,
                "BillingMode": "PAY_PER_REQUEST",
                "KeySchema": TABLE_KEY_SCHEMA,
                "PointInTimeRecoverySpecification": {"PointInTimeRecoveryEnabled": True},
                "SSESpecification": {"SSEEnabled": True},
                "TimeToLiveSpecification": {"AttributeName": TTL_ATTRIBUTE, "Enabled": True},
                "DeletionProtectionEnabled": not cfg.destroy,
            },
            "DeletionPolicy": "Delete" if cfg.destroy else "Retain",
            "UpdateReplacePolicy": "Delete" if cfg.destroy else "Retain",
        },
    )
    _, table = _one(synth, "AWS::DynamoDB::Table")
    props = table["Properties"]
    assert sorted(props["AttributeDefinitions"], key=str) == sorted(TABLE_ATTRIBUTES, key=str)
    assert props["GlobalSecondaryIndexes"] == TABLE_GSIS
    gsi1 = next(g for g in props["GlobalSecondaryIndexes"] if g["IndexName"] == "gsi1")
    assert [k["AttributeName"] for k in gsi1["KeySchema"]] == ["gsi1pk", "gsi1sk"]


def test_the_table_lists_a_tenants_unfinished_tasks_by_their_scopes_for_the_stop_and_the_api_may_query_it(
    synth: Synthesized,
) -> None:
    """A stop (``control.stops``, run by the API) reads one tenant's unfinished tasks with what
    names their scopes: the sparse ``tenant_live`` index, as the local stack makes it."""
    _, table = _one(synth, "AWS::DynamoDB::Table")
    [index] = [g for g in table["Properties"]["GlobalSecondaryIndexes"] if g["IndexName"] == GSI_TENANT_LIVE]
    assert [(k["AttributeName"], k["KeyType"]) for k in index["KeySchema"]] == [
        ("gsi1pk", "HASH"),
        ("live_sk", "RANGE"),
    ]
    assert index["Projection"] == {
        "ProjectionType": "INCLUDE", "NonKeyAttributes": ["parent_id", "user_pk", "key_id", "agent"],
    }  # fmt: skip
    [table_grant] = [s for s in _role_statements(synth, "api") if s.get("Sid") == "Table"]
    assert any(json.dumps(r).endswith(f'/index/{GSI_TENANT_LIVE}"]]}}') for r in _as_list(table_grant["Resource"]))
    assert "dynamodb:Query" in _as_list(table_grant["Action"])


def test_payload_bucket_is_private_encrypted_tls_only_and_never_expires_a_payload_by_its_age(
    synth: Synthesized, template: assertions.Template
) -> None:
    template.has_resource_properties(
        "AWS::S3::Bucket",
        {
            "BucketEncryption": {"ServerSideEncryptionConfiguration": [{"ServerSideEncryptionByDefault": {"SSEAlgorithm": "AES256"}}]},
            "PublicAccessBlockConfiguration": {
                "BlockPublicAcls": True, "BlockPublicPolicy": True, "IgnorePublicAcls": True, "RestrictPublicBuckets": True,
            },
            "LoggingConfiguration": Match.object_like({"LogFilePrefix": "payloads/"}),
            # Unfinished uploads are aborted: no rule expires a task's payloads by their age,
            # which would lose a live task's (a conversation reopened past it); the reaper deletes
            # them with the task. Nor a tenant's uploads (tasks/.uploads/), which the tasks naming
            # one read for their whole life. (Only what was deleted or replaced expires, in a
            # retained environment: the test below.)
            "LifecycleConfiguration": {
                "Rules": Match.array_with([{"Id": "abort-incomplete-uploads", "AbortIncompleteMultipartUpload": {"DaysAfterInitiation": 1}, "Status": "Enabled"}])
            },
        },
    )  # fmt: skip
    (payloads,) = [r for lid, r in synth.resources("AWS::S3::Bucket").items() if lid.startswith("Payloads")]
    for rule in payloads["Properties"]["LifecycleConfiguration"]["Rules"]:
        assert not {"ExpirationInDays", "ExpirationDate", "Transitions"} & set(rule), rule  # a current object stays
    # Every bucket denies plain HTTP.
    for lid in synth.resources("AWS::S3::Bucket"):
        template.has_resource_properties(
            "AWS::S3::BucketPolicy",
            {
                "Bucket": {"Ref": lid},
                "PolicyDocument": {
                    "Statement": Match.array_with(
                        [
                            Match.object_like(
                                {
                                    "Effect": "Deny",
                                    "Action": "s3:*",
                                    "Condition": {"Bool": {"aws:SecureTransport": "false"}},
                                }
                            )
                        ]
                    )
                },
            },
        )


def test_in_a_retained_environment_the_payload_bucket_keeps_what_was_deleted_or_replaced_as_long_as_the_tables_pitr(
    synth: Synthesized,
) -> None:
    """The table can be restored to any point of its PITR window; the step bodies and workspace
    objects its items name (``tasks/<id>/...``) must be there too, so the bucket is versioned and
    keeps a deleted or replaced object (a noncurrent version) exactly that long, and cleans up
    the delete markers left with nothing behind them. What is current never expires by age
    (above). A dev environment (``destroy``) keeps nothing: no versioning."""
    cfg = settings_of(synth.env_name)
    _, table = _one(synth, "AWS::DynamoDB::Table")
    pitr = table["Properties"]["PointInTimeRecoverySpecification"]
    (payloads,) = [r for lid, r in synth.resources("AWS::S3::Bucket").items() if lid.startswith("Payloads")]
    props = payloads["Properties"]
    noncurrent = [r for r in props["LifecycleConfiguration"]["Rules"] if "NoncurrentVersionExpiration" in r]
    if cfg.destroy:
        assert "VersioningConfiguration" not in props and not noncurrent
        return
    assert pitr == {"PointInTimeRecoveryEnabled": True, "RecoveryPeriodInDays": 35}
    assert props["VersioningConfiguration"] == {"Status": "Enabled"}
    assert noncurrent == [{"Id": "expire-noncurrent-versions", "Status": "Enabled", "ExpiredObjectDeleteMarker": True,
                           "NoncurrentVersionExpiration": {"NoncurrentDays": pitr["RecoveryPeriodInDays"]}}]  # fmt: skip


@pytest.mark.parametrize(
    "path",
    [
        "docs/ARCHITECTURE.md",
        "docs/SANDBOX.md",
        "layers/agentq/python/agentq/storage/workspaces.py",
        "layers/agentq/python/agentq/control/workspaces.py",
    ],
)
def test_nothing_says_an_expiry_the_payload_bucket_no_longer_has_deletes_uploads(path: str) -> None:
    """The bucket expires nothing by age (above), so a tenant's uploaded starting files, outside
    every task's prefix, are deleted by nothing: what is said of their retention says so, not
    that the removed ``payload_expiration_days`` rule deletes them (as it did before 1a02168)."""
    text = (ROOT / path).read_text()
    stale = [c for c in ("payload_expiration_days", "bucket's expiry", "payload expiry") if c in text]
    assert not stale, f"{path} still relies on the removed payload expiry: {stale}"


def test_each_tier_has_an_encrypted_tls_only_queue_and_dlq_with_the_redrive_policy(
    synth: Synthesized, template: assertions.Template
) -> None:
    cfg = settings_of(synth.env_name)
    ids = _queue_ids(synth)
    for tier in TIERS:
        queue_id, dlq_id = ids[cfg.names.queue(tier)], ids[cfg.names.dlq(tier)]
        queue = synth.template["Resources"][queue_id]["Properties"]
        assert queue["SqsManagedSseEnabled"] is True
        assert queue["RedrivePolicy"] == {
            "deadLetterTargetArn": {"Fn::GetAtt": [dlq_id, "Arn"]},
            # the backstop for messages no worker can handle; a task's own failures are counted on META
            "maxReceiveCount": cfg.max_receive_count + FAULT_RECEIVES,
        }
        assert queue["MessageRetentionPeriod"] == cfg.queue_retention_seconds
        dlq = synth.template["Resources"][dlq_id]["Properties"]
        assert dlq["SqsManagedSseEnabled"] is True
        assert dlq["MessageRetentionPeriod"] == cfg.dlq_retention_seconds
        assert "RedrivePolicy" not in dlq
        assert dlq["RedriveAllowPolicy"]["redrivePermission"] == "byQueue"
        for lid in (queue_id, dlq_id):
            template.has_resource_properties(
                "AWS::SQS::QueuePolicy",
                {
                    "Queues": [{"Ref": lid}],
                    "PolicyDocument": {
                        "Statement": Match.array_with(
                            [
                                Match.object_like(
                                    {"Effect": "Deny", "Condition": {"Bool": {"aws:SecureTransport": "false"}}}
                                )
                            ]
                        )
                    },
                },
            )


def test_queue_visibility_covers_the_executor_slice(synth: Synthesized) -> None:
    """A message must stay invisible for a whole Lambda invocation plus a margin, or a second
    executor would receive it while the first still runs the slice."""
    cfg = settings_of(synth.env_name)
    _, executor = _function(synth, "executor")
    timeout = executor["Properties"]["Timeout"]
    assert timeout == cfg.executor.timeout_seconds
    env = executor["Properties"]["Environment"]["Variables"]
    assert int(env["AGENTQ_SLICE_MARGIN_SECONDS"]) < timeout
    assert int(env["AGENTQ_LEASE_SECONDS"]) < int(env["AGENTQ_VISIBILITY_SECONDS"])
    ids = _queue_ids(synth)
    for tier in TIERS:
        visibility = synth.template["Resources"][ids[cfg.names.queue(tier)]]["Properties"]["VisibilityTimeout"]
        assert visibility >= timeout + cfg.executor.queue_visibility_margin_seconds > timeout


# -- compute ---------------------------------------------------------------------------------


def test_executor_reads_each_tier_queue_one_message_at_a_time_with_partial_failures(
    synth: Synthesized, template: assertions.Template
) -> None:
    cfg = settings_of(synth.env_name)
    executor_id, _ = _function(synth, "executor")
    ids = _queue_ids(synth)
    mappings = [
        m
        for m in synth.resources("AWS::Lambda::EventSourceMapping").values()
        if m["Properties"]["FunctionName"] == {"Ref": executor_id}
    ]
    assert len(mappings) == len(TIERS)
    for tier in TIERS:
        template.has_resource_properties(
            "AWS::Lambda::EventSourceMapping",
            {
                "EventSourceArn": {"Fn::GetAtt": [ids[cfg.names.queue(tier)], "Arn"]},
                "FunctionName": {"Ref": executor_id},
                "BatchSize": 1,
                "FunctionResponseTypes": ["ReportBatchItemFailures"],
                "ScalingConfig": {"MaximumConcurrency": cfg.executor.tier_max_concurrency[tier]},
            },
        )


def test_reserved_concurrency_is_the_environments(synth: Synthesized) -> None:
    cfg = settings_of(synth.env_name)
    _, executor = _function(synth, "executor")
    assert executor["Properties"].get("ReservedConcurrentExecutions") == cfg.executor.reserved_concurrency
    assert ENVIRONMENTS[synth.env_name]["executor"]["reserved_concurrency"] == cfg.executor.reserved_concurrency
    assert cfg.executor.reserved_concurrency is not None
    assert sum(cfg.executor.tier_max_concurrency.values()) <= cfg.executor.reserved_concurrency


def test_functions_run_python_312_traced_with_both_layers_and_their_environment(synth: Synthesized) -> None:
    cfg = settings_of(synth.env_name)
    machine_id, _ = _one(synth, "AWS::StepFunctions::StateMachine")
    table_id, _ = _one(synth, "AWS::DynamoDB::Table")
    layers = set(synth.resources("AWS::Lambda::LayerVersion"))
    assert len(layers) == 2
    for name in FUNCTIONS:
        _, fn = _function(synth, name)
        props = fn["Properties"]
        assert props["Runtime"] == "python3.12"
        assert props["TracingConfig"] == {"Mode": "Active"}
        assert props["Architectures"] == [cfg.architecture]
        assert {ref["Ref"] for ref in props["Layers"]} == layers
        env = props["Environment"]["Variables"]
        assert env["AGENTQ_TABLE"] == {"Ref": table_id}
        assert env["AGENTQ_PREFIX"] == cfg.prefix
        assert env["POWERTOOLS_SERVICE_NAME"] == f"agentq-{name}"
        assert env["POWERTOOLS_METRICS_NAMESPACE"] == names.NAMESPACE
        if name in ("executor", "api"):
            assert env["AGENTQ_STATE_MACHINE_ARN"] == {"Ref": machine_id}  # no ListStateMachines at cold start
        if name != "authorizer":
            assert "AGENTQ_BUCKET" in env
            assert env["AGENTQ_TASK_RETENTION_DAYS"] == str(cfg.task_retention_days)
    _, executor = _function(synth, "executor")
    env = executor["Properties"]["Environment"]["Variables"]
    assert env["AGENTQ_MAX_RECEIVE_COUNT"] == str(cfg.max_receive_count)
    assert cfg.event_bus == "stack" and env.get("AGENTQ_EVENT_BUS") == f"{cfg.prefix}-events"
    assert json.loads(env["AGENTQ_BREAKER"]) == cfg.flow.breaker.model_dump()  # the thresholds of this environment
    [bus] = synth.resources("AWS::Events::EventBus").values()
    assert bus["Properties"]["Name"] == f"{cfg.prefix}-events"
    _, api = _function(synth, "api")
    assert api["Properties"]["Environment"]["Variables"]["AGENTQ_EVENT_BUS"] == f"{cfg.prefix}-events"


def test_every_function_handler_is_a_module_in_functions(synth: Synthesized) -> None:
    for name in FUNCTIONS:
        _, fn = _function(synth, name)
        module, _, attr = fn["Properties"]["Handler"].rpartition(".")
        path = ROOT / "functions" / (module.replace(".", "/") + ".py")
        assert path.exists(), f"{fn['Properties']['Handler']}: {path} is missing"
        assert f"def {attr}(" in path.read_text()


def test_deps_layer_holds_the_third_party_packages_for_the_lambda_platform(synth: Synthesized) -> None:
    layer = synth.deps_layer
    if not layer["built"]:
        pytest.skip(f"dependencies layer not checked: {layer['message']} (the stack synthesized with a placeholder)")
    site = Path(layer["path"]) / "python"
    for package in ("pydantic", "pydantic_core", "aws_lambda_powertools", "aws_xray_sdk", "anthropic", "yaml"):
        assert (site / package).is_dir(), f"{package} missing from the layer"
    machine = "aarch64" if settings_of(synth.env_name).architecture == "arm64" else "x86_64"
    assert any(p.name.endswith(f"312-{machine}-linux-gnu.so") for p in (site / "pydantic_core").iterdir())
    assert not (site / "botocore").exists(), "the runtime's botocore must not be shadowed"


# -- permissions -----------------------------------------------------------------------------


def _statements(synth: Synthesized) -> list[tuple[str, dict[str, Any]]]:
    out = []
    for lid, policy in synth.resources("AWS::IAM::Policy").items():
        for statement in policy["Properties"]["PolicyDocument"]["Statement"]:
            out.append((lid, statement))
    for lid, role in synth.resources("AWS::IAM::Role").items():
        for inline in role["Properties"].get("Policies", []):
            for statement in inline["PolicyDocument"]["Statement"]:
                out.append((lid, statement))
    return out


def _as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


def test_no_statement_grants_star_resources_or_actions_beyond_what_aws_requires(synth: Synthesized) -> None:
    for lid, statement in _statements(synth):
        actions = set(_as_list(statement["Action"]))
        assert not any(a == "*" or a.endswith(":*") for a in actions), f"{lid}: wildcard action {actions}"
        if "*" in _as_list(statement["Resource"]):
            assert actions <= STAR_ONLY_ACTIONS, f"{lid}: {actions - STAR_ONLY_ACTIONS} on Resource '*'"


def _role_statements(synth: Synthesized, name: str) -> list[dict[str, Any]]:
    _, fn = _function(synth, name)
    role_id = fn["Properties"]["Role"]["Fn::GetAtt"][0]
    return [
        s for lid, policy in synth.resources("AWS::IAM::Policy").items()
        if {"Ref": role_id} in policy["Properties"]["Roles"]
        for s in policy["Properties"]["PolicyDocument"]["Statement"]
    ]  # fmt: skip


def _actions(statements: list[dict[str, Any]]) -> set[str]:
    return {a for s in statements for a in _as_list(s["Action"])}


def test_each_function_gets_only_what_its_code_calls(synth: Synthesized) -> None:
    authorizer = _actions(_role_statements(synth, "authorizer"))
    assert authorizer - {"xray:PutTraceSegments", "xray:PutTelemetryRecords"} == {
        "dynamodb:GetItem", "logs:CreateLogStream", "logs:PutLogEvents",
    }  # fmt: skip
    api = _actions(_role_statements(synth, "api"))
    assert {"dynamodb:Query", "dynamodb:UpdateItem", "s3:PutObject", "sqs:SendMessage", "states:StopExecution"} <= api
    # The API reads and removes messages only from the DLQs (a tenant's dead letters), never a tier queue.
    names = settings_of(synth.env_name).names
    dlq_ids = sorted(_queue_ids(synth)[names.dlq(tier)] for tier in ("high", "normal", "low"))
    receiving = [
        s
        for s in _role_statements(synth, "api")
        if set(_as_list(s["Action"])) & {"sqs:ReceiveMessage", "sqs:DeleteMessage"}
    ]
    assert len(receiving) == 1 and receiving[0]["Sid"] == "DeadLetters"
    assert "sqs:GetQueueAttributes" in _as_list(receiving[0]["Action"])  # a listing waits for held messages
    assert sorted(r["Fn::GetAtt"][0] for r in _as_list(receiving[0]["Resource"])) == dlq_ids
    assert not api & {
        "states:StartExecution",
        "bedrock:InvokeModel",
        "dynamodb:Scan",
    }
    executor = _actions(_role_statements(synth, "executor"))
    assert {
        "dynamodb:GetItem", "dynamodb:PutItem", "dynamodb:UpdateItem", "dynamodb:Query", "dynamodb:BatchGetItem",
        "dynamodb:ConditionCheckItem", "s3:GetObject", "s3:PutObject",
        "sqs:SendMessage", "sqs:DeleteMessage", "sqs:ChangeMessageVisibility", "sqs:GetQueueUrl",
        "states:StartExecution", "states:StopExecution", "states:SendTaskSuccess", "states:SendTaskFailure",
        "bedrock:InvokeModel",
    } <= executor  # fmt: skip
    assert "states:ListStateMachines" not in executor  # the ARN comes in the environment
    # DeleteItem only for the running slots' HOLD# and WAIT# items, in their partitions (the fleet's too).
    # (and the vault's partitions: a waiting task's note, storage/vault.py)
    deleting = [s for s in _role_statements(synth, "executor") if "dynamodb:DeleteItem" in _as_list(s["Action"])]
    assert [s["Sid"] for s in deleting] == ["RunningSlots", "Vault"]
    assert deleting[0]["Condition"] == {
        "ForAllValues:StringLike": {"dynamodb:LeadingKeys": ["TENANT#*", "CKEY#*", "FLEET*", "TIER#*"]}
    }
    assert deleting[1]["Condition"] == {"ForAllValues:StringLike": {"dynamodb:LeadingKeys": ["VAULT#*"]}}
    assert not executor & {
        "dynamodb:Scan",
        "s3:DeleteObject",
        "sqs:PurgeQueue",
        "sqs:DeleteQueue",
    }
    reaper = _actions(_role_statements(synth, "reaper"))
    assert reaper - {"xray:PutTraceSegments", "xray:PutTelemetryRecords"} == {
        "logs:CreateLogStream", "logs:PutLogEvents",
        "dynamodb:Query", "dynamodb:BatchWriteItem", "dynamodb:DeleteItem",
        "dynamodb:DescribeStream", "dynamodb:GetRecords", "dynamodb:GetShardIterator", "dynamodb:ListStreams",
        "s3:DeleteObject", "s3:ListBucket",
        "sqs:SendMessage", "sqs:GetQueueAttributes", "sqs:GetQueueUrl",
    }  # fmt: skip


def test_the_authorizer_may_read_only_api_key_items(synth: Synthesized) -> None:
    """agentq.api.auth reads ``APIKEY#<sha256>`` items and nothing else (an issuer's JWKS is
    cached in memory): a GetItem on the whole table would let the function that parses every
    caller's token read any tenant's tasks, vault items and webhook secrets."""
    table = [s for s in _role_statements(synth, "authorizer") if any(a.startswith("dynamodb:") for a in _as_list(s["Action"]))]  # fmt: skip
    assert table, "the authorizer reads the table"
    for statement in table:
        assert statement.get("Condition") == {"ForAllValues:StringLike": {"dynamodb:LeadingKeys": ["APIKEY#*"]}}, (
            statement
        )


def test_the_event_stream_function_may_read_only_task_partitions_and_key_ids(synth: Synthesized) -> None:
    """``GET /tasks/{id}/events`` reads a task's META, log and spawns: ``TASK#<id>`` items only
    (every call its server makes: tests/test_task_events.py), and, to end an open stream once
    its key is revoked, that key's id item (``APIKEYID#<id>``, GetItem only: no key in it). The
    function behind it is an internet-facing server: a GetItem on the whole table would let it
    read a tenant's webhook signing secret (``TENANT#<t>``/``WEBHOOK``), the ``APIKEY#`` items the
    authorizer reads, idempotency records and the vault."""
    table = [s for s in _role_statements(synth, "events") if any(a.startswith("dynamodb:") for a in _as_list(s["Action"]))]  # fmt: skip
    assert table, "the events function reads the table"
    allowed = {
        "TASK#*": {"dynamodb:GetItem", "dynamodb:Query"},
        api_key_id_key("*")["pk"]: {"dynamodb:GetItem"},
    }
    for statement in table:
        [leading] = statement["Condition"]["ForAllValues:StringLike"]["dynamodb:LeadingKeys"]
        assert leading in allowed and set(_as_list(statement["Action"])) <= allowed[leading], statement


def test_table_and_payload_grants_name_this_environments_resources(synth: Synthesized) -> None:
    table_id, _ = _one(synth, "AWS::DynamoDB::Table")
    for name in ("executor", "api", "reaper"):
        for statement in _role_statements(synth, name):
            actions = _as_list(statement["Action"])
            if "dynamodb:ListStreams" in actions:
                continue  # no resource-level permission (see STAR_ONLY_ACTIONS)
            resources = json.dumps(statement["Resource"])
            if any(a.startswith("dynamodb:") for a in actions):
                assert table_id in resources and '"*"' not in resources
            if actions == ["s3:ListBucket"]:  # on the bucket, for the payload prefix only
                assert statement["Condition"] == {"StringLike": {"s3:prefix": [f"{PAYLOAD_PREFIX}*"]}}
            elif any(a.startswith("s3:") for a in actions):
                assert resources.endswith('/tasks/*"]]}') or "/tasks/*" in resources


# -- retention: TTL on META, the stream, the reaper ---------------------------------------------


def _reaper_mapping(synth: Synthesized) -> dict[str, Any]:
    reaper_id, _ = _function(synth, "reaper")
    (mapping,) = [
        m["Properties"] for m in synth.resources("AWS::Lambda::EventSourceMapping").values()
        if m["Properties"]["FunctionName"] == {"Ref": reaper_id}
    ]  # fmt: skip
    return dict(mapping)


def test_table_streams_keys_only_for_the_reaper(synth: Synthesized, template: assertions.Template) -> None:
    """Keys are all the reaper reads (the task id is in pk) and all its filter matches on; an
    image would put goals and results of every write on the stream for nothing."""
    template.has_resource_properties(
        "AWS::DynamoDB::Table",
        {"StreamSpecification": {"StreamViewType": TABLE_STREAM_VIEW_TYPE},
         "TimeToLiveSpecification": {"AttributeName": TTL_ATTRIBUTE, "Enabled": True}},
    )  # fmt: skip
    assert TABLE_STREAM_VIEW_TYPE == "KEYS_ONLY"


def test_only_ttl_deletions_of_task_meta_reach_the_reaper(synth: Synthesized) -> None:
    table_id, _ = _one(synth, "AWS::DynamoDB::Table")
    mapping = _reaper_mapping(synth)
    assert mapping["EventSourceArn"] == {"Fn::GetAtt": [table_id, "StreamArn"]}
    (only,) = mapping["FilterCriteria"]["Filters"]
    pattern = json.loads(only["Pattern"])
    assert pattern == ttl_removal_pattern()
    assert pattern == {
        "eventName": ["REMOVE"],
        "userIdentity": {"type": ["Service"], "principalId": ["dynamodb.amazonaws.com"]},
        "dynamodb": {"Keys": {"pk": {"S": [{"prefix": "TASK#"}]}, "sk": {"S": ["META"]}}},
    }


def test_a_failing_reaper_batch_is_bisected_retried_then_dead_lettered(
    synth: Synthesized, template: assertions.Template
) -> None:
    cfg = settings_of(synth.env_name)
    dlq_id = _queue_ids(synth)[f"{cfg.prefix}-reaper-dlq"]
    mapping = _reaper_mapping(synth)
    assert mapping["StartingPosition"] == "TRIM_HORIZON"
    assert mapping["BatchSize"] == cfg.reaper.batch_size
    assert mapping["BisectBatchOnFunctionError"] is True
    assert mapping["MaximumRetryAttempts"] == cfg.reaper.retry_attempts
    assert mapping["FunctionResponseTypes"] == ["ReportBatchItemFailures"]
    assert mapping["DestinationConfig"] == {"OnFailure": {"Destination": {"Fn::GetAtt": [dlq_id, "Arn"]}}}
    template.has_resource_properties(
        "AWS::SQS::Queue",
        {
            "QueueName": f"{cfg.prefix}-reaper-dlq",
            "SqsManagedSseEnabled": True,
            "MessageRetentionPeriod": cfg.dlq_retention_seconds,
        },
    )
    template.has_resource_properties(
        "AWS::SQS::QueuePolicy",
        {"Queues": [{"Ref": dlq_id}], "PolicyDocument": {"Statement": Match.array_with(
            [Match.object_like({"Effect": "Deny", "Condition": {"Bool": {"aws:SecureTransport": "false"}}})])}},
    )  # fmt: skip
    alarm = _alarms(synth)[f"{cfg.prefix}-reaper-dlq-not-empty"]
    assert _metric(alarm) == ("AWS/SQS", "ApproximateNumberOfMessagesVisible", "Maximum")
    assert alarm["Dimensions"][0]["Value"] == {"Fn::GetAtt": [dlq_id, "QueueName"]}


def test_the_reaper_may_delete_task_items_and_payloads_and_nothing_else(synth: Synthesized) -> None:
    """Only in task partitions (``TASK#*``: every call a purge makes, tests/test_retention.py):
    not a tenant's API keys, limits, secrets or vault items."""
    table_id, _ = _one(synth, "AWS::DynamoDB::Table")
    bucket_id = next(lid for lid in synth.resources("AWS::S3::Bucket") if lid.startswith("Payloads"))
    statements = {s.get("Sid"): s for s in _role_statements(synth, "reaper")}
    purge = statements["PurgeTaskItems"]
    assert sorted(_as_list(purge["Action"])) == ["dynamodb:BatchWriteItem", "dynamodb:DeleteItem", "dynamodb:Query"]
    assert purge["Resource"] == {"Fn::GetAtt": [table_id, "Arn"]}  # the table, not its indexes
    assert purge["Condition"] == {"ForAllValues:StringLike": {"dynamodb:LeadingKeys": [task_pk("*")]}}
    delete = statements["DeletePayloads"]
    assert delete["Action"] == "s3:DeleteObject"
    assert delete["Resource"] == {"Fn::Join": ["", [{"Fn::GetAtt": [bucket_id, "Arn"]}, f"/{PAYLOAD_PREFIX}*"]]}
    listing = statements["ListPayloads"]
    assert listing["Resource"] == {"Fn::GetAtt": [bucket_id, "Arn"]}
    assert listing["Condition"] == {"StringLike": {"s3:prefix": [f"{PAYLOAD_PREFIX}*"]}}
    stream = [s for s in statements.values() if "dynamodb:GetRecords" in _as_list(s["Action"])]
    assert [s["Resource"] for s in stream] == [{"Fn::GetAtt": [table_id, "StreamArn"]}]
    writes = {
        "dynamodb:PutItem",
        "dynamodb:UpdateItem",
        "dynamodb:GetItem",
        "dynamodb:Scan",
        "s3:PutObject",
        "s3:GetObject",
    }
    assert not _actions(list(statements.values())) & writes


# -- fan-out ---------------------------------------------------------------------------------


def _resolve_string(value: Any) -> str:
    """A template string: plain, or an Fn::Join whose parts are plain (no tokens expected)."""
    if isinstance(value, str):
        return value
    parts = value["Fn::Join"][1]
    assert all(isinstance(p, str) for p in parts), f"unexpected token in {value}"
    return str(value["Fn::Join"][0]).join(parts)


def test_state_machine_runs_the_same_asl_as_the_local_stack(synth: Synthesized, template: assertions.Template) -> None:
    cfg = settings_of(synth.env_name)
    _, machine = _one(synth, "AWS::StepFunctions::StateMachine")
    props = machine["Properties"]
    assert props["StateMachineName"] == cfg.names.state_machine
    definition = json.loads(_resolve_string(props["DefinitionString"]))
    assert definition == fanout_definition()
    # Fair queues: both of its sends (a child's run, the parent's wake) carry the tenant as MessageGroupId.
    child = definition["States"]["RunChildren"]["ItemProcessor"]["States"]["RunChild"]["Parameters"]
    assert (
        child["MessageGroupId.$"] == definition["States"]["WakeParent"]["Parameters"]["MessageGroupId.$"] == "$.tenant"
    )
    assert props["TracingConfiguration"] == {"Enabled": True}
    assert props["LoggingConfiguration"]["Level"] == "ALL"
    role_id = props["RoleArn"]["Fn::GetAtt"][0]
    sends = [
        s for policy in synth.resources("AWS::IAM::Policy").values()
        if {"Ref": role_id} in policy["Properties"]["Roles"]
        for s in policy["Properties"]["PolicyDocument"]["Statement"] if "sqs:SendMessage" in _as_list(s["Action"])
    ]  # fmt: skip
    ids = _queue_ids(synth)
    expected = {ids[cfg.names.queue(t)] for t in TIERS}
    if cfg.workspace.tier == "ec2":  # a spawn from that pool sends there (tests/test_cdk_workspace_tier.py)
        expected |= {ids[cfg.names.queue(pooled(t, WORKSPACE_POOL))] for t in TIERS}
    assert all(s["Action"] == "sqs:SendMessage" for s in sends)
    assert {r["Fn::GetAtt"][0] for s in sends for r in _as_list(s["Resource"])} == expected


# -- API -------------------------------------------------------------------------------------


def _resource_path(synth: Synthesized, resource_id: Any) -> str:
    """The full path of an API Gateway resource (a Ref to it, or the root's GetAtt)."""
    resources = synth.resources("AWS::ApiGateway::Resource")
    parts: list[str] = []
    while isinstance(resource_id, dict) and "Ref" in resource_id:
        props = resources[resource_id["Ref"]]["Properties"]
        parts.insert(0, props["PathPart"])
        resource_id = props["ParentId"]
    return "/" + "/".join(parts)


def test_the_console_is_served_by_the_api_lambda_without_a_key_and_every_data_route_keeps_the_authorizer(
    synth: Synthesized, template: assertions.Template
) -> None:
    api_fn, _ = _function(synth, "api")
    by_path: dict[str, list[dict[str, Any]]] = {}
    for method in synth.resources("AWS::ApiGateway::Method").values():
        by_path.setdefault(_resource_path(synth, method["Properties"]["ResourceId"]), []).append(method["Properties"])
    for path in ("/console", "/console/{proxy+}"):
        (get,) = by_path[path]  # GET only: the console's routes answer nothing else
        assert get["HttpMethod"] == "GET" and get["AuthorizationType"] == "NONE"
        assert get["Integration"]["Type"] == "AWS_PROXY"
        assert api_fn in json.dumps(get["Integration"]["Uri"])
    for path in ("/tasks", "/tasks/{task_id}", "/tasks/{task_id}/{proxy+}", "/tasks/{task_id}/events", "/{proxy+}"):
        # the data, dead letters and event streams included, need a key
        assert {m["AuthorizationType"] for m in by_path[path]} == {"CUSTOM"}
    template.has_resource_properties("AWS::ApiGateway::Resource", {"PathPart": "console"})
    # The stack says where the console is: the API's URL (with its stage) and console/.
    output = json.dumps(template.find_outputs("ConsoleUrl"))
    assert "execute-api" in output and "/console/" in output


def test_event_streams_are_their_own_function_behind_the_web_adapter_and_api_gateway_response_streaming(
    synth: Synthesized,
) -> None:
    fn_id, fn = _function(synth, "events")
    props = fn["Properties"]
    assert props["Handler"] == "events/run.sh" and props["Timeout"] == 900
    run = ROOT / "functions" / "events" / "run.sh"
    assert os.access(run, os.X_OK) and "events/server.py" in run.read_text()
    env = props["Environment"]["Variables"]
    assert env["AWS_LAMBDA_EXEC_WRAPPER"] == "/opt/bootstrap" and env["AWS_LWA_INVOKE_MODE"] == "response_stream"
    assert env["AWS_LWA_READINESS_CHECK_PATH"] == "/health" and "AGENTQ_TABLE" in env
    # an open stream reads its key again as often as API Gateway's cached decision lives
    assert env["AGENTQ_AUTHORIZER_CACHE_SECONDS"] == str(settings_of(synth.env_name).api.authorizer_cache_seconds)
    adapter = (
        "LambdaAdapterLayerArm64" if settings_of(synth.env_name).architecture == "arm64" else "LambdaAdapterLayerX86"
    )
    assert any(f"layer:{adapter}:26" in json.dumps(layer) for layer in props["Layers"])
    # It only reads: the task's items and offloaded step bodies.
    actions = _actions(_role_statements(synth, "events")) - {"xray:PutTraceSegments", "xray:PutTelemetryRecords"}
    assert actions == {
        "dynamodb:GetItem",
        "dynamodb:Query",
        "s3:GetObject",
        "logs:CreateLogStream",
        "logs:PutLogEvents",
    }
    by_path: dict[str, list[dict[str, Any]]] = {}
    for method in synth.resources("AWS::ApiGateway::Method").values():
        by_path.setdefault(_resource_path(synth, method["Properties"]["ResourceId"]), []).append(method["Properties"])
    (get,) = [m for m in by_path["/tasks/{task_id}/events"] if m["HttpMethod"] == "GET"]
    integration = get["Integration"]
    assert get["AuthorizationType"] == "CUSTOM"  # the same authorizer: its tenant reaches the stream
    assert integration["ResponseTransferMode"] == "STREAM" and integration["TimeoutInMillis"] == 900_000
    uri = json.dumps(integration["Uri"])
    assert fn_id in uri and "response-streaming-invocations" in uri
    alarm = _alarms(synth)[f"{settings_of(synth.env_name).prefix}-event-stream-failures"]
    assert {m.get("MetricStat", {}).get("Metric", {}).get("MetricName") for m in alarm["Metrics"]} >= {
        "Errors",
        "Throttles",
    }


def test_a2a_calls_stream_from_a_web_adapter_function_with_the_apis_role_and_the_card_stays_with_the_api(
    synth: Synthesized,
) -> None:
    """``POST /a2a/{agent}`` (SendStreamingMessage, SubscribeToTask among its methods) goes to a
    function that can stream (infra/a2a.py): the events server behind the Web Adapter, with API
    Gateway's response streaming, the same authorizer, and the API function's own role (it
    submits and answers as the API does); the Agent Card and other methods stay with the API."""
    fn_id, fn = _function(synth, "a2a")
    api_id, api = _function(synth, "api")
    props = fn["Properties"]
    assert props["Handler"] == "events/run.sh" and props["Timeout"] == 900
    env = props["Environment"]["Variables"]
    assert env["AWS_LWA_INVOKE_MODE"] == "response_stream" and env["AWS_LAMBDA_EXEC_WRAPPER"] == "/opt/bootstrap"
    api_env = api["Properties"]["Environment"]["Variables"]
    assert {k: v for k, v in env.items() if k in api_env and k != "POWERTOOLS_SERVICE_NAME"} == {
        k: v for k, v in api_env.items() if k in env and k != "POWERTOOLS_SERVICE_NAME"
    }
    assert props["Role"] == api["Properties"]["Role"]  # the same grants, by construction
    by_path: dict[str, list[dict[str, Any]]] = {}
    for method in synth.resources("AWS::ApiGateway::Method").values():
        by_path.setdefault(_resource_path(synth, method["Properties"]["ResourceId"]), []).append(method["Properties"])
    (post,) = [m for m in by_path["/a2a/{agent}"] if m["HttpMethod"] == "POST"]
    assert post["AuthorizationType"] == "CUSTOM"
    integration = post["Integration"]
    assert integration["ResponseTransferMode"] == "STREAM" and integration["TimeoutInMillis"] == 900_000
    uri = json.dumps(integration["Uri"])
    assert fn_id in uri and "response-streaming-invocations" in uri
    for method in [m for m in by_path["/a2a/{agent}"] if m["HttpMethod"] != "POST"] + by_path["/a2a/{agent}/{proxy+}"]:
        assert method["AuthorizationType"] == "CUSTOM" and api_id in json.dumps(method["Integration"]["Uri"])


def test_api_needs_a_key_everywhere_but_health_and_openapi_and_leaves_validation_to_the_api(
    synth: Synthesized, template: assertions.Template
) -> None:
    cfg = settings_of(synth.env_name)
    assert cfg.api.authorizer_cache_seconds <= 300  # how long a revoked key keeps working
    template.has_resource_properties(
        "AWS::ApiGateway::Authorizer",
        {"Type": "TOKEN", "IdentitySource": "method.request.header.Authorization",
         "AuthorizerResultTtlInSeconds": cfg.api.authorizer_cache_seconds},
    )  # fmt: skip
    authorizer_id, _ = _one(synth, "AWS::ApiGateway::Authorizer")
    methods = synth.resources("AWS::ApiGateway::Method")
    public = set()
    for lid, method in methods.items():
        props = method["Properties"]
        if props["AuthorizationType"] == "NONE":
            assert "AuthorizerId" not in props and props["HttpMethod"] == "GET", lid
            public.add(_resource_path(synth, props["ResourceId"]))
        else:
            assert props["AuthorizationType"] == "CUSTOM" and props["AuthorizerId"] == {"Ref": authorizer_id}, lid
    # Liveness, the OpenAPI document and the console's page and assets (no tenant data).
    assert public == {"/health", "/openapi.json", "/console", "/console/{proxy+}"}
    posts = [m["Properties"] for m in methods.values() if m["Properties"]["HttpMethod"] == "POST"]
    # POST /tasks (declared for its throttle) and POST /a2a/{agent} (streamed, infra/a2a.py)
    assert sorted(_resource_path(synth, p["ResourceId"]) for p in posts) == ["/a2a/{agent}", "/tasks"]
    assert all("RequestModels" not in p for p in posts)  # the API validates, naming the field
    assert not synth.resources("AWS::ApiGateway::Model")
    template.has_resource_properties(
        "AWS::ApiGateway::Stage",
        {
            "StageName": cfg.api.stage_name,
            "TracingEnabled": True,
            "AccessLogSetting": Match.object_like({"DestinationArn": Match.any_value(), "Format": Match.string_like_regexp("tenant")}),
            "MethodSettings": Match.array_with(
                [
                    Match.object_like({"HttpMethod": "*", "ResourcePath": "/*", "ThrottlingRateLimit": cfg.api.throttle_rate_limit,
                                       "ThrottlingBurstLimit": cfg.api.throttle_burst_limit, "LoggingLevel": "ERROR"}),
                    Match.object_like({"HttpMethod": "POST", "ResourcePath": "/~1tasks", "ThrottlingRateLimit": cfg.api.submit_rate_limit,
                                       "ThrottlingBurstLimit": cfg.api.submit_burst_limit}),
                ]
            ),
        },
    )  # fmt: skip
    responses = {r["Properties"]["ResponseType"] for r in synth.resources("AWS::ApiGateway::GatewayResponse").values()}
    assert {"UNAUTHORIZED", "ACCESS_DENIED", "THROTTLED"} <= responses
    assert bool(synth.resources("AWS::WAFv2::WebACLAssociation")) is cfg.api.waf


def test_the_apis_execution_logs_go_to_a_log_group_the_stack_owns_kept_for_the_environments_retention(
    synth: Synthesized,
) -> None:
    """Execution logging (ERROR) writes to ``API-Gateway-Execution-Logs_<api id>/<stage>``, which
    API Gateway makes itself with no retention (kept for ever) when no stack owns it. The stack
    declares it, kept ``log_retention_days`` and removed with the stack where ``destroy``, and
    the stage waits for it, so API Gateway never makes it first."""
    cfg = settings_of(synth.env_name)
    api_id, _ = _one(synth, "AWS::ApiGateway::RestApi")
    stage_id, stage = _one(synth, "AWS::ApiGateway::Stage")
    assert any(m.get("LoggingLevel") == "ERROR" for m in stage["Properties"]["MethodSettings"])
    execution = [
        (lid, group) for lid, group in synth.resources("AWS::Logs::LogGroup").items()
        if "API-Gateway-Execution-Logs_" in json.dumps(group["Properties"].get("LogGroupName"))
    ]  # fmt: skip
    assert len(execution) == 1, "no log group of the API's execution logs"
    ((group_id, group),) = execution
    name = group["Properties"]["LogGroupName"]["Fn::Join"]
    rendered = name[0].join(p if isinstance(p, str) else f"<{p['Ref']}>" for p in name[1])
    assert rendered == f"API-Gateway-Execution-Logs_<{api_id}>/{cfg.api.stage_name}"
    assert group["Properties"]["RetentionInDays"] == cfg.log_retention_days
    assert group["DeletionPolicy"] == ("Delete" if cfg.destroy else "Retain")
    assert group_id in _as_list(synth.template["Resources"][stage_id].get("DependsOn", []))


# -- observability ---------------------------------------------------------------------------


def _metric(alarm: dict[str, Any]) -> tuple[str, str, str]:
    """(namespace, metric name, statistic) of a single-metric alarm, in either rendering."""
    if "MetricName" in alarm:
        return alarm["Namespace"], alarm["MetricName"], alarm.get("ExtendedStatistic") or alarm["Statistic"]
    (stat,) = [m["MetricStat"] for m in alarm["Metrics"] if "MetricStat" in m]
    return stat["Metric"]["Namespace"], stat["Metric"]["MetricName"], stat["Stat"]


def _alarms(synth: Synthesized) -> dict[str, dict[str, Any]]:
    return {
        r["Properties"]["AlarmName"]: r["Properties"] for r in synth.resources("AWS::CloudWatch::Alarm").values()
        if "AlarmName" in r["Properties"]  # a scaling policy's alarms have none (the workers')
    }  # fmt: skip


def test_alarms_cover_dlqs_queue_age_errors_tenant_caps_and_fanout_failures(synth: Synthesized) -> None:
    cfg = settings_of(synth.env_name)
    alarms = _alarms(synth)
    topic_id, _ = _one(synth, "AWS::SNS::Topic")
    p = cfg.prefix
    for tier in TIERS:
        dlq = alarms[f"{p}-{tier}-dlq-not-empty"]
        assert _metric(dlq) == ("AWS/SQS", "ApproximateNumberOfMessagesVisible", "Maximum") and dlq["Threshold"] == 1
        assert dlq["Dimensions"][0]["Value"]["Fn::GetAtt"][1] == "QueueName"
        age = alarms[f"{p}-{tier}-queue-starved"]
        assert _metric(age)[:2] == ("AWS/SQS", "ApproximateAgeOfOldestMessage")
        assert age["Threshold"] == cfg.alarms.pickup_objective_seconds[tier] + cfg.executor.timeout_seconds
    error_rate = alarms[f"{p}-executor-error-rate"]
    assert error_rate["Threshold"] == cfg.alarms.executor_error_rate_percent
    assert {m.get("MetricStat", {}).get("Metric", {}).get("MetricName") for m in error_rate["Metrics"]} >= {
        "Errors",
        "Invocations",
    }
    soft_cap = alarms[f"{p}-tenant-soft-cap"]
    assert _metric(soft_cap) == ("agentq", "tenant_soft_cap_crossed", "Sum") and soft_cap["Threshold"] == 1
    assert soft_cap["ComparisonOperator"] == "GreaterThanOrEqualToThreshold"
    held = alarms[f"{p}-tenant-held-at-limit"]  # a tenant (or key) held at its running limit for 15 minutes
    assert _metric(held) == ("agentq", "tasks_held_at_limit", "Sum") and held["Threshold"] == 1
    assert held["EvaluationPeriods"] == 3
    assert f"{p}-reaper-dlq-not-empty" in alarms
    circuit = alarms[f"{p}-circuit-opened"]
    assert _metric(circuit) == ("agentq", "circuit_opened", "Sum") and circuit["Threshold"] == 1
    fanout = alarms[f"{p}-fanout-executions-failed"]
    assert _metric(fanout) == ("AWS/States", "ExecutionsFailed", "Sum")
    for name, alarm in alarms.items():
        assert {"Ref": topic_id} in alarm["AlarmActions"], name
        assert alarm["TreatMissingData"] == "notBreaching", name


def test_each_tiers_pickup_latency_alarms_at_that_tiers_objective(synth: Synthesized) -> None:
    """cdk.json gives each tier its own pickup objective (prod: high 30 s). One fleet-wide alarm
    at the slowest tier's (900 s) and the queue-age alarm at objective + a slice let a high-tier
    task wait ten minutes unremarked: each tier's p99 (``tier`` dimension) alarms at its own."""
    cfg = settings_of(synth.env_name)
    alarms = _alarms(synth)
    topic_id, _ = _one(synth, "AWS::SNS::Topic")
    for tier in TIERS:
        alarm = alarms[f"{cfg.prefix}-{tier}-pickup-latency"]
        assert _metric(alarm) == (names.NAMESPACE, names.PICKUP_LATENCY, "p99")
        dimensions = alarm.get("Dimensions") or next(m["MetricStat"]["Metric"]["Dimensions"] for m in alarm["Metrics"])
        assert {d["Name"]: d["Value"] for d in dimensions} == {names.SERVICE: names.EXECUTOR, names.TIER: tier}
        assert alarm["Threshold"] == cfg.alarms.pickup_objective_seconds[tier], tier
        assert alarm["ComparisonOperator"] == "GreaterThanOrEqualToThreshold"
        assert {"Ref": topic_id} in alarm["AlarmActions"] and {"Ref": topic_id} in alarm["OKActions"], tier


def test_a_sweeper_that_fails_alarms(synth: Synthesized) -> None:
    """The sweeper is what resumes a task whose message was lost (docs/DEPLOY.md); it runs from
    an EventBridge rule with no retry, no DLQ and no destination, so only an alarm on its errors
    tells anyone it has stopped working."""
    cfg = settings_of(synth.env_name)
    sweeper_id, _ = _function(synth, "sweeper")
    alarm = _alarms(synth)[f"{cfg.prefix}-sweeper-errors"]
    assert _metric(alarm) == ("AWS/Lambda", "Errors", "Sum") and alarm["Threshold"] == 1
    assert alarm["Dimensions"] == [{"Name": "FunctionName", "Value": {"Ref": sweeper_id}}]
    assert alarm["Period"] == cfg.sweeper.every_minutes * 60


def test_a_reaper_that_falls_an_hour_behind_its_stream_alarms_long_before_the_stream_drops_a_record(
    synth: Synthesized,
) -> None:
    """The table's stream keeps a record 24 hours: a reaper that falls behind (throttled, or
    failing before its retries count) loses what the stream drops, and an expired task whose TTL
    record is gone is never purged. The reaper DLQ's alarm sees only the batches it gave up on;
    the age of the records it reads shows falling behind, at an hour."""
    cfg = settings_of(synth.env_name)
    reaper_id, _ = _function(synth, "reaper")
    alarm = _alarms(synth)[f"{cfg.prefix}-reaper-iterator-age"]
    assert _metric(alarm) == ("AWS/Lambda", "IteratorAge", "Maximum")
    assert alarm["Dimensions"] == [{"Name": "FunctionName", "Value": {"Ref": reaper_id}}]
    assert alarm["Threshold"] == 3_600_000  # milliseconds: an hour, of the stream's 24
    assert alarm["Period"] * alarm["EvaluationPeriods"] <= 15 * 60
    assert alarm["AlarmActions"] and alarm["ComparisonOperator"] == "GreaterThanOrEqualToThreshold"


def documented_alarms(prefix: str) -> set[str]:
    """The alarm names docs/DEPLOY.md's table lists, for ``prefix``: a cell's `{prefix}-...`
    names, its `-...` shorthands of the same prefix, ``{tier}`` and ``{scope}`` expanded."""
    from agentq.core.caps import SCOPES

    table = (ROOT / "docs" / "DEPLOY.md").read_text().split("| alarm | fires when |", 1)[1].split("\n\n", 1)[0]
    out: set[str] = set()
    for cell in re.findall(r"^\| (.+?) \|", table, re.M):
        for written in re.findall(r"`(\{prefix\}[^`]+|-[^`]+)`", cell):
            name = written if written.startswith("{prefix}") else "{prefix}" + written
            for tier in TIERS:
                for scope in SCOPES:
                    out.add(name.replace("{prefix}", prefix).replace("{tier}", tier).replace("{scope}", scope))
    return out


def test_every_alarm_the_stack_makes_is_in_deploy_md_by_its_name(synth: Synthesized) -> None:
    """An on-call engineer looks the paged alarm's name up in docs/DEPLOY.md's table."""
    documented = documented_alarms(settings_of(synth.env_name).prefix)
    assert sorted(set(_alarms(synth)) - documented) == []


def test_every_dlq_alarm_fires_at_the_configured_dlq_messages_and_the_emails_are_subscribed(
    worker_synth: Synthesized,
) -> None:
    """``alarms.dlq_messages`` is every DLQ alarm's threshold (the webhooks' had 1 written in)."""
    dlq_alarms = {name: a["Threshold"] for name, a in _alarms(worker_synth).items() if name.endswith("-dlq-not-empty")}
    assert "agentq-dev-webhooks-dlq-not-empty" in dlq_alarms and set(dlq_alarms.values()) == {3}, dlq_alarms
    subscriptions = worker_synth.resources("AWS::SNS::Subscription").values()
    assert [(s["Properties"]["Protocol"], s["Properties"]["Endpoint"]) for s in subscriptions] == [("email", ONCALL)]


def test_alarm_topic_is_encrypted_with_a_key_cloudwatch_may_use(
    synth: Synthesized, template: assertions.Template
) -> None:
    key_id, _ = _one(synth, "AWS::KMS::Key", Description=f"{settings_of(synth.env_name).prefix} alarm topic")
    template.has_resource_properties("AWS::SNS::Topic", {"KmsMasterKeyId": {"Fn::GetAtt": [key_id, "Arn"]}})
    template.has_resource_properties(
        "AWS::KMS::Key",
        {"EnableKeyRotation": True, "KeyPolicy": {"Statement": Match.array_with(
            [Match.object_like({"Principal": {"Service": "cloudwatch.amazonaws.com"}})])}},
    )  # fmt: skip


def test_dashboard_shows_queues_executor_outcomes_latency_and_active_tasks(synth: Synthesized) -> None:
    cfg = settings_of(synth.env_name)
    _, dashboard = _one(synth, "AWS::CloudWatch::Dashboard", DashboardName=f"{cfg.prefix}-overview")
    body = json.dumps(dashboard["Properties"]["DashboardBody"])
    for metric in (
        "ApproximateNumberOfMessagesVisible", "ApproximateAgeOfOldestMessage", "ApproximateNumberOfMessagesNotVisible",
        "Invocations", "Errors", "Throttles", "Duration",
        "tasks_succeeded", "tasks_failed", "tasks_cost_exceeded", "tasks_timed_out", "tasks_cancelled",
        "steps_committed", "pickup_latency", "resume_latency", "dlq_moves", "budget_refusals", "tenant_soft_cap_crossed",
    ):  # fmt: skip
        assert f'\\"{metric}\\"' in body, metric
    assert "p99" in body


def _dashboard_body(synth: Synthesized) -> str:
    cfg = settings_of(synth.env_name)
    _, dashboard = _one(synth, "AWS::CloudWatch::Dashboard", DashboardName=f"{cfg.prefix}-overview")
    return json.dumps(dashboard["Properties"]["DashboardBody"])


def _alarms_off_the_dashboard(synth: Synthesized) -> list[str]:
    """The named alarms (a scaling policy's have no name) the dashboard's alarm widget leaves out."""
    body = _dashboard_body(synth)
    return [r["Properties"]["AlarmName"] for lid, r in synth.resources("AWS::CloudWatch::Alarm").items()
            if "AlarmName" in r["Properties"] and f"\"{lid}\"" not in body]  # fmt: skip


def test_the_dashboards_alarm_widget_shows_every_alarm_of_the_stack(synth: Synthesized) -> None:
    """docs/DEPLOY.md: the dashboard shows "the state of every alarm"; the workspace tier's
    (staging, prod) are made after the core's, so the dashboard is made last."""
    assert _alarms_off_the_dashboard(synth) == []


def test_the_dashboard_shows_the_depth_of_every_queue_and_every_dead_letter_queue(synth: Synthesized) -> None:
    """The DLQ runbook's check ("the DLQ depth on the dashboard drops to 0") needs every DLQ on
    it: the webhooks' and the workspace tier's too; and the workspace pool's queues beside the tiers'."""
    body = _dashboard_body(synth)
    queues = {r["Properties"]["QueueName"]: lid for lid, r in synth.resources("AWS::SQS::Queue").items()}
    dlqs = [name for name in queues if name.endswith("-dlq")]
    assert len(dlqs) >= 5  # three tiers', the reaper's, the webhooks'
    assert [name for name in dlqs if f'"{queues[name]}"' not in body] == []
    pools = [n for n in queues if n.startswith(f"{settings_of(synth.env_name).prefix}-workspace-") and n not in dlqs]
    assert [name for name in pools if f'"{queues[name]}"' not in body] == []


def _dashboard_metrics(synth: Synthesized) -> list[Any]:
    """Every metric entry of every graph on the overview dashboard (Refs as placeholders)."""
    cfg = settings_of(synth.env_name)
    _, dashboard = _one(synth, "AWS::CloudWatch::Dashboard", DashboardName=f"{cfg.prefix}-overview")
    body = dashboard["Properties"]["DashboardBody"]
    parts = body["Fn::Join"][1] if isinstance(body, dict) else [body]
    widgets = json.loads("".join(p if isinstance(p, str) else "REF" for p in parts))["widgets"]
    return [m for w in widgets for m in w["properties"].get("metrics", [])]


SEARCH = re.compile(r"SEARCH\('\{(?P<schema>[^}]*)\}(?P<terms>[^']*)'")


def _draws(entry: list[Any], namespace: str, name: str, dimensions: dict[str, str]) -> bool:
    """Whether a dashboard metric entry graphs this EMF metric: the same namespace, name and
    dimension values, or a SEARCH over exactly its dimension names that its values satisfy."""
    if isinstance(entry[0], str):
        ns, metric, *rest = [e for e in entry if not isinstance(e, dict)]
        return (ns, metric) == (namespace, name) and dict(zip(rest[::2], rest[1::2], strict=True)) == dimensions
    for expression in (e["expression"] for e in entry if isinstance(e, dict) and "expression" in e):
        for found in SEARCH.finditer(expression):
            schema = [part.strip() for part in found["schema"].split(",")]
            terms = dict(re.findall(r'(\w+)="([^"]*)"', found["terms"]))
            if schema[0] != namespace or set(schema[1:]) != set(dimensions) or terms.pop("MetricName", None) != name:
                continue
            if all(dimensions.get(k) == v for k, v in terms.items()):
                return True
    return False


def test_the_dashboard_draws_the_metrics_the_code_emits(
    synth: Synthesized, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """What agentq.observe really prints (EMF), checked against what the widgets query."""
    from agentq import observe
    from agentq.core.engine import RunResult
    from agentq.core.models import TaskStatus, Usage

    monkeypatch.setenv("AGENTQ_EMF", "1")
    monkeypatch.delenv("POWERTOOLS_METRICS_DISABLED", raising=False)
    capsys.readouterr()
    observe.emf.record_llm_usage("claude-haiku-4-5", Usage(input_tokens=10, output_tokens=3, cache_read_input_tokens=5))
    observe.emf.record_tool_error("lookup")
    for budget in names.BUDGETS:
        observe.record_budget_refusal(budget)
    observe.record_submitted()
    observe.record_dead_letter()
    observe.record_run(RunResult("t", "finished", status=TaskStatus.SUCCEEDED, steps_committed=3))
    observe.flush()
    emitted = []
    for line in capsys.readouterr().out.splitlines():
        if '"_aws"' in line:
            doc = json.loads(line)
            directive = doc["_aws"]["CloudWatchMetrics"][0]
            dims = {k: doc[k] for k in directive["Dimensions"][0]}
            emitted += [(directive["Namespace"], m["Name"], dims) for m in directive["Metrics"]]
    drawn = {
        names.TOKENS_IN, names.TOKENS_OUT, names.TOOL_ERRORS, names.BUDGET_REFUSALS, names.TASKS_SUBMITTED,
        names.DLQ_MOVES, names.STEPS_COMMITTED, names.task_outcome("succeeded"),
    }  # fmt: skip
    entries = _dashboard_metrics(synth)
    checked = [(ns, name, dims) for ns, name, dims in emitted if name in drawn]
    assert {name for _, name, _ in checked} == drawn
    assert len([c for c in checked if c[1] == names.BUDGET_REFUSALS]) == len(names.BUDGETS)  # one line each
    for ns, name, dims in checked:
        assert any(_draws(entry, ns, name, dims) for entry in entries), f"{name} {dims} is emitted but drawn nowhere"
    any_model = {names.SERVICE: names.EXECUTOR, names.MODEL: "a-model-unknown-at-synth"}
    for metric in (names.TOKENS_IN, names.TOKENS_OUT):  # its own per-model line, and the all-models total
        assert len([e for e in entries if _draws(e, names.NAMESPACE, metric, any_model)]) == 2, metric


def test_the_dashboard_draws_budget_refusals_of_every_kind_the_code_records(
    synth: Synthesized, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Each ``record_budget_refusal("<kind>")`` call in the package (the engine's task budget,
    the tenant window, storage/scope_caps.py's cap) is drawn: a kind missing from
    names.BUDGETS would be recorded and shown nowhere."""
    from agentq import observe

    package = ROOT / "layers" / "agentq" / "python" / "agentq"
    kinds = {kind for path in package.rglob("*.py")
             for kind in re.findall(r'record_budget_refusal\(\s*"(\w+)"', path.read_text(encoding="utf-8"))}  # fmt: skip
    assert kinds >= {"task", "tenant", "cap"}, kinds
    monkeypatch.setenv("AGENTQ_EMF", "1")
    monkeypatch.delenv("POWERTOOLS_METRICS_DISABLED", raising=False)
    capsys.readouterr()
    for kind in sorted(kinds):
        observe.record_budget_refusal(kind)
    entries = _dashboard_metrics(synth)
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == len(kinds)
    for line in lines:
        doc = json.loads(line)
        dims = {k: doc[k] for k in doc["_aws"]["CloudWatchMetrics"][0]["Dimensions"][0]}
        assert any(_draws(e, names.NAMESPACE, names.BUDGET_REFUSALS, dims) for e in entries), dims


# -- cdk-nag and cfn-lint --------------------------------------------------------------------


def test_cdk_nag_aws_solutions_is_clean_and_every_acknowledgement_has_a_reason(synth: Synthesized) -> None:
    reports = {r["pluginName"]: r for r in synth.validation["pluginReports"]}
    nag = reports["AwsSolutions"]
    assert nag["conclusion"] == "success"
    assert nag["violations"] == []
    for suppressed in nag.get("suppressedViolations", []):
        assert len(suppressed.get("reason", "")) >= 40, suppressed["ruleName"]


def test_cdk_nag_fails_the_synth_on_an_unacknowledged_finding() -> None:
    """The plugin is wired: a non-compliant resource makes synth raise."""
    import aws_cdk as cdk
    from aws_cdk import aws_sqs as sqs
    from cdk_nag import AwsSolutionsChecks

    app = cdk.App()
    cdk.Validations.of(app).add_plugins(AwsSolutionsChecks(app))
    stack = cdk.Stack(app, "bad")
    sqs.Queue(stack, "PlainQueue", encryption=sqs.QueueEncryption.UNENCRYPTED)
    with pytest.raises(RuntimeError, match="ValidationFailed"):
        app.synth()


def test_cfn_lint_is_clean(synth_root: Path) -> None:
    paths = [str(synthesize(env, synth_root / env).template_path) for env in ENVIRONMENTS]
    proc = subprocess.run(
        [*CFN_LINT, "--", *paths],
        capture_output=True, text=True, timeout=240, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr


# -- the optional worker ---------------------------------------------------------------------


def test_optional_fargate_worker_scales_on_queue_depth_and_passes_nag_and_lint(worker_synth: Synthesized) -> None:
    template = assertions.Template.from_json(worker_synth.template)
    template.resource_count_is("AWS::ECS::Service", 1)
    template.has_resource_properties(
        "AWS::ECS::TaskDefinition",
        {"ContainerDefinitions": Match.array_with([Match.object_like({
            "Image": WORKER_IMAGE,
            "Command": ["agentq", "worker", "--concurrency", "256", "--heartbeat", "1.0", "--lease", "3.0",
                        "--visibility", "4", "--max-receive-count", "5"],
            "StopTimeout": 120,
            "LogConfiguration": Match.object_like({"LogDriver": "awslogs"}),
            "Environment": Match.array_with([
                {"Name": "AGENTQ_EMF", "Value": "1"},
                {"Name": "AGENTQ_LOG_FORMAT", "Value": "json"},
                {"Name": "POWERTOOLS_METRICS_NAMESPACE", "Value": names.NAMESPACE},
            ]),
        })]), "RuntimePlatform": {"CpuArchitecture": "ARM64", "OperatingSystemFamily": "LINUX"}},
    )  # fmt: skip
    template.has_resource_properties(
        "AWS::ApplicationAutoScaling::ScalableTarget", {"MinCapacity": 1, "MaxCapacity": 6}
    )
    policies = [r["Properties"] for r in worker_synth.resources("AWS::ApplicationAutoScaling::ScalingPolicy").values()]
    assert policies and all(p["PolicyType"] == "StepScaling" for p in policies)
    depth_alarms = [
        a["Properties"] for a in worker_synth.resources("AWS::CloudWatch::Alarm").values()
        if "ApproximateNumberOfMessagesNotVisible" in json.dumps(a["Properties"].get("Metrics", []))
    ]  # fmt: skip
    assert len(depth_alarms) == 2  # scale-out and scale-in on the backlog expression
    task_role = [
        s for r in worker_synth.resources("AWS::IAM::Policy").values()
        if "WorkerTaskTaskRole" in json.dumps(r["Properties"]["Roles"])
        for s in r["Properties"]["PolicyDocument"]["Statement"]
    ]  # fmt: skip
    assert "sqs:ReceiveMessage" in _actions(task_role)
    assert worker_synth.validation["pluginReports"][0]["violations"] == []
    proc = subprocess.run(
        [*CFN_LINT, "--", str(worker_synth.template_path)],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.parametrize(
    ("variable", "secret"),
    [("AGENTQ_ANTHROPIC_API_KEY_SECRET", ANTHROPIC_SECRET), ("AGENTQ_OPENAI_API_KEY_SECRET", OPENAI_SECRET)],
)
def test_a_named_api_key_secret_reaches_the_task_runners_and_only_they_may_read_it(
    worker_synth: Synthesized, variable: str, secret: str
) -> None:
    env_of = {
        r["Properties"]["FunctionName"]: r["Properties"]["Environment"]["Variables"]
        for r in worker_synth.resources("AWS::Lambda::Function").values()
        if isinstance(r["Properties"].get("FunctionName"), str)
    }
    assert env_of["agentq-dev-executor"][variable] == secret
    assert variable not in env_of["agentq-dev-api"]
    (task_def,) = worker_synth.resources("AWS::ECS::TaskDefinition").values()
    container_env = {e["Name"]: e["Value"] for e in task_def["Properties"]["ContainerDefinitions"][0]["Environment"]}
    assert container_env[variable] == secret
    readers = []
    for policy in worker_synth.resources("AWS::IAM::Policy").values():
        for statement in policy["Properties"]["PolicyDocument"]["Statement"]:
            if f":secret:{secret}-??????" in json.dumps(statement["Resource"]):
                assert _as_list(statement["Action"]) == ["secretsmanager:GetSecretValue"]
                assert len(_as_list(statement["Resource"])) == 1  # that secret only
                readers.append(json.dumps(policy["Properties"]["Roles"]))
    assert (
        len(readers) == 2 and any("ExecutorFunction" in r for r in readers) and any("WorkerTask" in r for r in readers)
    )


def test_budget_defaults_reach_the_api_and_the_task_runners(synth: Synthesized) -> None:
    cfg = settings_of(synth.env_name)
    functions = {
        r["Properties"]["FunctionName"]: r["Properties"]["Environment"]["Variables"]
        for r in synth.resources("AWS::Lambda::Function").values()
        if isinstance(r["Properties"].get("FunctionName"), str)
    }
    expected = {"AGENTQ_DEFAULT_MAX_TOKENS": str(cfg.budget_defaults.max_tokens),
                "AGENTQ_DEFAULT_MAX_STEPS": str(cfg.budget_defaults.max_steps),
                "AGENTQ_DEFAULT_TIMEOUT_SECONDS": str(cfg.budget_defaults.timeout_seconds)}  # fmt: skip
    if cfg.budget_defaults.tenant_hourly_tokens:
        expected["AGENTQ_DEFAULT_TENANT_HOURLY_TOKENS"] = str(cfg.budget_defaults.tenant_hourly_tokens)
    if cfg.budget_defaults.tenant_hourly_usd:
        expected["AGENTQ_DEFAULT_TENANT_HOURLY_USD"] = str(cfg.budget_defaults.tenant_hourly_usd)
    if cfg.budget_defaults.tenant_max_running:  # the executors and the worker honour it in the dispatcher
        expected["AGENTQ_DEFAULT_TENANT_MAX_RUNNING"] = str(cfg.budget_defaults.tenant_max_running)
    if cfg.budget_defaults.fleet_capacity:  # admissions at submission and in the dispatcher take a fleet slot
        expected["AGENTQ_FLEET_CAPACITY"] = str(cfg.budget_defaults.fleet_capacity)
    for name in (f"{cfg.prefix}-api", f"{cfg.prefix}-executor"):
        got = {
            k: v for k, v in functions[name].items() if k.startswith("AGENTQ_DEFAULT_") or k == "AGENTQ_FLEET_CAPACITY"
        }
        assert got == expected
        assert (
            Defaults.from_env(got).apply(TaskSubmission(goal="g", script="research")).constraints.max_tokens
            == cfg.budget_defaults.max_tokens
        )


def test_each_tiers_running_limit_per_tenant_reaches_every_function_that_admits_or_wakes(synth: Synthesized) -> None:
    # Fair by default per tier (storage/tier_slots.py): each tier's event source runs at most its
    # maximum concurrency, so a tenant's running tasks of a tier stay under fair_limit of it: the
    # API (admission at submission), the executor (its gate) and the sweeper (a raised capacity's room).
    cfg = settings_of(synth.env_name)
    expected = {tier: fair_limit(n) for tier, n in cfg.executor.tier_max_concurrency.items()}
    assert expected and all(limit < cfg.executor.tier_max_concurrency[t] for t, limit in expected.items())
    for name in ("api", "executor", "sweeper"):
        env = _function(synth, name)[1]["Properties"]["Environment"]["Variables"]
        assert Defaults.from_env(env).tier_limits() == expected, name


def test_with_the_worker_on_no_tier_has_a_capacity_of_its_own(worker_synth: Synthesized) -> None:
    # The Fargate workers take every tier's messages: a tier's runners are not its event source alone.
    for name in ("api", "executor", "sweeper"):
        env = _function(worker_synth, name)[1]["Properties"]["Environment"]["Variables"]
        assert "AGENTQ_TIER_CAPACITY" not in env and Defaults.from_env(env).tier_limits() == {}, name


def test_the_worker_is_absent_unless_enabled(synth: Synthesized) -> None:
    assert not synth.resources("AWS::ECS::Service")
    vpcs = [lid for lid in synth.resources("AWS::EC2::VPC") if not lid.startswith("SandboxVpc")]
    # the workers' VPC is there only for the EC2 workspace tier (tests/test_cdk_workspace_tier.py)
    assert len(vpcs) == (1 if settings_of(synth.env_name).workspace.tier == "ec2" else 0)


# -- the sandbox function and least privilege for what runs tasks -----------------------------


def _refs(value: Any) -> set[str]:
    """Logical ids a template value refers to (Ref / Fn::GetAtt), however deep."""
    found: set[str] = set()
    if isinstance(value, dict):
        if "Ref" in value and isinstance(value["Ref"], str):
            found.add(value["Ref"])
        if "Fn::GetAtt" in value:
            found.add(value["Fn::GetAtt"][0])
        for inner in value.values():
            found |= _refs(inner)
    elif isinstance(value, list):
        for inner in value:
            found |= _refs(inner)
    return found


def _statements_of_role(synth: Synthesized, role_id: str) -> list[dict[str, Any]]:
    return [
        s for policy in synth.resources("AWS::IAM::Policy").values()
        if {"Ref": role_id} in policy["Properties"]["Roles"]
        for s in policy["Properties"]["PolicyDocument"]["Statement"]
    ]  # fmt: skip


def test_the_sandbox_function_may_do_nothing_but_log(synth: Synthesized) -> None:
    _, sandbox = _function(synth, "sandbox")
    props = sandbox["Properties"]
    assert props["Handler"] == "sandbox.handler.lambda_handler"
    assert (ROOT / "functions" / "sandbox" / "handler.py").exists()
    core_layer = next(
        lid
        for lid, r in synth.resources("AWS::Lambda::LayerVersion").items()
        if "core" in r["Properties"]["Description"]
    )
    assert props["Layers"] == [{"Ref": core_layer}]  # no third-party dependencies at all
    assert props["Timeout"] >= 75 and props["EphemeralStorage"] == {
        "Size": settings_of(synth.env_name).sandbox.ephemeral_storage_mb
    }
    assert not any(k.startswith("AWS_") or "KEY" in k or "SECRET" in k for k in props["Environment"]["Variables"])
    role_id = props["Role"]["Fn::GetAtt"][0]
    role = synth.template["Resources"][role_id]["Properties"]
    assert "ManagedPolicyArns" not in role and "Policies" not in role
    actions = _actions(_statements_of_role(synth, role_id))
    assert actions == {"logs:CreateLogStream", "logs:PutLogEvents", *VPC_ACCESS_ACTIONS}
    for statement in _statements_of_role(synth, role_id):
        if "logs:PutLogEvents" in _as_list(statement["Action"]):
            assert _refs(statement["Resource"]) == _refs(props["LoggingConfig"])


def test_the_sandbox_function_has_no_network_path_anywhere(synth: Synthesized) -> None:
    _, sandbox = _function(synth, "sandbox")
    vpc_config = sandbox["Properties"]["VpcConfig"]
    subnets = _refs(vpc_config["SubnetIds"])
    (group,) = _refs(vpc_config["SecurityGroupIds"])
    (vpc_id,) = {synth.template["Resources"][s]["Properties"]["VpcId"]["Ref"] for s in subnets}
    # No way out: no internet or NAT gateway, no endpoint, no route but the VPC's own.
    for type_ in ("AWS::EC2::InternetGateway", "AWS::EC2::NatGateway", "AWS::EC2::EgressOnlyInternetGateway"):
        assert not [r for r in synth.resources(type_).values() if vpc_id in _refs(r)], type_
    for resource in [
        *synth.resources("AWS::EC2::VPCEndpoint").values(),
        *synth.resources("AWS::EC2::VPCGatewayAttachment").values(),
    ]:
        assert resource["Properties"]["VpcId"] != {"Ref": vpc_id}
    tables = {
        r["Properties"]["RouteTableId"]["Ref"] for r in synth.resources("AWS::EC2::SubnetRouteTableAssociation").values()
        if r["Properties"]["SubnetId"]["Ref"] in subnets
    }  # fmt: skip
    assert tables and not [
        r for r in synth.resources("AWS::EC2::Route").values() if _refs(r["Properties"]["RouteTableId"]) & tables
    ]
    # A security group with no ingress and only CDK's "disallow all" placeholder as egress.
    sg = synth.template["Resources"][group]["Properties"]
    assert "SecurityGroupIngress" not in sg
    assert sg["SecurityGroupEgress"] == [
        {
            "CidrIp": "255.255.255.255/32",
            "Description": "Disallow all traffic",
            "FromPort": 252,
            "IpProtocol": "icmp",
            "ToPort": 86,
        }
    ]
    assert not [r for r in synth.resources("AWS::EC2::SecurityGroupIngress").values() if group in _refs(r)]
    assert not [r for r in synth.resources("AWS::EC2::SecurityGroupEgress").values() if group in _refs(r)]


def _invokers(synth: Synthesized) -> dict[str, list[Any]]:
    """Role ids that may lambda:InvokeFunction, with the resources they may invoke."""
    out: dict[str, list[Any]] = {}
    for policy in synth.resources("AWS::IAM::Policy").values():
        for statement in policy["Properties"]["PolicyDocument"]["Statement"]:
            if any(a.startswith("lambda:") for a in _as_list(statement["Action"])):
                assert _as_list(statement["Action"]) == ["lambda:InvokeFunction"]
                for role in policy["Properties"]["Roles"]:
                    out.setdefault(role["Ref"], []).extend(_as_list(statement["Resource"]))
    return out


def test_only_the_task_runners_may_invoke_the_sandbox_and_nothing_else(
    synth: Synthesized, worker_synth: Synthesized
) -> None:
    for s, runners in ((synth, ["executor"]), (worker_synth, ["executor", "worker"])):
        sandbox_id, _ = _function(s, "sandbox")
        executor_role = _function(s, "executor")[1]["Properties"]["Role"]["Fn::GetAtt"][0]
        invokers = _invokers(s)
        expected = {executor_role}
        if "worker" in runners:
            (task_def,) = s.resources("AWS::ECS::TaskDefinition").values()
            expected.add(task_def["Properties"]["TaskRoleArn"]["Fn::GetAtt"][0])
        assert set(invokers) == expected
        for resources in invokers.values():
            assert resources == [{"Fn::GetAtt": [sandbox_id, "Arn"]}]
        env = _function(s, "executor")[1]["Properties"]["Environment"]["Variables"]
        assert env["AGENTQ_SANDBOX"] == "lambda" and env["AGENTQ_SANDBOX_FUNCTION"] == {"Ref": sandbox_id}


def test_task_runners_reach_only_task_and_worker_partitions_and_delete_only_liveness_and_slot_items(
    worker_synth: Synthesized,
) -> None:
    (task_def,) = worker_synth.resources("AWS::ECS::TaskDefinition").values()
    roles = {
        "executor": _function(worker_synth, "executor")[1]["Properties"]["Role"]["Fn::GetAtt"][0],
        "worker": task_def["Properties"]["TaskRoleArn"]["Fn::GetAtt"][0],
    }
    for name, role_id in roles.items():
        table = {
            s["Sid"]: s
            for s in _statements_of_role(worker_synth, role_id)
            if any(a.startswith("dynamodb:") for a in _as_list(s["Action"]))
        }
        # The worker also keeps its liveness item and reads the owner index (storage/workers.py).
        runner = {"Table", "RunningSlots", "Vault", "A2APushConfigs"}  # Vault: infra.access.vault_statements
        assert set(table) == (runner | {"WorkerLiveness", "OwnerIndex"} if name == "worker" else runner), name
        assert table["Table"]["Condition"] == {
            "ForAllValues:StringLike": {
                "dynamodb:LeadingKeys": ["TASK#*", "TENANT#*", "FLOW#*", "SCHEDULES", WORKERS_PK]
            }
        }
        assert "dynamodb:DeleteItem" not in _as_list(table["Table"]["Action"])
        # Releasing a running slot deletes its HOLD# item, waking a waiter its WAIT# item: the
        # tenant's, the concurrency keys' and the fleet's partitions only (storage/running_slots.py,
        # storage/fleet_slots.py: an admission reads its tenant's item and the shards in one batch).
        assert table["RunningSlots"]["Condition"] == {
            "ForAllValues:StringLike": {"dynamodb:LeadingKeys": ["TENANT#*", "CKEY#*", "FLEET*", "TIER#*"]}
        }
        assert "dynamodb:DeleteItem" in _as_list(table["RunningSlots"]["Action"])
        assert table["Vault"]["Condition"] == {"ForAllValues:StringLike": {"dynamodb:LeadingKeys": ["VAULT#*"]}}
        # A task's A2A push configs are read when it pauses or ends (queueing/a2a_push.py), never written.
        assert table["A2APushConfigs"]["Condition"] == {
            "ForAllValues:StringLike": {"dynamodb:LeadingKeys": ["A2APUSH#*"]}
        }
        assert _as_list(table["A2APushConfigs"]["Action"]) == ["dynamodb:Query"]
        if name == "worker":
            assert table["WorkerLiveness"]["Condition"] == {
                "ForAllValues:StringLike": {"dynamodb:LeadingKeys": [WORKERS_PK]}
            }
        assert "APIKEY" not in json.dumps(_statements_of_role(worker_synth, role_id))


def test_the_worker_runs_as_non_root_read_only_without_capabilities_in_private_subnets(
    worker_synth: Synthesized,
) -> None:
    (task_def,) = worker_synth.resources("AWS::ECS::TaskDefinition").values()
    container = task_def["Properties"]["ContainerDefinitions"][0]  # [1]: the trace collector (test_cdk_model_access)
    assert container["User"] == "65534:65534"
    assert container["ReadonlyRootFilesystem"] is True
    assert container["LinuxParameters"]["Capabilities"] == {"Drop": ["ALL"]}
    assert container["MountPoints"] == [{"ContainerPath": "/tmp", "ReadOnly": False, "SourceVolume": "tmp"}]
    assert task_def["Properties"]["Volumes"] == [{"Name": "tmp"}]
    env = {e["Name"]: e["Value"] for e in container["Environment"]}
    sandbox_id, _ = _function(worker_synth, "sandbox")
    assert env["AGENTQ_SANDBOX"] == "lambda" and env["AGENTQ_SANDBOX_FUNCTION"] == {"Ref": sandbox_id}

    (service,) = worker_synth.resources("AWS::ECS::Service").values()
    network = service["Properties"]["NetworkConfiguration"]["AwsvpcConfiguration"]
    assert network["AssignPublicIp"] == "DISABLED"
    subnets = _refs(network["Subnets"])
    for subnet in subnets:
        assert synth_subnet_is_private(worker_synth, subnet)
    (group,) = _refs(network["SecurityGroups"])
    sg = worker_synth.template["Resources"][group]["Properties"]
    assert "SecurityGroupIngress" not in sg
    assert sorted((e["IpProtocol"], e["FromPort"], e["ToPort"]) for e in sg["SecurityGroupEgress"]) == [
        ("tcp", 80, 80),
        ("tcp", 443, 443),
    ]
    endpoints = {
        json.dumps(e["Properties"]["ServiceName"]) for e in worker_synth.resources("AWS::EC2::VPCEndpoint").values()
    }
    assert any("dynamodb" in e for e in endpoints) and any(".s3" in e for e in endpoints)


def test_deploy_md_says_where_the_worker_runs_as_the_stack_puts_it(worker_synth: Synthesized) -> None:
    """The worker's row in DEPLOY.md is what an operator reads before opening a security group
    or budgeting a NAT gateway: private subnets (above), leaving through NAT gateway(s)."""
    assert worker_synth.resources("AWS::EC2::NatGateway")
    (row,) = [
        line
        for line in (ROOT / "docs" / "DEPLOY.md").read_text().splitlines()
        if line.startswith("| worker (optional)")
    ]
    assert "public subnets" not in row and "without NAT" not in row, row
    assert "private subnets" in row and "NAT gateway" in row, row


def synth_subnet_is_private(synth: Synthesized, subnet: str) -> bool:
    """No public IPs on launch, and its default route leads to a NAT gateway, not the internet gateway."""
    props = synth.template["Resources"][subnet]["Properties"]
    if props.get("MapPublicIpOnLaunch"):
        return False
    (table,) = [
        r["Properties"]["RouteTableId"]["Ref"] for r in synth.resources("AWS::EC2::SubnetRouteTableAssociation").values()
        if r["Properties"]["SubnetId"] == {"Ref": subnet}
    ]  # fmt: skip
    routes = [
        r["Properties"]
        for r in synth.resources("AWS::EC2::Route").values()
        if r["Properties"]["RouteTableId"] == {"Ref": table}
    ]
    return bool(routes) and all("NatGatewayId" in r and "GatewayId" not in r for r in routes)


def test_the_sweeper_runs_on_a_schedule_with_only_the_indexes_the_tasks_the_workers_and_the_queues(
    synth: Synthesized,
) -> None:
    cfg = settings_of(synth.env_name)
    fn_id, fn = _function(synth, "sweeper")
    env = fn["Properties"]["Environment"]["Variables"]
    assert env["AGENTQ_SWEEP_STALE_AFTER_SECONDS"] == str(cfg.sweeper.stale_after_seconds)
    assert fn["Properties"]["ReservedConcurrentExecutions"] == 1
    _, rule = _one(synth, "AWS::Events::Rule", Description="agentq: run the sweeper")
    assert rule["Properties"]["ScheduleExpression"] == f"rate({cfg.sweeper.every_minutes} minutes)"
    assert rule["Properties"]["Targets"][0]["Arn"] == {"Fn::GetAtt": [fn_id, "Arn"]}
    statements = {s.get("Sid"): s for s in _role_statements(synth, "sweeper")}
    assert _as_list(statements["ListLive"]["Action"]) == ["dynamodb:Query"]
    [index] = _as_list(statements["ListLive"]["Resource"])
    assert json.dumps(index).endswith(f'/index/{GSI_LIVE}"]]}}')
    assert statements["ReadTasks"]["Condition"] == {"ForAllValues:StringLike": {"dynamodb:LeadingKeys": ["TASK#*"]}}
    # Deleting only a dead worker's liveness item (storage/workers.py) and a waiter's WAIT item
    # (the wake of a tenant with room), never a task's item.
    deleting = [s for s in statements.values() if "dynamodb:DeleteItem" in _as_list(s["Action"])]
    assert sorted(s["Sid"] for s in deleting) == ["WaitingLists", "WorkerLiveness"]
    liveness = {"ForAllValues:StringLike": {"dynamodb:LeadingKeys": [WORKERS_PK]}}
    assert statements["WorkerLiveness"]["Condition"] == liveness
    waiting = {"ForAllValues:StringLike": {"dynamodb:LeadingKeys": ["TENANT#*", "CKEY#*", "FLEET*", "TIER#*"]}}
    assert statements["WaitingLists"]["Condition"] == waiting  # a parked task is left alone
    assert set(_as_list(statements["WaitingLists"]["Action"])) == {
        "dynamodb:Query", "dynamodb:GetItem", "dynamodb:DeleteItem",
    }  # fmt: skip
    # A parked task's slots its dead worker never gave back (queueing.sweeper): the slot items'
    # counts, and a key's HOLD# item when a freed slot is handed off; in the slot partitions only.
    assert set(_as_list(statements["GiveBackSlots"]["Action"])) == {"dynamodb:UpdateItem", "dynamodb:PutItem"}
    assert statements["GiveBackSlots"]["Condition"] == waiting
    if cfg.budget_defaults.tenant_max_running:  # a raised default wakes the waiters it has room for
        assert env["AGENTQ_DEFAULT_TENANT_MAX_RUNNING"] == str(cfg.budget_defaults.tenant_max_running)
    if cfg.budget_defaults.fleet_capacity:  # a raised capacity wakes the fleet's waiters, by weight
        assert env["AGENTQ_FLEET_CAPACITY"] == str(cfg.budget_defaults.fleet_capacity)
    # The fleet's wake reads the shards and the waiting tenants' items together, and may put a
    # waiting tenant's mark back: PutItem under FLEET# only.
    assert statements["FleetShares"]["Action"] == "dynamodb:BatchGetItem"
    assert statements["FleetMarks"]["Action"] == "dynamodb:PutItem"
    assert statements["FleetMarks"]["Condition"] == {"ForAllValues:StringLike": {"dynamodb:LeadingKeys": ["FLEET*"]}}
    [owner_index] = _as_list(statements["OwnerIndex"]["Resource"])
    assert json.dumps(owner_index).endswith(f'/index/{GSI_OWNER}"]]}}')
    assert set(_as_list(statements["Enqueue"]["Action"])) == {
        "sqs:SendMessage", "sqs:GetQueueUrl", "sqs:ChangeMessageVisibility",
    }  # fmt: skip
    assert len(_as_list(statements["Enqueue"]["Resource"])) == len(TIERS)
    # A blocked task past a dependency's end no walk reported is moved on (queueing.endings.resolve):
    # a Query and the event's PutItem in task partitions only, and a cancelled one's callback.
    assert set(_as_list(statements["ReleaseBlocked"]["Action"])) == {"dynamodb:Query", "dynamodb:PutItem"}
    assert statements["ReleaseBlocked"]["Condition"] == statements["ReadTasks"]["Condition"]  # TASK#* only
    [callbacks] = _as_list(statements["Callbacks"]["Resource"])
    assert "WebhooksQueue" in json.dumps(callbacks), callbacks


def test_callbacks_have_their_own_queue_dlq_deliverer_and_alarm(synth: Synthesized) -> None:
    cfg = settings_of(synth.env_name)
    queues = {r["Properties"].get("QueueName"): r for r in synth.resources("AWS::SQS::Queue").values()}
    webhooks = queues[f"{cfg.prefix}-webhooks"]
    assert webhooks["Properties"]["RedrivePolicy"]["maxReceiveCount"] == 6
    assert f"{cfg.prefix}-webhooks-dlq" in queues
    _, deliverer = _function(synth, "webhooks")
    assert deliverer["Properties"]["Handler"] == "webhooks.handler.lambda_handler"
    mappings = [m["Properties"] for m in synth.resources("AWS::Lambda::EventSourceMapping").values()]
    assert any(m.get("FunctionResponseTypes") == ["ReportBatchItemFailures"] and m.get("BatchSize") == WEBHOOK_BATCH_SIZE
               for m in mappings)  # fmt: skip
    assert f"{cfg.prefix}-webhooks-dlq-not-empty" in _alarms(synth)


def test_the_webhooks_deliverer_has_time_for_a_whole_batch_and_its_queue_hides_a_message_six_timeouts(
    synth: Synthesized,
) -> None:
    """A batch must fit in the function's timeout (each delivery up to ``longest_delivery_seconds``,
    and the handler's margin around it), or Lambda ends the invocation and the whole batch comes
    back: callbacks already delivered are posted again, every record spends an attempt. And AWS
    asks a queue a Lambda consumes to hide a message >= 6x the function's timeout (a throttled
    invoke is retried while the visibility clock runs). The local stack makes its webhooks queue
    from the same constants (``agentq.resources``)."""
    from agentq.core.webhooks import longest_delivery_seconds

    cfg = settings_of(synth.env_name)
    function_id, fn = _function(synth, "webhooks")
    timeout = fn["Properties"]["Timeout"]
    (mapping,) = [m["Properties"] for m in synth.resources("AWS::Lambda::EventSourceMapping").values()
                  if m["Properties"]["FunctionName"] == {"Ref": function_id}]  # fmt: skip
    queue = synth.template["Resources"][_queue_ids(synth)[f"{cfg.prefix}-webhooks"]]["Properties"]
    per_record = longest_delivery_seconds() + DELIVERY_MARGIN_SECONDS
    assert mapping["BatchSize"] * per_record <= timeout, (
        f"{mapping['BatchSize']} x {per_record} s in a {timeout} s function"
    )
    assert queue["VisibilityTimeout"] >= 6 * timeout
    assert (timeout, mapping["BatchSize"], queue["VisibilityTimeout"]) == (
        WEBHOOK_TIMEOUT_SECONDS, WEBHOOK_BATCH_SIZE, WEBHOOK_VISIBILITY_SECONDS
    )  # fmt: skip


def test_schedules_have_a_group_a_role_that_only_sends_fires_and_an_api_that_may_only_use_them(
    synth: Synthesized,
) -> None:
    cfg = settings_of(synth.env_name)
    [group] = synth.resources("AWS::Scheduler::ScheduleGroup").values()
    assert group["Properties"]["Name"] == f"{cfg.prefix}-schedules"
    roles = {r["Properties"].get("RoleName"): r for r in synth.resources("AWS::IAM::Role").values()}
    role = roles[f"{cfg.prefix}-scheduler"]
    [trust] = role["Properties"]["AssumeRolePolicyDocument"]["Statement"]
    assert trust["Principal"] == {"Service": "scheduler.amazonaws.com"}
    _, api = _function(synth, "api")
    env = api["Properties"]["Environment"]["Variables"]
    assert env["AGENTQ_SCHEDULER_GROUP"] == f"{cfg.prefix}-schedules"
    assert {"AGENTQ_SCHEDULER_ROLE_ARN", "AGENTQ_SCHEDULE_TARGET_ARN"} <= set(env)
    statements = [
        s for p in synth.resources("AWS::IAM::Policy").values() for s in p["Properties"]["PolicyDocument"]["Statement"]
    ]
    passes = [s for s in statements if s.get("Sid") == "PassSchedulerRole"]
    assert passes and passes[0]["Condition"] == {"StringEquals": {"iam:PassedToService": "scheduler.amazonaws.com"}}
    [schedules] = [s for s in statements if s.get("Sid") == "Schedules"]
    assert sorted(schedules["Action"]) == ["scheduler:CreateSchedule", "scheduler:DeleteSchedule",
                                           "scheduler:UpdateSchedule"]  # fmt: skip


def test_a_schedule_fire_the_scheduler_cannot_send_goes_to_the_normal_dlq_its_role_may_send_to(
    synth: Synthesized,
) -> None:
    """Without a DeadLetterConfig EventBridge Scheduler drops a fire after its retries with no
    trace. The API names the normal tier's DLQ (control.schedules sets it on every schedule's
    target), the scheduler role may send to it, and an alarm reads AWS/Scheduler's counts."""
    cfg = settings_of(synth.env_name)
    dlq_id = _queue_ids(synth)[cfg.names.dlq("normal")]
    _, api = _function(synth, "api")
    assert api["Properties"]["Environment"]["Variables"]["AGENTQ_SCHEDULE_DLQ_ARN"] == {"Fn::GetAtt": [dlq_id, "Arn"]}
    role_id = next(lid for lid, r in synth.resources("AWS::IAM::Role").items()
                   if r["Properties"].get("RoleName") == f"{cfg.prefix}-scheduler")  # fmt: skip
    sends = [s for p in synth.resources("AWS::IAM::Policy").values() if {"Ref": role_id} in p["Properties"]["Roles"]
             for s in p["Properties"]["PolicyDocument"]["Statement"]
             if s["Effect"] == "Allow" and "sqs:SendMessage" in _as_list(s["Action"])]  # fmt: skip
    assert {"Fn::GetAtt": [dlq_id, "Arn"]} in [r for s in sends for r in _as_list(s["Resource"])], sends
    alarm = _alarms(synth)[f"{cfg.prefix}-schedule-fires-failed"]
    read = {
        m["MetricStat"]["Metric"]["MetricName"]: m["MetricStat"]["Metric"]
        for m in alarm["Metrics"]
        if "MetricStat" in m
    }
    assert set(read) == {"InvocationsSentToDeadLetterCount", "InvocationsFailedToBeSentToDeadLetterCount",
                         "InvocationDroppedCount"}  # fmt: skip
    for metric in read.values():
        assert metric["Namespace"] == "AWS/Scheduler"
        assert metric["Dimensions"] == [{"Name": "ScheduleGroup", "Value": f"{cfg.prefix}-schedules"}]


def test_a_retained_environment_keeps_its_tenants_schedules(synth: Synthesized) -> None:
    """The schedule group holds the tenants' schedules (made at run time by POST /schedules);
    deleting it with the stack deletes them while the retained table still lists them."""
    cfg = settings_of(synth.env_name)
    (group,) = synth.resources("AWS::Scheduler::ScheduleGroup").values()
    assert group.get("DeletionPolicy", "Delete") == ("Delete" if cfg.destroy else "Retain")
    assert group.get("UpdateReplacePolicy", "Delete") == ("Delete" if cfg.destroy else "Retain")


def test_conversation_routes_reach_the_api_lambda_behind_the_authorizer(synth: Synthesized) -> None:
    """POST /tasks/{id}/messages, /interrupt and /close (and GET /messages) are served in AWS by the
    same function as every data route: /tasks/{task_id}/{proxy+}, any method, with the API key."""
    api_fn, _ = _function(synth, "api")
    methods = [
        m["Properties"]
        for m in synth.resources("AWS::ApiGateway::Method").values()
        if _resource_path(synth, m["Properties"]["ResourceId"]) == "/tasks/{task_id}/{proxy+}"
    ]
    assert [m["HttpMethod"] for m in methods] == ["ANY"]
    (route,) = methods
    assert route["AuthorizationType"] == "CUSTOM" and route["Integration"]["Type"] == "AWS_PROXY"
    assert api_fn in json.dumps(route["Integration"]["Uri"])


def test_the_a2a_routes_reach_the_api_lambda_behind_the_authorizer(synth: Synthesized) -> None:
    """An agent's Agent Card (GET /a2a/{agent}/.well-known/agent-card.json) is the API Lambda's,
    with the API key, and so is every method but POST of /a2a/{agent}, which streams from the A2A
    function (``test_a2a_calls_stream_from_a_web_adapter_function_...``); neither is public."""
    from agentq.api.app import is_public

    api_fn, _ = _function(synth, "api")
    paths = {
        _resource_path(synth, m["Properties"]["ResourceId"])
        for m in synth.resources("AWS::ApiGateway::Method").values()
    }
    assert {p for p in paths if p.startswith("/a2a")} == {"/a2a/{agent}", "/a2a/{agent}/{proxy+}"}
    (route,) = [
        m["Properties"]
        for m in synth.resources("AWS::ApiGateway::Method").values()
        if _resource_path(synth, m["Properties"]["ResourceId"]) == "/{proxy+}"
    ]
    assert route["HttpMethod"] == "ANY" and route["AuthorizationType"] == "CUSTOM"
    assert route["Integration"]["Type"] == "AWS_PROXY" and api_fn in json.dumps(route["Integration"]["Uri"])
    assert not is_public("/a2a/support") and not is_public("/a2a/support/.well-known/agent-card.json")


def test_the_public_paths_are_made_in_one_order_whatever_the_hash_seed(synth: Synthesized) -> None:
    """``PUBLIC_PATHS`` is a set, whose order follows the interpreter's hash seed; made in that
    order, the API's deployment got another logical id from one synth to the next (a deploy that
    churns the deployment). They are made sorted: the template lists them so."""
    from agentq.api.app import PUBLIC_PATHS

    made = [
        r["Properties"]["PathPart"]
        for r in synth.resources("AWS::ApiGateway::Resource").values()
        if "/" + r["Properties"]["PathPart"] in PUBLIC_PATHS
    ]
    assert made == sorted(p.strip("/") for p in PUBLIC_PATHS)


def test_binary_workspace_files_leave_api_gateway_as_bytes(synth: Synthesized) -> None:
    """GET /tasks/{id}/files/{path} answers a binary file base64-encoded (powertools, isBase64Encoded);
    API Gateway turns it back into bytes only for a media type it lists (the client's Accept)."""
    (api,) = synth.resources("AWS::ApiGateway::RestApi").values()
    assert api["Properties"]["BinaryMediaTypes"] == ["application/octet-stream"]


def test_an_oidc_issuer_from_cdk_json_reaches_the_authorizer_and_a_refused_token_is_a_401_naming_why(
    worker_synth: Synthesized,
) -> None:
    """cdk.json's ``oidc`` is the authorizer's ``AGENTQ_OIDC`` (what ``agentq.api.oidc`` reads),
    and the authorizer's Deny of a bad token (its reason in the context) is a 401 JSON body
    naming that reason; without ``oidc`` (every shipped environment) the authorizer has none."""
    from agentq.api.oidc import OIDC_ENV, OidcSettings

    _, authorizer = _function(worker_synth, "authorizer")
    env = authorizer["Properties"]["Environment"]["Variables"]
    assert OidcSettings.from_env({OIDC_ENV: env[OIDC_ENV]}) == OidcSettings(**OIDC)
    template = assertions.Template.from_json(worker_synth.template)
    template.has_resource_properties("AWS::ApiGateway::GatewayResponse", {
        "ResponseType": "ACCESS_DENIED", "StatusCode": "401",
        "ResponseTemplates": {"application/json":
                              '{"error": {"code": "unauthorized", "message": "$context.authorizer.error"}}'},
    })  # fmt: skip


class RefusingIssuer:
    """An OIDC verifier (``api.auth.OidcVerifier``) whose refusal says ``reason``: the reasons
    ``api.oidc`` gives are our own words, so this is how a hostile one reaches the authorizer."""

    def __init__(self, reason: str) -> None:
        self.reason = reason

    def verify(self, token: str) -> dict[str, str]:
        from agentq.api.auth import Unauthorized

        raise Unauthorized(self.reason, public=True)


@pytest.mark.parametrize(
    "hostile", ['x", "code": "forged', 'x"}} trailing', "x\\", "line\nbreak\u2028", "nul\x00\x7f", '"' * 400]
)
def test_a_refused_tokens_401_body_and_access_log_line_stay_json_whatever_its_reason_holds(
    synth: Synthesized, hostile: str
) -> None:
    """API Gateway puts ``$context.authorizer.error`` unescaped into the ACCESS_DENIED body and
    the access log line: the authorizer (``api.auth.token_authorizer``) makes any reason safe
    between those quotes, whatever wrote it."""
    from agentq.api.auth import token_authorizer

    event = {"authorizationToken": "Bearer a.b.c", "methodArn": "arn:x/v1/GET/tasks"}
    answer = token_authorizer(None, event, RefusingIssuer(hostile))  # type: ignore[arg-type]
    assert answer["policyDocument"]["Statement"][0]["Effect"] == "Deny"
    reason = str(answer["context"]["error"])
    assert reason.strip(), "a reason is left"
    (denied,) = [r["Properties"] for r in synth.resources("AWS::ApiGateway::GatewayResponse").values()
                 if r["Properties"]["ResponseType"] == "ACCESS_DENIED"]  # fmt: skip
    body = denied["ResponseTemplates"]["application/json"].replace("$context.authorizer.error", reason)
    assert json.loads(body) == {"error": {"code": "unauthorized", "message": reason}}
    (stage,) = [r["Properties"] for r in synth.resources("AWS::ApiGateway::Stage").values()]
    line = re.sub(r"\$context\.[A-Za-z.]+", lambda m: reason if m[0] == "$context.authorizer.error" else "v",
                  stage["AccessLogSetting"]["Format"])  # fmt: skip
    logged = json.loads(line)
    assert logged["authorizerError"] == reason and set(logged) == set(json.loads(stage["AccessLogSetting"]["Format"]))


def test_without_oidc_the_authorizer_takes_api_keys_only(synth: Synthesized) -> None:
    from agentq.api.oidc import OIDC_ENV

    _, authorizer = _function(synth, "authorizer")
    assert OIDC_ENV not in authorizer["Properties"]["Environment"]["Variables"]


def test_the_vault_key_rotates_and_the_api_may_only_seal_and_the_task_runners_only_open_with_a_tenant_context(
    synth: Synthesized, template: assertions.Template
) -> None:
    """The vault's KMS key (core.vault_crypto): rotated yearly; the API generates data keys and
    cannot decrypt one, the executor decrypts and cannot generate; each only with an encryption
    context that names a tenant; both find the key in AGENTQ_VAULT_KMS_KEY; nothing else uses it."""
    keys = template.find_resources("AWS::KMS::Key")
    [vault_key] = [k for k, v in keys.items() if "vault" in v["Properties"].get("Description", "")]
    assert keys[vault_key]["Properties"]["EnableKeyRotation"] is True
    kms_actions = {}
    for role in ("api", "executor", "authorizer", "reaper"):
        statements = [
            s for s in _role_statements(synth, role) if any(a.startswith("kms:") for a in _as_list(s["Action"]))
        ]
        kms_actions[role] = {a for s in statements for a in _as_list(s["Action"])}
        for s in statements:
            assert s["Condition"] == {"Null": {"kms:EncryptionContext:agentq:tenant": "false"}}
            assert s["Resource"] == {"Fn::GetAtt": [vault_key, "Arn"]}
    assert kms_actions == {"api": {"kms:GenerateDataKey"}, "executor": {"kms:Decrypt"}, "authorizer": set(),
                           "reaper": set()}  # fmt: skip
    functions = template.find_resources("AWS::Lambda::Function")
    with_key = sorted(
        v["Properties"]["Handler"].split(".")[0]
        for v in functions.values()
        if "AGENTQ_VAULT_KMS_KEY" in v["Properties"].get("Environment", {}).get("Variables", {})
    )
    assert with_key == [
        "api",
        "events/run",
        "executor",
    ]  # the API (and its A2A streaming twin, infra/a2a.py), the executor


def test_each_scope_kind_has_an_alarm_at_80_percent_of_its_caps(synth: Synthesized) -> None:
    """Caps per end user, agent and key (core.caps): one alarm per scope kind on the
    scope_cap_crossed metric (three series whatever the users; the event names who)."""
    p = settings_of(synth.env_name).prefix
    alarms = _alarms(synth)
    for scope in ("user", "agent", "key"):
        alarm = alarms[f"{p}-scope-cap80-{scope}"]
        assert _metric(alarm) == ("agentq", "scope_cap_crossed", "Sum") and alarm["Threshold"] == 1
        (stat,) = [m["MetricStat"] for m in alarm["Metrics"] if "MetricStat" in m]
        assert {"Name": "scope", "Value": scope} in stat["Metric"]["Dimensions"]
