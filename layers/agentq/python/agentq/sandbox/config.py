"""Which sandbox a deployment uses, from its environment.

``AGENTQ_SANDBOX``:

- ``bwrap`` (the default): bubblewrap on the worker's host (local stack, a worker on a VM);
- ``lambda``: the sandbox Lambda function named by ``AGENTQ_SANDBOX_FUNCTION`` (what the CDK
  stack sets for the Lambda executor and the Fargate worker, where namespaces are not allowed);
- ``off``: code execution refused, in a task's workspace too (``shell`` and ``python_exec``
  check it there: ``core.tools.workspace.check_code_allowed``); the file tools stay.

A setting that cannot be used gives a sandbox that refuses every call and says why, rather
than an exception at start-up: the other tools keep working, and ``python_exec`` answers the
model with the reason.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from agentq.sandbox.base import CodeSandbox, RefusingSandbox

SANDBOX_VARIABLE = "AGENTQ_SANDBOX"
FUNCTION_VARIABLE = "AGENTQ_SANDBOX_FUNCTION"
CHOICES = ("bwrap", "lambda", "off")


def sandbox_from_env(env: Mapping[str, str] | None = None) -> CodeSandbox:
    env = os.environ if env is None else env
    kind = (env.get(SANDBOX_VARIABLE) or "bwrap").strip().lower()
    if kind == "bwrap":
        from agentq.sandbox.bwrap import BwrapSandbox

        return BwrapSandbox()
    if kind == "lambda":
        function = (env.get(FUNCTION_VARIABLE) or "").strip()
        if not function:
            return RefusingSandbox(f"{SANDBOX_VARIABLE}=lambda needs {FUNCTION_VARIABLE} (the sandbox function's name)")
        from agentq.sandbox.remote import RemoteSandbox, lambda_invoker

        return RemoteSandbox(lambda_invoker(function))
    if kind == "off":
        return RefusingSandbox("code execution is turned off in this deployment")
    return RefusingSandbox(f"{SANDBOX_VARIABLE}={kind!r} is not a sandbox this worker knows ({', '.join(CHOICES)})")
