"""The worker's tuning knobs, kept apart from the loop that uses them (as temporalio's
worker keeps ``_tuning.py``): what a deployment may change, with the reason for each default."""

from __future__ import annotations

from dataclasses import dataclass, field

from agentq.resources import QueueSettings

DEFAULT_WEIGHTS = {"high": 6, "normal": 3, "low": 1}


@dataclass(frozen=True)
class WorkerConfig:
    concurrency: int = 256
    # The worker process's liveness (``storage.workers``): renewed every heartbeat, one write
    # per process whatever it holds. A peer that sees it stand still for ``lease_seconds`` of
    # its own clock hands its tasks on (``queueing.recovery``): a dead worker's task resumes
    # within about lease + heartbeat + a receive.
    lease_seconds: float = 3.0
    heartbeat_seconds: float = 1.0
    # A received message not yet claimed is kept invisible this long at a time.
    visibility_seconds: int = 4
    # A claimed task's own lease, a backstop under the worker's liveness: renewed (a write)
    # only when half of it is left, so a task that waits on a model call costs no write.
    task_lease_seconds: float = 600.0
    # While a held task's shell may reach the network (``LeaseState.reaching_since``), its META is
    # read this often (one BatchGetItem a round for up to 100 such tasks, no write), so a stop's
    # mark (or a cancel, a takeover) kills that shell within this and a round, not when the lease
    # write above next comes due (up to half of ``task_lease_seconds``, against a shell's 600 s).
    stop_look_seconds: float = 2.0
    # A claimed task's message stays invisible this long, extended in batches of 10 when half
    # is left; a dead worker's are made visible again at once by whoever notices.
    held_visibility_seconds: int = 600
    # A receive's long poll. A busy tier's holds the slots it asked for while it waits, so it
    # is short: another tier's message does not wait for them. An idle tier probes with one
    # slot of its own (``SlotPool.probe``) and waits as long as SQS lets it: an idle worker then
    # makes 9 receives a minute, not 180 (at $0.40 a million, $0.16 a worker-month, not $3.11),
    # and an idle local stack of two workers costs 8.9 % of a core, not 13.8 %
    # (bench/idle_cost.py). The price: a worker paused or cut off with its connection open (not
    # a killed one) may take one message a tier that a peer hands on from it, which then comes
    # back after ``visibility_seconds`` (docs/ARCHITECTURE.md, "Polling").
    poll_wait_seconds: int = 1
    idle_poll_wait_seconds: int = 20
    max_receive_count: int = QueueSettings().max_receive_count
    weights: dict[str, int] = field(default_factory=lambda: dict(DEFAULT_WEIGHTS))
    drain_seconds: float = 60.0  # how long SIGTERM waits for steps in flight
    # Admission (see ``Admission``): hold at most what ``beat_threads`` lease writes at the
    # measured latency can extend in ``admission_safety`` x (lease - heartbeat) seconds, and
    # never fewer than ``admission_floor`` (or ``concurrency`` if that is lower).
    beat_threads: int = 16
    admission_safety: float = 0.5
    admission_floor: int = 8
