"""Whether a process of this host has ended: what the sweeps of a killed process's leftovers
(its workspace directories, its egress proxies' sockets) ask before removing anything. Only a
process known to be gone counts; a live one, or one this process may not signal, never does."""

from __future__ import annotations

import os


def gone(pid: int) -> bool:
    """True only when no process ``pid`` exists (``kill(pid, 0)`` says so); a pid later reused
    by another process reads as alive, so its leftovers wait (a leak, never a loss)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # alive, another user's
        return False
    return False
