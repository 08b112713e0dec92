"""The executor: runs a task for one time slice per SQS message of the tier queues.

One event source per tier, batch size 1 (a message is a task slice; a failed one comes back
alone), partial batch failures reported, each tier's maximum concurrency. Its variables and
grants are a task runner's (``infra/task_runners.py``, the same as the Fargate worker's), plus
your tools' (``user_code``) and, with ``tracing.exporter = "adot"``, the collector beside it
(``infra/telemetry.py``).
"""

from __future__ import annotations

from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_lambda_event_sources as sources
from aws_cdk import aws_stepfunctions as sfn
from constructs import Construct

from agentq.resources import TIERS
from infra.access import vault_env
from infra.data import Data
from infra.functions import FunctionFactory
from infra.sandbox import Sandbox
from infra.settings import EnvironmentSettings
from infra.task_runners import grant_task_runner, grant_user_code, task_runner_env, user_code_env
from infra.telemetry import lambda_collector, otel_env


def build_executor(
    scope: Construct,
    function: FunctionFactory,
    cfg: EnvironmentSettings,
    data: Data,
    machine: sfn.StateMachine,
    sandbox: Sandbox,
    common: dict[str, str],
) -> lambda_.Function:
    collector_layers, collector_env = lambda_collector(scope, cfg)  # tracing.exporter = "adot" only
    ex = cfg.executor
    executor_env = {
        **common,
        "AGENTQ_SLICE_MARGIN_SECONDS": str(ex.slice_margin_seconds),
        "AGENTQ_VISIBILITY_SECONDS": str(ex.visibility_seconds),
        "AGENTQ_LEASE_SECONDS": str(ex.lease_seconds),
        "AGENTQ_MAX_RECEIVE_COUNT": str(cfg.max_receive_count),
        **task_runner_env(cfg, sandbox),
        **vault_env(data),
        **user_code_env(cfg),
        **collector_env,
        **otel_env(cfg, "agentq-executor"),
    }
    executor = function(
        "executor",
        memory=ex.memory_mb,
        timeout=ex.timeout_seconds,
        env=executor_env,
        reserved=ex.reserved_concurrency,
        description="agentq executor: runs a task for one time slice per SQS message",
        extra_layers=[*function.layers.tools, *collector_layers],
    )
    grant_task_runner(executor, data, machine, cfg, sandbox, receive=False)
    grant_user_code(executor, cfg, runs_tools=True)
    for tier in TIERS:
        executor.add_event_source(
            sources.SqsEventSource(
                data.queues[tier],
                batch_size=1,
                report_batch_item_failures=True,
                max_concurrency=ex.tier_max_concurrency[tier],
            )
        )
    return executor
