"""The long-running worker (what Fargate runs, and what runs locally): long-polls the tier
queues and runs many tasks at once in one process.

Agents spend their time waiting on LLMs and tools, so a task is a thread and a process holds
hundreds of them. Three pieces keep that cheap and fair:

- ``SlotPool``: the concurrency limit, shared by one poller per tier with weighted fair
  shares (high 6 : normal 3 : low 1 by default). Under contention a freed slot goes to the
  tier furthest below its share, so high goes first and low is never starved.
- ``HeartbeatHub``: one thread keeps every held task alive with one liveness write for the
  whole process per heartbeat (``storage.workers``), and hands on the tasks of a peer it finds
  dead (``queueing.recovery``); per task it writes only what is due (a long backstop lease,
  live text, a long message visibility in batches of 10).
- ``Admission``: the pool admits no more tasks than the hub can keep with the per-task writes
  it makes. It times the hub's own writes (the liveness renewal each round, backstop lease
  extensions) and caps what the pollers receive; what it does not take stays in SQS for
  another worker.
- graceful SIGTERM: polling stops, running tasks end at their next step boundary (the step in
  flight is committed), leases are released and each task gets a continuation message. A
  termination notice of the EC2 tier's scale-in (``agentq.scale_in``) drains the same way, then
  completes the lifecycle hook's action (``terminating`` tells the CLI to exit for good).

A worker of the workspace pool (``AGENTQ_QUEUE_POOL`` = ``AGENTQ_WORKSPACE_POOL``: the EC2 tier,
docs/SANDBOX.md) first runs a workspace sandbox (``sandbox.workspace.check_host``) and refuses
to start when it cannot: a host without user namespaces never claims a task it cannot run.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from agentq import observe
from agentq.core.engine import Engine, RunResult
from agentq.queueing._tuning import DEFAULT_WEIGHTS, WorkerConfig
from agentq.queueing.admission import Admission, LeaseWriteRate, SlotPool
from agentq.queueing.dispatch import Action
from agentq.queueing.heartbeat import HeartbeatHub
from agentq.queueing.queues import is_stale_receipt
from agentq.resources import TIERS
from agentq.runtime import Settings, build_dispatcher, build_engine, build_queues, build_store, client
from agentq.scale_in import ScaleIn

log = logging.getLogger("agentq.worker")

__all__ = [
    "DEFAULT_WEIGHTS",
    "Admission",
    "HeartbeatHub",
    "LeaseWriteRate",
    "SlotPool",
    "Worker",
    "WorkerConfig",
    "run_task",
    "worker_id",
]


def worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


class Worker:
    def __init__(self, settings: Settings, config: WorkerConfig = WorkerConfig(), engine: Engine | None = None) -> None:
        self.settings = settings
        self.config = config
        pool = config.concurrency + 32
        self.store = build_store(settings, pool=pool)
        self.queues = build_queues(settings, pool=pool)
        self.engine = engine or build_engine(
            settings,
            self.store,
            worker_id=worker_id(),
            pool=pool,
            lease_seconds=config.task_lease_seconds,
            heartbeat_seconds=config.heartbeat_seconds,
        )
        self.dispatcher = build_dispatcher(
            self.engine, self.store, self.queues, max_receive_count=config.max_receive_count,
            default_max_running=settings.defaults.tenant_max_running,
            fleet_capacity=settings.defaults.fleet_capacity,
            tier_limits=settings.defaults.tier_limits(),
        )  # fmt: skip
        self.hub = HeartbeatHub(self.store, self.queues, config, self.engine.worker_id)
        self.admission = Admission(config, self.hub.rate, demand=self.hub.demand)
        self.slots = SlotPool(config.concurrency, config.weights, limit=self.admission.limit)
        self.stopping = threading.Event()
        self._executor = ThreadPoolExecutor(max_workers=config.concurrency, thread_name_prefix="task")
        self._pollers: dict[str, threading.Thread] = {}  # by tier
        self._probing: set[str] = set()  # the tiers whose idle probe is waiting on SQS now
        self._checked = False  # the workspace pool's sandbox check passed
        self.processed = 0
        self.scale_in = ScaleIn(autoscaling=lambda: client(settings, "autoscaling"))
        self.terminating = threading.Event()  # drained for scale-in: the instance is going

    def stats(self) -> dict[str, Any]:
        """What admission and the heartbeat are doing, for logs, benchmarks and tests."""
        latency = self.hub.rate.latency
        per_second = self.hub.rate.per_second()
        with self.hub._lock:
            counts = dict(self.hub.counts)
        return {
            "concurrency": self.config.concurrency,
            "admission_limit": self.admission.limit(self.slots.busy),
            "admission_limit_min": self.admission.lowest,
            "admission_limit_max": self.admission.highest,
            "admitted": self.slots.busy,
            "held": self.hub.held,
            "held_max": self.hub.held_max,
            "lease_write_latency_s": None if latency is None else round(latency, 4),
            "lease_writes_per_s": None if per_second is None else round(per_second, 1),
            "lease_write_samples": self.hub.rate.samples,
            **{f"beat_{k}": v for k, v in sorted(counts.items())},
        }

    # ---------------------------------------------------------------- running

    def check_sandbox(self) -> None:
        """For the workspace pool's worker: the sandbox works here, or ``SandboxUnavailable``."""
        if self.queues.pool is not None and self.queues.pool == self.queues.workspace_pool and not self._checked:
            from agentq.sandbox.workspace import check_host

            check_host()
            self._checked = True

    def start(self) -> Worker:
        self.check_sandbox()  # before the heartbeat and the pollers: nothing is claimed if it fails
        self.hub.start()
        for tier in TIERS:
            thread = threading.Thread(target=self._poll, args=(tier,), name=f"poll-{tier}", daemon=True)
            thread.start()
            self._pollers[tier] = thread
        return self

    def serve_forever(self) -> None:
        """Run until SIGTERM/SIGINT, then drain."""
        signal.signal(signal.SIGTERM, lambda *_: self.stopping.set())
        signal.signal(signal.SIGINT, lambda *_: self.stopping.set())
        if self.scale_in.enabled:  # the EC2 tier: drain when the group scales this instance in
            self.scale_in.watch(self.stopping, self._drain_for_scale_in)
        self.start()
        last_flush = time.monotonic()
        while not self.stopping.wait(0.5):
            if time.monotonic() - last_flush > 60:
                observe.flush()
                last_flush = time.monotonic()
        self.shutdown()
        if self.terminating.is_set():
            self.scale_in.complete()

    def _drain_for_scale_in(self) -> None:
        self.terminating.set()
        self.stopping.set()

    def shutdown(self) -> None:
        """Stop polling; running tasks end at their next step boundary and hand their message back.

        A busy tier's receive ends within its short poll, and hands back what it got. An idle
        tier's probe may wait up to ``idle_poll_wait_seconds``: it is waited for only as long as
        a short poll (``poll_wait_seconds``) after the tasks here have handed their messages
        back, since SQS gives a waiting poll a message made visible, its own worker's included;
        a probe whose receive returned meanwhile is joined, and hands what it took back. One that
        takes a message as the process ends leaves it invisible for ``visibility_seconds``, as
        a dead worker's poll would (the local moto ends a poll whose client has gone before it
        takes anything)."""
        self.stopping.set()
        self._join_pollers(lambda tier: tier not in self._probing)
        self._executor.shutdown(wait=True, cancel_futures=False)
        returned = time.monotonic() + self.config.poll_wait_seconds
        self._join_pollers(lambda tier: tier not in self._probing or time.monotonic() < returned)
        self.hub.stop()
        observe.flush()

    def _join_pollers(self, waited_for: Callable[[str], bool]) -> None:
        """Join each poller while ``waited_for(tier)``, up to the short poll and its hand-back."""
        for tier, thread in self._pollers.items():
            deadline = time.monotonic() + self.config.poll_wait_seconds + 5
            while thread.is_alive() and waited_for(tier) and time.monotonic() < deadline:
                thread.join(timeout=0.05)

    # ---------------------------------------------------------------- polling

    def _poll(self, tier: str) -> None:
        url = self.queues.url(tier)
        idle = True  # an idle tier probes with one slot of its own, outside the pool's contest
        while not self.stopping.is_set():
            if not self.hub.alive():  # its liveness is not being renewed: take nothing new
                self.stopping.wait(self.config.heartbeat_seconds)
                continue
            probing = idle
            if probing:
                self.slots.probe(tier)
                granted = 1
            else:
                granted = self.slots.acquire(tier, 10, timeout=0.5)
            if not granted:
                continue
            if probing:
                self._probing.add(tier)
                if self.stopping.is_set():  # stopped as it began: the stop did not wait for it, so no poll
                    self._probing.discard(tier)
                    self.slots.end_probe(tier, 0)
                    return
            try:
                resp = self.queues.sqs.receive_message(
                    QueueUrl=url,
                    MaxNumberOfMessages=granted,
                    WaitTimeSeconds=self.config.idle_poll_wait_seconds if probing else self.config.poll_wait_seconds,
                    VisibilityTimeout=self.config.visibility_seconds,
                    AttributeNames=["ApproximateReceiveCount"],
                    MessageAttributeNames=["All"],
                )
            except Exception:
                if probing:
                    self.slots.end_probe(tier, 0)
                else:
                    self.slots.release(tier, granted)
                if self.stopping.is_set():  # e.g. a probe the stop did not wait for, its endpoint gone since
                    log.debug("receive failed on %s while stopping", tier, exc_info=True)
                    return
                log.exception("receive failed on %s", tier)
                time.sleep(1)
                continue
            finally:
                self._probing.discard(tier)
            messages = resp.get("Messages", [])
            if probing:
                self.slots.end_probe(tier, len(messages))
            else:
                self.slots.release(tier, granted - len(messages))
            idle = not messages
            for message in messages:
                if self.stopping.is_set():  # hand it straight back: another worker takes it now
                    self._safe(lambda m=message: self.queues.change_visibility(tier, m["ReceiptHandle"], 0))
                    self.slots.release(tier)
                    continue
                self._executor.submit(self._process, tier, message)

    def _process(self, tier: str, message: dict[str, Any]) -> None:
        if not self.hub.alive():  # received just before its liveness went stale: another worker takes it
            self._safe(lambda: self.queues.change_visibility(tier, message["ReceiptHandle"], 0))
            self.slots.release(tier)
            return
        try:
            with self.hub.hold(tier, message["ReceiptHandle"]) as held:
                action = self.dispatcher.handle(
                    message["Body"],
                    tier=tier,
                    receive_count=int(message.get("Attributes", {}).get("ApproximateReceiveCount", "1")),
                    attributes=message.get("MessageAttributes"),
                    keeper=lambda state: self.hub.track(held, state),
                    stop=self.stopping,
                    owner=self.hub.owner(held),
                )
        except Exception as exc:  # a bug or an outage: the message comes back after a pause
            log.exception("task message failed on %s", tier)
            action = Action("retry", f"worker error: {type(exc).__name__}: {exc}", delay_seconds=5)
        finally:
            self.slots.release(tier)
        self._apply(tier, message, action)
        self.processed += 1

    def _apply(self, tier: str, message: dict[str, Any], action: Action) -> None:
        receipt = message["ReceiptHandle"]
        if action.kind == "delete":
            self._safe(lambda: self.queues.delete(tier, receipt))
        elif action.kind == "retry":
            self._safe(lambda: self.queues.change_visibility(tier, receipt, action.delay_seconds))
        elif action.kind == "dead_letter":
            log.warning("dead-lettering message on %s: %s", tier, action.reason)
            try:
                self.queues.dead_letter(
                    tier, message["Body"], action.reason, message.get("MessageAttributes"),
                    dead_letter_id=action.dead_letter_id,
                )  # fmt: skip
            except Exception:  # not lost in the thread pool: neither sent nor deleted, it comes back
                log.exception("could not dead-letter a message on %s; it comes back after its visibility timeout", tier)
                return
            observe.record_dead_letter()
            self._safe(lambda: self.queues.delete(tier, receipt))

    @staticmethod
    def _safe(op: Any) -> None:
        try:
            op()
        except Exception as exc:
            if is_stale_receipt(exc):
                # Another receive of this message superseded ours (a takeover, or the message
                # was deleted through a duplicate's receipt): expected, one line, no traceback.
                log.info("SQS refused a superseded receipt handle: %s", exc)
                return
            log.exception("SQS call failed")


def run_task(
    task_id: str,
    *,
    settings: Settings | None = None,
    lease_seconds: float = 30.0,
    wait_seconds: float = 0.0,
    poll_seconds: float = 0.1,
) -> RunResult:
    """Run ``task_id`` in this process, no queue involved; if another worker's lease is live,
    retry the claim for up to ``wait_seconds`` (how a replacement picks up a dead one's task)."""
    settings = settings or Settings.from_env()
    store = build_store(settings)
    engine = build_engine(settings, store, worker_id=worker_id(), lease_seconds=lease_seconds)
    give_up = time.monotonic() + wait_seconds
    while True:
        result = engine.run(task_id)
        if result.outcome == "deferred":  # a lost lease's call may still complete: wait it out
            wait = float((result.error or {}).get("retry_after") or poll_seconds)
            if time.monotonic() + wait > give_up:
                return result
            time.sleep(wait)
            continue
        if result.outcome != "not_claimed":
            return result
        status = store.tasks.get(task_id).status
        if status.terminal:
            result.status = status  # nothing left to do: a queue consumer deletes the message
            return result
        if time.monotonic() >= give_up:
            return result
        time.sleep(poll_seconds)
