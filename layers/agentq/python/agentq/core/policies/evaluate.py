"""One call checked against the rules that apply to its task: a ``Verdict``.

The documents of a task's scopes (its tenant's, its agent's) are compiled into one Cedar policy
set, each rule renamed ``<scope>/<id>`` so a decision names it, with one ``permit`` of agentq's
own (what no rule forbids is allowed). One ``is_authorized`` answers for every rule at once: the
rules that matched are Cedar's reasons, and a rule that failed to evaluate is one of its errors.

Precedence: an enforced rule that failed to evaluate denies (fail closed), then an enforced
``deny``, then an enforced ``ask``; ``log_only`` rules never decide, and what they would have
decided is returned beside (``shadow``). A set that cannot be evaluated at all denies too.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from typing import Any, Literal

import cedarpy

from agentq.core.endusers import Approver
from agentq.core.policies.rules import DEFAULT_APPROVER, Rule, check
from agentq.core.policies.schema import TOOL_ATTRIBUTES, TREE_ATTRIBUTES, USER_SPEND_ATTRIBUTE

DEFAULT_ALLOW = "agentq/default-allow"
EVALUATION = "agentq/evaluation"  # names a failure of the whole evaluation, not of one rule
_ALLOW_ALL = {
    "effect": "permit",
    "principal": {"op": "All"},
    "action": {"op": "All"},
    "resource": {"op": "All"},
    "conditions": [],
}
_ERROR_POLICY = re.compile(r"policy `([^`]+)`")
_CONTEXT = {"Var": "context"}
_HISTORY = {".": {"left": _CONTEXT, "attr": "history"}}
ALL_HISTORY = "*"  # ``history_reads`` of a rule that uses the history record whole
_LONG = 2**63


@dataclass(frozen=True)
class PolicyDocument:
    """One stored version of a scope's rules (``storage.policies``)."""

    tenant: str
    scope: str  # "tenant" or "agent:<name>"
    version: int
    text: str
    digest: str
    created_at: float
    created_by: str | None = None  # the id of the API key that wrote it (None: a keyless local API's write)


@dataclass(frozen=True)
class Hit:
    """A rule that matched the call (or failed to evaluate on it: ``error``)."""

    rule: str  # "<scope>/<id>"
    version: int
    effect: Literal["deny", "ask"]
    message: str
    log_only: bool
    error: str | None = None
    approver: Approver = DEFAULT_APPROVER  # an ask's: who may decide the held call (``rules``)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"rule": self.rule, "version": self.version, "effect": self.effect}
        out["message"] = self.message
        if self.effect == "ask":
            out["approver"] = self.approver
        if self.error is not None:
            out["error"] = self.error
        return out


@dataclass(frozen=True)
class Verdict:
    effect: Literal["allow", "deny", "ask"]
    rule: Hit | None = None  # the rule that decided (None: allowed)
    shadow: tuple[Hit, ...] = ()  # log_only rules that would have denied or asked

    def mark(self) -> dict[str, Any] | None:
        """What the trace and the step record of the call: None when no rule was involved."""
        if self.rule is None and not self.shadow:
            return None
        out: dict[str, Any] = {"decision": self.effect}
        if self.rule is not None:
            out.update(self.rule.to_dict())
        if self.shadow:
            out["log_only"] = [h.to_dict() for h in self.shadow]
        return out

    def reason(self) -> str:
        """What the model reads for a denied call (and a reviewer for an asked one)."""
        hit = self.rule
        if hit is None:
            return ""
        if hit.error is not None:
            return f"denied by policy rule {hit.rule}: the rule failed to evaluate ({hit.error}); calls it covers are denied"
        return f"{'denied' if hit.effect == 'deny' else 'held for approval'} by policy rule {hit.rule}: {hit.message}"


ALLOWED = Verdict("allow")


@dataclass
class RuleSet:
    """The compiled rules of some documents; empty when no document applies."""

    documents: tuple[PolicyDocument, ...] = ()
    rules: dict[str, tuple[Rule, int]] = field(default_factory=dict)  # "<scope>/<id>" -> rule, version
    policies: Any = None  # cedarpy.PolicySet
    reads: frozenset[str] = frozenset()  # the ``context.history`` attributes a rule names (``history_reads``)

    @property
    def reads_tree(self) -> bool:
        """A rule names the tree's spend: the check reads the root's budget."""
        return bool(self.reads & {*TREE_ATTRIBUTES, ALL_HISTORY})

    @property
    def reads_user_spend(self) -> bool:
        """A rule names the end user's spend today: the check reads the user's day item."""
        return bool(self.reads & {USER_SPEND_ATTRIBUTE, ALL_HISTORY})

    @property
    def reads_tools(self) -> bool:
        """A rule names the task's tool calls: the check gathers them (``core.engine._history``)."""
        return bool(self.reads & {*TOOL_ATTRIBUTES, ALL_HISTORY})

    @classmethod
    def of(cls, documents: list[PolicyDocument]) -> RuleSet:
        rules: dict[str, tuple[Rule, int]] = {}
        static: dict[str, Any] = {DEFAULT_ALLOW: _ALLOW_ALL}
        for doc in documents:
            for rule in check(doc.text).rules:
                name = f"{doc.scope}/{rule.id}"
                rules[name] = (rule, doc.version)
                static[name] = rule.ast
        if len(static) == 1:
            return cls(documents=tuple(documents))
        text = json.dumps({"staticPolicies": static, "templates": {}, "templateLinks": []})
        policies = cedarpy.PolicySet.from_json_str(text)
        reads = frozenset().union(*(history_reads(rule.ast) for rule, _ in rules.values()))
        return cls(documents=tuple(documents), rules=rules, policies=policies, reads=reads)

    @property
    def empty(self) -> bool:
        return not self.rules

    def decide(self, request: dict[str, Any]) -> Verdict:
        if self.empty:
            return ALLOWED
        try:
            result = cedarpy.is_authorized(request, self.policies, [])
            reasons, errors = list(result.diagnostics.reasons), list(result.diagnostics.errors)
        except Exception as exc:  # a request Cedar refuses: no rule can be trusted to have said allow
            return Verdict("deny", Hit(EVALUATION, 0, "deny", "", log_only=False, error=_short(exc)))
        hits = [self._hit(name) for name in reasons if name != DEFAULT_ALLOW]
        for error in errors:
            match = _ERROR_POLICY.search(str(error))
            name = match[1] if match else EVALUATION
            hit = self._hit(name) if name in self.rules else Hit(name, 0, "deny", "", log_only=False)
            hits.append(Hit(hit.rule, hit.version, "deny", hit.message, hit.log_only, error=_short(error)))
        enforced = [h for h in hits if not h.log_only]
        shadow = tuple(h for h in hits if h.log_only)
        for wanted in ("error", "deny", "ask"):
            for hit in enforced:
                if (hit.error is not None) if wanted == "error" else (hit.error is None and hit.effect == wanted):
                    return Verdict("deny" if wanted != "ask" else "ask", hit, shadow)
        return Verdict("allow", None, shadow)

    def _hit(self, name: str) -> Hit:
        rule, version = self.rules[name]
        return Hit(name, version, rule.effect, rule.message, log_only=rule.mode == "log_only", approver=rule.approver)


def history_reads(ast: Any) -> frozenset[str]:
    """The attributes of ``context.history`` a rule names, read from its parsed form (an access
    ``context.history.x`` or ``context["history"]["x"]``, or a test ``context.history has x``):
    a comment or a string that spells a name is not a read. A rule that uses the history record
    (or the context) whole, not one attribute of it, reads them all (``ALL_HISTORY``)."""
    found: set[str] = set()

    def walk(node: Any) -> None:
        if isinstance(node, list):
            for item in node:
                walk(item)
            return
        if not isinstance(node, dict):
            return
        if node in (_CONTEXT, _HISTORY):
            found.add(ALL_HISTORY)
            return
        for op in (".", "has"):
            inner = node.get(op)
            if isinstance(inner, dict) and "attr" in inner:
                left = inner.get("left")
                if left == _HISTORY:
                    found.add(str(inner["attr"]))
                    return
                if left == _CONTEXT:
                    return  # another attribute of the context (or ``context has history``)
        for value in node.values():
            walk(value)

    walk(ast)
    return frozenset(found)


def cedar_value(value: Any, depth: int = 0) -> Any:
    """A JSON value of a tool's input as a Cedar value: a fractional number becomes a decimal
    (4 places), one out of Cedar's range a string (comparing it with a number then fails, and a
    rule that fails denies), a null is left out; Cedar's escape keys (``__entity``, ``__extn``,
    ``__expr``) are dropped, so input cannot forge an entity reference."""
    if depth > 32:
        return str(value)[:200]
    if isinstance(value, (bool, str)):
        return value
    if isinstance(value, int):
        return value if -_LONG <= value < _LONG else str(value)
    if isinstance(value, float):
        if math.isfinite(value) and value.is_integer() and -_LONG <= value < _LONG:
            return int(value)
        if math.isfinite(value) and abs(value) < 9e14:
            return {"__extn": {"fn": "decimal", "arg": f"{value:.4f}"}}
        return str(value)
    if isinstance(value, list):
        return [cedar_value(v, depth + 1) for v in value if v is not None]
    if isinstance(value, dict):
        return {
            str(k): cedar_value(v, depth + 1)
            for k, v in value.items()
            if v is not None and str(k) not in ("__entity", "__extn", "__expr")
        }
    return str(value)


def _short(exc: object) -> str:
    return " ".join(str(exc).split())[:300]
