"""The worker's tuning knobs, kept apart from the loop that uses them (as temporalio's
worker keeps ``_tuning.py``): what a deployment may change, with the reason for each default."""

from __future__ import annotations

from dataclasses import dataclass, field

from agentq.resources import QueueSettings

DEFAULT_WEIGHTS = {"high": 6, "normal": 3, "low": 1}


@dataclass(frozen=True)
class WorkerConfig:
    concurrency: int = 256
    # A dead worker's task is resumed once its message is visible again: within
    # ``visibility_seconds`` of its last heartbeat. The lease lapses a second earlier, so the
    # next receiver can claim at once. Cost: one lease write per task per heartbeat, less the
    # heartbeats a step commit makes unnecessary (it renews the lease in its own write).
    lease_seconds: float = 3.0
    heartbeat_seconds: float = 1.0
    visibility_seconds: int = 4
    poll_wait_seconds: int = 1
    max_receive_count: int = QueueSettings().max_receive_count
    weights: dict[str, int] = field(default_factory=lambda: dict(DEFAULT_WEIGHTS))
    drain_seconds: float = 60.0  # how long SIGTERM waits for steps in flight
    # Admission (see ``Admission``): hold at most what ``beat_threads`` lease writes at the
    # measured latency can extend in ``admission_safety`` x (lease - heartbeat) seconds, and
    # never fewer than ``admission_floor`` (or ``concurrency`` if that is lower).
    beat_threads: int = 16
    admission_safety: float = 0.5
    admission_floor: int = 8
