"""Policy documents as the API and the CLI manage them: write one (checked first: nothing broken
is stored), read them, and test one against a sample call without running anything.

A write is checked in full before anything is stored (``core.policies.check``): a document that
does not parse, does not validate against the published schema, or breaks agentq's conventions
is a ``ValidationError`` naming ``policies`` (422), an unknown scope one naming ``scope``. A
rule that forbids everything is stored, with a warning in the answer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from agentq.core.policies import (
    PolicyCall,
    PolicyDocument,
    Principal,
    RuleSet,
    TaskFacts,
    Verdict,
    check,
    check_scope,
    request,
)
from agentq.storage.container import Storage


@dataclass(frozen=True)
class PolicyWrite:
    document: PolicyDocument
    created: bool
    warnings: tuple[str, ...]


def put_policy(store: Storage, tenant: str, scope: str, text: str, *, by: str | None = None) -> PolicyWrite:
    check_scope(scope)
    checked = check(text)
    document, created = store.policies.put(tenant, scope, text, checked.digest, by=by)
    return PolicyWrite(document, created, checked.warnings)


def test_policy(
    store: Storage,
    tenant: str,
    *,
    call: PolicyCall,
    principal: Principal,
    facts: TaskFacts,
    documents: dict[str, str] | None = None,
) -> Verdict:
    """What the rules would decide for ``call``: ``documents`` (scope -> text, checked first) in
    place of the stored documents of those scopes, the stored ones for the rest. Nothing runs
    and nothing is written. Only the scopes that apply to ``principal`` take part, as in the
    engine (the tenant's, and its agent's)."""
    stored = {d.scope: d for d in store.policies.current(tenant)}
    for scope, text in (documents or {}).items():
        check_scope(scope)
        checked = check(text)
        stored[scope] = PolicyDocument(tenant, scope, 0, text, checked.digest, 0.0)
    scopes = {"tenant", f"agent:{principal.agent}"} if principal.agent else {"tenant"}
    applying = sorted((d for d in stored.values() if d.scope in scopes), key=lambda d: d.scope)
    return RuleSet.of(applying).decide(request(call, Principal(**{**vars(principal), "tenant": tenant}), facts))


def verdict_view(verdict: Verdict) -> dict[str, Any]:
    return {"decision": verdict.effect, "reason": verdict.reason() or None, **(verdict.mark() or {})}
