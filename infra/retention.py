"""How long what the stack makes lives: each log group's retention (``log_retention_days``), and
whether the stateful resources outlive the stack (``destroy``: dev environments go with it)."""

from __future__ import annotations

import aws_cdk as cdk
from aws_cdk import aws_logs as logs

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
