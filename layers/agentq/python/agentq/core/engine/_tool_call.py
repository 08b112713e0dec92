"""One tool call of a turn: a side-effecting one runs at most once (ARCHITECTURE 3).

Its effect record is begun, fenced, before the tool runs and finished after: a worker that finds
a record begun by another never runs the tool again (the model reads ``unknown_outcome``, or the
recorded result when it was finished). A tool whose calls keep failing fleet-wide has its
circuit opened (``core.flow``) and is not run while it is open.

A workspace call whose sandbox reaches the task's allowed hosts (``NETWORK_TOOLS``: ``shell`` in a
task that allows hosts) is a side effect from its first contact with one (``NetworkedCall``): the
egress proxy records its effect, fenced, before it opens that connection, so after a crash a call
that reached the network is reported ``unknown_outcome`` (or its recorded result replayed), never
run again, while a call that stayed in the workspace left no record and runs again on the
restored workspace (replay-safe).

An effect record is its call's own (``core.call_keys``): it names the call's LLM step, and a
record another call left under the same tool_use id (a later turn reusing an id) is neither
replayed nor reported for this call; this call's record, and its idempotency key, are then
under its qualified key.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, ClassVar

from agentq import observe
from agentq.core.call_keys import CallRef, own_record
from agentq.core.context import RECALL_TOOL
from agentq.core.engine._credentials import TaskCredentials
from agentq.core.engine._memory import TaskMemory
from agentq.core.engine._operation import RecordedOperation
from agentq.core.engine._request import RequestBuilder
from agentq.core.engine._session import Session, TaskNotes
from agentq.core.faults import crash_point
from agentq.core.flow import Admission
from agentq.core.models import ToolOutcome, ToolsStep
from agentq.core.ports import EffectLog, FlowPort, MemoryBook, NoteBook, StepLog, VaultBook
from agentq.core.records import EffectRecord
from agentq.core.secrets import SecretSource
from agentq.core.tools import ToolContext, idempotency_key_for
from agentq.core.tools.egress import ContactMark
from agentq.core.vault import Cipher
from agentq.core.workspace import NETWORK_TOOLS


class ToolCaller:
    def __init__(
        self,
        flow: FlowPort,
        effects: EffectLog,
        notes: NoteBook,
        steps: StepLog,
        requests: RequestBuilder,
        secrets: SecretSource,
        memory: MemoryBook | None = None,
        vault: VaultBook | None = None,
        cipher: Cipher | None = None,
    ) -> None:
        self.flow, self.effects, self.notes, self.steps = flow, effects, notes, steps
        self.requests = requests
        self.secrets = secrets
        self.memory = memory
        self.vault, self.cipher = vault, cipher

    def credentials_for(self, s: Session) -> TaskCredentials | None:
        """The vault of the task's user (and tenant), opened on first use and kept for the run."""
        if self.vault is None:
            return None
        if s.credentials is None:
            s.credentials = TaskCredentials(self.vault, self.cipher, s.task.tenant, s.task.user, s.held)
        credentials: TaskCredentials = s.credentials
        return credentials

    def notes_for(self, s: Session) -> TaskNotes:
        """The notes the turn's tools see (writes fenced by the run's lease)."""
        return TaskNotes(self.notes, s.held)

    def memory_for(self, s: Session, tool_use_id: str) -> TaskMemory | None:
        """The task's memory stores, if it has any attached; the step is the one holding the call."""
        attachments = s.task.submission.memory
        if not attachments or self.memory is None:
            return None
        return TaskMemory(self.memory, s.task.tenant, s.held, attachments, s.next_step - 1, tool_use_id)

    def call(self, s: Session, use: dict[str, Any], allowlist: list[str], notes: TaskNotes) -> ToolOutcome:
        spec = self.requests.registry(s).get(use["name"])
        verdict = s.verdicts.get(use["id"])
        if verdict is not None and verdict.effect == "deny":
            return self.denied(s, use, verdict.reason(), bool(spec and spec.side_effects and use["name"] in allowlist))
        if use["name"] == RECALL_TOOL:
            return recalled(self.steps, s, use)
        circuit = f"tool/{use['name']}"
        admission = self.flow.admit(circuit, 0, 0) if spec is not None else None
        if admission is not None and not admission.ok:  # it failed repeatedly, fleet-wide: not run, not started
            return error_outcome(
                use,
                f"tool {use['name']!r} is unavailable: it failed repeatedly and its circuit is open; try again in "
                f"{admission.wait:.0f}s, or do without it",
            )
        pending = PendingCall(
            s=s, use=use, allowlist=allowlist, notes=notes, registered=spec is not None,
            description=spec.description if spec is not None else None,
            side_effects=bool(spec and spec.side_effects and use["name"] in allowlist),
            circuit=circuit, admission=admission, started=time.time(),
        )  # fmt: skip
        if pending.side_effects:
            return SideEffect(self, pending).run()
        if use["name"] in NETWORK_TOOLS and spec is not None and _egress(s) is not None:
            return NetworkedCall(self, pending).run()
        return self.execute(pending)

    def denied(self, s: Session, use: dict[str, Any], reason: str, side_effects: bool) -> ToolOutcome:
        """A call a policy rule denies: never run; the model reads the rule's message as the
        tool's error. A side-effecting one still takes its effect record (begun and finished
        with the denial), so that a call an earlier worker had already started before the rule
        existed is reported as what it was (``prior_effect``), never as denied."""
        outcome = error_outcome(use, f"{reason}; {use['name']} was not run")
        if not side_effects:
            return outcome
        key, prior = begin_effect(self.effects, s, s.call(use))
        if prior is not None:
            return prior_effect(use, prior, time.time())
        self.effects.finish(s.lease, key, outcome)
        return outcome

    def execute(self, pending: PendingCall, key: str | None = None) -> ToolOutcome:
        """Run the call. ``key``: its effect record's (the idempotency key's source), if it has one."""
        s, use = pending.s, pending.use
        ctx = ToolContext(
            task_id=s.task_id,
            tool_use_id=use["id"],
            idempotency_key=idempotency_key_for(s.task_id, key or use["id"]),
            notes=pending.notes,
            deadline=tool_deadline(s),
            secrets=self.secrets,
            memory=self.memory_for(s, use["id"]),
            workspace=s.workspace,
            credentials=self.credentials_for(s),
        )
        with observe.tool_call(
            use["name"],
            registered=pending.registered,
            call_id=use["id"],
            task_id=s.task_id,
            step=s.next_step,
            description=pending.description,
        ) as call:
            run = self.requests.registry(s).execute(use["name"], use.get("input") or {}, ctx, pending.allowlist)
            call.finished(run.status, run.is_error)
        crash_point("after_tool_run")
        if pending.admission is not None:
            if run.tool_failed:
                self.flow.failed(pending.circuit, pending.admission)
            else:
                self.flow.succeeded(pending.circuit, pending.admission)
        return ToolOutcome(
            tool_use_id=use["id"],
            name=use["name"],
            # Redacted twice, whatever the tool returned or raised: by the registry before it
            # cut the text, and by ToolOutcome itself, as every outcome however it is made.
            content=run.content,
            is_error=run.is_error,
            status=run.status,
            side_effects=pending.side_effects,
            started_at=pending.started,
            duration_ms=run.duration_ms,
        )


@dataclass(frozen=True)
class PendingCall:
    """One call of the turn, admitted and about to run: what running it (or replaying it) needs."""

    s: Session
    use: dict[str, Any]
    allowlist: list[str]
    notes: TaskNotes
    registered: bool  # the registry knows the tool (an unknown one runs to an error result)
    description: str | None  # the registered tool's, for the telemetry
    side_effects: bool  # it may change the world: it runs at most once (SideEffect)
    circuit: str  # its fleet-wide circuit (core.flow)
    admission: Admission | None
    started: float


class SideEffect(RecordedOperation[EffectRecord, ToolOutcome]):
    """A side-effecting call: begin (fenced; answers with an earlier worker's record if there
    is one), crash point, then run and finish, or replay what the earlier worker recorded."""

    after_create: ClassVar[str | None] = "after_effect_begin"

    def __init__(self, caller: ToolCaller, pending: PendingCall) -> None:
        self.caller, self.pending = caller, pending
        self._prior: EffectRecord | None = None
        self.call = pending.s.call(pending.use)
        self.key = self.call.first

    def check(self) -> EffectRecord | None:
        return None  # the begin is the check: one conditional write that answers with a prior record

    def create(self) -> None:
        self.key, self._prior = begin_effect(self.caller.effects, self.pending.s, self.call)

    def check_again(self) -> EffectRecord | None:
        return self._prior

    def act(self, record: EffectRecord | None) -> ToolOutcome:
        if record is not None:
            return prior_effect(self.pending.use, record, self.pending.started)
        outcome = self.caller.execute(self.pending, self.key)
        self.caller.effects.finish(self.pending.s.lease, self.key, outcome)
        crash_point("after_effect_finish")
        return outcome


class NetworkedCall(SideEffect):
    """A call whose sandbox may reach the task's allowed hosts. Before it runs: an earlier
    worker's record of it, if any, is acted on (replayed or ``unknown_outcome``), never run
    again. Else it runs with the egress proxy armed (``ContactMark``): its first contact with a
    host begins its effect record (fenced, then the ``after_effect_begin`` crash point) before
    the connection opens, and a call that made one is finished like any side effect. A call that
    made none wrote no record: after a crash it runs again on the restored workspace. While it
    runs, the heartbeat looks at the task's META (``LeaseState.reaching_since``): a stop's mark
    found there kills its sandbox (``TaskWorkspace.halt``), as does a credentialed request the
    proxy refused for it."""

    after_create = None  # the record is begun at the first contact, in the proxy

    def check(self) -> EffectRecord | None:
        self.key, record = find_effect(self.caller.effects, self.pending.s, self.call)
        return record

    def create(self) -> None:
        pass

    def check_again(self) -> EffectRecord | None:
        return None  # check() found none; this run begins it at the first contact

    def act(self, record: EffectRecord | None) -> ToolOutcome:
        pending = self.pending
        if record is not None:
            return prior_effect(pending.use, record, pending.started, WORKSPACE_NOTE)
        egress, held = _egress(pending.s), pending.s.held
        held.reaching_since = time.monotonic()  # the heartbeat looks for a stop meanwhile
        try:
            with egress.armed(ContactMark(self._begin)) as mark:
                outcome = self.caller.execute(pending, self.key)
        finally:
            held.reaching_since = None
        if not mark.fired:
            return outcome
        outcome = outcome.model_copy(update={"side_effects": True})
        self.caller.effects.finish(pending.s.lease, self.key, outcome)
        crash_point("after_effect_finish")
        return outcome

    def _begin(self) -> None:
        call = self.call
        if self.caller.effects.begin(self.pending.s.lease, self.key, call.name, step=call.step) is not None:
            raise RuntimeError("another run of this task already started this call")
        crash_point("after_effect_begin")


WORKSPACE_NOTE = (
    " The command had reached the network. The workspace is as the last committed step left it: "
    "files the command wrote are not there."
)


def begin_effect(effects: EffectLog, s: Session, call: CallRef) -> tuple[str, EffectRecord | None]:
    """Begin ``call``'s effect record (fenced): its key, and None (go ahead, run it) or the
    record an earlier run of this call left (``core.call_keys``: never another call's)."""
    return own_record(call, lambda key: effects.begin(s.lease, key, call.name, step=call.step), _effect_bound)


def find_effect(effects: EffectLog, s: Session, call: CallRef) -> tuple[str, EffectRecord | None]:
    """The key of ``call``'s effect record, and the record if an earlier run of it began one."""
    return own_record(call, lambda key: effects.get(s.task_id, key), _effect_bound)


def _effect_bound(record: EffectRecord) -> tuple[int | None, str | None, float]:
    return record.step, record.tool, record.started_at


def _egress(s: Session) -> Any:
    """The egress proxy of the task's workspace on this worker, if the task allows hosts."""
    return getattr(s.workspace, "egress", None)


def prior_effect(use: dict[str, Any], prior: EffectRecord, started: float, note: str = "") -> ToolOutcome:
    """A side-effecting call that an earlier worker already started: never run it again."""
    if prior.state == "done":
        replay = (
            f"{prior.content or ''}\n[recorded by a worker that stopped before this step committed; not run again.{note}]"
            if note
            else prior.content or ""
        )
        return ToolOutcome(
            tool_use_id=use["id"],
            name=use["name"],
            content=replay,
            is_error=prior.is_error,
            status="replayed",
            side_effects=True,
            started_at=started,
            duration_ms=0,
        )
    return ToolOutcome(
        tool_use_id=use["id"],
        name=use["name"],
        content=(
            f"outcome unknown: tool '{use['name']}' was started by a worker that stopped before "
            "recording its result. It was NOT run again, to avoid repeating a side effect. "
            f"Check its effect before deciding whether to retry.{note}"
        ),
        is_error=True,
        status="unknown_outcome",
        side_effects=True,
        started_at=started,
        duration_ms=0,
    )


def tool_deadline(s: Session) -> float | None:
    started = s.task.started_at or time.time()
    deadlines = [started + s.task.submission.constraints.timeout_seconds]
    if s.deadline is not None:
        deadlines.append(s.deadline)
    return min(deadlines)


def recalled(steps_log: StepLog, s: Session, use: dict[str, Any]) -> ToolOutcome:
    """``recall``: a tool result cleared from the context, read from the task's own steps
    (those before the latest compaction from the store: a resumed session does not hold them)."""
    wanted = (use.get("input") or {}).get("tool_use_id")
    first = s.steps[0].number if s.steps else 1
    for steps in (s.steps, steps_log.load(s.task_id, upto=first - 1) if first > 1 else []):
        for record in steps:
            if isinstance(record.body, ToolsStep):
                for result in record.body.results:
                    if result.tool_use_id == wanted:
                        return ToolOutcome(
                            tool_use_id=use["id"], name=RECALL_TOOL, content=result.content,
                            is_error=result.is_error, started_at=time.time(), duration_ms=0,
                        )  # fmt: skip
    return error_outcome(use, f"no tool result with id {wanted!r} in this task")


def error_outcome(use: dict[str, Any], message: str) -> ToolOutcome:
    return ToolOutcome(
        tool_use_id=use["id"],
        name=use["name"],
        content=message,
        is_error=True,
        status="error",
        started_at=time.time(),
        duration_ms=0,
    )
