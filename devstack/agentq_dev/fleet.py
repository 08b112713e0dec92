"""How the local stack keeps its worker processes up, as a fleet is kept in AWS: a worker that
exits is replaced, so SIGKILLing one (to watch its task resume, the product's main promise)
leaves the API and the other workers running and the fleet at its size.

A worker that dies soon after it started, over and over (a tool module that no longer imports,
a bad setting), would otherwise be restarted as fast as it dies. ``RestartBackoff`` counts such
quick exits per line of replacements and delays the next start, doubling up to a minute: the
stack says so once per exit and never spins. A worker that stayed up past ``grace_seconds``
ends its line's count, so the replacement of a healthy worker killed later starts at once.
"""

from __future__ import annotations

import signal
from dataclasses import dataclass

GRACE_SECONDS = 10.0  # a worker that exits sooner is counted as dying at start
QUICK_EXITS_BEFORE_BACKOFF = 1  # the first quick exit is replaced at once (a kill right after a start)
FIRST_DELAY_SECONDS = 1.0
MAX_DELAY_SECONDS = 60.0


def describe_exit(returncode: int) -> str:
    """``killed by SIGKILL`` or ``exited with code 2``: what ended a worker process."""
    if returncode < 0:
        try:
            return f"killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    return f"exited with code {returncode}"


@dataclass(frozen=True)
class Restart:
    """When to start a dead worker's replacement, and how many quick exits led there."""

    delay_seconds: float
    quick_exits: int  # consecutive exits within the grace period in this line of workers


@dataclass(frozen=True)
class RestartBackoff:
    grace_seconds: float = GRACE_SECONDS
    quick_exits_before_backoff: int = QUICK_EXITS_BEFORE_BACKOFF
    first_delay_seconds: float = FIRST_DELAY_SECONDS
    max_delay_seconds: float = MAX_DELAY_SECONDS

    def after_exit(self, lived_seconds: float, quick_exits_before: int) -> Restart:
        """The restart of a worker that lived ``lived_seconds`` and whose predecessors had
        exited quickly ``quick_exits_before`` times in a row."""
        if lived_seconds >= self.grace_seconds:
            return Restart(0.0, 0)
        quick = quick_exits_before + 1
        over = quick - self.quick_exits_before_backoff
        if over <= 0:
            return Restart(0.0, quick)
        return Restart(min(self.max_delay_seconds, self.first_delay_seconds * 2 ** (over - 1)), quick)
