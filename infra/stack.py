"""The agentq stack: everything one environment runs on (``cdk deploy -c env=dev|staging|prod``).

One module a concern, each adding its resources to this stack (so their logical IDs are the
stack's own), composed here in the order they depend on one another:

layers       agentq, its dependencies, your tools                         infra/layers.py
data         table (PITR, TTL, gsi1), payload bucket, tier queues + DLQs   infra/data.py
fan-out      Step Functions from agentq/asl/fanout.asl.json               infra/fanout.py
functions    one role each, least privilege (infra/functions.py makes them, infra/access.py names
             what they reach): the executor (infra/executor.py, a task runner as the worker is:
             infra/task_runners.py), the API and its authorizer (infra/api_functions.py), the
             reaper, sweeper and webhooks (infra/background.py), event streams (infra/events.py),
             python_exec's sandbox (infra/sandbox.py)
api          REST API, TOKEN authorizer, access logs, throttles, WAF       infra/api.py
worker       optional Fargate worker scaled on queue depth                infra/worker.py
hub          optional events hub for watchers: Fargate behind an ALB      infra/hub.py
workspace    optional EC2 tier for tasks with a workspace (bubblewrap)    infra/workspace_tier.py
observe      alarms on an SNS topic; the dashboard, last (every alarm)    infra/observability.py
nag          the cdk-nag findings acknowledged, each with its reason      infra/nag.py
"""

from __future__ import annotations

from typing import Any

import aws_cdk as cdk
from aws_cdk import aws_events as events
from constructs import Construct

from agentq.api.console import CONSOLE_PATH
from infra import nag
from infra.a2a import build_a2a_function
from infra.alarms import AlarmFactory
from infra.api import build_api
from infra.api_functions import build_api_function, build_authorizer
from infra.background import build_reaper, build_sweeper, build_webhooks
from infra.build_layers import DepsLayer, build_deps_layer
from infra.data import Data, build_data
from infra.events import build_events_function
from infra.executor import build_executor
from infra.fanout import build_fanout
from infra.functions import FunctionFactory, Functions, common_env, functions_code
from infra.hub import build_hub, hub_alarms
from infra.layers import RUNTIME, Layers, architecture, build_layers, require_built, user_code_layer
from infra.observability import add_dashboard, build_observability
from infra.retention import log_retention
from infra.sandbox import build_sandbox
from infra.settings import EnvironmentSettings
from infra.worker import build_worker
from infra.workspace_tier import acknowledge_workspace_tier, build_workspace_tier


class AgentqStack(cdk.Stack):
    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        env_name: str,
        settings: EnvironmentSettings,
        deps_layer: DepsLayer | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(scope, construct_id, description=f"agentq durable task queue ({env_name})", **kwargs)
        self.env_name = env_name
        self.settings = cfg = settings
        cdk.Tags.of(self).add("agentq:env", env_name)

        self.deps_layer = require_built(
            self,
            deps_layer or build_deps_layer(cfg.architecture),
            "The dependencies layer must be built before a deployable synth: "
            "run `.venv/bin/python infra/build_layers.py` where PyPI is reachable.",
        )
        self.user_layer = user_code_layer(self, cfg)

        self.data = build_data(self, cfg)
        self.event_bus = (
            events.EventBus(self, "EventBus", event_bus_name=f"{cfg.prefix}-events")
            if cfg.event_bus == "stack"
            else None
        )
        self.state_machine = build_fanout(self, cfg, self.data)
        self.layers = build_layers(self, cfg, self.deps_layer, self.user_layer)
        self.functions = self._functions(env_name, cfg, self.data, self.layers)
        self.api = build_api(self, cfg, self.functions)
        self.worker = (
            build_worker(self, env_name, cfg, self.data, self.state_machine, self.functions.sandbox)
            if cfg.worker.enabled
            else None
        )
        self.observability = build_observability(self, cfg, self.data, self.functions, self.state_machine, self.api)
        self.hub = build_hub(self, env_name, cfg, self.data) if cfg.live.hub else None
        if self.hub is not None:  # GET /health names it: the clients' discovery
            self.functions.api.add_environment("AGENTQ_EVENTS_HUB_URL", self.hub.url)
            self.observability.alarms += hub_alarms(AlarmFactory(self, cfg.prefix, self.observability.topic), self.hub)
            cdk.CfnOutput(self, "EventsHubUrl", value=self.hub.url, description="the events hub (watchers)")

        self.workspace_tier = None
        if cfg.workspace.tier == "ec2":  # tasks with a workspace run there (docs/SANDBOX.md)
            self.workspace_tier = build_workspace_tier(
                self, env_name, cfg, self.data, self.state_machine, self.functions, self.worker,
                self.observability.topic, self.user_layer, self.deps_layer,
            )  # fmt: skip
            self.observability.alarms += self.workspace_tier.alarms
        # Last: every alarm and queue of the stack exists now, so the dashboard shows them all.
        add_dashboard(
            self, env_name, cfg, self.data, self.functions, self.state_machine, self.api, self.observability,
            (self.workspace_tier.queues, self.workspace_tier.dlqs) if self.workspace_tier is not None else None,
        )  # fmt: skip

        cdk.CfnOutput(self, "ApiUrl", value=self.api.rest_api.url, description="AGENTQ_URL for the CLI and client")
        cdk.CfnOutput(
            self,
            "ConsoleUrl",
            value=self.api.rest_api.url_for_path(f"{CONSOLE_PATH}/"),
            description="the web console (it asks for an API key)",
        )
        cdk.CfnOutput(self, "TableName", value=self.data.table.table_name)
        cdk.CfnOutput(self, "PayloadBucket", value=self.data.payloads.bucket_name)
        cdk.CfnOutput(self, "StateMachineArn", value=self.state_machine.state_machine_arn)
        cdk.CfnOutput(self, "AlarmTopicArn", value=self.observability.topic.topic_arn)
        cdk.CfnOutput(self, "DashboardName", value=f"{cfg.prefix}-overview")
        nag.acknowledge(self)
        if self.workspace_tier is not None:
            acknowledge_workspace_tier(self, self.workspace_tier)

    def _functions(self, env_name: str, cfg: EnvironmentSettings, data: Data, layers: Layers) -> Functions:
        """Every function, on one code asset and the layers; the sandbox first (the task runners
        are granted its invocation), the executor next."""
        code = functions_code()
        sandbox = build_sandbox(
            self,
            cfg,
            code=code,
            core_layer=layers.core,
            runtime=RUNTIME,
            architecture=architecture(cfg),
            retention=log_retention(cfg.log_retention_days),
        )
        function = FunctionFactory(self, cfg, code, layers)
        common = common_env(env_name, cfg, data, self.state_machine)
        executor = build_executor(self, function, cfg, data, self.state_machine, sandbox, common)
        api = build_api_function(self, function, cfg, data, common)
        authorizer = build_authorizer(function, cfg, data)
        reaper, reaper_dlq = build_reaper(self, function, cfg, data)
        sweeper = build_sweeper(self, function, cfg, data)
        webhooks = build_webhooks(function, data, common)
        streams = build_events_function(self, function, data, common)
        a2a = build_a2a_function(self, function, data, common, api)
        return Functions(
            executor=executor,
            api=api,
            authorizer=authorizer,
            reaper=reaper,
            reaper_dlq=reaper_dlq,
            sweeper=sweeper,
            webhooks=webhooks,
            events=streams,
            a2a=a2a,
            sandbox=sandbox,
            log_groups=function.log_groups,
        )
