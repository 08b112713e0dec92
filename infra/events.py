"""How the task event stream (``GET /tasks/{id}/events``) is served in AWS.

The Python managed Lambda runtime cannot stream a response, so the stream is the one function
that runs behind the Lambda Web Adapter (its layer, pinned here): API Gateway invokes it with
response streaming (``responseTransferMode: STREAM``) and the adapter hands each invocation to
the API's HTTP server (``agentq.api.http_server``, which ``agentq dev`` runs too;
``functions/events/server.py``). Same REST API, same authorizer, same path; the function may
only read the table and the payloads. The reasons against a WebSocket API or the Fargate
service are in docs/ARCHITECTURE.md (invariant 10).
"""

from __future__ import annotations

from typing import cast

import aws_cdk as cdk
from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda as lambda_
from constructs import Construct

from agentq.api.event_hub import AUTHORIZE_ENV
from agentq.storage.keys import api_key_id_key, task_pk
from infra.access import payload_objects, table_resources, workspace_objects
from infra.data import Data
from infra.functions import FunctionFactory
from infra.layers import architecture

ADAPTER_ACCOUNT = "753240598075"  # the Lambda Web Adapter's public layers (awslabs/aws-lambda-web-adapter)
ADAPTER_VERSION = 26
SERVER_MODULE = "events.server"  # what functions/events/run.sh runs (its main())
STREAM_TIMEOUT_SECONDS = 900  # a stream's longest life: the function's, and the streaming integration's
ADAPTER_ENV = {
    "AWS_LAMBDA_EXEC_WRAPPER": "/opt/bootstrap",  # the adapter starts events/run.sh, the server
    "AWS_LWA_INVOKE_MODE": "response_stream",
    "AWS_LWA_PORT": "8080",
    "AWS_LWA_READINESS_CHECK_PATH": "/health",
}


def adapter_layer(scope: Construct, architecture: lambda_.Architecture) -> lambda_.ILayerVersion:
    name = (
        "LambdaAdapterLayerArm64" if architecture.name == lambda_.Architecture.ARM_64.name else "LambdaAdapterLayerX86"
    )
    arn = f"arn:{cdk.Aws.PARTITION}:lambda:{cdk.Aws.REGION}:{ADAPTER_ACCOUNT}:layer:{name}:{ADAPTER_VERSION}"
    made = scope.node.try_find_child("WebAdapterLayer")  # one reference, for every function behind the adapter
    if made is not None:
        return cast("lambda_.ILayerVersion", made)
    return lambda_.LayerVersion.from_layer_version_arn(scope, "WebAdapterLayer", arn)


def build_events_function(
    scope: Construct, function: FunctionFactory, data: Data, common: dict[str, str]
) -> lambda_.Function:
    streams = function(
        "events",
        memory=512,
        timeout=STREAM_TIMEOUT_SECONDS,
        # A stream reads its caller's key again this often (agentq.api.event_hub.authorize_seconds).
        env={**common, **ADAPTER_ENV, AUTHORIZE_ENV: str(function.cfg.api.authorizer_cache_seconds)},
        reserved=function.cfg.live.sse_reserved_concurrency,  # watchers never draw on the executors' pool
        description="agentq task event streams (GET /tasks/{id}/events) behind the Lambda Web Adapter",
        extra_layers=[adapter_layer(scope, architecture(function.cfg))],
    )
    # It reads a task's META, its log (steps, events, claims, spawns) and offloaded step bodies,
    # and, to end an open stream once its key is revoked, that key's id item (APIKEYID#, no key
    # in it); nothing else. An internet-facing server has no business with the rest of the table
    # (webhook signing secrets, the APIKEY# items the authorizer reads, idempotency records, the
    # vault).
    streams.add_to_role_policy(
        iam.PolicyStatement(sid="Table", actions=["dynamodb:GetItem", "dynamodb:Query"],
                            resources=table_resources(data, indexes=False),
                            conditions={"ForAllValues:StringLike": {"dynamodb:LeadingKeys": [task_pk("*")]}})
    )  # fmt: skip
    streams.add_to_role_policy(
        iam.PolicyStatement(sid="KeyIds", actions=["dynamodb:GetItem"], resources=table_resources(data, indexes=False),
                            conditions={"ForAllValues:StringLike":
                                        {"dynamodb:LeadingKeys": [api_key_id_key("*")["pk"]]}})
    )  # fmt: skip
    streams.add_to_role_policy(
        iam.PolicyStatement(sid="Payloads", actions=["s3:GetObject"], resources=[payload_objects(data)])
    )
    # The payloads it reads are under the same prefix as every task's workspace content, which
    # an event stream never shows: denied outright, so no bug in it can serve a task's files.
    streams.add_to_role_policy(
        iam.PolicyStatement(
            sid="NoWorkspaceContent",
            effect=iam.Effect.DENY,
            actions=["s3:GetObject"],
            resources=[workspace_objects(data)],
        )
    )
    return streams
