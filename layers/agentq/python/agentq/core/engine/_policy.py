"""The policy check before every call the engine makes (``core.policies``, docs/POLICIES.md).

Each tool call, MCP call and spawn of a turn, and each model call (the agent's turn's, and the
grading model's of an outcome: ``_grade``), is checked against the rules of its task's scopes
(its tenant's and its agent's) before anything of it starts. What a check reads, and what it
costs in AWS calls:

- the rules: every current document of the tenant, one DynamoDB Query (``PolicySource.current``),
  cached per process for ``EngineConfig.policy_cache_seconds`` (5 s), so a check costs none
  most of the time and a new version is enforced within that long;
- the call, the principal, the task's tools and their results' status and the task's own spend:
  the session already holds them (the task as claimed, the steps committed since, the latest
  compaction's history of the calls before it: ``_history``), no call; for a compaction written
  before it carried that history, one Query of the steps before it, once a run, only when a
  rule names the task's tool calls;
- the tree's spend: one GetItem of the root's budget (``BudgetLedger.get``), only when a rule of
  the set names ``tree_tokens`` or ``tree_spend_micros``;
- the end user's spend today: one GetItem of the user's day item (``ScopeCapsPort.usage``, the
  item the user's caps hold on), only when a rule of the set names ``user_spend_today_micros``
  and the task acts for a user (absent otherwise). What the rules name is read from the parsed
  rules (``RuleSet.reads``), never from the text.

The user's day item counts every model call of every task of the user while the user has a cap
(``storage.scope_caps``); for a user without one, the claim adds a scope that counts without
capping (``core.caps.counted``) when any rule of the tenant, in any scope, names the attribute
(``counts_user_spend``): the item then counts the user's calls from that claim on.

Every decision a rule took part in is counted (metric ``policy_decisions``) and logged as an
event naming the rule, ``log_only`` ones with what they would have decided beside what happened.

A turn's calls are all checked before any runs, one after another in the order they run
(``tool_verdicts``): each with the calls before it in the turn counted as made (the ones no rule
denies). How those end is not known yet, so a rule that names the tool calls decides the call
twice, as if they had all ended ``ok`` and as if they had all ended ``error``, and the stricter
verdict stands: "one charge per task" denies a turn's second charge (the first counted ``ok``),
and "a refund only after a fraud_check that passed" denies a refund beside its fraud_check (that
counted ``error``): it waits for a turn after the check's result.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from agentq import observe
from agentq.core.engine._history import task_tools
from agentq.core.engine._holds import BudgetHolds
from agentq.core.engine._session import Session
from agentq.core.engine.conversation import final_text
from agentq.core.engine.result import RunResult
from agentq.core.fanout import SPAWN_TOOL
from agentq.core.models import CompactStep, LLMStep, TaskStatus, ToolHistory
from agentq.core.policies import (
    ALLOWED,
    CallKind,
    Hit,
    PolicyCall,
    PolicyDocument,
    Principal,
    RuleSet,
    TaskFacts,
    Verdict,
)
from agentq.core.policies import request as cedar_request
from agentq.core.policies.evaluate import EVALUATION
from agentq.core.ports import BudgetLedger, PolicySource, ScopeCapsPort, StepLog, TaskLeases
from agentq.core.pricing import micros


class PolicyGate:
    """Verdicts for a session's calls; None ``source``: no rules anywhere (every call allowed)."""

    def __init__(
        self,
        source: PolicySource | None,
        budgets: BudgetLedger,
        cache_seconds: float = 5.0,
        caps: ScopeCapsPort | None = None,
        steps: StepLog | None = None,
    ) -> None:
        self.source, self.budgets, self.cache_seconds, self.caps = source, budgets, cache_seconds, caps
        self.steps = steps  # the steps before a compaction that carries no history of them (``_history``)
        self._lock = threading.Lock()
        self._read: dict[str, tuple[float, list[PolicyDocument]]] = {}  # tenant -> (read at, documents)
        # By tenant and by each document's scope, version and digest: two tenants' documents of the
        # same scope and version are different rules, and one worker serves many tenants.
        self._compiled: dict[tuple[str, tuple[tuple[str, int, str], ...]], RuleSet] = {}

    def documents(self, tenant: str) -> list[PolicyDocument]:
        """The tenant's current documents, every scope's (read at most every ``cache_seconds``)."""
        if self.source is None:
            return []
        now = time.monotonic()
        with self._lock:
            cached = self._read.get(tenant)
        if cached is None or now - cached[0] > self.cache_seconds:
            cached = (now, self.source.current(tenant))
            with self._lock:
                self._read[tenant] = cached
        return cached[1]

    def counts_user_spend(self, tenant: str) -> bool:
        """Whether a rule of the tenant, in any scope, reads the end user's spend today: then the
        user's day is counted for every task of the tenant that acts for a user (any agent's:
        the user's spend is all of its tasks'), capped or not (``CallWindows.caps_of``). Each
        document is asked on its own (one that no longer compiles reads nothing; the others
        still count)."""
        return any(self.compiled(tenant, [doc]).reads_user_spend for doc in self.documents(tenant))

    def rules(self, tenant: str, agent: str) -> RuleSet:
        """The compiled rules of ``tenant`` and of its agent ``agent``."""
        if self.source is None:
            return RuleSet()
        scopes = {"tenant", f"agent:{agent}"} if agent else {"tenant"}
        documents = sorted((d for d in self.documents(tenant) if d.scope in scopes), key=lambda d: d.scope)
        return self.compiled(tenant, documents)

    def compiled(self, tenant: str, documents: list[PolicyDocument]) -> RuleSet:
        """``documents`` of ``tenant`` compiled, once per worker for each version of them."""
        key = (tenant, tuple((d.scope, d.version, d.digest) for d in documents))
        with self._lock:
            compiled = self._compiled.get(key)
        if compiled is None:
            try:
                compiled = RuleSet.of(documents)
            except Exception as exc:  # a stored document that no longer compiles: deny everything
                compiled = _broken(documents, exc)
            with self._lock:
                if len(self._compiled) > 1_000:
                    self._compiled.clear()
                self._compiled[key] = compiled
        return compiled

    def check(self, s: Session, call: PolicyCall, earlier: tuple[str, ...] = ()) -> Verdict:
        """The verdict on ``call``; ``earlier``: the tools of the calls of its turn that run
        before it, counted as made, ending ``ok`` and ``error`` in turn: the stricter verdict."""
        who = principal(s)
        rules = self.rules(s.task.tenant, who.agent)
        if isinstance(rules, _Broken):
            verdict = rules.verdict
        elif rules.empty:
            return ALLOWED
        else:
            facts = self.facts(s, rules)
            verdict = rules.decide(cedar_request(call, who, facts.with_made(earlier, "ok")))
            if earlier and rules.reads_tools:
                verdict = stricter(verdict, rules.decide(cedar_request(call, who, facts.with_made(earlier, "error"))))
        record(s, call, verdict)
        return verdict

    def model_verdict(self, s: Session, model: str, estimate: tuple[int, int]) -> Verdict:
        """A model call to ``model``, the model it goes to (the task's own, or a fallback: the
        one its route chose before it, or the one that takes it after the first failed), with
        the tokens and money its hold takes (``estimate``)."""
        tokens, money = estimate
        return self.check(s, PolicyCall("model", model=model, estimated_tokens=tokens, estimated_usd_micros=money))

    def tool_verdicts(self, s: Session, uses: list[dict[str, Any]]) -> dict[str, Verdict]:
        """Each of a turn's calls checked (all before any runs), in the order they run
        (``uses``), each with those before it that no rule denies counted as made: by tool_use id."""
        pins = {p.qualified: p.server for p in s.task.submission.mcp_tools or []}
        out: dict[str, Verdict] = {}
        made: list[str] = []
        for use in uses:
            name = use["name"]
            kind: CallKind = "spawn" if name == SPAWN_TOOL else "mcp" if name in pins else "tool"
            args = use.get("input") if isinstance(use.get("input"), dict) else {}
            call = PolicyCall(kind, tool=name, args=args or {}, model=s.task.submission.model,
                              mcp_server=pins.get(name, ""))  # fmt: skip
            out[use["id"]] = verdict = self.check(s, call, tuple(made))
            if verdict.effect != "deny":
                made.append(name)
        return out

    def facts(self, s: Session, rules: RuleSet) -> TaskFacts:
        """The task's history as ``rules`` read it: what costs a read is read only if they name it."""
        task = s.task
        tokens, spend = task.tokens_in + task.tokens_out, micros(task.cost_usd)
        for record in s.steps[len(s.steps) - s.committed :] if s.committed else []:
            if isinstance(record.body, LLMStep | CompactStep):  # committed by this run: not in the task as claimed
                tokens += record.body.usage.input_total + record.body.usage.output_tokens
                spend += micros(record.body.cost_usd)
        tools = task_tools(s, self.steps) if rules.reads_tools else ToolHistory()
        tree_tokens = tree_micros = 0
        if rules.reads_tree:
            state = self.budgets.get(task.root_id)
            tree_tokens, tree_micros = state.used + state.reserved, state.used_micros + state.reserved_micros
        user_today = None  # absent: the task acts for no user (or no rule reads it)
        if rules.reads_user_spend and task.user and self.caps is not None:
            user_today = self.caps.usage(task.tenant, "user", task.user)["day_usd"]  # held and spent, today (UTC)
        return TaskFacts(
            task_id=task.task_id, root_id=task.root_id, depth=task.depth, step=s.next_step,
            tools=tuple(tools.made), tool_calls=tools.calls, task_tokens=tokens, task_spend_micros=spend,
            tree_tokens=tree_tokens, tree_spend_micros=tree_micros, user_spend_today_micros=user_today,
        )  # fmt: skip


def stricter(first: Verdict, second: Verdict) -> Verdict:
    """The verdict that lets less through: deny over ask over allow, and of two asks the one
    only the tenant decides; ``first`` when they are alike."""
    rank = {"allow": 0, "ask": 1, "deny": 2}

    def weight(v: Verdict) -> tuple[int, bool]:
        return rank[v.effect], v.rule is not None and v.rule.approver == "tenant"

    return second if weight(second) > weight(first) else first


def principal(s: Session) -> Principal:
    """Who makes the call: the tenant, the agent and its version, the end user (``Task.user``) and
    the id of the API key its tree was submitted with (``Task.key_id``)."""
    ref = s.task.submission.agent or ""
    name, _, version = ref.partition("@")
    user = getattr(s.task, "user", None)
    key = s.task.key_id
    return Principal(
        tenant=s.task.tenant,
        agent=name,
        agent_version=int(version) if version.isdigit() else 0,
        user=user if isinstance(user, str) else None,
        api_key=key if isinstance(key, str) else None,
    )


def record(s: Session, call: PolicyCall, verdict: Verdict) -> None:
    """The decision's metric and event, when a rule took part in it."""
    mark = verdict.mark()
    if mark is None:
        return
    observe.record_policy_decision(verdict.effect, [h.effect for h in verdict.shadow])
    observe.emit_event(
        "PolicyDecision",
        {"tenant": s.task.tenant, "task_id": s.task_id, "step": s.next_step, "kind": call.kind,
         "tool": call.tool, "model": call.model, **mark},
    )  # fmt: skip


def refusal(verdict: Verdict, what: str = "model call") -> str:
    """Why a model call (``what``: which one) was refused, naming the rule: a model call has no
    approval pause, so a rule's ``ask`` denies it."""
    message = f"{what} {verdict.reason()}"
    if verdict.effect == "ask":
        message += " (a model call cannot wait for approval: denied)"
    return message


def refuse_model_call(
    tasks: TaskLeases, holds: BudgetHolds, s: Session, verdict: Verdict, *, what: str = "model call",
    result: str | None = None,
) -> RunResult:  # fmt: skip
    """A model call a rule denies (or asks for: a model call has no approval pause, so ``ask``
    denies it): nothing is sent, the hold goes back, and the task ends ``failed`` with the rule
    named in its error. The agent's turn and the grading model's call (``_grade``: ``what`` names
    it, ``result`` keeps its answer as the task's result) end alike."""
    holds.release(s)
    error = {"code": "policy_denied", "message": refusal(verdict, what), "policy": verdict.mark()}
    kept = result if result is not None else final_text(s.messages)
    tasks.transition(s.task_id, TaskStatus.FAILED, lease=s.lease, result=kept, error=error)
    s.task = s.task.model_copy(update={"status": TaskStatus.FAILED})
    return RunResult(s.task_id, "finished", status=TaskStatus.FAILED, error=error)


class _Broken(RuleSet):
    verdict: Verdict = ALLOWED


def _broken(documents: list[PolicyDocument], exc: Exception) -> RuleSet:
    broken = _Broken(documents=tuple(documents))
    scopes = ", ".join(f"{d.scope}@{d.version}" for d in documents)
    hit = Hit(EVALUATION, 0, "deny", "", log_only=False, error=f"the rules ({scopes}) do not compile: {exc}"[:300])
    broken.verdict = Verdict("deny", hit)
    return broken
