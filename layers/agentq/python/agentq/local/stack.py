"""The embedded local stack: moto server, the production resources, N worker processes and
the API handler on localhost. What `agentq dev`, `agentq demo` and the system tests run."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from typing import Any

from agentq.api.app import build_app
from agentq.api.auth import authorize
from agentq.control.defaults import Defaults
from agentq.core.secrets import Secrets
from agentq.core.tools.mcp import McpServers
from agentq.local.api_server import LocalApiServer
from agentq.local.moto_server import LOCAL_CREDENTIALS, MotoServer
from agentq.queueing.sweeper import sweep
from agentq.queueing.webhooks import delivery_loop
from agentq.queueing.worker import WorkerConfig
from agentq.resources import QueueSettings, provision
from agentq.runtime import Settings, build_fanout, build_queues, build_registry, build_store, session
from agentq.storage.api_keys import KeyStore

# The demo's own tools (send_report): always there locally, whatever else is loaded.
DEFAULT_TOOL_MODULES: tuple[str, ...] = ("agentq.core.tools.examples",)


@dataclass
class LocalStack:
    prefix: str = "agentq-local"
    workers: int = 2
    worker_config: WorkerConfig = field(default_factory=WorkerConfig)
    queue_settings: QueueSettings = field(default_factory=lambda: QueueSettings(visibility_timeout=4))
    tool_modules: tuple[str, ...] = DEFAULT_TOOL_MODULES
    extra_env: dict[str, str] = field(default_factory=dict)
    api: bool = True
    auth: bool = False  # the API requires a bearer key (create one with create_api_key), as in AWS
    # The sweeper (queueing/sweeper.py), a thread here as the scheduled Lambda is in AWS: every
    # ``sweep_every`` seconds (None: no sweeper), tasks silent for ``sweep_stale_after`` seconds
    # are re-enqueued. Shorter than in AWS: local retries and deferrals wait seconds, not minutes.
    sweep_every: float | None = 15.0
    sweep_stale_after: float = 120.0

    def __post_init__(self) -> None:
        self.moto = MotoServer()
        self.processes: list[subprocess.Popen[bytes]] = []
        self.api_server: LocalApiServer | None = None
        self.settings: Settings | None = None
        self._stopping = threading.Event()
        self._sweeper: threading.Thread | None = None
        self.swept: list[str] = []  # every task the sweeper re-enqueued

    def start(self) -> LocalStack:
        for key, value in LOCAL_CREDENTIALS.items():
            os.environ.setdefault(key, value)
        self.moto.start()
        self.settings = Settings.for_prefix(
            self.prefix, self.moto.endpoint_url, tool_modules=self.tool_modules, defaults=Defaults.from_env()
        )
        provision(
            session(self.settings), self.settings.names, endpoint_url=self.moto.endpoint_url, queues=self.queue_settings
        )
        if self.api:
            app = self._build_app()
            authorizer = None
            if self.auth:
                keys = self.keys()
                authorizer = lambda header: authorize(keys, header).tenant  # noqa: E731
            self.api_server = LocalApiServer(app.resolve, authorizer=authorizer).start()
        for _ in range(self.workers):
            self.spawn_worker()
        if self.sweep_every is not None:
            self._sweeper = threading.Thread(target=self._sweep_loop, name="agentq-sweeper", daemon=True)
            self._sweeper.start()
        # The callbacks' deliverer, a thread here as the Lambda on the webhooks queue is in AWS.
        self._deliverer = threading.Thread(
            target=delivery_loop, args=(self.store(), self.queues(), self._stopping), name="agentq-webhooks",
            daemon=True,
        )  # fmt: skip
        self._deliverer.start()
        # The schedules' clock, a thread here as EventBridge Scheduler is in AWS.
        self._scheduler = threading.Thread(target=self._schedule_loop, name="agentq-scheduler", daemon=True)
        self._scheduler.start()
        return self

    def _build_app(self) -> Any:
        assert self.settings is not None
        return build_app(
            self.store(),
            build_registry(self.settings),
            build_queues(self.settings),
            build_fanout(self.settings),
            defaults=self.settings.defaults,
            # the API reads the MCP servers and secrets its workers get, not this process's
            mcp=McpServers.from_env(self.env(), secrets=Secrets.from_env(self.env())),
        )

    def store(self) -> Any:
        assert self.settings is not None
        return build_store(self.settings)

    def keys(self) -> KeyStore:
        assert self.settings is not None
        keys: KeyStore = self.store().api_keys
        return keys

    def create_api_key(self, tenant: str = "local") -> str:
        """A new API key for ``tenant`` (what `agentq keys create` does)."""
        return self.keys().create(tenant)[0]

    def queues(self) -> Any:
        assert self.settings is not None
        return build_queues(self.settings)

    def env(self, **extra: str) -> dict[str, str]:
        assert self.settings is not None
        return {**os.environ, **LOCAL_CREDENTIALS, **self.settings.env(), **self.extra_env, **extra}

    def worker_command(self) -> list[str]:
        c = self.worker_config
        return [
            sys.executable, "-m", "agentq", "worker",
            "--concurrency", str(c.concurrency),
            "--lease", str(c.lease_seconds),
            "--heartbeat", str(c.heartbeat_seconds),
            "--visibility", str(c.visibility_seconds),
            "--max-receive-count", str(self.queue_settings.max_receive_count),
            "--beat-threads", str(c.beat_threads),
            "--admission-safety", str(c.admission_safety),
            "--admission-floor", str(c.admission_floor),
        ]  # fmt: skip

    def spawn_worker(self, **extra_env: str) -> subprocess.Popen[bytes]:
        proc = subprocess.Popen(self.worker_command(), env=self.env(**extra_env), start_new_session=True)
        self.processes.append(proc)
        return proc

    def restart_workers(self) -> list[subprocess.Popen[bytes]]:
        """Stop every worker (SIGTERM: each ends its tasks at a step boundary) and start as many
        new ones, which load the tool modules afresh; the API's tools are rebuilt too."""
        old, self.processes = self.processes, []
        for proc in old:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in old:
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
        if self.api_server is not None:
            self.api_server.handler = self._build_app().resolve
        return [self.spawn_worker() for _ in old]

    def worker_by_id(self, worker: str) -> subprocess.Popen[bytes] | None:
        """The process behind a lease owner id (``host:pid``)."""
        pid = int(worker.rsplit(":", 1)[-1])
        return next((p for p in self.processes if p.pid == pid), None)

    def _schedule_loop(self) -> None:
        from agentq.control.schedules import fire_due
        from agentq.runtime import build_registry

        assert self.settings is not None
        store, queues, tools = self.store(), self.queues(), build_registry(self.settings)
        while not self._stopping.wait(1.0):
            try:
                fire_due(store, tools, queues)
            except Exception:  # the store going away at shutdown, a moto hiccup: next tick
                logging.getLogger("agentq.schedules").warning("scheduler tick failed", exc_info=True)

    def _sweep_loop(self) -> None:
        assert self.settings is not None and self.sweep_every is not None
        store, queues = self.store(), self.queues()
        while not self._stopping.wait(self.sweep_every):
            try:
                self.swept += sweep(store, queues, stale_after=self.sweep_stale_after).swept
            except Exception:  # the store going away at shutdown, a moto hiccup: next round
                logging.getLogger("agentq.sweeper").warning("sweep failed", exc_info=True)

    def stop(self) -> None:
        # The workers are told first: each ends its long poll (up to a second) and its tasks at a
        # step boundary while the background loops here finish their own last poll.
        self._stopping.set()
        for proc in self.processes:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        if self._sweeper is not None:
            self._sweeper.join(timeout=30)
        if getattr(self, "_deliverer", None) is not None:
            self._deliverer.join(timeout=10)
        if getattr(self, "_scheduler", None) is not None:
            self._scheduler.join(timeout=10)
        for proc in self.processes:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
        if self.api_server:
            self.api_server.stop()
        self.moto.stop()

    def __enter__(self) -> LocalStack:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
