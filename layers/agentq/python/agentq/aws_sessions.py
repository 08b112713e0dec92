"""One boto3 session per process and setting, from which agentq makes its AWS clients
(``agentq.runtime``: the store, the queues, the fan-out, provisioning).

Why one: making a boto3 session costs ~12 ms of CPU (botocore registers its few hundred event
handlers), and its first client builds the session's credential resolver and endpoint
components again. The store, the queues and the fan-out each made a session of their own at a
worker's start or a Lambda's cold start, and the tests made one or two per test: in a
``make test`` profiled with py-spy, making sessions was 4.8 % of the xdist workers' CPU.

What stays as it was:

- **Each caller gets a client of its own.** A session is shared, its clients are not: a
  client's event hooks (a bench counting its calls) see only that client's calls. A boto3
  session is not thread-safe, so the clients asked of it are made under its lock; the clients
  themselves are. (botocore's own STS or SSO client for refreshing assumed-role credentials is
  made outside it, once the session's parts are built.) A caller must not change the session
  itself (register events or components, set credentials): every other caller would see it.
- **A change of credentials or configuration is seen by the next client**, as with a new
  session each time: the key is the region and what a botocore session reads once and keeps
  (its credentials, the profile's configuration): every ``AWS_*`` and ``BOTO_*`` variable, and
  the credentials and config files as they are on disk (path, size, modification time, inode).
  Credentials a ``credential_process`` prints without an expiry are read once per setting, not
  once per client.
- **A forked child makes its own**: a session's lock, or this module's, may be held by a thread
  of the parent that the child does not have.

Every session, whatever its key, shares one botocore data loader: the parsed service models,
endpoint rules and partitions (~60 ms per service to parse), which only read botocore's and
boto3's bundled data.
"""

from __future__ import annotations

import functools
import os
import threading
from typing import Any

import boto3
import botocore.session

SHARED_SESSIONS = 8  # settings kept at once; the least recently used is forgotten

SessionKey = tuple[object, ...]


class SharedSession(boto3.session.Session):
    """A boto3 session whose clients and resources are made one at a time (its lock), so any
    thread may ask it for one."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._making = threading.RLock()  # re-entrant: resource() makes its client through client()

    def client(self, *args: Any, **kwargs: Any) -> Any:
        with self._making:
            return super().client(*args, **kwargs)

    def resource(self, *args: Any, **kwargs: Any) -> Any:
        with self._making:
            return super().resource(*args, **kwargs)


_lock = threading.Lock()  # one session made at a time, so one per setting
_loader: Any = None  # botocore's data loader, shared by every session made here


def shared_session(region: str) -> SharedSession:
    """This process's session for ``region`` and the environment as it is now."""
    environment = _environment()
    with _lock:
        return _session(region, environment)


@functools.lru_cache(maxsize=SHARED_SESSIONS)
def _session(region: str, _: SessionKey) -> SharedSession:
    """A session on the shared data loader (the caller holds ``_lock``)."""
    global _loader
    core = botocore.session.get_session()
    if _loader is None:
        made = SharedSession(botocore_session=core, region_name=region)
        _loader = core.get_component("data_loader")
        return made
    core.register_component("data_loader", _loader)
    known = len(_loader.search_paths)
    made = SharedSession(botocore_session=core, region_name=region)
    del _loader.search_paths[known:]  # boto3 appends its data folder per session; the loader has it
    return made


def _environment() -> SessionKey:
    """What a botocore session reads once and keeps: the ``AWS_*`` and ``BOTO_*`` variables,
    and the shared credentials and config files as they are on disk."""
    read = ((k, os.environ.get(k)) for k in list(os.environ) if k.startswith(("AWS_", "BOTO_")))
    variables = tuple(sorted((k, v) for k, v in read if v is not None))  # one another thread removed: gone
    files: list[tuple[str, tuple[int, int, int] | None]] = []
    for variable, default in (
        ("AWS_SHARED_CREDENTIALS_FILE", "~/.aws/credentials"),
        ("AWS_CONFIG_FILE", "~/.aws/config"),
    ):
        path = os.path.expanduser(os.path.expandvars(os.environ.get(variable) or default))  # as botocore
        try:
            found = os.stat(path)
        except OSError:
            files.append((path, None))
        else:
            files.append((path, (found.st_size, found.st_mtime_ns, found.st_ino)))
    return (*variables, *files)


def _forget_in_child() -> None:
    global _lock
    _lock = threading.Lock()
    _session.cache_clear()


os.register_at_fork(after_in_child=_forget_in_child)
