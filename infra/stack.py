"""The agentq stack. Resources arrive with the infrastructure issue; until then the stack
synthesizes empty rather than declaring anything the code does not use yet."""

from __future__ import annotations

from typing import Any

import aws_cdk as cdk
from constructs import Construct


class AgentqStack(cdk.Stack):
    def __init__(self, scope: Construct, construct_id: str, *, env_name: str, settings: dict[str, Any], **kwargs: Any) -> None:
        super().__init__(scope, construct_id, **kwargs)
        self.env_name = env_name
        self.settings = settings
        cdk.Tags.of(self).add("agentq:env", env_name)
