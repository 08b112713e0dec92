"""Per-task credentials for a task's workspace objects: the EC2 tier's least privilege.

The EC2 workspace tier runs many tenants' tasks on one instance. Its instance role must not reach
workspace objects itself (``infra/workspace_tier.py`` denies ``tasks/*/workspace/*`` to it);
instead, when a run touches a task's workspace content, the worker assumes the tier's narrow
workspace role (``AGENTQ_WORKSPACE_ROLE_ARN``) with a *session policy* naming only that task's
prefix (read and write) and the prefixes its starting content is looked up under (read only: a
sub-agent's ancestors, its tenant's uploads; ``core.workspace.lookup_of``). A session's
permissions are the intersection of the role's policy and the session policy, so a bug that
names another task's key in this task's run is refused by S3, not by our code.

Credentials are cached per task until ``REFRESH_SECONDS`` before they expire, so a run makes one
``sts:AssumeRole`` per claim and hour, not one per object. Without the variable (the local stack,
Lambda, Fargate) ``build_store`` keeps the plain ``WorkspaceObjects``.

Two consequences of the narrow grant, handled here:

- No ``s3:ListBucket``: S3 answers a GetObject of a missing key with 403, not 404, to a principal
  that may not list. Under a session whose policy allows reading the key, a 403 is "absent" (or a
  denial only an operator can fix), so it is reported as ``MissingObject`` naming both: the
  lookup falls through to the next owner as it does on a 404, and a restore that finds nothing
  fails ``workspace_restore_failed`` naming the key.
- A session policy's plain text is at most ``MAX_POLICY_CHARS``. A deep chain of ancestors with
  long caller-chosen ids can exceed it: then the read-only statement widens to every task's
  workspace prefix (the role's own read scope) and the write grant stays this task's only; the
  widening is logged. uuid task ids fit at the deepest spawn depth (tests/test_workspace_access.py).
"""

from __future__ import annotations

import json
import logging
import re
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from agentq.core.ports import Readable
from agentq.storage.serdes import MissingObject, Payloads
from agentq.storage.workspaces import WorkspaceObjects, owner_prefix, workspace_prefix

log = logging.getLogger("agentq.storage")

ROLE_VARIABLE = "AGENTQ_WORKSPACE_ROLE_ARN"
DURATION_SECONDS = 3600  # the role's default maximum session
REFRESH_SECONDS = 300  # renewed this long before they expire: a call never starts on spent ones
MAX_POLICY_CHARS = 2048  # STS: a session policy's plain text
# What may appear in a prefix a session policy names: a task id (api.models TASK_ID_PATTERN, uuid
# hex when generated) and a tenant (storage.api_keys.TENANT_PATTERN). Nothing here is an IAM
# wildcard (``*``, ``?``) or a policy variable (``${``): a name can never widen its own grant.
_NAME = re.compile(r"[A-Za-z0-9._-]{1,128}")
_SESSION_NAME = re.compile(r"[^\w+=,.@-]")

T = TypeVar("T")
Credentials = dict[str, Any]  # sts:AssumeRole's Credentials: AccessKeyId, SecretAccessKey, SessionToken, Expiration


def _checked(name: str) -> str:
    """``name`` (a task id, a tenant) as a policy may name it, else ValueError."""
    if not _NAME.fullmatch(name):
        raise ValueError(f"a name a workspace session policy cannot carry: {name!r}")
    return name


def _owner(owner: str) -> str:
    return owner_prefix(f"{owner.partition(':')[0]}:{_checked(owner.partition(':')[2])}")


def session_policy(bucket: str, task_id: str, lookup: Sequence[str] = (), *, partition: str = "aws") -> dict[str, Any]:
    """The session policy of ``task_id``'s workspace credentials: read and write under its own
    workspace prefix, read under each owner of ``lookup``, nothing else (no list, no delete)."""
    arn = f"arn:{partition}:s3:::{bucket}/"
    own = arn + workspace_prefix(_checked(task_id)) + "*"
    reads = sorted({arn + _owner(o) + "*" for o in lookup} - {own})
    statements: list[dict[str, Any]] = [
        {"Sid": "OwnWorkspace", "Effect": "Allow", "Action": ["s3:GetObject", "s3:PutObject"], "Resource": own}
    ]
    if reads:
        statements.append({"Sid": "StartingContent", "Effect": "Allow", "Action": "s3:GetObject", "Resource": reads})
    policy = {"Version": "2012-10-17", "Statement": statements}
    if len(policy_text(policy)) > MAX_POLICY_CHARS:
        log.warning("workspace session policy of task %s over %d chars: its reads widen to every task's workspace",
                    task_id, MAX_POLICY_CHARS)  # fmt: skip
        statements[1]["Resource"] = arn + "tasks/*/workspace/*"
    return policy


def policy_text(policy: dict[str, Any]) -> str:
    return json.dumps(policy, separators=(",", ":"))


def session_name(task_id: str) -> str:
    """The role session's name (CloudTrail shows it): the task's id, as STS allows it."""
    return _SESSION_NAME.sub("_", f"task-{task_id}")[:64]


class ScopedWorkspaceObjects(WorkspaceObjects):
    """``WorkspaceObjects`` whose reads and writes of a task's workspace run with credentials
    scoped to that task (``session_policy``). ``payloads_for(credentials)`` builds the payload
    store those credentials sign for; ``assume(task_id, policy_text)`` returns them."""

    def __init__(
        self,
        payloads: Payloads,
        *,
        bucket: str,
        assume: Callable[[str, str], Credentials],
        payloads_for: Callable[[Credentials], Payloads],
        partition: str = "aws",
        clock: Callable[[], float] = time.time,
    ) -> None:
        super().__init__(payloads)
        self.bucket = bucket
        self.partition = partition
        self._assume = assume
        self._payloads_for = payloads_for
        self._clock = clock
        self._lock = threading.Lock()
        self._cached: dict[str, tuple[frozenset[str], float, WorkspaceObjects]] = {}
        self.assumed = 0  # sts:AssumeRole calls made (tests, benchmarks)

    def objects(self, task_id: str, lookup: Sequence[str] = ()) -> WorkspaceObjects:
        """The task's objects under credentials that cover ``lookup``: cached, else assumed."""
        now = self._clock()
        with self._lock:
            for key in [k for k, (_, expires, _) in self._cached.items() if expires - REFRESH_SECONDS <= now]:
                del self._cached[key]  # spent (or about to be): a task that runs on assumes afresh
            cached = self._cached.get(task_id)
            if cached is not None and cached[0] >= frozenset(lookup):
                return cached[2]
            owners = frozenset(lookup) | (cached[0] if cached is not None else frozenset())
        policy = session_policy(self.bucket, task_id, sorted(owners), partition=self.partition)
        credentials = self._assume(task_id, policy_text(policy))
        expires = credentials["Expiration"]
        expires_at = expires.timestamp() if hasattr(expires, "timestamp") else now + DURATION_SECONDS
        objects = WorkspaceObjects(_MissingOnDenied(self._payloads_for(credentials)))
        with self._lock:
            self.assumed += 1
            self._cached[task_id] = (owners, expires_at, objects)
        return objects

    def put_blob(self, task_id: str, digest: str, data: bytes | Readable) -> bool:
        return self.objects(task_id).put_blob(task_id, digest, data)

    def get_blob(self, task_id: str, digest: str, lookup: Sequence[str] = ()) -> bytes:
        return self.objects(task_id, lookup).get_blob(task_id, digest, lookup)

    def open_blob(self, task_id: str, digest: str, lookup: Sequence[str] = ()) -> Readable:
        return self.objects(task_id, lookup).open_blob(task_id, digest, lookup)

    def put_manifest(self, task_id: str, digest: str, data: bytes) -> None:
        self.objects(task_id).put_manifest(task_id, digest, data)

    def get_manifest(self, task_id: str, digest: str, lookup: Sequence[str] = ()) -> bytes:
        return self.objects(task_id, lookup).get_manifest(task_id, digest, lookup)


class _MissingOnDenied:
    """A payload store whose GetObject 403 (no ``s3:ListBucket``: how S3 reports a missing key to
    this session) is ``MissingObject``; everything else passes through."""

    def __init__(self, inner: Payloads) -> None:
        self._inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def get_bytes(self, key: str) -> bytes:
        return self._denied_missing(key, self._inner.get_bytes)

    def open_bytes(self, key: str) -> Readable:
        return self._denied_missing(key, self._inner.open_bytes)

    @staticmethod
    def _denied_missing(key: str, read: Callable[[str], T]) -> T:
        try:
            return read(key)
        except MissingObject:
            raise
        except Exception as exc:
            code = getattr(exc, "response", {}).get("Error", {}).get("Code")
            if code in ("AccessDenied", "403", "Forbidden"):
                raise MissingObject(f"{key} (absent, or denied to this task's workspace credentials)") from None
            raise
