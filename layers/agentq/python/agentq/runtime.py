"""Wiring from the environment: AWS clients, the store, the tool registry.

One place reads configuration so the CLI, local workers and (later) Lambda handlers build
the same objects. boto3 itself honours AWS_ENDPOINT_URL, which is how the local stack and
the tests point everything at moto.
"""

from __future__ import annotations

import importlib
import os
from dataclasses import dataclass
from typing import Any

import boto3
from botocore.config import Config

from agentq.queue import TaskQueues
from agentq.resources import ResourceNames
from agentq.serdes import DEFAULT_OFFLOAD_THRESHOLD, PayloadStore
from agentq.store import Store
from agentq.tools import ToolRegistry, default_registry

def boto_config(pool: int = 64) -> Config:
    """Standard retries; a connection pool as large as the number of threads that share it."""
    return Config(retries={"max_attempts": 5, "mode": "standard"}, max_pool_connections=pool)


@dataclass(frozen=True)
class Settings:
    table: str
    bucket: str
    prefix: str = "agentq"  # queue names: {prefix}-{tier}, {prefix}-{tier}-dlq
    endpoint_url: str | None = None
    region: str = "us-east-1"
    offload_threshold: int = DEFAULT_OFFLOAD_THRESHOLD
    tool_modules: tuple[str, ...] = ()

    @property
    def names(self) -> ResourceNames:
        return ResourceNames(table=self.table, bucket=self.bucket, prefix=self.prefix)

    @classmethod
    def for_prefix(cls, prefix: str, endpoint_url: str | None = None, **kwargs: Any) -> "Settings":
        names = ResourceNames.for_prefix(prefix)
        return cls(table=names.table, bucket=names.bucket, prefix=prefix, endpoint_url=endpoint_url, **kwargs)

    @classmethod
    def from_env(cls) -> "Settings":
        prefix = os.environ.get("AGENTQ_PREFIX", "agentq")
        names = ResourceNames.for_prefix(prefix)
        modules = tuple(m for m in os.environ.get("AGENTQ_TOOL_MODULES", "").split(",") if m)
        return cls(
            prefix=prefix,
            table=os.environ.get("AGENTQ_TABLE", names.table),
            bucket=os.environ.get("AGENTQ_BUCKET", names.bucket),
            endpoint_url=os.environ.get("AWS_ENDPOINT_URL") or None,
            region=os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1",
            offload_threshold=int(os.environ.get("AGENTQ_OFFLOAD_BYTES", DEFAULT_OFFLOAD_THRESHOLD)),
            tool_modules=modules,
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
        }
        if self.endpoint_url:
            out["AWS_ENDPOINT_URL"] = self.endpoint_url
        return out


def session(settings: Settings) -> boto3.session.Session:
    return boto3.session.Session(region_name=settings.region)


def client(settings: Settings, service: str, sess: Any | None = None, pool: int = 64) -> Any:
    return (sess or session(settings)).client(service, endpoint_url=settings.endpoint_url, config=boto_config(pool))


def build_store(settings: Settings, sess: Any | None = None, pool: int = 64) -> Store:
    sess = sess or session(settings)
    payloads = PayloadStore(client(settings, "s3", sess, pool), settings.bucket, settings.offload_threshold)
    return Store(client(settings, "dynamodb", sess, pool), settings.table, payloads)


def build_queues(settings: Settings, sess: Any | None = None, pool: int = 64) -> TaskQueues:
    return TaskQueues(client(settings, "sqs", sess, pool), settings.names)


def build_registry(settings: Settings) -> ToolRegistry:
    """Built-in tools plus those of each module in AGENTQ_TOOL_MODULES (its ``TOOLS`` list)."""
    registry = default_registry()
    for name in settings.tool_modules:
        module = importlib.import_module(name)
        for spec in getattr(module, "TOOLS", []):
            registry.register(spec)
    return registry
