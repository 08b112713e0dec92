"""Whether a process of this host has ended: what the sweeps of a killed process's leftovers
(its workspace directories, its egress proxies' sockets) ask before removing anything. Only a
process known to be gone counts; a live one, or one this process may not signal, never does."""

from __future__ import annotations

import os
import re


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


def left_by_gone(directory: str | os.PathLike[str], named: re.Pattern[str]) -> list[str]:
    """The names in ``directory`` that ``named`` matches whose pid (its first group) is
    ``gone``: what killed processes left there; none when the directory is not there."""
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return []
    return [name for name in names if (found := named.match(name)) is not None and gone(int(found.group(1)))]
