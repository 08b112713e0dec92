"""Where model-written code runs: isolated from the worker, its credentials and the network.

``CodeSandbox`` is the seam ``python_exec`` calls. ``BwrapSandbox`` isolates on the worker's
own host with bubblewrap; ``RemoteSandbox`` sends the code to the sandbox Lambda function
(``functions/sandbox``), which runs it with ``agentq.sandbox.host``. ``sandbox_from_env``
picks one from the deployment's configuration. Every implementation refuses to run code it
cannot isolate (``SandboxUnavailable``). The threat model is in docs/SANDBOX.md.

A leaf package: the standard library only (boto3 on demand for the Lambda client), so the
sandbox function imports it without the rest of agentq.
"""

from agentq.sandbox.base import (
    CodeSandbox,
    ExecRequest,
    ExecResult,
    RefusingSandbox,
    SandboxLimits,
    SandboxUnavailable,
)

__all__ = [
    "CodeSandbox",
    "ExecRequest",
    "ExecResult",
    "RefusingSandbox",
    "SandboxLimits",
    "SandboxUnavailable",
]
