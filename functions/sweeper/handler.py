"""Sweeper Lambda: on a schedule (EventBridge), re-enqueue unfinished tasks that have no worker
and no message (``agentq.queueing.sweeper``). A thin adapter: the sweep is the core's; the
schedule, the grace (``AGENTQ_SWEEP_STALE_AFTER_SECONDS``) and the metric's flush are this
function's."""

from __future__ import annotations

import os
from typing import Any

from aws_lambda_powertools import Logger
from aws_lambda_powertools.utilities.typing import LambdaContext

from agentq import observe
from agentq.control.defaults import Defaults
from agentq.queueing.sweeper import DEFAULT_STALE_AFTER_SECONDS, sweep
from agentq.runtime import lazy_store_and_queues

logger = Logger(service="agentq-sweeper")

clients = lazy_store_and_queues()


@logger.inject_lambda_context
def lambda_handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    store, queues = clients()
    stale_after = float(os.environ.get("AGENTQ_SWEEP_STALE_AFTER_SECONDS") or DEFAULT_STALE_AFTER_SECONDS)
    # The deployment's default running limit, fleet and tier capacities: waiters they now have room for are woken.
    defaults = Defaults.from_env()
    report = sweep(store, queues, stale_after=stale_after, default_max_running=defaults.tenant_max_running,
                   fleet_capacity=defaults.fleet_capacity, tier_limits=defaults.tier_limits())  # fmt: skip
    observe.flush()
    logger.info("swept", extra={"listed": report.listed, "swept": report.swept, "unlisted": report.unlisted,
                                "woken": report.woken, "released": report.released,
                                "given_back": report.given_back})  # fmt: skip
    return {
        "listed": report.listed,
        "swept": len(report.swept),
        "unlisted": report.unlisted,
        "woken": len(report.woken),
        "released": len(report.released),
        "given_back": len(report.given_back),
    }
