"""A person's decisions on a turn's calls: ``request_approval``, each call of an ``ask`` tool, and
``request_credential`` (decided by the user adding the credential, ``control.vault``).

A decision is stored once and read by every later attempt, so a resumed worker never asks
again for what was decided and never runs a rejected call. Until one is made the task parks in
``paused`` and holds nothing (its message comes back when the decision is made). A decision is
its call's own: the record names the call's step and tool, and one another call made under the
same tool_use id (a later turn reusing it) is never read as this call's (``core.call_keys``).
"""

from __future__ import annotations

import json
import time
from typing import Any

from agentq.core.approval import APPROVAL_TOOL, credential_outcome, credential_question, decision_outcome
from agentq.core.call_keys import CallRef, own_record
from agentq.core.endusers import Approver
from agentq.core.engine._credentials import TaskCredentials
from agentq.core.engine._operation import RecordedOperation, Settled
from agentq.core.engine._session import Session
from agentq.core.engine._tool_call import error_outcome
from agentq.core.engine.result import RunResult
from agentq.core.errors import IllegalTransition
from agentq.core.models import ASKS, TaskStatus, ToolOutcome
from agentq.core.ports import ApprovalBook, VaultBook
from agentq.core.records import ApprovalRecord
from agentq.core.vault import REQUEST_CREDENTIAL_TOOL, valid_name


class Decision(RecordedOperation[ApprovalRecord, "ApprovalRecord | RunResult"]):
    """The stored decision on one call, or ask for it (fenced) and park the task in ``paused``."""

    def __init__(
        self, approvals: ApprovalBook, s: Session, use: dict[str, Any], question: str, approver: Approver = "user"
    ) -> None:
        self.approvals, self.s, self.use, self.question, self.approver = approvals, s, use, question, approver
        self._asked: ApprovalRecord | None = None  # asked before, not decided yet (a resumed worker)
        self.call = s.call(use)
        self.key = self.call.first

    def check(self) -> ApprovalRecord | None:
        self.key, record = own_approval(self.approvals, self.s.task_id, self.call)
        if record is not None and record.state != "pending":
            return record
        self._asked = record
        return None

    def create(self) -> None:
        self.approvals.request(self.s.lease, self.key, self.question, approver=self.approver,
                               step=self.call.step, tool=self.call.name)  # fmt: skip

    def check_again(self) -> ApprovalRecord | None:
        return None  # just asked: nobody has decided yet

    def act(self, record: ApprovalRecord | None) -> ApprovalRecord | RunResult:
        if record is not None:
            return record
        s = self.s
        s.task = s.task.model_copy(update={"status": TaskStatus.PAUSED})
        paused = RunResult(s.task_id, "waiting", status=TaskStatus.PAUSED)
        timeout = s.task.submission.constraints.approval_timeout_seconds
        if timeout is not None:  # asked before (a resumed worker): the first ask's clock runs on
            paused.approval_due = (self._asked.asked_at if self._asked is not None else time.time()) + timeout
        return paused


class CredentialRequest(RecordedOperation[ApprovalRecord, "ApprovalRecord | RunResult | None"]):
    """``request_credential``: settled at once if the user has the credential; else the task
    notes that it waits for it (``VaultBook.wait``) and parks in ``paused`` on an approval that
    names the credential and the host. The vault's write wakes it (``control.vault.put``)."""

    def __init__(
        self, approvals: ApprovalBook, vault: VaultBook, credentials: TaskCredentials, s: Session, use: dict[str, Any]
    ) -> None:
        self.approvals, self.vault, self.credentials, self.s, self.use = approvals, vault, credentials, s, use
        args = use.get("input") or {}
        self.name, self.host = str(args.get("name", "")), str(args.get("host", ""))[:255]
        self.reason = str(args.get("reason", ""))[:2000]
        self.call = s.call(use)
        self.key = self.call.first

    def check(self) -> ApprovalRecord | None:
        self.key, record = own_approval(self.approvals, self.s.task_id, self.call)
        return record if record is not None and record.state != "pending" else None

    def create(self) -> None:
        if not valid_name(self.name) or self.credentials.has(self.name):
            raise Settled(None)
        s = self.s
        for owner in dict.fromkeys([s.task.user, None]):  # a tenant-wide credential satisfies it too
            self.vault.wait(s.task.tenant, owner, self.name, s.task_id, self.key)
        question = credential_question(s.task.user, self.name, self.host, self.reason)
        self.approvals.request(s.lease, self.key, question, credential={"name": self.name, "host": self.host},
                               step=self.call.step, tool=self.call.name)  # fmt: skip

    def check_again(self) -> ApprovalRecord | None:
        return None

    def act(self, record: ApprovalRecord | None) -> ApprovalRecord | RunResult | None:
        if record is not None:
            return record
        s = self.s
        s.task = s.task.model_copy(update={"status": TaskStatus.PAUSED})
        if self.credentials.has(self.name):  # added between the look and the pause: wake now
            try:
                self.approvals.decide(s.task_id, self.key, approved=True, by="vault",
                                      note=f"credential {self.name!r} was added")  # fmt: skip
            except IllegalTransition:  # the vault's write decided first: its message resumes the task
                return RunResult(s.task_id, "waiting", status=TaskStatus.PAUSED)
            for owner in dict.fromkeys([s.task.user, None]):
                self.vault.unwait(s.task.tenant, owner, self.name, s.task_id, self.key)
            return RunResult(s.task_id, "deferred", status=TaskStatus.QUEUED,
                             error={"retry_after": 1, "message": f"credential {self.name!r} arrived"})  # fmt: skip
        return RunResult(s.task_id, "waiting", status=TaskStatus.PAUSED)


def own_approval(book: ApprovalBook, task_id: str, call: CallRef) -> tuple[str, ApprovalRecord | None]:
    """The key of ``call``'s approval and the record stored under it (``core.call_keys``)."""
    return own_record(call, lambda key: book.get(task_id, key), lambda r: (r.step, r.tool, r.asked_at))


def decisions(
    book: ApprovalBook,
    s: Session,
    uses: list[dict[str, Any]],
    allowlist: list[str],
    vault: VaultBook | None = None,
    credentials: TaskCredentials | None = None,
) -> dict[str, ToolOutcome] | RunResult:
    """The outcomes a person decided for this turn's calls, or park the task in ``paused``
    until the next decision is made.

    ``request_approval`` gets the decision as its result; if it was rejected, no other call
    of the turn runs (the approval gated them). A call of a tool whose policy is ``ask`` or
    ``ask_tenant`` waits for its own decision (one at a time, in the turn's order), as does a
    call a policy rule answers ``ask`` for (``s.verdicts``; the question names the rule);
    rejected, it gets the denial as its result and never runs.

    Who may decide (``approver``, kept on the pending record): the model's own
    ``request_approval`` and ``request_credential`` ask whoever acts on the task, its end
    user's token too (``user``), and a tool's ``ask`` too; a tool's ``ask_tenant`` only the
    tenant; a rule's ask whom its ``@approver`` names (``tenant`` unless it says ``user``). A
    call both hold is decided once, by the narrower: the tenant if either says so.
    """
    policies = s.task.submission.constraints.tool_policies
    decided: dict[str, ToolOutcome] = {}
    approvals = [u for u in uses if u["name"] == APPROVAL_TOOL and APPROVAL_TOOL in allowlist]
    if approvals:
        use = approvals[0]
        question = str((use.get("input") or {}).get("question") or "(no question given)")
        record = Decision(book, s, use, question).run()
        if isinstance(record, RunResult):
            return record
        decided[use["id"]] = decision_outcome(use, record, record.asked_at, time.time())
        if record.state != "approved":
            for other in uses:
                if other["id"] != use["id"]:
                    decided[other["id"]] = error_outcome(
                        other,
                        f"not run: the approval asked for in this turn was rejected ({record.note or 'no note'})",
                    )
            return decided
    for use in uses:
        if use["name"] != REQUEST_CREDENTIAL_TOOL or use["name"] not in allowlist or use["id"] in decided:
            continue
        if (verdict := s.verdicts.get(use["id"])) is not None and verdict.effect == "deny":
            continue  # a rule denies it: ToolCaller.call answers it
        if vault is None or credentials is None:
            decided[use["id"]] = error_outcome(use, "this worker has no vault: no credential can be asked for")
            continue
        started = time.time()
        asked = CredentialRequest(book, vault, credentials, s, use).run()
        if isinstance(asked, RunResult):
            return asked
        decided[use["id"]] = credential_outcome(use, asked, started, time.time())
    for use in uses:
        verdict = s.verdicts.get(use["id"])
        if verdict is not None and verdict.effect == "deny":
            continue  # a rule denies it: it will not run whatever a person says (ToolCaller.call)
        rule = verdict.rule if verdict is not None and verdict.effect == "ask" else None
        policy = policies.get(use["name"]) if use["name"] in allowlist else None
        asked_by_policy = policy in ASKS
        if rule is None and not asked_by_policy:
            continue
        shown = json.dumps(use.get("input") or {}, sort_keys=True)
        why = f" ({verdict.reason()})" if verdict is not None and rule is not None else ""
        question = f"Run {use['name']} with {shown}?{why}"[:4000]
        tenant_only = (rule is not None and rule.approver == "tenant") or policy == "ask_tenant"
        record = Decision(book, s, use, question, "tenant" if tenant_only else "user").run()
        if isinstance(record, RunResult):
            return record
        if record.state != "approved":
            by = record.decider
            decided[use["id"]] = error_outcome(
                use, f"REJECTED by {by}: {record.note or '(no note)'}; {use['name']} was not run"
            )
    return decided
