"""The tools turn: the calls the committed LLM step asked for, then one commit of their results.

The commit also ends the task when the next call must not start (a cap, the timeout), or holds
the budget for that call in the same write, saving a round trip per turn. A spawn may park the
task in ``waiting`` instead, as may a call of a remote A2A agent (``_remote``: those run first,
so a turn that parks has run nothing else), and a call that needs a person's decision in ``paused``.
"""

from __future__ import annotations

import time
from typing import Any

from agentq import observe
from agentq.core.engine._approvals import decisions
from agentq.core.engine._commit import StepWriter
from agentq.core.engine._holds import BudgetHolds
from agentq.core.engine._policy import PolicyGate
from agentq.core.engine._remote import RemoteCalls
from agentq.core.engine._request import RequestBuilder
from agentq.core.engine._session import Session
from agentq.core.engine._spawn import Spawn, SpawnPorts
from agentq.core.engine._stops import stop_error, stop_reason
from agentq.core.engine._tool_call import ToolCaller
from agentq.core.engine._workspace import Workspaces
from agentq.core.engine.config import EngineConfig
from agentq.core.engine.conversation import conversation, final_text, task_tools
from agentq.core.engine.result import RunResult
from agentq.core.errors import BudgetExceeded
from agentq.core.fanout import SPAWN_TOOL, FanoutLauncher
from agentq.core.faults import crash_point
from agentq.core.models import LLMStep, StepRecord, TaskStatus, ToolOutcome, ToolsStep, repeated_tool_use_id
from agentq.core.ports import ApprovalBook
from agentq.core.providers.retry import MALFORMED
from agentq.core.remote_agents import remote_ref
from agentq.core.reservation import Reservation
from agentq.core.workspace import WORKSPACE_TOOLS, WorkspaceRef, WorkspaceRefused


class ToolTurn:
    def __init__(
        self,
        approvals: ApprovalBook,
        spawn_ports: SpawnPorts,
        config: EngineConfig,
        tools: ToolCaller,
        fanout: FanoutLauncher | None,
        writer: StepWriter,
        holds: BudgetHolds,
        requests: RequestBuilder,
        workspaces: Workspaces | None = None,
        policy: PolicyGate | None = None,
        remote: RemoteCalls | None = None,
    ) -> None:
        self.approvals, self.spawn_ports = approvals, spawn_ports
        self.config, self.tools, self.fanout = config, tools, fanout
        self.writer, self.holds, self.requests = writer, holds, requests
        self.workspaces = workspaces
        self.policy = policy
        self.remote = remote

    def run(self, s: Session, llm: LLMStep) -> RunResult | None:
        """Run the turn's tool calls and commit their results (None), or park the task."""
        uses = llm.tool_uses()
        repeated = repeated_tool_use_id(uses)
        if repeated is not None:
            return self._refused(s, uses, repeated)
        allowlist = task_tools(s.task.submission)
        # Every call of the turn is checked before any of them runs, in the order they run, the
        # ones before it counted as made (_policy): a denied one never runs (ToolCaller.call), an
        # asked one waits for a person's decision (decisions).
        s.verdicts = self.policy.tool_verdicts(s, run_order(s, uses)) if self.policy is not None else {}
        denied = {i for i, v in s.verdicts.items() if v.effect == "deny"}
        decided = decisions(self.approvals, s, uses, allowlist, self.tools.vault, self.tools.credentials_for(s))
        if isinstance(decided, RunResult):
            return decided
        if self.remote is not None:
            remote = self.remote.run(s, uses, allowlist, skip={*decided, *denied})
            if isinstance(remote, RunResult):
                return remote
            decided = {**decided, **remote}
        spawns = [
            u for u in uses
            if u["name"] == SPAWN_TOOL and SPAWN_TOOL in allowlist and u["id"] not in decided and u["id"] not in denied
        ]  # fmt: skip
        outcomes: list[ToolOutcome]
        spawning = bool(spawns) and self.fanout is not None
        if spawns and self.fanout is not None:
            changes = self.workspaces.child_changes if self.workspaces is not None else None
            spawned = Spawn(self.spawn_ports, self.fanout, self.tools, s, uses, spawns[0], decided, changes).run()
            if isinstance(spawned, RunResult):
                return spawned
            outcomes = spawned
        else:
            notes = self.tools.notes_for(s)
            outcomes = []
            for use in uses:
                s.held.check()
                outcomes.append(decided.get(use["id"]) or self.tools.call(s, use, allowlist, notes))
        s.held.check()
        outcomes = [_marked(o, s) for o in outcomes]
        ref, outcomes = self._checkpoint(s, outcomes)
        body = ToolsStep(results=outcomes, workspace=ref)
        messages = conversation(
            s.goal or s.task.submission.goal, [*s.steps, _draft(s, body)], s.task.submission.output_schema
        )
        record = self._commit(s, body, messages)
        if self.workspaces is not None and ref is not None:
            self.workspaces.committed(s)
            s.task = s.task.model_copy(update={"workspace": ref})
        self.writer.committed(s, record, messages)
        if spawning:
            self._spawn_spans(s, outcomes, decided)
        crash_point("after_tools_commit")
        return None

    def _spawn_spans(self, s: Session, outcomes: list[ToolOutcome], decided: dict[str, ToolOutcome]) -> None:
        """The ``execute_tool`` span of each spawn_subagents call the spawn made its result for
        (``observe.otel.spawned``; a call whose result a decision gave, or any call of a turn that
        spawned nothing, went through ``ToolCaller``, which spans it), timed by its result: a spawn
        that parked the task began in an earlier run."""
        spec = self.requests.registry(s).get(SPAWN_TOOL)
        described = spec.description if spec is not None else None
        for outcome in outcomes:
            if outcome.name == SPAWN_TOOL and outcome.tool_use_id not in decided:
                error = outcome.status if outcome.is_error or outcome.status != "ok" else None
                observe.otel.spawned(s.task_id, outcome.tool_use_id, started=outcome.started_at,
                                     ended=outcome.started_at + outcome.duration_ms / 1000, error=error,
                                     description=described)  # fmt: skip

    def _refused(self, s: Session, uses: list[dict[str, Any]], repeated: str) -> RunResult:
        """A turn giving one tool_use id to two calls makes none of them, whoever answered it:
        their verdicts, approvals and effect records are found by id, so a call a rule denies
        would run under another's verdict. The providers refuse such a reply (as malformed,
        ``providers.retry.distinct_tool_uses``); this holds for any provider, and for a turn
        committed before they did. Each call is told it was not made, and the task fails with
        ``malformed_response`` in the same commit (fail closed: asked again, a server that
        repeats ids would repeat them)."""
        said = f"not made: the model's turn gave tool_use id {repeated[:64]!r} to more than one call"
        now = time.time()
        body = ToolsStep(results=[
            ToolOutcome(tool_use_id=u["id"], name=u["name"], content=said, is_error=True, status="error",
                        started_at=now, duration_ms=0)
            for u in uses
        ])  # fmt: skip
        error = {"code": MALFORMED, "message": f"{said}; none of its calls was made"}
        messages = conversation(
            s.goal or s.task.submission.goal, [*s.steps, _draft(s, body)], s.task.submission.output_schema
        )
        record = self.writer.commit(s, body, finish=TaskStatus.FAILED, result=final_text(messages), error=error)
        self.writer.committed(s, record, messages)
        s.task = s.task.model_copy(update={"status": TaskStatus.FAILED})
        return RunResult(s.task_id, "finished", status=TaskStatus.FAILED, error=error)

    def _checkpoint(self, s: Session, outcomes: list[ToolOutcome]) -> tuple[WorkspaceRef | None, list[ToolOutcome]]:
        """The workspace the calls left, stored before their step commits (``_workspace``). A
        workspace past the task's quota, or one that cannot be read back (``WorkspaceRefused``),
        is put back as the last step left it, and the turn's last workspace call says so: the
        model reads it as that call's error."""
        if self.workspaces is None or s.workspace is None:
            return None, outcomes
        try:
            return self.workspaces.checkpoint(s), outcomes
        except WorkspaceRefused as exc:
            self.workspaces.revert(s)
            note = f"\n[refused: {exc.message}; this turn's changes to the workspace were undone]"
            touched = [i for i, o in enumerate(outcomes) if o.name in (*WORKSPACE_TOOLS, "python_exec")]
            at = touched[-1] if touched else len(outcomes) - 1
            if at < 0:
                return None, outcomes
            hit = outcomes[at]
            changed = hit.model_copy(update={"content": hit.content + note, "is_error": True, "status": "error"})
            return None, [*outcomes[:at], changed, *outcomes[at + 1 :]]

    def _commit(self, s: Session, body: ToolsStep, messages: list[dict[str, Any]]) -> StepRecord:
        """Commit the tool results, and in the same write either end the task (cap, timeout)
        or reserve tokens for the next LLM call, saving one round trip per turn."""
        number = s.next_step
        preview = Session(
            s.held, s.task, [*s.steps, _draft(s, body)], messages, s.deadline, earlier_turns=s.earlier_turns
        )
        stop = stop_reason(preview, self.config.slice_margin_seconds)
        if isinstance(stop, TaskStatus):
            error = stop_error(preview, stop)
            record = self.writer.commit(s, body, finish=stop, result=final_text(messages), error=error)
            s.task = s.task.model_copy(update={"status": stop})
            return record
        reserve = money = 0
        if stop is None:
            est_in, reserve = self.requests.wanted_reservation(preview)
            money = self.holds.hold_micros(preview, reserve, est_in)
        until = self.holds.hold_until(s)
        try:
            record = self.writer.commit(
                s, body, reserve_next=reserve, reserve_next_micros=money, hold_until=until if reserve else None
            )
        except BudgetExceeded:
            record = self.writer.commit(s, body)
            reserve = 0
        if reserve:
            held = Reservation(amount=reserve, epoch=s.lease.epoch, step=number + 1, until=until, micros=money)
            s.task = s.task.model_copy(update={"inflight": held})
        return record


def run_order(s: Session, uses: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The turn's calls in the order they run: a remote agent's first (``RemoteCalls``, before
    the turn's others), then the others as the model gave them, a spawn last (``Spawn`` runs the
    others before it makes its children)."""
    refs = s.task.submission.remote_agents
    remote = [u for u in uses if refs and remote_ref(refs, u["name"]) is not None]
    spawns = [u for u in uses if u["name"] == SPAWN_TOOL and u not in remote]
    return [*remote, *(u for u in uses if u not in remote and u not in spawns), *spawns]


def _marked(outcome: ToolOutcome, s: Session) -> ToolOutcome:
    """The outcome with the policy rules that took part in its call, for the step and the trace."""
    verdict = s.verdicts.get(outcome.tool_use_id)
    mark = verdict.mark() if verdict is not None else None
    return outcome if mark is None else outcome.model_copy(update={"policy": mark})


def _draft(s: Session, body: ToolsStep) -> StepRecord:
    return StepRecord(task_id=s.task_id, number=s.next_step, epoch=s.lease.epoch, committed_at=time.time(), body=body)
