"""The REST API: a TOKEN authorizer in front of every method but /health, /openapi.json and
the web console's page and assets (GET /console, /console/{proxy+}), the API Lambda behind them.

Routes are the API Lambda's (``agentq.api.app``); the gateway proxies ``/{proxy+}``,
``/tasks/{task_id}`` and ``/tasks/{task_id}/{proxy+}`` to it, so a new route needs no
infrastructure change; ``GET /tasks/{task_id}/events`` streams from the events function. ``POST /tasks`` is
declared on its own for its own throttle.

Requests are validated by the API (powertools' resolver with the pydantic models its OpenAPI
document is generated from), not by a gateway model: a gateway check could only answer
"Invalid request body" with another status for the same mistake, where the API answers 422
naming the exact field (``constraints.tools[1]``). One validator, one contract.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import aws_cdk as cdk
from aws_cdk import aws_apigateway as apigw
from aws_cdk import aws_logs as logs
from aws_cdk import aws_wafv2 as wafv2
from constructs import Construct

from agentq.api.app import PUBLIC_PATHS
from agentq.api.console import CONSOLE_PATH
from infra.events import STREAM_TIMEOUT_SECONDS
from infra.functions import Functions
from infra.retention import log_group
from infra.settings import EnvironmentSettings

ACCESS_LOG_FORMAT = {
    "requestId": "$context.requestId",
    "extendedRequestId": "$context.extendedRequestId",
    "ip": "$context.identity.sourceIp",
    "requestTime": "$context.requestTime",
    "httpMethod": "$context.httpMethod",
    "resourcePath": "$context.resourcePath",
    "path": "$context.path",
    "status": "$context.status",
    "protocol": "$context.protocol",
    "responseLength": "$context.responseLength",
    "tenant": "$context.authorizer.tenant",
    "authorizerError": "$context.authorizer.error",
    "integrationLatency": "$context.integrationLatency",
    "responseLatency": "$context.responseLatency",
    "errorMessage": "$context.error.message",
    "xrayTraceId": "$context.xrayTraceId",
}

# Gateway-generated errors in the API's own shape: {"error": {"code", "message"}}. The authorizer
# denies (ACCESS_DENIED) only a refused JWT, with the reason in its context (``api.auth``): a 401
# whose message is that reason. API Gateway substitutes it unescaped, here and in the access log
# line, so it is our own words, never the token's, and ``api.auth.quotable`` (no quote,
# backslash or control character) is the last thing done to it.
GATEWAY_ERRORS: dict[str, tuple[apigw.ResponseType, str, str]] = {
    "Unauthorized": (apigw.ResponseType.UNAUTHORIZED, "401", "unauthorized"),
    "AccessDenied": (apigw.ResponseType.ACCESS_DENIED, "401", "unauthorized"),
    "Throttled": (apigw.ResponseType.THROTTLED, "429", "throttled"),
}
GATEWAY_MESSAGES = {"AccessDenied": '"$context.authorizer.error"'}


@dataclass
class Api:
    rest_api: apigw.RestApi
    access_logs: logs.LogGroup
    web_acl: wafv2.CfnWebACL | None


def build_api(scope: Construct, cfg: EnvironmentSettings, fns: Functions) -> Api:
    rest_api, access_logs = _rest_api(scope, cfg, fns)
    _routes(rest_api, fns)
    for cid, (response_type, status, code) in GATEWAY_ERRORS.items():
        # Gateway response templates only substitute variables; messageString is documented
        # as already quoted, so it is the one safe to embed in JSON.
        error = {"code": code, "message": "MESSAGE"}
        message = GATEWAY_MESSAGES.get(cid, "$context.error.messageString")
        body = json.dumps({"error": error}).replace('"MESSAGE"', message)
        rest_api.add_gateway_response(cid, type=response_type, status_code=status, templates={"application/json": body})
    web_acl = _web_acl(scope, cfg, rest_api) if cfg.api.waf else None
    return Api(rest_api=rest_api, access_logs=access_logs, web_acl=web_acl)


def _rest_api(scope: Construct, cfg: EnvironmentSettings, fns: Functions) -> tuple[apigw.RestApi, logs.LogGroup]:
    """The API, its stage (access logs, throttles, tracing) and the TOKEN authorizer on every method."""
    a = cfg.api
    access_logs = log_group(scope, "ApiAccessLogs", cfg)
    authorizer = apigw.TokenAuthorizer(
        scope,
        "ApiKeyAuthorizer",
        handler=fns.authorizer,
        identity_source=apigw.IdentitySource.header("Authorization"),
        validation_regex=r"^Bearer \S+$",
        results_cache_ttl=cdk.Duration.seconds(a.authorizer_cache_seconds),
    )
    rest_api = apigw.RestApi(
        scope,
        "Api",
        rest_api_name=f"{cfg.prefix}-api",
        description="agentq task API",
        endpoint_types=[apigw.EndpointType.REGIONAL],
        # The account-wide API Gateway -> CloudWatch Logs role execution logging needs; kept
        # when the stack goes because other APIs in the account/region may rely on it.
        cloud_watch_role=True,
        cloud_watch_role_removal_policy=cdk.RemovalPolicy.RETAIN,
        # A workspace file that is not text (GET /tasks/{id}/files/{path}) leaves the Lambda
        # base64-encoded; a caller that sends Accept: application/octet-stream gets its bytes.
        binary_media_types=["application/octet-stream"],
        deploy_options=apigw.StageOptions(
            stage_name=a.stage_name,
            access_log_destination=apigw.LogGroupLogDestination(access_logs),
            access_log_format=apigw.AccessLogFormat.custom(json.dumps(ACCESS_LOG_FORMAT)),
            logging_level=apigw.MethodLoggingLevel.ERROR,
            data_trace_enabled=False,  # bodies hold goals and results: keep them out of logs
            metrics_enabled=True,
            tracing_enabled=True,
            throttling_rate_limit=a.throttle_rate_limit,
            throttling_burst_limit=a.throttle_burst_limit,
            method_options={
                "/tasks/POST": apigw.MethodDeploymentOptions(
                    throttling_rate_limit=a.submit_rate_limit, throttling_burst_limit=a.submit_burst_limit
                )
            },
        ),
        default_method_options=apigw.MethodOptions(
            authorizer=authorizer, authorization_type=apigw.AuthorizationType.CUSTOM
        ),
    )
    # Execution logs (ERROR: a failed invoke, a configuration error, what the access log line
    # cannot say) go to a group API Gateway names and, when no stack owns it, makes itself with
    # no retention. Owned here, kept as every other; the stage waits for it, so API Gateway never
    # makes it first. (The stage's name, not its token: the group would then wait on the stage.)
    execution_logs = log_group(
        scope, "ApiExecutionLogs", cfg, name=f"API-Gateway-Execution-Logs_{rest_api.rest_api_id}/{a.stage_name}"
    )
    rest_api.deployment_stage.node.add_dependency(execution_logs)
    return rest_api, access_logs


def _routes(rest_api: apigw.RestApi, fns: Functions) -> None:
    """Everything to the API Lambda (``POST /tasks`` declared for its throttle) but the event stream;
    the public paths and the console without the authorizer."""
    integration = apigw.LambdaIntegration(fns.api, proxy=True, allow_test_invoke=False)
    tasks = rest_api.root.add_resource("tasks")
    tasks.add_method("POST", integration)
    tasks.add_method("GET", integration)
    # /tasks/{task_id}/events streams from its own function (infra/events.py); every other path of
    # a task is the API Lambda's. (API Gateway allows one variable per level: {task_id}, not {proxy+}.)
    task = tasks.add_resource("{task_id}")
    task.add_method("ANY", integration)
    task.add_proxy(default_integration=integration, any_method=True)
    events = task.add_resource("events")
    events.add_method(
        "GET",
        apigw.LambdaIntegration(
            fns.events,
            proxy=True,
            allow_test_invoke=False,
            response_transfer_mode=apigw.ResponseTransferMode.STREAM,
            timeout=cdk.Duration.seconds(STREAM_TIMEOUT_SECONDS),
        ),
    )
    events.add_method("ANY", integration)  # other methods: the API's 405
    # POST /a2a/{agent} streams from the A2A function (infra/a2a.py): SendStreamingMessage and
    # SubscribeToTask send each event as it happens; the card and other methods are the API's.
    agent = rest_api.root.add_resource("a2a").add_resource("{agent}")
    agent.add_method(
        "POST",
        apigw.LambdaIntegration(
            fns.a2a,
            proxy=True,
            allow_test_invoke=False,
            response_transfer_mode=apigw.ResponseTransferMode.STREAM,
            timeout=cdk.Duration.seconds(STREAM_TIMEOUT_SECONDS),
        ),
    )
    agent.add_method("ANY", integration)
    agent.add_proxy(default_integration=integration, any_method=True)
    rest_api.root.add_proxy(default_integration=integration, any_method=True)
    # Liveness and the API's own description need no key (load balancers, client generators).
    for path in sorted(PUBLIC_PATHS):  # a set's order follows the hash seed; the deployment's id must not
        resource = rest_api.root.add_resource(path.strip("/"))
        # NONE without an authorizer drops the API's default one (CDK's Method does exactly this).
        resource.add_method("GET", integration, authorization_type=apigw.AuthorizationType.NONE)
    # The web console's page and assets (agentq.api.console) hold no data: every call the page
    # makes goes to the methods above with the person's key, through the authorizer.
    console = rest_api.root.add_resource(CONSOLE_PATH.strip("/"))
    console.add_method("GET", integration, authorization_type=apigw.AuthorizationType.NONE)
    console.add_proxy(any_method=False).add_method("GET", integration, authorization_type=apigw.AuthorizationType.NONE)


def _managed_rule(name: str, priority: int, overrides: list[str] | None = None) -> Any:
    return wafv2.CfnWebACL.RuleProperty(
        name=name,
        priority=priority,
        override_action=wafv2.CfnWebACL.OverrideActionProperty(none={}),
        statement=wafv2.CfnWebACL.StatementProperty(
            managed_rule_group_statement=wafv2.CfnWebACL.ManagedRuleGroupStatementProperty(
                vendor_name="AWS",
                name=name,
                rule_action_overrides=[
                    wafv2.CfnWebACL.RuleActionOverrideProperty(
                        name=rule, action_to_use=wafv2.CfnWebACL.RuleActionProperty(count={})
                    )
                    for rule in overrides or []
                ]
                or None,
            )
        ),
        visibility_config=wafv2.CfnWebACL.VisibilityConfigProperty(
            cloud_watch_metrics_enabled=True, metric_name=name, sampled_requests_enabled=True
        ),
    )


def _web_acl(scope: Construct, cfg: EnvironmentSettings, rest_api: apigw.RestApi) -> wafv2.CfnWebACL:
    acl = wafv2.CfnWebACL(
        scope,
        "ApiWebAcl",
        name=f"{cfg.prefix}-api",
        scope="REGIONAL",
        default_action=wafv2.CfnWebACL.DefaultActionProperty(allow={}),
        visibility_config=wafv2.CfnWebACL.VisibilityConfigProperty(
            cloud_watch_metrics_enabled=True, metric_name=f"{cfg.prefix}-api", sampled_requests_enabled=True
        ),
        rules=[
            wafv2.CfnWebACL.RuleProperty(
                name="per-ip-rate",
                priority=0,
                action=wafv2.CfnWebACL.RuleActionProperty(block={}),
                statement=wafv2.CfnWebACL.StatementProperty(
                    rate_based_statement=wafv2.CfnWebACL.RateBasedStatementProperty(
                        limit=cfg.api.waf_rate_limit_per_5_minutes, aggregate_key_type="IP"
                    )
                ),
                visibility_config=wafv2.CfnWebACL.VisibilityConfigProperty(
                    cloud_watch_metrics_enabled=True, metric_name="per-ip-rate", sampled_requests_enabled=True
                ),
            ),
            # Task submissions may carry inline scripts well over the common rule set's 8 KB
            # body limit; the API enforces its own 256 KB limit, so that one rule only counts.
            _managed_rule("AWSManagedRulesCommonRuleSet", 1, overrides=["SizeRestrictions_BODY"]),
            _managed_rule("AWSManagedRulesKnownBadInputsRuleSet", 2),
        ],
    )
    wafv2.CfnWebACLAssociation(
        scope, "ApiWebAclAssociation", resource_arn=rest_api.deployment_stage.stage_arn, web_acl_arn=acl.attr_arn
    )
    return acl
