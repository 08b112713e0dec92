"""Per-environment settings: ``cdk.json`` context, validated.

``cdk.json`` holds ``environment_defaults`` and, under ``environments``, what each environment
overrides (deep-merged onto the defaults). Everything here is validated with pydantic, so a
typo or an inconsistent number (a lease longer than the heartbeat visibility, tier
concurrencies adding up past the reserved concurrency) fails the synth with the field named,
instead of deploying something that misbehaves.

No account or region lives here unless an environment pins one (``account``/``region``);
otherwise the stack takes the CLI's (CDK_DEFAULT_ACCOUNT / CDK_DEFAULT_REGION) or stays
environment-agnostic.
"""

from __future__ import annotations

import copy
import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from agentq.control.defaults import fair_limit
from agentq.core.flow import FlowSettings
from agentq.core.model_ids import model_family
from agentq.resources import TIERS, QueueSettings, ResourceNames
from infra.budget_settings import BudgetDefaults
from infra.live_settings import LiveSettings
from infra.workspace_settings import ScalingStep, WorkspaceSettings

# CloudWatch Logs accepts only these retention periods (days).
LOG_RETENTION_DAYS = (
    1,
    3,
    5,
    7,
    14,
    30,
    60,
    90,
    120,
    150,
    180,
    365,
    400,
    545,
    731,
    1096,
    1827,
    2192,
    2557,
    2922,
    3288,
    3653,
)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ExecutorSettings(_Strict):
    """The Lambda executor and the time slice its queue visibility must cover."""

    memory_mb: int = Field(1024, ge=128, le=10240)
    timeout_seconds: int = Field(900, ge=60, le=900, description="Lambda timeout: one time slice")
    slice_margin_seconds: int = Field(60, ge=5, description="commit and hand over this long before the deadline")
    visibility_seconds: int = Field(60, ge=5, le=43200, description="what each heartbeat extends visibility to")
    lease_seconds: int = Field(45, ge=2, description="task lease; lapses before the message is visible again")
    queue_visibility_margin_seconds: int = Field(60, ge=0, description="queue visibility = timeout + this")
    reserved_concurrency: int | None = Field(None, ge=1, description="None: draw from the account's pool")
    tier_max_concurrency: dict[str, int] = Field(
        default_factory=lambda: {"high": 2, "normal": 2, "low": 2},
        description="SQS event source maximum concurrency per tier (>= 2 each, AWS minimum)",
    )

    @model_validator(mode="after")
    def _consistent(self) -> ExecutorSettings:
        if self.slice_margin_seconds >= self.timeout_seconds:
            raise ValueError("executor.slice_margin_seconds must be below executor.timeout_seconds")
        if self.lease_seconds >= self.visibility_seconds:
            raise ValueError(
                "executor.lease_seconds must be below executor.visibility_seconds (the lease lapses first)"
            )
        if set(self.tier_max_concurrency) != set(TIERS):
            raise ValueError(f"executor.tier_max_concurrency must name exactly the tiers {', '.join(TIERS)}")
        if any(not 2 <= n <= 1000 for n in self.tier_max_concurrency.values()):
            raise ValueError("executor.tier_max_concurrency values must be 2..1000 (SQS event source limits)")
        if (
            self.reserved_concurrency is not None
            and sum(self.tier_max_concurrency.values()) > self.reserved_concurrency
        ):
            raise ValueError(
                "executor.tier_max_concurrency adds up past executor.reserved_concurrency: "
                "the event sources would be throttled and messages would count receives towards the DLQ"
            )
        return self

    @property
    def queue_visibility_seconds(self) -> int:
        return self.timeout_seconds + self.queue_visibility_margin_seconds


class ApiSettings(_Strict):
    memory_mb: int = Field(512, ge=128, le=10240)
    timeout_seconds: int = Field(29, ge=3, le=29, description="API Gateway integrations time out at 29 s")
    reserved_concurrency: int | None = Field(None, ge=1)
    stage_name: str = Field("v1", pattern=r"^[A-Za-z0-9_]{1,64}$")
    throttle_rate_limit: float = Field(50, gt=0, description="stage-wide steady requests per second")
    throttle_burst_limit: int = Field(100, ge=1)
    submit_rate_limit: float = Field(20, gt=0, description="POST /tasks requests per second")
    submit_burst_limit: int = Field(40, ge=1)
    authorizer_cache_seconds: int = Field(
        60,
        ge=0,
        le=300,
        description="a revoked key keeps working for up to this long (API Gateway caches the decision)",
    )
    waf: bool = Field(False, description="attach a WAFv2 web ACL (managed rules + per-IP rate limit)")
    waf_rate_limit_per_5_minutes: int = Field(2000, ge=10)


class AlarmSettings(_Strict):
    pickup_objective_seconds: dict[str, int] = Field(
        default_factory=lambda: {"high": 30, "normal": 120, "low": 900},
        description="a queued task should be picked up within this long, per tier",
    )
    executor_error_rate_percent: float = Field(5.0, gt=0, le=100)
    dlq_messages: int = Field(1, ge=1, description="alarm when a DLQ holds at least this many messages")
    evaluation_minutes: int = Field(5, ge=1, le=60)
    emails: list[Annotated[str, Field(pattern=r"^[^@\s]+@[^@\s]+\.[^@\s]+$", max_length=254)]] = Field(
        default_factory=list, description="subscribed to the alarm topic (an SNS email subscription each)"
    )

    @model_validator(mode="after")
    def _tiers(self) -> AlarmSettings:
        if set(self.pickup_objective_seconds) != set(TIERS):
            raise ValueError(f"alarms.pickup_objective_seconds must name exactly the tiers {', '.join(TIERS)}")
        return self


class ReaperSettings(_Strict):
    """The reaper: purges a task once DynamoDB TTL has deleted its META (agentq.control.retention)."""

    memory_mb: int = Field(256, ge=128, le=10240)
    timeout_seconds: int = Field(300, ge=30, le=900, description="one batch of purges")
    batch_size: int = Field(10, ge=1, le=100, description="stream records (expired tasks) per invocation")
    retry_attempts: int = Field(5, ge=0, le=10_000, description="then the batch goes to the reaper DLQ")


class SweeperSettings(_Strict):
    """The sweeper (agentq.queueing.sweeper): re-enqueues unfinished tasks left with no worker
    and no message. ``stale_after_seconds`` must exceed the longest silence of a healthy task:
    SQS's longest delay (900 s) plus the queues' visibility timeout."""

    every_minutes: int = Field(5, ge=1, le=1440, description="how often it runs (an EventBridge schedule)")
    stale_after_seconds: int = Field(960, ge=60, le=86_400, description="silence after which a task is swept")
    memory_mb: int = Field(256, ge=128, le=10240)
    timeout_seconds: int = Field(120, ge=10, le=900)


class SandboxSettings(_Strict):
    """The sandbox function that runs python_exec's code (infra/sandbox.py)."""

    memory_mb: int = Field(1024, ge=256, le=10240)
    timeout_seconds: int = Field(90, ge=75, le=900, description="the longest call (60 s) plus cleanup and margin")
    ephemeral_storage_mb: int = Field(512, ge=512, le=10240, description="Lambda's /tmp")
    reserved_concurrency: int | None = Field(None, ge=1, description="None: draw from the account's pool")
    vpc_cidr: str = "10.41.0.0/16"
    max_files: int = Field(2048, ge=16, description="files and directories one call may create")
    max_disk_mb: int = Field(64, ge=1, description="bytes one call may write to /tmp")

    @model_validator(mode="after")
    def _consistent(self) -> SandboxSettings:
        if self.max_disk_mb >= self.ephemeral_storage_mb:
            raise ValueError("sandbox.max_disk_mb must be below sandbox.ephemeral_storage_mb")
        return self


class WorkerSettings(_Strict):
    """The optional long-running worker on ECS Fargate (``agentq worker``)."""

    enabled: bool = False
    image: str | None = Field(
        None,
        description="container image URI holding agentq (ECR or another registry); null: CDK builds the repo's "
        "Dockerfile (agentq, plus user_code) at deploy time",
    )
    cpu: int = Field(1024, description="Fargate CPU units")
    memory_mb: int = Field(2048, ge=512)
    concurrency: int = Field(256, ge=1, description="tasks in flight per container")
    # Liveness per worker process (ARCHITECTURE, "Choosing the deployed liveness"): a heartbeat
    # is one write and one small Query per container whatever it holds: ~$0.005 an hour, and a
    # dead container's tasks resume within lease + heartbeat + a receive (p99 <= 5 s measured);
    # 10 / 30 / 40 saved ~$0.004 an hour per container and made that resume ~40 s.
    heartbeat_seconds: float = Field(1, gt=0)
    lease_seconds: float = Field(3, gt=0)
    visibility_seconds: int = Field(4, ge=1, le=43200)
    min_tasks: int = Field(0, ge=0)
    max_tasks: int = Field(4, ge=1)
    scale_out: list[ScalingStep] = Field(
        default_factory=lambda: [
            ScalingStep(backlog=1, change=1),
            ScalingStep(backlog=200, change=2),
            ScalingStep(backlog=1000, change=4),
        ]
    )
    vpc_cidr: str = "10.40.0.0/16"
    nat_gateways: int = Field(1, ge=1, le=2, description="the private subnets' way out (one per AZ at most)")

    @model_validator(mode="after")
    def _consistent(self) -> WorkerSettings:
        if not self.heartbeat_seconds < self.lease_seconds < self.visibility_seconds:
            raise ValueError("worker: heartbeat_seconds < lease_seconds < visibility_seconds is required")
        if self.min_tasks > self.max_tasks:
            raise ValueError("worker.min_tasks must not exceed worker.max_tasks")
        if self.cpu not in (256, 512, 1024, 2048, 4096, 8192, 16384):
            raise ValueError("worker.cpu must be a Fargate CPU size (256 .. 16384)")
        backlogs = [s.backlog for s in self.scale_out]
        if not backlogs or backlogs != sorted(set(backlogs)):
            raise ValueError("worker.scale_out backlogs must be distinct and ascending")
        return self


class IamStatement(_Strict):
    """An extra permission your tools need (the executor's and the worker's roles get it)."""

    sid: str | None = Field(None, pattern=r"^[A-Za-z0-9]{1,100}$")
    actions: list[str] = Field(min_length=1, description="e.g. dynamodb:GetItem")
    resources: list[str] = Field(min_length=1, description="ARNs; '*' is refused: name what the tool touches")

    @model_validator(mode="after")
    def _named(self) -> IamStatement:
        for action in self.actions:
            if not re.match(r"^[a-z0-9-]+:[A-Za-z0-9*]+$", action):
                raise ValueError(f"user_code.iam_statements: action {action!r} is not service:Action")
        if any(r.strip() == "*" for r in self.resources):
            raise ValueError("user_code.iam_statements: resources must name ARNs, not '*'")
        return self


class UserCodeSettings(_Strict):
    """Your tools in the stack: the package is bundled into a layer of its own (and the worker
    image), the modules are loaded by the executor, the API and the worker, the statements
    granted to the roles that run tools, and the secrets readable through ``ctx.secret``."""

    package_dir: str = Field(description="a folder, relative to cdk.json, whose contents go on the Python path")
    requirements: str | None = Field(None, description="a requirements.txt, relative to cdk.json, for the layer")
    tool_modules: list[str] = Field(min_length=1, description="modules of @tool functions (AGENTQ_TOOL_MODULES)")
    iam_statements: list[IamStatement] = Field(default_factory=list)
    secrets: list[str] = Field(
        default_factory=list, description="Secrets Manager names the tools and MCP headers read (ctx.secret)"
    )
    mcp_servers: dict[str, dict[str, Any]] = Field(
        default_factory=dict, description="AGENTQ_MCP_SERVERS: name -> {url, headers} (streamable HTTP)"
    )

    @model_validator(mode="after")
    def _consistent(self) -> UserCodeSettings:
        for name in self.tool_modules:
            if not re.match(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$", name):
                raise ValueError(f"user_code.tool_modules: {name!r} is not a module name")
        for name in self.secrets:
            if not re.match(r"^[A-Za-z0-9][A-Za-z0-9._/-]{0,127}$", name):
                raise ValueError(f"user_code.secrets: {name!r} is not a secret name")
        from agentq.core.tools.mcp import McpServerConfig

        for name, server in self.mcp_servers.items():
            config = McpServerConfig.model_validate(server)
            if config.command is not None:
                raise ValueError(f"user_code.mcp_servers.{name}: the Lambda functions run no stdio servers; give url")
        return self


BEDROCK_MODEL = re.compile(
    r"^(arn:[a-z-]+:bedrock:[a-z0-9-]*:\d{0,12}:[a-z-]+/[A-Za-z0-9._:/*-]+|[A-Za-z0-9*][A-Za-z0-9._:*-]{0,200})$"
)
ADOT_COLLECTOR_IMAGE = "public.ecr.aws/aws-observability/aws-otel-collector:v0.43.3"
# ADOT's collector-only Lambda layer (account 901920570463 publishes it in every region); the
# architecture goes into its name.
ADOT_COLLECTOR_LAYER = "aws-otel-collector-{arch}-ver-0-117-0:1"


class OidcIssuerSettings(_Strict):
    """An OIDC issuer whose JWTs the API accepts besides API keys (``agentq.api.oidc``): the
    authorizer checks signature (the issuer's JWKS), expiry, audience and issuer, and takes the
    tenant and the end user from the two claims named here."""

    issuer: str = Field(pattern=r"^https://[^\s]+$", description="exactly the tokens' iss (https)")
    audience: str = Field(min_length=1, max_length=512, description="what a token's aud must be or hold")
    tenant_claim: str = Field("tenant", pattern=r"^[A-Za-z0-9_:/.-]{1,128}$", description="the claim naming the tenant")
    user_claim: str = Field("sub", pattern=r"^[A-Za-z0-9_:/.-]{1,128}$", description="the claim naming the end user")
    jwks_url: str | None = Field(
        None, pattern=r"^https://[^\s]+$", description="the issuer's JWKS; null: <issuer>/.well-known/jwks.json"
    )


class TracingSettings(_Strict):
    """Where traces go. ``xray`` (the default): X-Ray segments from Lambda's active tracing.
    ``adot``: besides, agentq's OpenTelemetry spans (``agentq.observe.otel``) go by OTLP/HTTP to
    an ADOT collector next to the code that runs tasks (a Lambda layer on the executor; a sidecar
    container in the Fargate worker's task), which forwards them where its configuration says:
    X-Ray with ADOT's own configuration, or any OTLP backend with yours."""

    exporter: Literal["xray", "adot"] = "xray"
    collector_config: str | None = Field(
        None,
        pattern=r"^(s3|https?|file|env)://?[^\s]+$|^/[^\s]+$",
        description="the collector's configuration (s3://, https://, or a path in the image/layer); "
        "null: ADOT's default, which sends traces to X-Ray",
    )
    collector_layer_arn: str | None = Field(
        None, pattern=r"^arn:[a-z-]+:lambda:", description="null: ADOT's collector layer for the architecture"
    )
    collector_image: str = Field(ADOT_COLLECTOR_IMAGE, description="the Fargate worker's collector sidecar")


class EnvironmentSettings(_Strict):
    """One environment of cdk.json (``flow`` is ``agentq.core.flow.FlowSettings``: breaker,
    limits), validated before anything is synthesized."""

    prefix: str = Field(
        pattern=r"^[a-z][a-z0-9-]{1,40}$", description="resource names: {prefix}-{tier}, {prefix}-tasks ..."
    )
    account: str | None = Field(None, pattern=r"^\d{12}$", description="pin an account (default: the CLI's)")
    region: str | None = Field(None, description="pin a region (default: the CLI's)")
    removal_policy: Literal["destroy", "retain"]
    architecture: Literal["arm64", "x86_64"] = "arm64"
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    log_retention_days: int = 30
    task_retention_days: int = Field(30, ge=1, description="terminal tasks expire (TTL expires_at) after this")
    max_receive_count: int = Field(5, ge=1, le=1000)
    queue_retention_seconds: int = Field(QueueSettings().retention_seconds, ge=60, le=1_209_600)
    dlq_retention_seconds: int = Field(QueueSettings().dlq_retention_seconds, ge=60, le=1_209_600)
    event_bus: str | None = Field(
        "stack",
        pattern=r"^(?:[/.\-_A-Za-z0-9]{1,256}|arn:aws[a-z-]*:events:[a-z0-9-]+:\d{12}:event-bus/[/.\-_A-Za-z0-9]{1,256})$",
        description="EventBridge bus for agentq events (every status change, circuits, soft caps): 'stack' creates "
        "{prefix}-events; another name sends to that existing bus of this account and region, an event bus ARN "
        "to that bus (another account's: its policy must let this one put events); null: none",
    )
    anthropic_api_key_secret: str | None = Field(
        None,
        pattern=r"^[A-Za-z0-9/_+=.@-]{1,512}$",
        description="name of a Secrets Manager secret holding the Anthropic API key (provider=anthropic); "
        "null: only Bedrock (and scripted) tasks can run",
    )
    openai_api_key_secret: str | None = Field(
        None,
        pattern=r"^[A-Za-z0-9/_+=.@-]{1,512}$",
        description="name of a Secrets Manager secret holding the key of the OpenAI-compatible server "
        "(provider=openai); null: OPENAI_API_KEY is not set and only a server that wants no key can be used",
    )
    openai_base_url: str | None = Field(
        None,
        pattern=r"^https?://[^\s]+$",
        description="OPENAI_BASE_URL for provider=openai (a vLLM, Ollama or LiteLLM server); null: api.openai.com",
    )
    bedrock_models: list[str] = Field(
        default_factory=lambda: ["anthropic.*", "*.anthropic.*"],
        description="the Bedrock models (ids, inference profile ids, or ARNs) the task runners may invoke, "
        "through AnthropicBedrock or Converse; a trailing '*' names a family",
    )
    tracing: TracingSettings = Field(default_factory=TracingSettings)
    executor: ExecutorSettings = Field(default_factory=ExecutorSettings)
    api: ApiSettings = Field(default_factory=ApiSettings)
    alarms: AlarmSettings = Field(default_factory=AlarmSettings)
    budget_defaults: BudgetDefaults = Field(default_factory=BudgetDefaults)
    reaper: ReaperSettings = Field(default_factory=ReaperSettings)
    sweeper: SweeperSettings = Field(default_factory=SweeperSettings)
    flow: FlowSettings = Field(
        default_factory=FlowSettings,
        description="fleet-wide flow control: the circuit breaker's thresholds and rate limits per provider/model",
    )
    worker: WorkerSettings = Field(default_factory=WorkerSettings)
    live: LiveSettings = Field(default_factory=LiveSettings)
    sandbox: SandboxSettings = Field(default_factory=SandboxSettings)
    workspace: WorkspaceSettings = Field(default_factory=WorkspaceSettings)
    user_code: UserCodeSettings | None = Field(None, description="your tools: package, modules, IAM, secrets")
    oidc: OidcIssuerSettings | None = Field(
        None, description="an OIDC issuer whose JWTs authenticate end users; null: API keys only"
    )

    @model_validator(mode="before")
    @classmethod
    def _removed(cls, data: Any) -> Any:
        """A setting an older cdk.json may still hold, refused with what replaced it."""
        if isinstance(data, dict) and "payload_expiration_days" in data:
            raise ValueError(
                "payload_expiration_days was removed: a task's S3 payloads are deleted with the task (the "
                "reaper, when its record expires), never by their age, which lost the payloads of live tasks "
                "(a conversation reopened, a task paused) past it; delete the key"
            )
        return data

    @model_validator(mode="after")
    def _consistent(self) -> EnvironmentSettings:
        if self.log_retention_days not in LOG_RETENTION_DAYS:
            raise ValueError(f"log_retention_days must be one of {LOG_RETENTION_DAYS}")
        if self.dlq_retention_seconds < self.queue_retention_seconds:
            raise ValueError("dlq_retention_seconds must not be shorter than queue_retention_seconds")
        capacity, runs = self.budget_defaults.fleet_capacity, self.fleet_runs()
        if capacity is not None and runs is not None and capacity > runs:  # admitted past what runs: unshared
            raise ValueError(
                f"budget_defaults.fleet_capacity ({capacity}) is more than the fleet runs at once ({runs}: "
                "executor.reserved_concurrency, plus worker.max_tasks x worker.concurrency when enabled, plus "
                "workspace.ec2.max_instances x workspace.ec2.concurrency with the EC2 workspace tier)"
            )
        if self.workspace.tier == "ec2":
            family = self.workspace.ec2.instance_type.split(".")[0]
            graviton = bool(re.match(r"^[a-z]+\d+[a-z]*g[a-z]*$", family))
            if graviton != (self.architecture == "arm64"):
                raise ValueError(
                    f"workspace.ec2.instance_type {self.workspace.ec2.instance_type!r} does not run {self.architecture} "
                    "code (architecture): arm64 takes a Graviton type (m7g, c7g, t4g...), x86_64 any other"
                )
        self._fair_by_default()
        for model in self.bedrock_models:
            family = model_family(model)
            if not BEDROCK_MODEL.match(model) or not family.strip("*.") or "*" in model.rstrip("*").lstrip("*."):
                raise ValueError(
                    f"bedrock_models: {model!r} is not a model id, an inference profile id or a Bedrock ARN "
                    "('*' only at the end of a family, or as the profile's region: *.anthropic.*)"
                )
        return self

    def fleet_runs(self) -> int | None:
        """What the fleet runs at once (reserved concurrency plus the enabled workers, the EC2
        workspace tier's among them); None: unbounded."""
        runs = self.executor.reserved_concurrency
        workers = self.worker.max_tasks * self.worker.concurrency if self.worker.enabled else 0
        ec2 = self.workspace.ec2
        workers += ec2.max_instances * ec2.concurrency if self.workspace.tier == "ec2" else 0
        return None if runs is None else runs + workers

    def _fair_by_default(self) -> None:
        """Fair by default (issue 44; ARCHITECTURE invariant 12): a capacity left out is ``fleet_runs``,
        a tenant limit left out ``fair_limit`` of it, a tier capacity left out the tier's event
        source's maximum concurrency (each tier's limit per tenant is ``fair_limit`` of it); set on the frozen ``budget_defaults`` here only,
        so the functions' variables and every reader see the numbers the deployment runs with."""
        budget = self.budget_defaults
        capacity = budget.fleet_capacity if budget.fleet_capacity is not None else self.fleet_runs()
        if capacity is not None:
            limit = budget.tenant_max_running if budget.tenant_max_running is not None else fair_limit(capacity)
            derived = budget.model_copy(update={"fleet_capacity": capacity, "tenant_max_running": limit})
            object.__setattr__(self, "budget_defaults", derived)
        if self.budget_defaults.tier_capacity is None and not self.worker.enabled:
            # Each tier's event source runs at most its maximum concurrency, and nothing else runs
            # its tasks (the EC2 workspace tier's take none: FairShare). With the Fargate worker on,
            # the workers take every tier's messages, so no tier has a capacity of its own.
            tiers = dict(self.executor.tier_max_concurrency)
            object.__setattr__(
                self, "budget_defaults", self.budget_defaults.model_copy(update={"tier_capacity": tiers})
            )

    @property
    def names(self) -> ResourceNames:
        return ResourceNames.for_prefix(self.prefix)

    @property
    def destroy(self) -> bool:
        return self.removal_policy == "destroy"

    def queue_settings(self) -> QueueSettings:
        """What both the CDK queues and the local stack's ``provision`` get for this environment."""
        return QueueSettings(
            visibility_timeout=self.executor.queue_visibility_seconds,
            max_receive_count=self.max_receive_count,
            retention_seconds=self.queue_retention_seconds,
            dlq_retention_seconds=self.dlq_retention_seconds,
        )


def deep_merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def resolve(environments: dict[str, Any], defaults: dict[str, Any] | None, env_name: str) -> EnvironmentSettings:
    """The validated settings of ``env_name`` (defaults deep-merged with its overrides)."""
    return EnvironmentSettings.model_validate(deep_merge(defaults or {}, environments[env_name]))
