"""Scale-in that loses no step: how a worker of the EC2 workspace tier leaves an instance the
Auto Scaling group is terminating (docs/SANDBOX.md "Scale-in").

The group has a termination lifecycle hook (``infra/workspace_tier_access.py``): an instance it
scales in waits in ``Terminating:Wait`` instead of being stopped at once. The worker polls the
instance's *target lifecycle state* from IMDSv2 (``/latest/meta-data/autoscaling/
target-lifecycle-state``, every ``POLL_SECONDS``); when it reads ``Terminated`` it drains as on
SIGTERM (``agentq.worker``): it claims nothing more, each running task ends at its next step
boundary (the step in flight commits), releases its lease and gets a continuation message
another instance takes at once. Then it completes the hook's lifecycle action (``CONTINUE``) so
the instance goes now rather than at the hook's timeout, and exits ``TERMINATING_EXIT``, which
the unit does not restart. A worker that cannot complete the action (no permission, an API
error) only logs it: the hook's timeout ends the wait, with the same result.

Why IMDS and not a signal from an EventBridge rule or SSM: the worker needs no inbound path, no
extra service and no permission to learn of its own termination, and the state is there as long
as the instance is; the hop limit of 1 keeps it from the sandboxes. A worker whose IMDS cannot
be read (the local stack) sees no notice and runs as before.
"""

from __future__ import annotations

import logging
import os
import threading
import urllib.request
from collections.abc import Callable
from typing import Any

log = logging.getLogger("agentq.scale_in")

TERMINATING_EXIT = 75  # the worker drained for scale-in (EX_TEMPFAIL): systemd must not restart it
HOOK_VARIABLE = "AGENTQ_LIFECYCLE_HOOK"  # infra/workspace_unit.py sets both on the EC2 tier
GROUP_VARIABLE = "AGENTQ_AUTOSCALING_GROUP"
POLL_VARIABLE = "AGENTQ_TERMINATION_POLL_SECONDS"
ENDPOINT_VARIABLE = "AWS_EC2_METADATA_SERVICE_ENDPOINT"  # the SDKs' own variable for IMDS
DEFAULT_ENDPOINT = "http://169.254.169.254/"
POLL_SECONDS = 5.0
TERMINATED = "Terminated"
STATE_PATH = "latest/meta-data/autoscaling/target-lifecycle-state"
INSTANCE_ID_PATH = "latest/meta-data/instance-id"
TOKEN_PATH = "latest/api/token"
TOKEN_TTL_SECONDS = 300


class InstanceMetadata:
    """IMDSv2: a session token (PUT), then each read with it. None when IMDS does not answer."""

    def __init__(self, endpoint: str | None = None, timeout: float = 2.0) -> None:
        self.endpoint = (endpoint or os.environ.get(ENDPOINT_VARIABLE) or DEFAULT_ENDPOINT).rstrip("/") + "/"
        self.timeout = timeout

    def _token(self) -> str:
        request = urllib.request.Request(
            self.endpoint + TOKEN_PATH, method="PUT",
            headers={"X-aws-ec2-metadata-token-ttl-seconds": str(TOKEN_TTL_SECONDS)},
        )  # fmt: skip
        with urllib.request.urlopen(request, timeout=self.timeout) as resp:
            return str(resp.read().decode())

    def get(self, path: str) -> str | None:
        try:
            request = urllib.request.Request(self.endpoint + path, headers={"X-aws-ec2-metadata-token": self._token()})
            with urllib.request.urlopen(request, timeout=self.timeout) as resp:
                return str(resp.read().decode()).strip()
        except OSError:
            return None


class ScaleIn:
    """Watches for the termination notice and completes the lifecycle action after the drain.
    ``enabled`` only where the deployment names a hook (the EC2 tier's unit)."""

    def __init__(
        self,
        *,
        hook: str | None = None,
        group: str | None = None,
        metadata: InstanceMetadata | None = None,
        poll_seconds: float | None = None,
        autoscaling: Callable[[], Any] | None = None,  # () -> a boto3 autoscaling client
    ) -> None:
        self.hook = hook if hook is not None else os.environ.get(HOOK_VARIABLE) or None
        self.group = group if group is not None else os.environ.get(GROUP_VARIABLE) or None
        self.metadata = metadata or InstanceMetadata()
        self.poll_seconds = poll_seconds or float(os.environ.get(POLL_VARIABLE) or POLL_SECONDS)
        self.autoscaling = autoscaling
        self.noticed = threading.Event()

    @property
    def enabled(self) -> bool:
        return self.hook is not None and self.group is not None

    def watch(self, stop: threading.Event, on_notice: Callable[[], None]) -> threading.Thread:
        """Poll the target lifecycle state until it says ``Terminated`` (then ``on_notice``) or ``stop``."""

        def run() -> None:
            while not stop.is_set():
                if self.metadata.get(STATE_PATH) == TERMINATED:
                    log.warning("termination notice: the instance is being scaled in; draining (hook %s)", self.hook)
                    self.noticed.set()
                    on_notice()
                    return
                stop.wait(self.poll_seconds)

        thread = threading.Thread(target=run, name="scale-in", daemon=True)
        thread.start()
        return thread

    def complete(self) -> bool:
        """After the drain: let the group terminate the instance now (``CONTINUE``)."""
        instance = self.metadata.get(INSTANCE_ID_PATH)
        if not (self.enabled and instance and self.autoscaling is not None):
            log.warning("drained; lifecycle action not completed (instance %s): the hook's timeout ends it", instance)
            return False
        try:
            self.autoscaling().complete_lifecycle_action(
                LifecycleHookName=self.hook, AutoScalingGroupName=self.group,
                LifecycleActionResult="CONTINUE", InstanceId=instance,
            )  # fmt: skip
        except Exception as exc:
            log.warning("drained; completing the lifecycle action of %s failed (%s): the hook's timeout ends it",
                        instance, exc)  # fmt: skip
            return False
        log.warning("drained; lifecycle action of %s completed: the instance terminates now", instance)
        return True
