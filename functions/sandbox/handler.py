"""The sandbox Lambda function: runs one model-written Python script per invocation.

The executor and the Fargate worker invoke it synchronously (``agentq.sandbox.remote``);
nothing else may. The function is the trust boundary: its role grants nothing but writing
its own logs, it sits in a VPC subnet with no route anywhere, its root filesystem is
read-only. Inside, ``agentq.sandbox.host`` runs the script in a locked-down child process and
leaves the environment as it found it; if it cannot, this process exits, so Lambda throws
the environment away instead of handing it to the next caller.

Event: ``{"code": str, "timeout_seconds": number, "memory_mb": int}``. Answer:
``{"result": ExecResult}``, or ``{"error": reason}`` when the input is unusable or the
sandbox could not be set up (the code did not run).
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Any

from agentq.sandbox.base import ExecRequest, SandboxLimits, SandboxUnavailable
from agentq.sandbox.host import EnvironmentDirty, ScratchRunner, harden_process

logger = logging.getLogger("agentq.sandbox")
logger.setLevel(logging.INFO)

MAX_TIMEOUT_SECONDS = 60.0
MEMORY_MB = (64, 2048)
CLEANUP_MARGIN_MS = 5_000  # killing leftovers and emptying /tmp after the run

harden_process()  # fail the cold start rather than run code in a process that could be read
LIMITS = SandboxLimits(
    max_files=int(os.environ.get("AGENTQ_SANDBOX_MAX_FILES", SandboxLimits.max_files)),
    max_disk_bytes=int(os.environ.get("AGENTQ_SANDBOX_MAX_DISK_MB", SandboxLimits.max_disk_bytes // 2**20)) * 2**20,
)
RUNNER = ScratchRunner(os.environ.get("AGENTQ_SANDBOX_ROOT", "/tmp"), LIMITS)


def parse(event: Any) -> ExecRequest | str:
    """The request, or what is wrong with it (naming the field)."""
    if not isinstance(event, dict):
        return "the event must be a JSON object"
    code, timeout, memory = event.get("code"), event.get("timeout_seconds"), event.get("memory_mb")
    if not isinstance(code, str) or not code:
        return "code: a non-empty string is required"
    if len(code.encode("utf-8")) > LIMITS.max_code_bytes:
        return f"code: at most {LIMITS.max_code_bytes} bytes"
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 0 < timeout <= MAX_TIMEOUT_SECONDS:
        return f"timeout_seconds: a number in (0, {MAX_TIMEOUT_SECONDS:g}] is required"
    if isinstance(memory, bool) or not isinstance(memory, int) or not MEMORY_MB[0] <= memory <= MEMORY_MB[1]:
        return f"memory_mb: an integer in [{MEMORY_MB[0]}, {MEMORY_MB[1]}] is required"
    return ExecRequest(code=code, timeout_seconds=float(timeout), memory_mb=memory)


def lambda_handler(event: Any, context: Any) -> dict[str, Any]:
    request = parse(event)
    if isinstance(request, str):
        return {"error": request}
    if context is not None:
        left = (context.get_remaining_time_in_millis() - CLEANUP_MARGIN_MS) / 1000
        if left <= 0:
            return {"error": "the invocation has no time left to run code"}
        request = ExecRequest(request.code, min(request.timeout_seconds, left), request.memory_mb)
    try:
        result = RUNNER.run(request)
    except SandboxUnavailable as exc:
        return {"error": str(exc)}
    except EnvironmentDirty as exc:
        # The environment may carry something into the next call: end it, unanswered.
        sys.stderr.write(f"agentq sandbox: the environment could not be cleaned, exiting: {exc}\n")
        sys.stderr.flush()
        os._exit(70)
    logger.info(
        "ran code: exit %s, %d ms, timed_out=%s, limit=%s",
        result.exit_code,
        result.duration_ms,
        result.timed_out,
        result.limit,
    )
    return {"result": result.to_json()}
