"""Wiring from the environment: AWS clients, the store, the tool registry.

One place reads configuration so the CLI, local workers and (later) Lambda handlers build
the same objects. boto3 itself honours AWS_ENDPOINT_URL, which is how the local stack and
the tests point everything at moto.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import boto3

from agentq.aws import boto_config, region_from_env
from agentq.aws_sessions import shared_session
from agentq.control.defaults import ConfigurationError, Defaults
from agentq.core.secrets import Secrets
from agentq.core.tools import ToolRegistry, default_registry
from agentq.core.tools.mcp import McpServers
from agentq.queueing.queues import POOL_VARIABLE, WORKSPACE_POOL_VARIABLE, TaskQueues
from agentq.resources import ResourceNames
from agentq.storage.container import Storage
from agentq.storage.dynamodb import DynamoTable
from agentq.storage.serdes import DEFAULT_OFFLOAD_THRESHOLD, PayloadStore
from agentq.storage.tasks import DAY_SECONDS, DEFAULT_TASK_RETENTION_DAYS
from agentq.storage.workspace_access import DURATION_SECONDS, ScopedWorkspaceObjects, session_name
from agentq.storage.workspace_access import ROLE_VARIABLE as WORKSPACE_ROLE_VARIABLE

if TYPE_CHECKING:
    from agentq.core.engine import Engine, EngineConfig
    from agentq.core.vault_crypto import EnvelopeCipher
    from agentq.queueing.dispatch import Dispatcher, RetryBackoff


@dataclass(frozen=True)
class Settings:
    table: str
    bucket: str
    prefix: str = "agentq"  # queue names: {prefix}-{tier}, {prefix}-{tier}-dlq
    endpoint_url: str | None = None
    region: str = "us-east-1"
    offload_threshold: int = DEFAULT_OFFLOAD_THRESHOLD
    tool_modules: tuple[str, ...] = ()
    state_machine_arn: str | None = None  # default: looked up by name ({prefix}-fanout)
    defaults: Defaults = Defaults()  # AGENTQ_DEFAULT_*: what submissions and tenants leave out
    task_retention_days: int = DEFAULT_TASK_RETENTION_DAYS  # terminal tasks expire after this
    # Queue pools (queueing.queues): the one this process reads (AGENTQ_QUEUE_POOL), and where
    # tasks with a workspace run (AGENTQ_WORKSPACE_POOL: the deployment's EC2 tier). None: the default set.
    queue_pool: str | None = None
    workspace_pool: str | None = None
    # The EC2 tier's narrow role for workspace objects (storage.workspace_access): set, each task's
    # workspace content is reached with credentials scoped to its prefix. None: this process's own.
    workspace_role_arn: str | None = None

    @property
    def names(self) -> ResourceNames:
        return ResourceNames(table=self.table, bucket=self.bucket, prefix=self.prefix)

    @classmethod
    def for_prefix(cls, prefix: str, endpoint_url: str | None = None, **kwargs: Any) -> Settings:
        names = ResourceNames.for_prefix(prefix)
        return cls(table=names.table, bucket=names.bucket, prefix=prefix, endpoint_url=endpoint_url, **kwargs)

    @classmethod
    def from_env(cls) -> Settings:
        prefix = os.environ.get("AGENTQ_PREFIX", "agentq")
        names = ResourceNames.for_prefix(prefix)
        modules = tuple(m for m in os.environ.get("AGENTQ_TOOL_MODULES", "").split(",") if m)
        return cls(
            prefix=prefix,
            table=_name_from_env("AGENTQ_TABLE", names.table),
            bucket=_name_from_env("AGENTQ_BUCKET", names.bucket),
            endpoint_url=_endpoint_from_env(),
            region=region_from_env(),
            offload_threshold=int(os.environ.get("AGENTQ_OFFLOAD_BYTES", DEFAULT_OFFLOAD_THRESHOLD)),
            tool_modules=modules,
            state_machine_arn=os.environ.get("AGENTQ_STATE_MACHINE_ARN") or None,
            defaults=Defaults.from_env(),
            task_retention_days=retention_days_from_env(),
            queue_pool=_pool_from_env(POOL_VARIABLE),
            workspace_pool=_pool_from_env(WORKSPACE_POOL_VARIABLE),
            workspace_role_arn=os.environ.get(WORKSPACE_ROLE_VARIABLE) or None,
        )

    def env(self) -> dict[str, str]:
        """The environment a child worker needs to build the same settings."""
        out = {
            "AGENTQ_PREFIX": self.prefix,
            "AGENTQ_TABLE": self.table,
            "AGENTQ_BUCKET": self.bucket,
            "AWS_REGION": self.region,
            "AGENTQ_OFFLOAD_BYTES": str(self.offload_threshold),
            "AGENTQ_TOOL_MODULES": ",".join(self.tool_modules),
            RETENTION_VARIABLE: str(self.task_retention_days),
        }
        out.update(self.defaults.env())
        if self.endpoint_url:
            out["AWS_ENDPOINT_URL"] = self.endpoint_url
        if self.state_machine_arn:
            out["AGENTQ_STATE_MACHINE_ARN"] = self.state_machine_arn
        if self.queue_pool:
            out[POOL_VARIABLE] = self.queue_pool
        if self.workspace_pool:
            out[WORKSPACE_POOL_VARIABLE] = self.workspace_pool
        if self.workspace_role_arn:
            out[WORKSPACE_ROLE_VARIABLE] = self.workspace_role_arn
        return out


def _name_from_env(variable: str, default: str) -> str:
    """A resource's name from ``variable`` (unset: ``default``, the prefix's). Set but empty, or
    with spaces, stops the process naming the variable: AWS's client would refuse each request
    with a ParamValidationError, and falling back to the default would act on another stack's."""
    value = os.environ.get(variable, default)
    if not value or value != value.strip() or any(c.isspace() for c in value):
        said = "empty" if not value.strip() else f"{value!r}, which holds a space"
        raise ConfigurationError(f"{variable} is {said}: name the resource, or unset it for {default!r}",
                                 field=variable)  # fmt: skip
    return value


def _endpoint_from_env() -> str | None:
    """AWS_ENDPOINT_URL (the local stack's moto), after every AWS_ENDPOINT_URL* variable is
    checked (botocore reads the per-service ones itself): anything but an http(s) URL stops the
    process naming the variable, where botocore would raise a ValueError making a client."""
    import urllib.parse

    for variable in sorted(v for v in os.environ if v.startswith("AWS_ENDPOINT_URL")):
        value = os.environ[variable]
        try:
            parts = urllib.parse.urlsplit(value)
            parts.port  # noqa: B018 (a port that is not a number raises here)
            usable = parts.scheme in ("http", "https") and bool(parts.hostname)
        except ValueError:  # an unclosed [IPv6 address, a port that is not a number
            usable = False
        if value and (not usable or any(c.isspace() or not c.isprintable() for c in value)):
            raise ConfigurationError(
                f"{variable} is {value!r}: not an http:// or https:// URL; export the one `agentq dev` printed, "
                "or unset it for AWS's own endpoints",
                field=variable,
            )
    return os.environ.get("AWS_ENDPOINT_URL") or None


def _pool_from_env(variable: str) -> str | None:
    """A queue pool's name from ``variable``: empty is none; anything but lowercase letters,
    digits and ``-`` stops the process naming the variable (it becomes part of queue names)."""
    value = os.environ.get(variable, "").strip()
    if value and not (value[0].isalpha() and all(c.islower() or c.isdigit() or c == "-" for c in value)):
        raise ConfigurationError(
            f"{variable}={value!r} is not a queue pool name (lowercase letters, digits, '-')", field=variable
        )
    return value or None


RETENTION_VARIABLE = "AGENTQ_TASK_RETENTION_DAYS"


def retention_days_from_env() -> int:
    """AGENTQ_TASK_RETENTION_DAYS as a whole number of days >= 1 (default 30).

    Read strictly: a typo here would otherwise decide how long every finished task lives.
    """
    raw = os.environ.get(RETENTION_VARIABLE, "").strip()
    if not raw:
        return DEFAULT_TASK_RETENTION_DAYS
    try:
        days = int(raw)
    except ValueError:
        days = 0
    if days < 1:
        raise ConfigurationError(
            f"{RETENTION_VARIABLE}: must be a whole number of days >= 1 (got {raw!r})", field=RETENTION_VARIABLE
        )
    return days


def session(settings: Settings) -> boto3.session.Session:
    """This process's boto3 session for ``settings.region`` (``agentq.aws_sessions``): one per
    process and environment, each caller's clients its own."""
    return shared_session(settings.region)


def warm_data_loader(services: Iterable[str], region: str = "us-east-1") -> None:
    """Parse botocore's data for ``services`` (model, endpoint rules, endpoints, partitions) into
    the shared loader now, by making one client of each.

    Why: a process that forks many others (the local stack's fork server, a test's pool of
    racers) does it once for all of them; each child's sessions then find it parsed (~0.1 CPU-s
    a child for DynamoDB, S3 and SQS). The clients are thrown away; explicit placeholder
    credentials keep their creation from searching the credential chain (no metadata call)."""
    make: Callable[..., Any] = session(Settings.for_prefix("warm", None, region=region)).client
    for service in services:
        make(
            service, region_name=region, endpoint_url="http://127.0.0.1:9", config=boto_config(1),
            aws_access_key_id="warm", aws_secret_access_key="warm",
        )  # fmt: skip


def client(settings: Settings, service: str, sess: boto3.session.Session | None = None, pool: int = 64) -> Any:
    # Any service by name: the stubs type Session.client by one overload per literal service name.
    make: Callable[..., Any] = (sess or session(settings)).client
    return make(service, endpoint_url=settings.endpoint_url, config=boto_config(pool))


def engine_config(settings: Settings, **kwargs: Any) -> EngineConfig:
    """An EngineConfig carrying the deployment's defaults (tenant cap, workspace limits) plus ``kwargs``."""
    from agentq.core.engine import EngineConfig

    kwargs.setdefault("max_call_seconds", max_call_seconds())
    kwargs.setdefault("unknown_recheck_seconds", unknown_recheck_seconds())
    kwargs.setdefault("workspace_quota", settings.defaults.workspace_quota())
    kwargs.setdefault("policy_cache_seconds", policy_cache_seconds())
    check_stream_above()
    check_provider_retry()
    return EngineConfig(default_tenant_limits=settings.defaults.tenant_limits(), **kwargs)


def build_engine(settings: Settings, store: Storage, *, worker_id: str, pool: int = 64, **config: Any) -> Engine:
    """The engine a worker or an executor runs: the deployment's tools, fan-out, secrets and
    defaults, with ``config`` (lease, heartbeat, slice margin) on top. One place builds it, so
    the Lambda executor and the long-running worker cannot drift apart."""
    from agentq.control.subtrees import time_out_subagent
    from agentq.core.engine import Engine
    from agentq.core.tools.egress import egress_factory
    from agentq.core.tools.fetch import FetchPolicy

    fanout = build_fanout(settings, pool=pool)
    # A sub-agent its parent's fan-out gave up on ends with its subtree, as a cancel ends one:
    # control's walk, handed to the core here (the core imports no control).
    time_out = None
    if fanout is not None:
        slots = settings.defaults.running_slots(store)
        time_out = functools.partial(time_out_subagent, store, fanout=fanout, queues=fanout.queues, slots=slots)
    return Engine(
        store,
        worker_id=worker_id,
        tools=build_registry(settings),
        config=engine_config(settings, **config),
        fanout=fanout,
        secrets=build_secrets(),
        egress=egress_factory(FetchPolicy.from_env()),
        cipher=build_cipher(settings),
        time_out=time_out,
    )


def build_dispatcher(
    engine: Engine,
    store: Storage,
    queues: TaskQueues,
    *,
    max_receive_count: int,
    backoff: RetryBackoff | None = None,
    default_max_running: int | None = None,
    fleet_capacity: int | None = None,
    tier_limits: Mapping[str, int] | None = None,
) -> Dispatcher:
    """The dispatcher (``queueing.dispatch``) with what it needs from ``control`` handed in: a
    schedule's fire (``control.schedules.fire``) and a cancel (``control.operations.cancel``,
    for a concurrency key's ``cancel_running``). Queueing never imports control; this is where
    the two meet. The rest is the dispatcher's own (``Dispatcher.__init__``); ``backoff``: its
    default when None."""
    from agentq.control.operations import cancel
    from agentq.control.schedules import fire
    from agentq.queueing.dispatch import DEFAULT_BACKOFF, Dispatcher

    return Dispatcher(engine, store, queues, max_receive_count=max_receive_count, fire_schedule=fire, cancel=cancel,
                      backoff=backoff or DEFAULT_BACKOFF, default_max_running=default_max_running,
                      fleet_capacity=fleet_capacity, tier_limits=tier_limits)  # fmt: skip


def max_call_seconds() -> float:
    """``AGENTQ_MAX_CALL_SECONDS`` (``agentq.core.providers.base.max_call_seconds``), a bad
    value refused as configuration naming the variable."""
    from agentq.core.providers.base import MAX_CALL_VARIABLE
    from agentq.core.providers.base import max_call_seconds as parse

    try:
        return parse()
    except ValueError as exc:
        raise ConfigurationError(str(exc), field=MAX_CALL_VARIABLE) from None


def check_stream_above() -> None:
    """``AGENTQ_STREAM_ABOVE_TOKENS`` is read per call (``core.providers.base.stream_above``);
    a bad value is refused here, at startup, as configuration naming the variable, rather
    than failing every model call."""
    from agentq.core.providers.base import STREAM_ABOVE_VARIABLE, stream_above

    try:
        stream_above()
    except ValueError as exc:
        raise ConfigurationError(str(exc), field=STREAM_ABOVE_VARIABLE) from None


def check_provider_retry() -> None:
    """``AGENTQ_PROVIDER_RETRY`` is read when a provider is built, at every task's first model
    call (``core.providers.retry.RetryPolicy.from_env``): a bad value is refused here, at
    startup, naming the variable, rather than failing every task as ``processing_failed``."""
    from agentq.core.providers.retry import RETRY_VARIABLE, RetryPolicy

    try:
        RetryPolicy.from_env()
    except ValueError as exc:
        raise ConfigurationError(str(exc), field=RETRY_VARIABLE) from None


UNKNOWN_RECHECK_VARIABLE = "AGENTQ_UNKNOWN_RECHECK_SECONDS"
POLICY_CACHE_VARIABLE = "AGENTQ_POLICY_CACHE_SECONDS"


def policy_cache_seconds() -> float:
    """``AGENTQ_POLICY_CACHE_SECONDS`` (default 5): how long a worker process reuses a tenant's
    policy documents (``core.engine._policy``) before one Query reads them again; 0 reads them
    at every check. A bad value refused as configuration naming the variable."""
    raw = os.environ.get(POLICY_CACHE_VARIABLE, "5")
    try:
        seconds = float(raw)
    except ValueError:
        seconds = -1.0
    if not 0 <= seconds <= 300:
        raise ConfigurationError(f"{POLICY_CACHE_VARIABLE} must be seconds from 0 to 300, not {raw!r}",
                                 field=POLICY_CACHE_VARIABLE)  # fmt: skip
    return seconds


def unknown_recheck_seconds() -> float:
    """``AGENTQ_UNKNOWN_RECHECK_SECONDS`` (default 60): how often a task held back only by calls
    of unknown outcome looks again (``core.engine._holds.UnknownUsage``); a bad value refused
    as configuration naming the variable."""
    raw = os.environ.get(UNKNOWN_RECHECK_VARIABLE, "60")
    try:
        seconds = float(raw)
    except ValueError:
        seconds = -1.0
    if not 1 <= seconds <= 900:  # SQS delays a message at most 15 minutes
        raise ConfigurationError(f"{UNKNOWN_RECHECK_VARIABLE} must be seconds from 1 to 900, not {raw!r}",
                                 field=UNKNOWN_RECHECK_VARIABLE)  # fmt: skip
    return seconds


def build_store(settings: Settings, sess: boto3.session.Session | None = None, pool: int = 64) -> Storage:
    sess = sess or session(settings)
    payloads = PayloadStore(client(settings, "s3", sess, pool), settings.bucket, settings.offload_threshold)
    store = Storage(
        DynamoTable(client(settings, "dynamodb", sess, pool), settings.table),
        payloads,
        retention_seconds=settings.task_retention_days * DAY_SECONDS,
    )
    if settings.workspace_role_arn:
        store.workspaces = scoped_workspaces(settings, payloads, sess, pool)
    return store


def scoped_workspaces(
    settings: Settings, payloads: PayloadStore, sess: boto3.session.Session, pool: int
) -> ScopedWorkspaceObjects:
    """Workspace objects reached with per-task credentials of ``settings.workspace_role_arn``."""
    role = settings.workspace_role_arn
    assert role is not None
    sts = client(settings, "sts", sess, pool)

    def assume(task_id: str, policy: str) -> dict[str, Any]:
        got = sts.assume_role(RoleArn=role, RoleSessionName=session_name(task_id), Policy=policy,
                              DurationSeconds=DURATION_SECONDS)  # fmt: skip
        return dict(got["Credentials"])

    def payloads_for(credentials: dict[str, Any]) -> PayloadStore:
        scoped = boto3.session.Session(
            aws_access_key_id=credentials["AccessKeyId"], aws_secret_access_key=credentials["SecretAccessKey"],
            aws_session_token=credentials["SessionToken"], region_name=settings.region,
        )  # fmt: skip
        return PayloadStore(client(settings, "s3", scoped, pool), settings.bucket, settings.offload_threshold)

    partition = role.split(":")[1] if role.startswith("arn:") else "aws"
    return ScopedWorkspaceObjects(payloads, bucket=settings.bucket, assume=assume, payloads_for=payloads_for,
                                  partition=partition)  # fmt: skip


def build_queues(settings: Settings, sess: boto3.session.Session | None = None, pool: int = 64) -> TaskQueues:
    return TaskQueues(
        client(settings, "sqs", sess, pool),
        settings.names,
        pool=settings.queue_pool,
        workspace_pool=settings.workspace_pool,
    )


def lazy_store_and_queues(pool: int = 4) -> Callable[[], tuple[Storage, TaskQueues]]:
    """For a Lambda handler module: a function that builds the store and the queues from the
    environment on first use and keeps them for the container's life (cold start only). One per
    module, not one per process, so a handler loaded afresh (as tests do) reads its env afresh."""
    built: list[tuple[Storage, TaskQueues]] = []

    def clients() -> tuple[Storage, TaskQueues]:
        if not built:
            settings = Settings.from_env()
            built.append((build_store(settings, pool=pool), build_queues(settings, pool=pool)))
        return built[0]

    return clients


def build_fanout(settings: Settings, sess: boto3.session.Session | None = None, pool: int = 64) -> Any:
    """The Step Functions fan-out launcher, or None where no state machine exists."""
    from agentq.queueing.stepfunctions import StepFunctionsFanout

    sfn = client(settings, "stepfunctions", sess, pool)
    arn = settings.state_machine_arn
    if arn is None:
        for page in sfn.get_paginator("list_state_machines").paginate():
            for machine in page["stateMachines"]:
                if machine["name"] == settings.names.state_machine:
                    arn = machine["stateMachineArn"]
    if arn is None:
        return None
    return StepFunctionsFanout(sfn, arn, build_queues(settings, sess, pool))


def build_secrets(environ: Mapping[str, str] = os.environ) -> Secrets:
    """The deployment's secrets for tools and MCP headers (``core.secrets``): the environment
    locally; Secrets Manager where ``AGENTQ_SECRETS_BACKEND=secretsmanager`` (the CDK stack sets
    it), read through powertools' parameters utility with a five-minute cache."""
    base = Secrets.from_env(environ)
    if environ.get("AGENTQ_SECRETS_BACKEND", "env") != "secretsmanager":
        return base
    from aws_lambda_powertools.utilities import parameters

    def read(name: str) -> str | None:
        try:
            return parameters.get_secret(name, max_age=300)
        except parameters.exceptions.GetParameterError:
            return None

    return Secrets(read, base.allowed)


def build_cipher(settings: Settings | None = None, environ: Mapping[str, str] = os.environ) -> EnvelopeCipher | None:
    """The vault's cipher (``core.vault_crypto``): KMS envelope encryption under
    ``AGENTQ_VAULT_KMS_KEY`` (the stack sets it), else the key file ``AGENTQ_VAULT_KEY_FILE``
    (``agentq dev``; made on first use), else None: no vault (writes are refused, tools are
    told a credential is unavailable)."""
    from agentq.core.vault_crypto import (
        KEY_FILE_VARIABLE,
        KMS_KEY_VARIABLE,
        EnvelopeCipher,
        KmsDataKeys,
        LocalDataKeys,
    )

    kms_key = environ.get(KMS_KEY_VARIABLE, "").strip()
    if kms_key:
        kms = client(settings or Settings.from_env(), "kms", pool=16)
        return EnvelopeCipher(KmsDataKeys(kms, kms_key))
    key_file = environ.get(KEY_FILE_VARIABLE, "").strip()
    if key_file:
        return EnvelopeCipher(LocalDataKeys.from_file(key_file))
    return None


def build_mcp(environ: Mapping[str, str] = os.environ) -> McpServers:
    """The deployment's MCP servers (``AGENTQ_MCP_SERVERS``), their headers read from its secrets."""
    return McpServers.from_env(environ, secrets=build_secrets(environ))


def build_registry(settings: Settings) -> ToolRegistry:
    """Built-in tools (spawn_subagents included) plus those of the deployment's tool modules, and
    their ``@grader`` functions
    (``agentq.tool_modules``: AGENTQ_TOOL_MODULES and installed packages). python_exec runs in the sandbox AGENTQ_SANDBOX
    names and http_fetch honours AGENTQ_HTTP_FETCH_ALLOW (agentq.sandbox.config,
    agentq.core.tools.fetch)."""
    from agentq.core.approval import approval_tool_spec, credential_request_spec
    from agentq.core.fanout import spawn_tool_spec
    from agentq.core.tools.fetch import FetchPolicy
    from agentq.sandbox.config import sandbox_from_env
    from agentq.tool_modules import load_modules

    registry = default_registry(sandbox=sandbox_from_env(), fetch_policy=FetchPolicy.from_env())
    registry.register(spawn_tool_spec())
    registry.register(approval_tool_spec())
    registry.register(credential_request_spec())
    specs, graders = load_modules(settings.tool_modules)
    for spec in specs:
        registry.register(spec)
    for grading in graders:
        registry.register_grader(grading)
    return registry
