"""A policy document checked at write time: Cedar text that parses, validates against the
published schema (``schema``) and follows agentq's conventions, or a ``ValidationError`` naming
the field and the rule, so nothing broken is ever stored.

The conventions, on top of Cedar:

- every rule is a ``forbid``: what no rule forbids is allowed (the engine adds one
  ``permit(principal, action, resource)`` of its own), so one rule restricts, never opens;
- every rule has ``@id("...")``, unique in its document: the trace, the events and the tool
  error the model reads name it;
- ``@message("...")``: what the model reads (and a reviewer, for ``ask``);
- ``@effect("deny")`` (the default) or ``@effect("ask")``: refuse the call, or hold it for a
  person's decision (the existing approval pause);
- ``@approver("tenant")`` (the default) or ``@approver("user")``, on an ``ask`` rule only: who
  may decide the held call. A rule is the operator's check on what a task does, often on what
  its end user asked for ("refunds over $100 ask"): by default only the tenant's API keys decide
  it, never the token of the user who would benefit; ``user`` lets that user's token decide too
  (a confirmation the user gives, the tenant still may). The pending approval keeps it
  (``storage.approvals``): a rule edited later does not change who decides an ask already made;
- ``@mode("enforce")`` (the default) or ``@mode("log_only")``: a shadowed rule decides nothing;
  what it would have decided is counted and shown beside what happened.

A rule that forbids every call unconditionally is allowed (a platform's kill switch) but the
write answers with a warning.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from typing import Any, Literal

import cedarpy

from agentq.core.endusers import APPROVERS, Approver
from agentq.core.errors import ValidationError
from agentq.core.policies.schema import SCHEMA_JSON

MAX_DOCUMENT_BYTES = 64_000  # one item with its history version: far under DynamoDB's 400 KB
MAX_RULES = 500
MAX_MESSAGE_CHARS = 1_000
RULE_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$"
ANNOTATIONS = frozenset({"id", "message", "effect", "mode", "description", "approver"})
SCOPE_PATTERN = r"^(tenant|agent:[a-z0-9][a-z0-9_-]{0,63})$"

Effect = Literal["deny", "ask"]
Mode = Literal["enforce", "log_only"]
DEFAULT_APPROVER: Approver = "tenant"  # a rule's ask: the operator's (see above)


@dataclass(frozen=True)
class Rule:
    """One rule of a document, as Cedar parsed it (``ast``: its JSON form)."""

    id: str
    effect: Effect
    mode: Mode
    message: str
    ast: dict[str, Any]
    approver: Approver = DEFAULT_APPROVER  # who decides its ask (a deny rule has none to decide)


@dataclass(frozen=True)
class CheckedDocument:
    rules: tuple[Rule, ...]
    warnings: tuple[str, ...]
    digest: str


def check_scope(scope: str) -> str:
    if not re.fullmatch(SCOPE_PATTERN, scope):
        raise ValidationError(
            f"scope: {scope!r} is not a scope; one of `tenant` (every task of the tenant) or `agent:<name>` "
            "(the tasks of that agent)",
            field="scope",
        )
    return scope


def parse(text: str) -> list[dict[str, Any]]:
    """The document's policies in Cedar's JSON form, in order; a ``ValidationError`` naming
    ``policies`` with Cedar's own message when it does not parse."""
    if len(text.encode()) > MAX_DOCUMENT_BYTES:
        raise ValidationError(
            f"policies: {len(text.encode()):,} bytes; at most {MAX_DOCUMENT_BYTES:,}", field="policies"
        )
    try:
        parsed = json.loads(cedarpy.policies_to_json_str(text))
    except ValueError as exc:
        raise ValidationError(f"policies: does not parse as Cedar: {_one_line(exc)}", field="policies") from exc
    if parsed.get("templates"):
        raise ValidationError("policies: templates are not supported; write each rule out", field="policies")
    policies = parsed.get("staticPolicies") or {}
    # Cedar names the policies of a text policy0, policy1, ... in their order in it.
    return [policies[f"policy{i}"] for i in range(len(policies))]


def check(text: str) -> CheckedDocument:
    """``text`` as a document of rules, or a ``ValidationError`` naming what is wrong."""
    asts = parse(text)
    if len(asts) > MAX_RULES:
        raise ValidationError(f"policies: {len(asts)} rules; at most {MAX_RULES}", field="policies")
    rules: list[Rule] = []
    seen: set[str] = set()
    for index, ast in enumerate(asts):
        rule = _rule(index, ast)
        if rule.id in seen:
            raise ValidationError(f"policies: two rules have @id({rule.id!r}); each id once", field="policies")
        seen.add(rule.id)
        rules.append(rule)
    _validate(text, rules)
    warnings = tuple(
        f"rule {r.id!r} forbids every call of every task in its scope (effect {r.effect}): nothing will run"
        for r in rules
        if r.mode == "enforce" and _matches_everything(r.ast)
    )
    digest = hashlib.sha256(text.encode()).hexdigest()
    return CheckedDocument(rules=tuple(rules), warnings=warnings, digest=digest)


def describe(text: str) -> list[dict[str, str | None]]:
    """Each rule of a stored document as a person reads it: ``id``, ``effect``, ``mode``,
    ``message``, ``description`` and, for an ``ask``, ``approver`` (the defaults filled in, as
    the engine applies them; a deny rule's ``approver`` is None). Read
    only: a stored document that no longer parses (a Cedar upgrade) describes as no rules here,
    where the engine denies every call of its scope."""
    try:
        asts = parse(text)
    except ValidationError:
        return []
    out: list[dict[str, str | None]] = []
    for ast in asts:
        notes: dict[str, str] = ast.get("annotations") or {}
        rule_id = notes.get("id") or ""
        effect = notes.get("effect") or "deny"
        out.append({
            "id": rule_id,
            "effect": effect,
            "mode": notes.get("mode") or "enforce",
            "message": notes.get("message") or f"forbidden by rule {rule_id}",
            "description": notes.get("description") or "",
            "approver": (notes.get("approver") or DEFAULT_APPROVER) if effect == "ask" else None,
        })  # fmt: skip
    return out


def _rule(index: int, ast: dict[str, Any]) -> Rule:
    notes: dict[str, str] = ast.get("annotations") or {}
    rule_id = notes.get("id")
    where = f"rule {index + 1}" + (f" ({rule_id!r})" if rule_id else "")
    if not rule_id:
        raise ValidationError(f'policies: {where} has no @id("..."); every rule is named', field="policies")
    if not re.fullmatch(RULE_ID_PATTERN, rule_id):
        raise ValidationError(
            f"policies: {where}: @id must be letters, digits, '_', '.', '-' (at most 100)", field="policies"
        )
    unknown = sorted(set(notes) - ANNOTATIONS)
    if unknown:
        raise ValidationError(
            f"policies: {where}: unknown annotation @{unknown[0]}; known: {', '.join('@' + a for a in sorted(ANNOTATIONS))}",
            field="policies",
        )
    if ast.get("effect") != "forbid":
        raise ValidationError(
            f"policies: {where} is a permit; rules are forbid policies (what no rule forbids is allowed)",
            field="policies",
        )
    effect = notes.get("effect") or "deny"
    if effect not in ("deny", "ask"):
        raise ValidationError(f'policies: {where}: @effect is "deny" or "ask", not {effect!r}', field="policies")
    mode = notes.get("mode") or "enforce"
    if mode not in ("enforce", "log_only"):
        raise ValidationError(f'policies: {where}: @mode is "enforce" or "log_only", not {mode!r}', field="policies")
    message = notes.get("message") or f"forbidden by rule {rule_id}"
    if len(message) > MAX_MESSAGE_CHARS:
        raise ValidationError(
            f"policies: {where}: @message is at most {MAX_MESSAGE_CHARS} characters", field="policies"
        )
    approver = notes.get("approver")
    if approver is not None and approver not in APPROVERS:
        raise ValidationError(
            f'policies: {where}: @approver is "tenant" (only the tenant\'s API keys decide its ask) or "user" (the '
            f"task's end user's token too), not {approver!r}",
            field="policies",
        )
    if approver is not None and effect != "ask":
        raise ValidationError(
            f'policies: {where}: @approver names who decides an ask, and this rule\'s @effect is "{effect}": '
            'write @effect("ask") with it, or leave @approver out',
            field="policies",
        )
    chosen: Approver = "user" if approver == "user" else DEFAULT_APPROVER
    return Rule(id=rule_id, effect=effect, mode=mode, message=message, ast=ast, approver=chosen)  # type: ignore[arg-type]


def _validate(text: str, rules: list[Rule]) -> None:
    """Cedar's validator over the published schema: an attribute no call has, a type mixed up,
    an optional attribute read without ``has``, a wrong entity type."""
    result = cedarpy.validate_policies(text, SCHEMA_JSON)
    if result.validation_passed:
        return
    error = result.errors[0]
    match = re.fullmatch(r"policy(\d+)", error.policy_id or "")
    who = f"rule {rules[int(match[1])].id!r}: " if match and int(match[1]) < len(rules) else ""
    raise ValidationError(
        f"policies: {who}does not validate against the policy schema: {_one_line(error.error)} "
        "(GET /policies/schema; docs/POLICIES.md lists every attribute)",
        field="policies",
    )


def _matches_everything(ast: dict[str, Any]) -> bool:
    scopes = (ast.get("principal"), ast.get("action"), ast.get("resource"))
    if any((s or {}).get("op") != "All" for s in scopes):
        return False
    conditions = ast.get("conditions") or []
    return all(c.get("kind") == "when" and c.get("body") == {"Value": True} for c in conditions)


def _one_line(exc: object) -> str:
    return " ".join(str(exc).split())[:600]
