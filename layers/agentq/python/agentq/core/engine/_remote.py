"""A call of a remote A2A agent (``a2a__<name>``): its message sent at most once, its task
waited for without a worker, its questions put to this task's people, its answer the result.

The call is a side effect (ARCHITECTURE 3) with one more checkpoint:

1. its effect record is begun, fenced, before anything is sent (``after_effect_begin``): from
   then on the call counts as made, and a worker that finds the record never sends it again;
2. the message goes out (``messageId`` and ``Idempotency-Key``: the call's idempotency key) and
   the remote answers at once with its task (``after_remote_send``: sent, its id not recorded);
3. the remote task's id and endpoint are recorded on the effect record, fenced
   (``after_remote_recorded``); a worker that resumes the call re-attaches to that task;
4. the task is looked at: ended, its text is the call's result (finished on the record, then
   the turn goes on); asking (``input-required``), the question becomes an approval of this
   task and the task pauses; the person's answer goes to the remote as a message of its own,
   begun as an effect before it is sent (never twice), and the question it answered is noted on
   the record; otherwise the task parks in ``waiting``, holding no worker, and a delayed
   ``remote_poll`` message (``remote_poll_seconds``) wakes it to look again.

A record begun with no remote task on it is a send whose answer was lost (a worker died between
2 and 3): reported ``unknown_outcome``, as any side effect whose worker died. The remote calls of
a turn are carried out before its other calls, so a turn that parks has run nothing else.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any

from agentq.core.engine._approvals import Decision
from agentq.core.engine._session import Session
from agentq.core.engine._tool_call import ToolCaller, begin_effect, error_outcome, find_effect, prior_effect
from agentq.core.engine.result import RunResult
from agentq.core.errors import AgentqError
from agentq.core.faults import crash_point
from agentq.core.models import TaskStatus, ToolOutcome
from agentq.core.ports import ApprovalBook, TaskLeases
from agentq.core.remote_agents import remote_ref
from agentq.core.status import LOOK_DUE
from agentq.core.tools import idempotency_key_for
from agentq.core.tools.a2a_remote import (
    ASKING,
    ENDED,
    RemoteAgents,
    RemoteDropped,
    RemoteView,
    untrusted,
)
from agentq.core.vault import Credential
from agentq.observe.redaction import redact

log = logging.getLogger("agentq.engine")


class RemoteCalls:
    """The remote agent calls of a turn (``ToolTurn``), each a ``RemoteCall``."""

    def __init__(self, caller: ToolCaller, approvals: ApprovalBook, tasks: TaskLeases,
                 client: RemoteAgents | None = None) -> None:  # fmt: skip
        self.caller, self.approvals, self.tasks = caller, approvals, tasks
        self.client = client or RemoteAgents()

    def run(
        self, s: Session, uses: list[dict[str, Any]], allowlist: list[str], skip: set[str]
    ) -> dict[str, ToolOutcome] | RunResult:
        """The outcomes of the turn's remote calls (not those in ``skip``: decided or denied),
        or park the task on the first one that is not done."""
        refs = s.task.submission.remote_agents
        done: dict[str, ToolOutcome] = {}
        if not refs:
            return done
        for use in uses:
            ref = remote_ref(refs, use["name"])
            if ref is None or use["id"] in skip or use["name"] not in allowlist:
                continue
            s.held.check()
            outcome = RemoteCall(self, s, use, ref).run()
            if isinstance(outcome, RunResult):
                return outcome
            done[use["id"]] = outcome
        return done


class RemoteCall:
    def __init__(self, calls: RemoteCalls, s: Session, use: dict[str, Any], ref: Any) -> None:
        self.calls, self.s, self.use, self.ref = calls, s, use, ref
        self.effects = calls.caller.effects
        self.started = time.time()
        self.call = s.call(use)
        self.effect = self.call.first  # its effect record's key (``core.call_keys``)
        self.key = idempotency_key_for(s.task_id, self.effect)

    def run(self) -> ToolOutcome | RunResult:
        s, call = self.s, self.call
        self.effect, record = find_effect(self.effects, s, call)
        self.key = idempotency_key_for(s.task_id, self.effect)
        if record is None:
            record = self.effects.begin(s.lease, self.effect, call.name, step=call.step)
            if record is None:  # ours: the call counts as made from here on
                crash_point("after_effect_begin")
                return self._send()
        if record.state == "done":
            return prior_effect(self.use, record, self.started)
        if not record.remote:  # sent (maybe) by a worker that died before its answer was recorded
            return prior_effect(self.use, record, self.started)
        return self._attend(dict(record.remote))

    # ------------------------------------------------------------ contacts

    def _credential(self) -> Credential | None:
        if self.ref.credential is None:
            return None
        credentials = self.calls.caller.credentials_for(self.s)
        if credentials is None:
            from agentq.core.vault import unavailable

            raise unavailable(self.ref.credential, self.s.task.user, self.ref.host)
        credential: Credential = credentials.get(self.ref.credential)
        return credential

    def _send(self) -> ToolOutcome | RunResult:
        text = str((self.use.get("input") or {}).get("message") or "")
        if not text.strip():
            return self._finish(error_outcome(self.use, "message: give the remote agent a message (not empty)"))
        try:
            view = self.calls.client.send(self.ref, text, key=self.key, credential=self._credential())
        except RemoteDropped as exc:
            return self._finish(self._outcome(f"outcome unknown: {exc.message}", error=True, status="unknown_outcome"))
        except AgentqError as exc:  # refused, unreachable, or the remote's error: nothing was taken
            return self._finish(self._outcome(f"{exc.message}; {self.use['name']} was not run", error=True))
        crash_point("after_remote_send")
        if view.task_id is None:  # the remote answered with a message, no task: that is its answer
            return self._finish(self._outcome(untrusted(self.ref, view.text)))
        remote: dict[str, Any] = {"task_id": view.task_id, "context_id": view.context_id, "url": view.url,
                  "sent_at": time.time(), "answered": []}  # fmt: skip
        self.effects.remember(self.s.lease, self.effect, remote)
        crash_point("after_remote_recorded")
        return self._act(view, remote)

    def _attend(self, remote: dict[str, Any]) -> ToolOutcome | RunResult:
        """Re-attach to the remote task a worker recorded: look at it, never send again."""
        try:
            view = self.calls.client.look(self.ref, remote, self._credential())
        except AgentqError as exc:
            if getattr(exc, "code", "") == "remote_error":  # the remote answered: it has no such task now
                return self._finish(self._outcome(f"remote agent {self.ref.name!r}: {exc.message}", error=True))
            log.warning("task %s: remote agent %s not reachable now (%s); looking again later",
                        self.s.task_id, self.ref.name, exc.message)  # fmt: skip
            return self._park(remote)
        return self._act(view, remote)

    def _act(self, view: RemoteView, remote: dict[str, Any]) -> ToolOutcome | RunResult:
        if view.state in ENDED:
            text = view.text or f"(the remote task ended {view.state} with no text)"
            ended = "" if view.state == "completed" else f"the remote task ended {view.state}: "
            return self._finish(self._outcome(untrusted(self.ref, ended + text), error=view.state != "completed"))
        if view.state in ASKING and view.status_key not in remote.get("answered", []):
            return self._ask(view, remote)
        return self._park(remote)

    def _ask(self, view: RemoteView, remote: dict[str, Any]) -> ToolOutcome | RunResult:
        """The remote's question as an approval of this task (pause until a person answers),
        then the answer sent on to the remote task, once."""
        s = self.s
        asking = {"id": f"{self.use['id']}-ask-{view.status_key}", "name": self.use["name"], "input": {}}
        kind = "needs your answer" if view.state == "input-required" else "needs authorization"
        question = redact(  # an approval's question is shown and evented: redacted whole, then cut
            f"Remote agent {self.ref.name!r} {kind} (its words, not ours): {view.text or '(no text)'}\n"
            "Approve with your answer as the note; it is sent to the remote agent."
        )[:4000]
        decided = Decision(self.calls.approvals, s, asking, question).run()
        if isinstance(decided, RunResult):
            return decided
        answer = decided.note or ("yes" if decided.state == "approved" else "no")
        if decided.state != "approved":
            answer = f"(declined) {answer}"
        reply_id = f"{self.use['id']}-answer-{view.status_key}"
        reply, prior = begin_effect(self.effects, s, s.call({"id": reply_id, "name": self.use["name"]}))
        if prior is None:
            try:
                self.calls.client.send(self.ref, answer, key=idempotency_key_for(s.task_id, reply),
                                       credential=self._credential(), remote=remote)  # fmt: skip
                sent = ToolOutcome(tool_use_id=reply_id, name=self.use["name"], content="sent",
                                   started_at=self.started, duration_ms=0)  # fmt: skip
            except AgentqError as exc:
                sent = error_outcome({"id": reply_id, "name": self.use["name"]}, exc.message)
            self.effects.finish(s.lease, reply, sent)
        remote = {**remote, "answered": [*remote.get("answered", []), view.status_key]}
        self.effects.remember(s.lease, self.effect, remote)
        return self._attend(remote)

    # ------------------------------------------------------------ endings

    def _park(self, remote: dict[str, Any]) -> RunResult:
        """Wait for the remote task without a worker; a ``remote_poll`` message looks again."""
        s = self.s
        seconds = remote_poll_seconds(remote)
        # When the look is due rides on the park, so a look lost with a worker that died before
        # queueing it is found by the sweeper, and a stray look is told from the due one.
        self.calls.tasks.transition(s.task_id, TaskStatus.WAITING, lease=s.lease,
                                    extra={LOOK_DUE: time.time() + seconds})  # fmt: skip
        s.task = s.task.model_copy(update={"status": TaskStatus.WAITING})
        log.info("task %s: waiting for remote agent %s (task %s)", s.task_id, self.ref.name, remote["task_id"])
        return RunResult(s.task_id, "waiting", status=TaskStatus.WAITING, remote_poll=seconds)

    def _outcome(self, content: str, *, error: bool = False, status: str | None = None) -> ToolOutcome:
        return ToolOutcome(
            tool_use_id=self.use["id"],
            name=self.use["name"],
            content=content,
            is_error=error,
            status=status or ("error" if error else "ok"),  # type: ignore[arg-type]
            side_effects=True,
            started_at=self.started,
            duration_ms=int((time.time() - self.started) * 1000),
        )

    def _finish(self, outcome: ToolOutcome) -> ToolOutcome:
        self.effects.finish(self.s.lease, self.effect, outcome)
        crash_point("after_effect_finish")
        return outcome


def remote_poll_seconds(remote: dict[str, Any]) -> float:
    """When to look at a remote task again: soon at first, then a quarter of its age, between
    ``AGENTQ_A2A_POLL_SECONDS`` (30) and SQS's longest delay (15 minutes)."""
    floor = float(os.environ.get("AGENTQ_A2A_POLL_SECONDS", "30"))
    return min(900.0, max(floor, (time.time() - float(remote.get("sent_at") or time.time())) / 4))
