"""Shared fixtures: one moto server per test session, a fresh table and bucket per test; the
in-memory twin of both for tests of the engine's own behaviour."""

from __future__ import annotations

import gc
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from agentq.core.tools import ToolRegistry
from agentq.queueing._tuning import WorkerConfig
from agentq.resources import ResourceNames, provision
from agentq.runtime import Settings, build_registry, build_store, session
from agentq.storage.container import Storage, memory_storage
from agentq_dev import forkserver
from agentq_dev.moto_server import LOCAL_CREDENTIALS, MotoServer
from agentq_dev.stack import LocalStack

from tests import forked_xdist_worker
from tests.api_support import ROOT, ApiStack

TESTS_DIR = Path(__file__).resolve().parent
sys.path.insert(0, str(TESTS_DIR.parent))  # lets child workers import tests.* tool modules

# How xdist groups and orders the tests, and how its workers end.
pytest_plugins = ("tests.xdist_scheduling", "tests.xdist_exit")


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


_forkserver: subprocess.Popen[bytes] | None = None


def pytest_configure(config: pytest.Config) -> None:
    """One fork server for the run (devstack/agentq_dev/forkserver.py), started by the process that
    starts the others (xdist's controller, or the only one with ``-n 0``); xdist's workers
    inherit its socket's path in the environment. Every moto server, local-stack worker,
    ``agentq`` command and bench the tests start (or a process they start: ``agentq dev``, a
    bench) is forked from it warm, not started cold: ~1.3 CPU-s less a moto server (~45 a run),
    ~0.4-1.5 less a worker or command (~150 a run). One for all workers, not one each: it is
    ~4 CPU-s of imports to start. xdist's workers are forked from it too
    (tests/forked_xdist_worker.py)."""
    global _forkserver
    if hasattr(config, "workerinput") or os.environ.get(forkserver.ENV_VAR):
        return
    path = str(tempfile.mkdtemp(prefix="agentq-fork-") + "/fork.sock")
    _forkserver = subprocess.Popen(
        [sys.executable, "-m", "agentq_dev.forkserver", path],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    assert _forkserver.stdout is not None and _forkserver.stdout.readline().strip() == b"ready"
    os.environ[forkserver.ENV_VAR] = path
    if getattr(config.option, "tx", None):  # xdist's workers, forked from it too
        config.option.tx = forked_xdist_worker.specs(config.option.tx)


def pytest_unconfigure(config: pytest.Config) -> None:
    if _forkserver is not None:
        path = os.environ.pop(forkserver.ENV_VAR, "")
        _forkserver.terminate()
        _forkserver.wait(timeout=10)
        shutil.rmtree(os.path.dirname(path), ignore_errors=True)


def pytest_collection(session: pytest.Session) -> None:
    """No garbage collection while the tests are collected: what collection builds lives to
    the end of the run (see below), so walking it as it grows is wasted (~1.1 CPU-s a
    collection of the suite, each xdist worker collecting it once)."""
    gc.disable()


def pytest_collection_finish(session: pytest.Session) -> None:
    """Each xdist worker's garbage collector, tuned for a test run's heap.

    What collection built (the modules the tests import, the collected items, the schema and
    CDK libraries) lives to the end of the run: it is frozen out of the collector's sight. And
    the tests allocate fast (templates, schemas, responses), so a young collection comes every
    10,000 allocations rather than 700 (a full one, as by default, at most every 100 of those,
    and only once a quarter of the heap is new: Python's own rule). Measured with
    gc.callbacks timing each generation, ``make test`` on a quiet machine: the six workers'
    collections took 38 CPU-s (32 of them in ~86 full collections of a 1.1 million object
    heap); frozen alone, 38 (a small heap, collected twice as often); frozen and tuned, 20.
    The workers' CPU went 207 -> 177 CPU-s, the run 285 -> 269 s. (A frozen object is not in
    ``gc.get_objects()``: a test that looks for leaked objects looks at what it made itself.)"""
    gc.collect()
    gc.freeze()
    gc.set_threshold(10_000, 10, 10)
    gc.enable()


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


def _on_memory(request: pytest.FixtureRequest) -> bool:
    """Whether the test's module runs its engine on the in-memory twin: ``STORAGE = "memory"``."""
    return getattr(request.module, "STORAGE", "moto") == "memory"


@pytest.fixture
def store(request: pytest.FixtureRequest) -> Storage:
    """A table and a bucket of the test's own on the shared moto server, or the in-memory twin
    where the module says ``STORAGE = "memory"`` (see ``memory_store``)."""
    made: Storage = request.getfixturevalue("memory_store" if _on_memory(request) else "settings_store")
    return made


@pytest.fixture
def registry(request: pytest.FixtureRequest) -> ToolRegistry:
    """The tests' tool modules, for ``store``."""
    made: ToolRegistry = request.getfixturevalue("memory_registry" if _on_memory(request) else "settings_registry")
    return made


@pytest.fixture
def settings_store(settings: Settings) -> Storage:
    return build_store(settings)


@pytest.fixture
def settings_registry(settings: Settings) -> ToolRegistry:
    return build_registry(settings)


@pytest.fixture
def memory_store() -> Storage:
    """The in-memory twin of the table and the bucket (agentq.storage.memory), for tests of the
    engine's own behaviour: no AWS, no network, milliseconds a request. tests/storage_conformance
    holds it to DynamoDB's rules; races between processes and AWS's own semantics stay on moto."""
    return memory_storage()


@pytest.fixture
def memory_registry() -> ToolRegistry:
    """The tests' tool modules, for an engine on ``memory_store`` (no endpoint to point at)."""
    return build_registry(Settings(table="memory", bucket="memory", tool_modules=("tests.effect_tools",)))


# The scripted provider and tests/fake_messages_api.py answer within seconds, so the maximum
# call time (the SDK's timeout and a budget hold's deadline, invariant 4) is 30 s here, not the
# production default of 600: a successor that must wait for a lost lease's hold (only when the
# budget cannot cover both) waits seconds. Tests of that wait set a shorter one of their own.
os.environ.setdefault("AGENTQ_MAX_CALL_SECONDS", "30")


def child_env(settings: Settings, **extra: str) -> dict[str, str]:
    env = {**os.environ, **LOCAL_CREDENTIALS, **settings.env(), **extra}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(TESTS_DIR.parent), env.get("PYTHONPATH", "")]))
    return env


@pytest.fixture(scope="session")
def api_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ApiStack]:
    """One local stack with the HTTP API and auth on, per test process, started by whichever
    test asks first (tests/api_support.py has the helpers it hands out).

    Its workers renew their liveness every 3 s (lease 9 s), not every second: no test of this
    stack is about a worker's liveness (the kills here are of `run-task` processes of their own),
    and the 1 s heartbeat's write and peer Query made about a fifth of its idle CPU (measured:
    1.69 -> 1.31 CPU-s per 30 s). Under make test its tests are one xdist group, and the stack
    ends after the group's last test (tests/xdist_scheduling.py)."""
    ledger = tmp_path_factory.mktemp("api-ledger") / "ledger.jsonl"
    stack = LocalStack(
        prefix=f"http{uuid.uuid4().hex[:8]}",
        workers=2,
        auth=True,
        worker_config=WorkerConfig(lease_seconds=9.0, heartbeat_seconds=3.0),
        tool_modules=("agentq.core.tools.examples", "tests.effect_tools"),
        extra_env={
            "AGENTQ_TEST_LEDGER": str(ledger),
            "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH", "")])),
            # Policy rules a test writes are enforced at the next check (tests/test_policies.py).
            "AGENTQ_POLICY_CACHE_SECONDS": "0",
        },
    ).start()
    try:
        assert stack.api_server is not None
        yield ApiStack(
            stack=stack,
            url=stack.api_server.url,
            key=stack.create_api_key("team-a"),
            other_key=stack.create_api_key("team-b"),
        )
    finally:
        stack.stop()
