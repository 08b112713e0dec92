"""AWS client configuration shared by everything that makes a client, and a botocore-only
client for a function that needs one client and no more (the authorizer).

Kept free of boto3 and of the rest of agentq: importing boto3 on top of botocore, and a
boto3 session per client, are cold-start time the authorizer has no use for. botocore, like
boto3, honours AWS_ENDPOINT_URL (the local stack, the tests) and the usual credential chain.
"""

from __future__ import annotations

import os
from typing import Any

from botocore.config import Config


def boto_config(pool: int = 64) -> Config:
    """Standard retries; a connection pool as large as the number of threads that share it."""
    return Config(retries={"max_attempts": 5, "mode": "standard"}, max_pool_connections=pool)


def region_from_env() -> str:
    """AWS_REGION, else AWS_DEFAULT_REGION, else the region of the AWS config file's profile
    (AWS_PROFILE's, or [default]: what `aws configure` wrote, and what boto3 and the aws CLI
    use), else us-east-1. A Lambda, a worker and the local stack always have AWS_REGION set, so
    the config file is read (~15 ms, a botocore session) only by a command in an operator's
    shell, which would otherwise act on another region than the deployment's. A profile that
    is not in the file raises botocore's ProfileNotFound, as its credential lookup would."""
    named = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
    if named:
        return named
    import botocore.session

    configured = botocore.session.get_session().get_config_variable("region")
    return str(configured) if configured else "us-east-1"


def botocore_client(service: str, *, region: str | None = None, endpoint_url: str | None = None, pool: int = 64) -> Any:
    """A low-level client from a botocore session of its own (what ``boto3.client`` returns,
    without importing boto3). Region and endpoint default as ``runtime.Settings.from_env``'s."""
    import botocore.session

    return botocore.session.get_session().create_client(
        service,
        region_name=region or region_from_env(),
        endpoint_url=endpoint_url or os.environ.get("AWS_ENDPOINT_URL") or None,
        config=boto_config(pool),
    )
