"""How long what the stack makes lives: each log group's retention (``log_retention_days``), and
whether the stateful resources outlive the stack (``destroy``: dev environments go with it).
``log_group`` and ``add_flow_logs`` make the groups that follow both, so no construct spells them
out again."""

from __future__ import annotations

import aws_cdk as cdk
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_logs as logs
from constructs import Construct

from infra.settings import EnvironmentSettings


def log_retention(days: int) -> logs.RetentionDays:
    return getattr(  # type: ignore[no-any-return]
        logs.RetentionDays,
        {
            1: "ONE_DAY", 3: "THREE_DAYS", 5: "FIVE_DAYS", 7: "ONE_WEEK", 14: "TWO_WEEKS", 30: "ONE_MONTH",
            60: "TWO_MONTHS", 90: "THREE_MONTHS", 120: "FOUR_MONTHS", 150: "FIVE_MONTHS", 180: "SIX_MONTHS",
            365: "ONE_YEAR", 400: "THIRTEEN_MONTHS", 545: "EIGHTEEN_MONTHS", 731: "TWO_YEARS",
            1096: "THREE_YEARS", 1827: "FIVE_YEARS", 2192: "SIX_YEARS", 2557: "SEVEN_YEARS",
            2922: "EIGHT_YEARS", 3288: "NINE_YEARS", 3653: "TEN_YEARS",
        }[days],
    )  # fmt: skip


def removal_policy(cfg: EnvironmentSettings) -> cdk.RemovalPolicy:
    return cdk.RemovalPolicy.DESTROY if cfg.destroy else cdk.RemovalPolicy.RETAIN


def log_group(scope: Construct, construct_id: str, cfg: EnvironmentSettings, name: str | None = None) -> logs.LogGroup:
    """A log group kept ``log_retention_days``, and removed with the stack only where ``destroy``;
    ``name``: where a service writes under a name of its own choosing."""
    return logs.LogGroup(
        scope,
        construct_id,
        log_group_name=name,
        retention=log_retention(cfg.log_retention_days),
        removal_policy=removal_policy(cfg),
    )


def add_flow_logs(scope: Construct, vpc: ec2.Vpc, construct_id: str, cfg: EnvironmentSettings) -> None:
    """The VPC's flow logs, into a log group of its own kept as every other."""
    flow_logs = log_group(scope, construct_id, cfg)
    vpc.add_flow_log("FlowLogs", destination=ec2.FlowLogDestination.to_cloud_watch_logs(flow_logs))
