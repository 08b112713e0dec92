"""The Step Functions adapter of the fan-out: start the execution that runs a parent's
children, and report a child's end through its callback token."""

from __future__ import annotations

import hashlib
import json
import logging
import re
from typing import Any

from botocore.exceptions import ClientError

from agentq.core.call_keys import OWN_KEYS
from agentq.core.fanout import ChildRun
from agentq.core.models import Task, TaskStatus
from agentq.queueing.queues import TaskQueues

log = logging.getLogger("agentq.stepfunctions")


def execution_name(parent_id: str, spawn_id: str) -> str:
    """The name of the spawn's execution: deterministic (a retried or a zombie's start answers
    ExecutionAlreadyExists and finds the same execution), unique per spawn (the name is the
    execution's for 90 days, ended or not), at most 80 characters of ``[A-Za-z0-9_-]`` (Step
    Functions' limit, and the names CloudWatch logs).

    A key agentq names (``agentq-<step>-<id>``, core.call_keys: a spawn under an id an earlier
    call used) is named from its hash: its last 40 characters would drop the ``<step>`` of a
    long id and hand the second spawn the first one's execution. Its 47-character tail is longer
    than any other name's (at most 40), so it shares no name with one. Any other key keeps the
    name it always had, so a start a worker began before this naming still finds its execution."""
    own = spawn_id.startswith(OWN_KEYS)
    tail = "q" + hashlib.sha256(spawn_id.encode()).hexdigest()[:46] if own else spawn_id[-40:]
    return re.sub(r"[^A-Za-z0-9_-]", "-", f"{parent_id[:32]}-{tail}")[:80]


class StepFunctionsFanout:
    def __init__(self, sfn: Any, state_machine_arn: str, queues: TaskQueues) -> None:
        self.sfn = sfn
        self.state_machine_arn = state_machine_arn
        self.queues = queues

    def start(self, *, parent: Task, spawn_id: str, children: list[ChildRun], max_concurrency: int) -> str:
        tier = parent.submission.priority
        name = execution_name(parent.task_id, spawn_id)
        payload = {
            "parent_id": parent.task_id,
            "spawn_id": spawn_id,
            "children": [{"task_id": task_id, "timeout_seconds": timeout} for task_id, timeout in children],
            "max_concurrency": max_concurrency,
            "child_queue_url": self.queues.url(tier),
            "parent_queue_url": self.queues.url(tier),
            "tenant": parent.tenant,  # every message's fair-queue group (MessageGroupId)
        }
        try:
            return str(
                self.sfn.start_execution(stateMachineArn=self.state_machine_arn, name=name, input=json.dumps(payload))[
                    "executionArn"
                ]
            )
        except ClientError as exc:
            if exc.response["Error"]["Code"] != "ExecutionAlreadyExists":
                raise
            return self.state_machine_arn.replace(":stateMachine:", ":execution:") + f":{name}"

    def child_finished(self, task_token: str, task_id: str, status: TaskStatus) -> None:
        try:
            self.sfn.send_task_success(
                taskToken=task_token, output=json.dumps({"task_id": task_id, "status": status.value})
            )
        except ClientError as exc:  # already reported, or the iteration timed out: nothing to do
            log.info("send_task_success for %s: %s", task_id, exc.response["Error"]["Code"])

    def stop(self, execution_arn: str, cause: str) -> None:
        try:
            self.sfn.stop_execution(executionArn=execution_arn, cause=cause[:32768])
        except ClientError as exc:
            log.info("stop_execution %s: %s", execution_arn, exc.response["Error"]["Code"])
