"""Policies: rules a platform team writes in Cedar, checked before every tool call, MCP call,
spawn and model call of the engine (docs/POLICIES.md).

- ``schema``: the Cedar schema a rule is validated against (what a rule sees);
- ``rules``: a document checked at write time (parses, validates, agentq's conventions);
- ``evaluate``: the stored documents compiled into one policy set, and a call's ``Verdict``;
- ``request``: a call, its principal and its task's history as one Cedar request.
"""

from agentq.core.policies.evaluate import ALLOWED, Hit, PolicyDocument, RuleSet, Verdict
from agentq.core.policies.request import CallKind, PolicyCall, Principal, TaskFacts, request
from agentq.core.policies.rules import SCOPE_PATTERN, CheckedDocument, check, check_scope
from agentq.core.policies.schema import SCHEMA

__all__ = [
    "ALLOWED",
    "SCHEMA",
    "SCOPE_PATTERN",
    "CallKind",
    "CheckedDocument",
    "Hit",
    "PolicyCall",
    "PolicyDocument",
    "Principal",
    "RuleSet",
    "TaskFacts",
    "Verdict",
    "check",
    "check_scope",
    "request",
]
