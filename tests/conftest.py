"""Shared fixtures: one moto server per test session, a fresh table and bucket per test."""

from __future__ import annotations

import logging
import os
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from agentq.core.tools import ToolRegistry
from agentq.local.moto_server import LOCAL_CREDENTIALS, MotoServer
from agentq.resources import ResourceNames, provision
from agentq.runtime import Settings, build_registry, build_store, session
from agentq.storage.container import Storage

TESTS_DIR = Path(__file__).resolve().parent
sys.path.insert(0, str(TESTS_DIR.parent))  # lets child workers import tests.* tool modules


@pytest.fixture(autouse=True)
def _core_logging_restored() -> Iterator[None]:
    """A Lambda handler module routes the ``agentq`` logger to its powertools Logger when it is
    imported (as Lambda wants: once per container). Tests import handlers in one process, so
    each test gets the logger back as it found it (propagating to the root, where caplog is)."""
    core = logging.getLogger("agentq")
    saved = (list(core.handlers), core.propagate, core.level)
    yield
    core.handlers, core.propagate = saved[0], saved[1]
    core.setLevel(saved[2])


@pytest.fixture(scope="session")
def moto_server() -> Iterator[MotoServer]:
    for key, value in LOCAL_CREDENTIALS.items():
        os.environ.setdefault(key, value)
    with MotoServer() as server:
        yield server


def fresh_settings(moto_server: MotoServer) -> Settings:
    """A table and a bucket of their own on the shared moto server."""
    names = ResourceNames.for_prefix(f"t{uuid.uuid4().hex[:12]}")
    s = Settings(
        table=names.table,
        bucket=names.bucket,
        endpoint_url=moto_server.endpoint_url,
        tool_modules=("tests.effect_tools",),
    )
    provision(session(s), names, endpoint_url=s.endpoint_url)
    return s


@pytest.fixture
def settings(moto_server: MotoServer) -> Settings:
    return fresh_settings(moto_server)


@pytest.fixture
def store(settings: Settings) -> Storage:
    return build_store(settings)


@pytest.fixture
def registry(settings: Settings) -> ToolRegistry:
    return build_registry(settings)


def child_env(settings: Settings, **extra: str) -> dict[str, str]:
    env = {**os.environ, **LOCAL_CREDENTIALS, **settings.env(), **extra}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(TESTS_DIR.parent), env.get("PYTHONPATH", "")]))
    return env
