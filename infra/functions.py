"""How a Lambda function of the stack is made, and the record of all of them.

Each function gets its own role with only the actions its code path calls, on this deployment's
resources (no ``*`` except X-Ray's, which AWS requires); ``FunctionFactory`` makes the function,
its log group and a role that may write that log group and nothing else, and the module of each
function grants the rest: ``infra/executor.py``, ``infra/api_functions.py`` (the API, the
authorizer), ``infra/background.py`` (reaper, sweeper, webhooks), ``infra/events.py`` (event
streams), ``infra/sandbox.py`` (python_exec's code). The handlers in ``functions/`` ship as one
small asset; each function runs its own module from it, on the core and dependencies layers
(``infra/layers.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import aws_cdk as cdk
from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_logs as logs
from aws_cdk import aws_sqs as sqs
from aws_cdk import aws_stepfunctions as sfn
from constructs import Construct

from agentq.observe.names import NAMESPACE as METRICS_NAMESPACE
from infra.data import Data
from infra.layers import ASSET_EXCLUDES, RUNTIME, Layers, architecture
from infra.retention import log_retention, removal_policy
from infra.sandbox import Sandbox
from infra.settings import EnvironmentSettings
from infra.task_runners import defaults_env

ROOT = Path(__file__).resolve().parent.parent
FUNCTIONS_DIR = ROOT / "functions"
HANDLERS = {
    "executor": "executor.handler.lambda_handler",
    "api": "api.handler.lambda_handler",
    "authorizer": "authorizer.handler.lambda_handler",
    "reaper": "reaper.handler.lambda_handler",
    "sweeper": "sweeper.handler.lambda_handler",
    "webhooks": "webhooks.handler.lambda_handler",
    "events": "events/run.sh",  # the startup script the Lambda Web Adapter runs (infra/events.py)
    "a2a": "events/run.sh",  # the same server, with the API's grants: A2A's streams (infra/a2a.py)
}


@dataclass
class Functions:
    executor: lambda_.Function
    api: lambda_.Function
    authorizer: lambda_.Function
    reaper: lambda_.Function
    reaper_dlq: sqs.Queue  # stream batches the reaper gave up on (their shard and sequence range)
    sweeper: lambda_.Function
    webhooks: lambda_.Function
    events: lambda_.Function  # GET /tasks/{id}/events, streamed (infra/events.py)
    a2a: lambda_.Function  # POST /a2a/{agent}, streamed, with the API's role (infra/a2a.py)
    sandbox: Sandbox
    log_groups: dict[str, logs.LogGroup]


def functions_code() -> lambda_.Code:
    """``functions/``, one asset every function runs its own handler from."""
    return lambda_.Code.from_asset(str(FUNCTIONS_DIR), exclude=ASSET_EXCLUDES)


def common_env(env_name: str, cfg: EnvironmentSettings, data: Data, machine: sfn.StateMachine) -> dict[str, str]:
    """What the functions that build the whole runtime (``agentq.runtime.Settings``) read."""
    names = cfg.names
    return {
        "AGENTQ_ENV": env_name,
        "AGENTQ_PREFIX": names.prefix,
        "AGENTQ_TABLE": data.table.table_name,
        "AGENTQ_BUCKET": data.payloads.bucket_name,
        "AGENTQ_STATE_MACHINE_ARN": machine.state_machine_arn,
        "AGENTQ_TASK_RETENTION_DAYS": str(cfg.task_retention_days),
        **defaults_env(cfg),
        "POWERTOOLS_METRICS_NAMESPACE": METRICS_NAMESPACE,
        "POWERTOOLS_LOG_LEVEL": cfg.log_level,
        # LLM responses can be large; X-Ray segments cap at 64 KB. Spans keep the GenAI
        # attributes (model, tokens, stop reason) the code adds, not whole payloads.
        "POWERTOOLS_TRACER_CAPTURE_RESPONSE": "false",
    }


class FunctionFactory:
    """Makes the stack's functions alike: ``{prefix}-{name}``, the handler ``HANDLERS[name]`` from
    one code asset, the core and dependencies layers (plus ``extra_layers``), active tracing, a log
    group of its own (kept in ``log_groups``) and a role that may write only that log group."""

    def __init__(self, scope: Construct, cfg: EnvironmentSettings, code: lambda_.Code, layers: Layers) -> None:
        self.scope = scope
        self.cfg = cfg
        self.code = code
        self.layers = layers
        self.log_groups: dict[str, logs.LogGroup] = {}

    def __call__(
        self,
        name: str,
        *,
        memory: int,
        timeout: int,
        env: dict[str, str],
        reserved: int | None,
        description: str,
        extra_layers: list[lambda_.ILayerVersion] | None = None,
        role: iam.Role | None = None,
    ) -> lambda_.Function:
        """``role``: another function's role to share (it is granted this one's log group too)."""
        cfg, scope = self.cfg, self.scope
        log_group = logs.LogGroup(
            scope,
            f"{name.capitalize()}FunctionLogs",
            retention=log_retention(cfg.log_retention_days),
            removal_policy=removal_policy(cfg),
        )
        self.log_groups[name] = log_group
        return lambda_.Function(
            scope,
            f"{name.capitalize()}Function",
            function_name=f"{cfg.names.prefix}-{name}",
            description=description,
            runtime=RUNTIME,
            architecture=architecture(cfg),
            code=self.code,
            handler=HANDLERS[name],
            layers=[self.layers.core, self.layers.deps, *(extra_layers or [])],
            memory_size=memory,
            timeout=cdk.Duration.seconds(timeout),
            reserved_concurrent_executions=reserved,
            environment={**env, "POWERTOOLS_SERVICE_NAME": f"agentq-{name}"},
            tracing=lambda_.Tracing.ACTIVE,
            log_group=log_group,
            role=self._role(f"{name.capitalize()}Function", log_group, f"agentq {name} ({cfg.names.prefix})")
            if role is None
            else self._share(role, name, log_group),
        )

    @staticmethod
    def _share(role: iam.Role, name: str, log_group: logs.LogGroup) -> iam.Role:
        role.add_to_principal_policy(
            iam.PolicyStatement(
                sid=f"{name.capitalize()}Logs",
                actions=["logs:CreateLogStream", "logs:PutLogEvents"],
                resources=[log_group.log_group_arn],
            )
        )
        return role

    def _role(self, name: str, log_group: logs.LogGroup, description: str) -> iam.Role:
        """A function role that may write its own log group and nothing else (yet)."""
        role = iam.Role(
            self.scope, f"{name}Role", assumed_by=iam.ServicePrincipal("lambda.amazonaws.com"), description=description
        )
        role.add_to_principal_policy(
            iam.PolicyStatement(
                sid="OwnLogs",
                actions=["logs:CreateLogStream", "logs:PutLogEvents"],
                resources=[log_group.log_group_arn],
            )
        )
        return role
