"""The embedded local stack: moto server, the production resources, N worker processes and
the API handler on localhost. What `agentq dev`, `agentq demo` and the system tests run.

With ``supervise`` the stack keeps its workers up as a fleet is kept (``agentq_dev.fleet``): a
worker that exits is replaced, the API and the other workers carry on, and the dead worker's
task resumes once its message is visible again. Off by default, for the tests that kill
workers and then count on exactly the processes they started.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from agentq.api.app import build_app
from agentq.api.auth import header_authorizer
from agentq.api.event_hub import EventHub
from agentq.api.http_server import ApiServer
from agentq.api.oidc import OidcVerifier
from agentq.api.stream_caps import StreamCaps
from agentq.api.stream_feed import StreamFeed
from agentq.control.defaults import Defaults
from agentq.core.secrets import Secrets
from agentq.core.tools.mcp import McpServers
from agentq.core.vault_crypto import KEY_FILE_VARIABLE
from agentq.hub import build_hub
from agentq.queueing.sweeper import sweep
from agentq.queueing.webhooks import delivery_loop
from agentq.resources import QueueSettings, provision
from agentq.runtime import Settings, build_cipher, build_fanout, build_queues, build_registry, build_store, session
from agentq.storage.api_keys import KeyStore
from agentq.worker import WorkerConfig
from agentq_dev import forkserver
from agentq_dev.fleet import RestartBackoff, describe_exit
from agentq_dev.moto_server import LOCAL_CREDENTIALS, MotoServer
from agentq_dev.oidc_issuer import LocalIssuer

# The demo's own tools (send_report): always there locally, whatever else is loaded.
DEFAULT_TOOL_MODULES: tuple[str, ...] = ("agentq.core.tools.examples",)
SUPERVISE_EVERY_SECONDS = 0.25  # how soon a dead worker is noticed

log = logging.getLogger("agentq.local")


@dataclass(frozen=True)
class WorkerReplacement:
    """A supervised worker that exited, and the one started in its place."""

    exited: int  # pid
    returncode: int  # negative: the signal that killed it
    replacement: int  # pid
    delay_seconds: float  # the crash-loop back-off waited before the replacement started


@dataclass
class _Pending:
    """A replacement held back by the crash-loop back-off."""

    due: float  # time.monotonic()
    exited: int
    returncode: int
    quick_exits: int
    delay_seconds: float
    env: dict[str, str]


def lambda_authorizer(keys: KeyStore, oidc: OidcVerifier) -> Callable[[str | None], dict[str, Any]]:
    """The local API server's authorizer: ``agentq.api.auth.header_authorizer`` (the events hub's too)."""
    return header_authorizer(keys, oidc)  # type: ignore[no-any-return]


@dataclass
class LocalStack:
    prefix: str = "agentq-local"
    workers: int = 2
    worker_config: WorkerConfig = field(default_factory=WorkerConfig)
    queue_settings: QueueSettings = field(default_factory=lambda: QueueSettings(visibility_timeout=4))
    tool_modules: tuple[str, ...] = DEFAULT_TOOL_MODULES
    extra_env: dict[str, str] = field(default_factory=dict)
    api: bool = True
    # Fair by default, as `agentq dev` runs (issue 44): the fleet's capacity is what the workers
    # run (workers x concurrency) and each tenant's default running limit leaves its reserve free
    # (``Defaults.fair_for``), unless the environment names them (AGENTQ_FLEET_CAPACITY,
    # AGENTQ_DEFAULT_TENANT_MAX_RUNNING). Off here by default: a test names the limits it tests.
    fair: bool = False
    auth: bool = False  # the API requires a bearer key (create one with create_api_key), as in AWS
    # The sweeper (queueing/sweeper.py), a thread here as the scheduled Lambda is in AWS: every
    # ``sweep_every`` seconds (None: no sweeper), tasks silent for ``sweep_stale_after`` seconds
    # are re-enqueued. Shorter than in AWS: a deferral or a retry is counted silent only from
    # when its delayed message is due (``core.status.SILENT_UNTIL``), so a cap's 15-minute hops are kept.
    sweep_every: float | None = 15.0
    sweep_stale_after: float = 120.0
    supervise: bool = False  # replace a worker that exits (agentq dev, agentq demo)
    restart_backoff: RestartBackoff = field(default_factory=RestartBackoff)
    announce: Callable[[str], None] | None = None  # where a replacement is told (default: a warning log)
    # The events hub (agentq.hub) as deployed: its own server, fed by the table's stream (moto's
    # DynamoDB Streams), named by the API's GET /health; the API's own route stays the fallback.
    events_hub: bool = False
    hub_caps: StreamCaps | None = None  # default: agentq.hub's (AGENTQ_HUB_STREAMS_PER_*)

    def __post_init__(self) -> None:
        self.moto = MotoServer()
        self.processes: list[subprocess.Popen[bytes]] = []
        self.replacements: list[WorkerReplacement] = []  # every worker the supervisor replaced
        self.backoffs: list[float] = []  # every delay the crash-loop back-off imposed
        # The supervisor thread and the methods that change the fleet (restart_workers) take
        # turns on ``processes``; each worker's start (monotonic), its line's quick exits so far
        # and its own environment are kept by pid, for its replacement.
        self._fleet_lock = threading.RLock()
        self._lineage: dict[int, tuple[float, int, dict[str, str]]] = {}
        self._pending: list[_Pending] = []
        self._supervisor: threading.Thread | None = None
        self.api_server: ApiServer | None = None
        self.hub_server: ApiServer | None = None
        self.hub_feed: StreamFeed | None = None
        self.issuer: LocalIssuer | None = None  # with auth: the local OIDC issuer (agentq_dev.oidc_issuer)
        self.settings: Settings | None = None
        self._stopping = threading.Event()
        self._sweeper: threading.Thread | None = None
        self.swept: list[str] = []  # every task the sweeper re-enqueued
        self._vault_dir: str | None = None  # the vault key's directory, when the stack made one

    def start(self) -> LocalStack:
        for key, value in LOCAL_CREDENTIALS.items():
            os.environ.setdefault(key, value)
        if KEY_FILE_VARIABLE not in self.extra_env and KEY_FILE_VARIABLE not in os.environ:
            # The vault's key (core.vault_crypto): one per stack, as its table is, made 0600 on
            # first use in a directory of its own (the moto server keeps no data past the stack).
            self._vault_dir = tempfile.mkdtemp(prefix="agentq-vault-")
            self.extra_env[KEY_FILE_VARIABLE] = os.path.join(self._vault_dir, "vault.key")
        self.moto.start()
        defaults = Defaults.from_env()
        if self.fair:
            defaults = defaults.fair_for(self.workers * self.worker_config.concurrency)
        self.settings = Settings.for_prefix(
            self.prefix, self.moto.endpoint_url, tool_modules=self.tool_modules, defaults=defaults
        )
        provision(
            session(self.settings), self.settings.names, endpoint_url=self.moto.endpoint_url, queues=self.queue_settings,
            stream=self.events_hub,
        )  # fmt: skip
        if self.api:
            authorizer = None
            if self.auth:
                self.issuer = LocalIssuer().start()
                authorizer = lambda_authorizer(self.keys(), OidcVerifier(self.issuer.settings))
            if self.events_hub:
                self.start_hub(authorizer)
            app = self._build_app(self.hub_server.url if self.hub_server else None)
            hub = EventHub(self.store())  # task event streams, served by this process as in `agentq dev`
            self.api_server = ApiServer(app.resolve, authorizer=authorizer, hub=hub).start()
        for _ in range(self.workers):
            self.spawn_worker()
        if self.supervise:
            self._supervisor = threading.Thread(target=self._supervise_loop, name="agentq-supervisor", daemon=True)
            self._supervisor.start()
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

    def start_hub(self, authorizer: Any = None) -> ApiServer:
        """Start (or start again, on a new port) the events hub over this stack's table."""
        assert self.settings is not None
        self.stop_hub()
        self.hub_server, self.hub_feed = build_hub(
            self.settings, authorizer=authorizer, local=True, caps=self.hub_caps, interval=0.1
        )  # one reader of moto's one shard
        self.hub_feed.start()
        return self.hub_server.start()

    def stop_hub(self) -> None:
        """Stop the events hub: its streams end, clients fall back to the API's route."""
        if self.hub_feed is not None:
            self.hub_feed.stop()
        if self.hub_server is not None:
            self.hub_server.stop()
        self.hub_server = self.hub_feed = None

    def _build_app(self, hub_url: str | None = None) -> Any:
        assert self.settings is not None
        return build_app(
            self.store(),
            build_registry(self.settings),
            build_queues(self.settings),
            build_fanout(self.settings),
            defaults=self.settings.defaults,
            # the API reads the MCP servers and secrets its workers get, not this process's
            mcp=McpServers.from_env(self.env(), secrets=Secrets.from_env(self.env())),
            cipher=build_cipher(self.settings, self.env()),
            hub_url=hub_url,
        )

    def store(self) -> Any:
        assert self.settings is not None
        return build_store(self.settings)

    def keys(self) -> KeyStore:
        assert self.settings is not None
        keys: KeyStore = self.store().api_keys
        return keys

    def create_api_key(self, tenant: str = "local", *, operator: bool = False, act_for_users: bool = False) -> str:
        """A new API key for ``tenant`` (what `agentq keys create [--operator] [--act-for-users]` does)."""
        return self.keys().create(tenant, operator=operator, act_for_users=act_for_users)[0]

    def token(
        self, *, user: str, tenant: str = "local", ttl: float = 3600, claims: dict[str, Any] | None = None
    ) -> str:
        """A JWT of the stack's local OIDC issuer (``auth`` only): what `agentq dev token` mints."""
        assert self.issuer is not None, "the stack's issuer runs with auth=True"
        return self.issuer.mint(user=user, tenant=tenant, ttl=ttl, claims=claims)

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
            "--idle-poll-wait", str(c.idle_poll_wait_seconds),
        ]  # fmt: skip

    def spawn_worker(self, **extra_env: str) -> subprocess.Popen[bytes]:
        return self._spawn(extra_env, quick_exits=0)

    def _spawn(self, extra_env: dict[str, str], quick_exits: int) -> subprocess.Popen[bytes]:
        with self._fleet_lock:
            proc = self._start(self.worker_command(), self.env(**extra_env))
            self.processes.append(proc)
            self._lineage[proc.pid] = (time.monotonic(), quick_exits, dict(extra_env))
            return proc

    def worker_process(self, **popen: Any) -> subprocess.Popen[bytes]:
        """A worker with this stack's settings that the stack does not supervise (for a caller
        that kills and replaces its own, as bench/chaos.py does), started as the stack's are;
        ``popen``: stdin, stdout, stderr as for ``Popen``."""
        return self._start(self.worker_command(), self.env(), **popen)

    @staticmethod
    def _start(command: list[str], env: dict[str, str], **popen: Any) -> subprocess.Popen[bytes]:
        """A worker process in a session of its own: forked warm where the environment names a
        fork server (``agentq_dev/forkserver.py``, as the tests do), else started as a program."""
        server = os.environ.get(forkserver.ENV_VAR)
        if server and command[0] == sys.executable:
            return forkserver.ForkedProcess(server, command[1:], env, **popen)
        return subprocess.Popen(command, env=env, start_new_session=True, **popen)

    def restart_workers(self) -> list[subprocess.Popen[bytes]]:
        """Stop every worker (SIGTERM: each ends its tasks at a step boundary) and start as many
        new ones, which load the tool modules afresh; the API's tools are rebuilt too. A
        replacement held back by the crash-loop back-off starts now too, afresh (a reload is
        how a module that killed its workers gets fixed)."""
        with self._fleet_lock:
            old, self.processes = self.processes, []
            held_back, self._pending = self._pending, []
            for proc in old:
                self._lineage.pop(proc.pid, None)
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
        return [self.spawn_worker() for _ in old] + [self._spawn(p.env, quick_exits=0) for p in held_back]

    def worker_by_id(self, worker: str) -> subprocess.Popen[bytes] | None:
        """The process behind a lease owner id (``host:pid``)."""
        pid = int(worker.rsplit(":", 1)[-1])
        return next((p for p in self.processes if p.pid == pid), None)

    def _supervise_loop(self) -> None:
        while not self._stopping.wait(SUPERVISE_EVERY_SECONDS):
            try:
                self.supervise_once()
            except Exception:  # a fork that failed (out of memory, pids): the next round tries again
                log.warning("worker supervision failed", exc_info=True)

    def supervise_once(self) -> None:
        """Replace every worker that exited (or hold it back, if its line keeps dying at start)
        and start the held-back replacements that are due; one line says what happened."""
        say = self.announce or log.warning
        now = time.monotonic()
        with self._fleet_lock:
            if self._stopping.is_set():
                return
            for proc in [p for p in self.processes if p.poll() is not None]:
                self.processes.remove(proc)
                code = proc.returncode
                started, quick_before, env = self._lineage.pop(proc.pid, (None, 0, {}))
                lived = now - started if started is not None else float("inf")
                restart = self.restart_backoff.after_exit(lived, quick_before)
                if restart.delay_seconds <= 0:
                    new = self._spawn(env, restart.quick_exits)
                    self.replacements.append(WorkerReplacement(proc.pid, code, new.pid, 0.0))
                    say(f"local stack: worker {proc.pid} {describe_exit(code)}; worker {new.pid} replaces it")
                    continue
                self.backoffs.append(restart.delay_seconds)
                self._pending.append(
                    _Pending(now + restart.delay_seconds, proc.pid, code, restart.quick_exits,
                             restart.delay_seconds, env)
                )  # fmt: skip
                say(
                    f"local stack: worker {proc.pid} {describe_exit(code)} {lived:.1f}s after it started "
                    f"({restart.quick_exits} quick exits in a row): its replacement starts in "
                    f"{restart.delay_seconds:.0f}s"
                )
            for pending in [p for p in self._pending if p.due <= now]:
                self._pending.remove(pending)
                new = self._spawn(pending.env, pending.quick_exits)
                self.replacements.append(
                    WorkerReplacement(pending.exited, pending.returncode, new.pid, pending.delay_seconds)
                )
                say(f"local stack: worker {new.pid} replaces worker {pending.exited} after the back-off")

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
                self.swept += sweep(store, queues, stale_after=self.sweep_stale_after,
                                    default_max_running=self.settings.defaults.tenant_max_running,
                                    fleet_capacity=self.settings.defaults.fleet_capacity,
                                    tier_limits=self.settings.defaults.tier_limits()).swept  # fmt: skip
            except Exception:  # the store going away at shutdown, a moto hiccup: next round
                logging.getLogger("agentq.sweeper").warning("sweep failed", exc_info=True)

    def stop(self) -> None:
        # The workers are told first: each ends its long poll (up to a second) and its tasks at a
        # step boundary while the background loops here finish their own last poll. The
        # supervisor is stopped first, so the workers told to stop are not replaced.
        self._stopping.set()
        if self._supervisor is not None:
            self._supervisor.join(timeout=10)
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
        self.stop_hub()
        if self.api_server:
            self.api_server.stop()
        if self.issuer is not None:
            self.issuer.stop()
        self.moto.stop()
        if self._vault_dir is not None:
            shutil.rmtree(self._vault_dir, ignore_errors=True)

    def __enter__(self) -> LocalStack:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
