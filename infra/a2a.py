"""How the A2A endpoint's calls (``POST /a2a/{agent}``) are served in AWS: by a function behind
the Lambda Web Adapter with API Gateway's response streaming, as the task event stream is
(``infra/events.py``), so ``SendStreamingMessage`` and ``SubscribeToTask`` send each event as it
happens (``agentq.api.live_stream``) instead of the whole stream when it ends, which is all the
request/response API Lambda can do.

The function runs the same server as the events function (``functions/events/server.py``: the
whole API's handler with an events hub, the tenant from the authorizer's context) but acts as
the API does over A2A: it submits, sends messages, decides approvals and cancels, so it shares
the API function's role (the same grants, by construction; its own log group added to it) and
environment. The Agent Card (``GET /a2a/{agent}/.well-known/agent-card.json``) stays with the
API Lambda (``infra/api.py``).
"""

from __future__ import annotations

from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda as lambda_
from constructs import Construct

from infra.api_functions import api_env
from infra.data import Data
from infra.events import ADAPTER_ENV, STREAM_TIMEOUT_SECONDS, adapter_layer
from infra.functions import FunctionFactory
from infra.layers import architecture


def build_a2a_function(
    scope: Construct, function: FunctionFactory, data: Data, common: dict[str, str], api: lambda_.Function
) -> lambda_.Function:
    role = api.role
    assert isinstance(role, iam.Role)  # the factory made it (infra/functions.py)
    return function(
        "a2a",
        memory=function.cfg.api.memory_mb,
        timeout=STREAM_TIMEOUT_SECONDS,
        env={**api_env(function.cfg, data, common), **ADAPTER_ENV},
        reserved=None,  # from the account's unreserved pool, as API Gateway's own calls of the API are
        description="agentq A2A endpoint (POST /a2a/{agent}) behind the Lambda Web Adapter: streams as they happen",
        extra_layers=[*function.layers.tools, adapter_layer(scope, architecture(function.cfg))],
        role=role,
    )
