"""The worker's side of the sandbox Lambda function: send the script, get the result.

The executor and the Fargate worker never run model-written code themselves in AWS; they
invoke the sandbox function (``functions/sandbox``), whose role can do nothing and whose
network leads nowhere. The transport is a plain callable (event in, response out), so this
module knows the request and response shapes, and ``lambda_invoker`` alone knows boto3.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from agentq.sandbox.base import ExecRequest, ExecResult, SandboxUnavailable

Invoke = Callable[[dict[str, Any]], dict[str, Any]]
INVOKE_READ_TIMEOUT_SECONDS = 150  # above the longest call (60 s) plus the function's cleanup and a cold start


class RemoteSandbox:
    name = "lambda"

    def __init__(self, invoke: Invoke, *, name: str = "lambda") -> None:
        self.invoke = invoke
        self.name = name

    def run(self, request: ExecRequest) -> ExecResult:
        try:
            response = self.invoke(request.to_json())
        except SandboxUnavailable:
            raise
        except Exception as exc:  # transport, throttling, a crashed environment: nothing to show
            raise SandboxUnavailable(
                f"the sandbox function could not run the code: {type(exc).__name__}: {exc}"
            ) from None
        if not isinstance(response, dict):
            raise SandboxUnavailable("the sandbox function answered with something other than a JSON object")
        if "error" in response:
            raise SandboxUnavailable(f"the sandbox function refused: {response['error']}")
        try:
            return ExecResult.from_json(response["result"])
        except (KeyError, TypeError, ValueError) as exc:
            raise SandboxUnavailable(f"the sandbox function's answer is malformed: {exc}") from None


def lambda_invoker(function_name: str, client: Any | None = None) -> Invoke:
    """A synchronous ``lambda:InvokeFunction`` of ``function_name``.

    No retries: a retried call would run the code twice, and the caller reports a failure
    to the model anyway. A function error (the handler crashed, or exited because it could
    not clean its environment) is a refusal, never a result.
    """
    clients = [client] if client is not None else []

    def lambda_client() -> Any:
        # Built on first use, not at start-up: an executor that never runs code pays nothing.
        if not clients:
            import boto3
            from botocore.config import Config

            config = Config(read_timeout=INVOKE_READ_TIMEOUT_SECONDS, retries={"total_max_attempts": 1})
            clients.append(boto3.client("lambda", config=config))
        return clients[0]

    def invoke(event: dict[str, Any]) -> dict[str, Any]:
        response = lambda_client().invoke(
            FunctionName=function_name, InvocationType="RequestResponse", Payload=json.dumps(event)
        )
        payload = response["Payload"].read()
        if response.get("FunctionError"):
            raise SandboxUnavailable(
                f"the sandbox function failed ({response['FunctionError']}): {payload[:500].decode('utf-8', 'replace')}"
            )
        answer: dict[str, Any] = json.loads(payload)
        return answer

    return invoke
