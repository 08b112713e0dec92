"""cdk-nag (AwsSolutions) findings this stack acknowledges, each with its reason.

Every other finding fails the synth (``cdk.Validations`` raises ``ValidationFailed``), so a
new wildcard, an unencrypted resource or a missing log shows up in ``make test``, not in
production. Acknowledgements sit on the narrowest construct they concern and name the exact
finding (for IAM5, the exact resource), so they cannot hide a different one.
"""

from __future__ import annotations

from typing import Protocol

import aws_cdk as cdk
from aws_cdk import aws_stepfunctions as sfn
from constructs import IConstruct

from agentq.api.app import PUBLIC_PATHS
from agentq.api.console import CONSOLE_PATH
from agentq.resources import PAYLOAD_PREFIX
from infra.api import Api
from infra.data import Data
from infra.functions import Functions
from infra.model_access import bedrock_resource_templates, wildcard_reason
from infra.settings import EnvironmentSettings
from infra.telemetry import adot
from infra.worker import Worker

PARTITION_REGION_ACCOUNT = "arn:<AWS::Partition>:{service}:<AWS::Region>:<AWS::AccountId>"


def _ack(scope: IConstruct | None, rule: str, reason: str) -> None:
    # CDK types a function's role and a task's default container as optional; ours always exist.
    if scope is None:
        raise ValueError(f"no construct to acknowledge {rule} on")
    rule_id = rule if "::" in rule.split("[", maxsplit=1)[0] else f"AwsSolutions::{rule}"
    cdk.Validations.of(scope).acknowledge(cdk.Acknowledgment(id=rule_id, reason=reason))


class Acknowledged(Protocol):
    """What of the stack (``infra.stack.AgentqStack``) the acknowledgements sit on."""

    env_name: str
    settings: EnvironmentSettings
    data: Data
    state_machine: sfn.StateMachine
    functions: Functions
    api: Api
    worker: Worker | None


def _logical_id(construct: IConstruct) -> str:
    child = construct.node.default_child
    if not isinstance(child, cdk.CfnElement):
        raise TypeError(f"{construct.node.path} has no CloudFormation resource of its own")
    return cdk.Stack.of(construct).get_logical_id(child)


XRAY = "X-Ray PutTraceSegments/PutTelemetryRecords support no resource-level permissions: AWS requires '*'."


def acknowledge(stack: Acknowledged) -> None:
    """Every acknowledgement, on the construct it concerns."""
    payload_objects = f"Resource::<{_logical_id(stack.data.payloads)}.Arn>/{PAYLOAD_PREFIX}*"
    _functions(stack.functions, stack.settings, payload_objects)
    _task_runners(stack, payload_objects)
    _ack(
        stack.state_machine.role,
        "AwsSolutions-IAM5[Resource::*]",
        "Added by CDK for logging and tracing: CloudWatch Logs vended log delivery (logs:*LogDelivery, PutResourcePolicy, Describe*) and X-Ray accept only '*'. The machine's own work is sqs:SendMessage on the three tier queues.",
    )
    _api(stack.api, stack.env_name)
    if stack.worker is not None:
        _worker(stack.worker)


def _functions(fns: Functions, cfg: EnvironmentSettings, payload_objects: str) -> None:
    """The runtime, X-Ray, and each function's own grants on a prefix or a name chosen at run time."""
    for fn in (fns.executor, fns.api, fns.authorizer, fns.reaper, fns.sweeper, fns.webhooks, fns.events, fns.a2a,
               fns.sandbox.function):  # fmt: skip
        _ack(
            fn,
            "AwsSolutions-L1",
            "Python 3.12 on purpose: both layers are built for cp312 (infra/build_layers.py) and the suite runs against it; moving runtimes is a deliberate change of layers and runtime together.",
        )
    for fn in (fns.executor, fns.api, fns.authorizer, fns.sweeper, fns.webhooks, fns.events):
        _ack(fn.role, "AwsSolutions-IAM5[Resource::*]", XRAY)
    _ack(
        fns.events.role,
        f"AwsSolutions-IAM5[{payload_objects}]",
        f"An event stream shows committed steps, whose bodies may be offloaded under {PAYLOAD_PREFIX}<task_id>/...; the grant is GetObject on that prefix of this environment's bucket only.",
    )
    _ack(
        fns.api.role,
        f"AwsSolutions-IAM5[Resource::arn:<AWS::Partition>:scheduler:<AWS::Region>:<AWS::AccountId>:schedule/{cfg.prefix}-schedules/*]",
        "POST/DELETE /schedules create and delete one EventBridge Scheduler schedule per tenant schedule, named at run time; the grant is limited to this environment's schedule group.",
    )
    _ack(
        fns.reaper.role,
        "AwsSolutions-IAM5[Resource::*]",
        XRAY
        + " dynamodb:ListStreams, which the stream event source mapping needs, has no resource-level permissions either; reading the stream (DescribeStream/GetRecords/GetShardIterator) is granted on this table's stream only.",
    )
    _ack(
        fns.reaper.role,
        f"AwsSolutions-IAM5[{payload_objects}]",
        f"The reaper deletes the payloads of one expired task at a time, keyed {PAYLOAD_PREFIX}<task_id>/...; the grant is DeleteObject on that prefix of this environment's bucket only (and ListBucket only with s3:prefix {PAYLOAD_PREFIX}*).",
    )
    _ack(
        fns.reaper_dlq,
        "AwsSolutions-SQS3",
        "This queue is a dead-letter queue: the on-failure destination of the reaper's stream event source mapping (cdk-nag only recognises an SQS redrive policy). A DLQ of a DLQ would add nothing; its depth is alarmed.",
    )
    sandbox_role = fns.sandbox.function.role
    assert sandbox_role is not None  # built with its own role (infra/sandbox.py)
    _ack(
        sandbox_role,
        "AwsSolutions-IAM5[Resource::*]",
        "Lambda attaches a VPC function to its subnets with the function's role: ec2:CreateNetworkInterface and the Describe/Delete/Assign calls it makes support no resource-level permissions for this use. The sandbox's subnets have no route anywhere, so these credentials cannot reach the EC2 API from inside the function.",
    )


def _task_runners(stack: Acknowledged, payload_objects: str) -> None:
    """The executor's and the worker's (and, for payloads and fan-out executions, the API's) grants
    on per-task prefixes, run-time names, Bedrock models and named secrets."""
    fns, cfg = stack.functions, stack.settings
    runners = [fns.executor.role]
    if stack.worker is not None:
        runners.append(stack.worker.task_definition.task_role)
    _per_task(stack, fns.api.role, payload_objects)
    for role in runners:
        acknowledge_task_runner(stack, role)
    if stack.worker is not None and adot(cfg):
        _ack(
            stack.worker.task_definition.task_role,
            "AwsSolutions-IAM5[Resource::*]",
            XRAY
            + " They are the ADOT collector sidecar's (tracing.exporter = adot), which forwards the worker's spans to X-Ray.",
        )


def _per_task(stack: Acknowledged, role: IConstruct | None, payload_objects: str) -> None:
    executions = f"Resource::{PARTITION_REGION_ACCOUNT.format(service='states')}:execution:{stack.settings.names.state_machine}:*"
    _ack(
        role,
        f"AwsSolutions-IAM5[{payload_objects}]",
        f"Payload objects are per task, keyed {PAYLOAD_PREFIX}<task_id>/...; the grant is Get/PutObject on that prefix of this environment's bucket only.",
    )
    _ack(
        role,
        f"AwsSolutions-IAM5[{executions}]",
        "Execution names are chosen per fan-out at run time; the grant is StopExecution on executions of this environment's fan-out machine only.",
    )


def acknowledge_task_runner(stack: Acknowledged, role: IConstruct | None) -> None:
    """One task runner's role (the executor's, the Fargate worker's, the EC2 workspace tier's):
    ``infra/task_runners.py``'s grants on per-task prefixes, Bedrock models and named secrets."""
    cfg = stack.settings
    _per_task(stack, role, f"Resource::<{_logical_id(stack.data.payloads)}.Arn>/{PAYLOAD_PREFIX}*")
    for template in bedrock_resource_templates(cfg.bedrock_models):  # infra/model_access.py
        if "*" in template:
            resource = template.format(partition="<AWS::Partition>", region="<AWS::Region>", account="<AWS::AccountId>")
            _ack(role, f"AwsSolutions-IAM5[Resource::{resource}]", wildcard_reason(template))
    for setting, name in (("anthropic_api_key_secret", cfg.anthropic_api_key_secret),
                          ("openai_api_key_secret", cfg.openai_api_key_secret)):  # fmt: skip
        if not name:
            continue
        secret = f"Resource::{PARTITION_REGION_ACCOUNT.format(service='secretsmanager')}:secret:{name}-??????"
        _ack(
            role,
            f"AwsSolutions-IAM5[{secret}]",
            f"Secrets Manager appends six random characters to a secret's ARN; the grant is GetSecretValue on the one named secret ({setting}).",
        )


def _api(apis: Api, env_name: str) -> None:
    """The REST API: no Cognito (tenants hold keys), the account's logging role, validation in the
    API Lambda, the public paths and the console, and no WAF where the settings say so."""
    api = apis.rest_api
    _ack(
        api,
        "AwsSolutions-COG4",
        "Callers are tenants holding API keys, verified by the TOKEN authorizer on every method (sha256 of the key looked up in the table, cached per key), and, where cdk.json configures oidc, end users holding JWTs of the product's own OIDC issuer, verified by the same authorizer (signature against the issuer's JWKS, expiry, audience, issuer): the identities live with that issuer, not in a Cognito user pool of ours.",
    )
    _ack(
        api.node.find_child("CloudWatchRole"),
        "AwsSolutions-IAM4[Policy::arn:<AWS::Partition>:iam::aws:policy/service-role/AmazonAPIGatewayPushToCloudWatchLogs]",
        "The account-level role API Gateway uses to write execution logs; AWS maintains this service-role policy for exactly that and it grants nothing else.",
    )
    _ack(
        api,
        "AwsSolutions-APIG2",
        "Requests are validated by the API Lambda (pydantic models, the same ones its OpenAPI document is generated from), which answers 422 naming the exact field; a gateway model would answer the same mistakes with a 400 and no field.",
    )
    for path in sorted(PUBLIC_PATHS):  # a set's order follows the hash seed; the deployment's id must not
        method = api.root.get_resource(path.strip("/")).node.find_child("GET")  # type: ignore[union-attr]
        for rule in ("AwsSolutions-APIG4", "AwsSolutions-COG4"):
            _ack(
                method,
                rule,
                f"GET {path} is public on purpose (liveness probes, client generators) and returns no tenant data; every other method needs a key.",
            )
    console = api.root.get_resource(CONSOLE_PATH.strip("/"))
    assert console is not None
    for method in (console.node.find_child("GET"), console.get_resource("{proxy+}").node.find_child("GET")):  # type: ignore[union-attr]
        for rule in ("AwsSolutions-APIG4", "AwsSolutions-COG4"):
            _ack(
                method,
                rule,
                f"GET {CONSOLE_PATH} and its assets are public on purpose: static HTML/CSS/JS shipped in the package, no tenant data; every call the page makes goes to the keyed methods with the person's key.",
            )
    if apis.web_acl is None:
        _ack(
            api,
            "AwsSolutions-APIG3",
            f"No WAF in {env_name} (api.waf=false in cdk.json): every method needs a tenant key and stage and per-route throttles apply; prod attaches a WAFv2 web ACL.",
        )


def _worker(w: Worker) -> None:
    """The Fargate worker's task definition, its image pull and its execution role."""
    _ack(
        w.task_definition,
        "AwsSolutions-ECS2",
        "The environment holds resource names and tuning only (table, bucket, queue prefix, state machine ARN), no secrets.",
    )
    if w.pulls_from_ecr:
        container = w.task_definition.default_container
        _ack(
            container,
            "Annotation::@aws-cdk/aws-ecs:ecrImageRequiresPolicy",
            "The execution role is granted pull on exactly the image's ECR repository (infra/worker.py _grant_image_pull).",
        )
    execution_role = w.task_definition.execution_role
    if execution_role is not None:
        _ack(
            execution_role,
            "AwsSolutions-IAM5[Resource::*]",
            "ecr:GetAuthorizationToken (registry login) supports no resource-level permissions: AWS requires '*'. Image pulls are scoped to the worker's repository.",
        )
