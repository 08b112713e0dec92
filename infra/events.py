"""How the task event stream (``GET /tasks/{id}/events``) is served in AWS.

The Python managed Lambda runtime cannot stream a response, so the stream is the one function
that runs behind the Lambda Web Adapter (its layer, pinned here): API Gateway invokes it with
response streaming (``responseTransferMode: STREAM``) and the adapter hands each invocation to
the HTTP server ``agentq dev`` runs (``functions/events/server.py``). Same REST API, same
authorizer, same path; the reasons against a WebSocket API or the Fargate service are in
docs/ARCHITECTURE.md (invariant 10).
"""

from __future__ import annotations

import aws_cdk as cdk
from aws_cdk import aws_lambda as lambda_
from constructs import Construct

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
    return lambda_.LayerVersion.from_layer_version_arn(scope, "WebAdapterLayer", arn)
