"""``Engine``: claim a task, rebuild its session from the committed steps, and run turns until
it ends, parks, loses its lease, or its time slice ends.

Each turn is a module of its own (``_llm_turn`` with ``_llm_call``, ``_tool_turn`` with ``_tool_call``,
``_approvals`` and ``_spawn``, ``_messages`` for a person's messages and interrupts, ``_grade`` for
an answer's grade against its outcome); budget holds are ``_holds``; the request is ``_request``. The
loop only decides which turn comes next from the last committed step, and how a run ends.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import threading
from collections.abc import Callable
from typing import Any

from agentq import observe
from agentq.core.dependencies import dependency_goal
from agentq.core.engine._caps import CallWindows
from agentq.core.engine._commit import StepWriter
from agentq.core.engine._finish import finish_without_step
from agentq.core.engine._grade import GradeTurn
from agentq.core.engine._grade_budget import GradeBudget
from agentq.core.engine._holds import BudgetHolds, HoldsInFlight
from agentq.core.engine._llm_answer import stopped_early
from agentq.core.engine._llm_call import waited_on
from agentq.core.engine._llm_turn import LLMTurn
from agentq.core.engine._messages import MessageTurn
from agentq.core.engine._policy import PolicyGate
from agentq.core.engine._remote import RemoteCalls
from agentq.core.engine._request import RequestBuilder
from agentq.core.engine._session import KeeperFactory, LeaseKeeper, LeaseState, Session
from agentq.core.engine._spawn import SpawnPorts
from agentq.core.engine._stops import stop_reason
from agentq.core.engine._tool_call import ToolCaller
from agentq.core.engine._tool_turn import ToolTurn
from agentq.core.engine._workspace import Workspaces
from agentq.core.engine.config import EngineConfig
from agentq.core.engine.conversation import conversation, final_text
from agentq.core.engine.result import RunResult, lease_lost
from agentq.core.errors import DETERMINISTIC_FAULTS, ConversationMoved, LeaseLost, TaskNotFound, fault_error
from agentq.core.fanout import FanoutLauncher
from agentq.core.faults import crash_point
from agentq.core.models import Lease, LLMStep, Task, TaskStatus, TaskSubmission
from agentq.core.ports import EngineStorage, SubtreeTimeout
from agentq.core.pricing import PriceTable, load_price_table
from agentq.core.providers import LLMProvider, ProviderFactory, default_provider_factory
from agentq.core.records import ClaimOwner, Inbox
from agentq.core.secrets import Secrets, SecretSource
from agentq.core.tools import ToolRegistry, default_registry
from agentq.core.tools.mcp import McpServers
from agentq.core.vault import Cipher
from agentq.observe.redaction import run_scope

log = logging.getLogger("agentq.engine")


class Engine:
    def __init__(
        self,
        store: EngineStorage,
        *,
        worker_id: str,
        tools: ToolRegistry | None = None,
        providers: ProviderFactory = default_provider_factory,
        prices: PriceTable | None = None,
        config: EngineConfig = EngineConfig(),
        fanout: FanoutLauncher | None = None,
        secrets: SecretSource | None = None,
        mcp: McpServers | None = None,
        egress: Callable[..., Any] | None = None,
        cipher: Cipher | None = None,
        time_out: SubtreeTimeout | None = None,
    ) -> None:
        """``egress``: makes the egress proxy of a task whose workspace allows hosts
        (``core.tools.egress.egress_factory``); None: a workspace has no network at all.
        ``cipher``: opens the vault's credentials (``core.vault_crypto``); None: a tool that
        asks for one is told it is unavailable. ``time_out``: ends a sub-agent whose parent's
        fan-out gave up on it, with its subtree (control's, ``core.ports.SubtreeTimeout``)."""
        self.store = store
        self.worker_id = worker_id
        self.tools = tools if tools is not None else default_registry()
        self.secrets: SecretSource = secrets if secrets is not None else Secrets.from_env()
        self.providers = providers
        self.prices = prices or load_price_table()
        self.config = config
        self.fanout = fanout
        self.windows = CallWindows(
            store.windows.with_default(config.default_tenant_limits), store.caps, store.approvals
        )
        self._requests = RequestBuilder(self.tools, self.secrets, mcp)
        # Each part gets the storage ports it uses, no more (core.ports).
        self._holds = BudgetHolds(store.budgets, store.tasks, self.prices, config, self._requests)
        writer = StepWriter(store.steps, config)
        self.policy = PolicyGate(store.policies, store.budgets, config.policy_cache_seconds, store.caps, store.steps)
        self._llm_turn = LLMTurn(
            store.tasks, store.steps, store.budgets, store.flow, self.windows, self._provider, self.prices, self._holds,
            self._requests, writer, self.policy,
        )  # fmt: skip
        caller = ToolCaller(
            store.flow, store.effects, store.notes, store.steps, self._requests, self.secrets, store.memory_stores,
            vault=store.vault, cipher=cipher,
        )  # fmt: skip
        spawning = SpawnPorts(store.spawns, store.budgets, store.tasks, store.steps, time_out)
        self._workspaces = Workspaces(
            store.workspaces, worker_id=worker_id, root=config.workspace_root, quota=config.workspace_quota,
            egress=egress, record_start=store.tasks.start_workspace,
            credentials=caller.credentials_for,
        )  # fmt: skip
        self._tool_turn = ToolTurn(
            store.approvals,
            spawning,
            config,
            caller,
            fanout,
            writer,
            self._holds,
            self._requests,
            self._workspaces,
            self.policy,
            RemoteCalls(caller, store.approvals, store.tasks),
        )
        self._message_turn = MessageTurn(store.messages, self._holds, writer)
        graded = GradeBudget(self._holds, store.budgets, store.tasks, self.windows, self.prices)
        self._grade_turn = GradeTurn(
            store.effects, self._provider, self.prices, self.tools, writer, graded, store.quality, self.policy
        )

    def _provider(self, submission: TaskSubmission) -> LLMProvider:
        """``self.providers`` as it is when the call is made (an adapter may swap it)."""
        return self.providers(submission)

    def run(
        self,
        task_id: str,
        *,
        deadline: float | None = None,
        keeper: KeeperFactory | None = None,
        on_beat: Callable[[], None] | None = None,
        stop: threading.Event | None = None,
        owner: ClaimOwner | None = None,
    ) -> RunResult:
        """Run ``task_id`` until it ends, loses its lease, or ``deadline`` draws near.

        ``keeper`` replaces the per-task heartbeat thread (the worker's shared heartbeat);
        ``on_beat`` is called on every heartbeat of the default one. ``owner``: the worker
        process whose liveness keeps the claim alive (``storage.workers``), recorded by the
        claim. Every line logged meanwhile, in this thread or the threads it starts, carries
        the task id and the step.
        """
        # The run's own values redact its results and files (observe.redaction.current): never
        # another run's, another tenant's, that this worker holds too.
        with observe.task_context(task_id=task_id, worker_id=self.worker_id), run_scope():
            return self._run(task_id, deadline=deadline, keeper=keeper, on_beat=on_beat, stop=stop, owner=owner)

    def _run(
        self,
        task_id: str,
        *,
        deadline: float | None,
        keeper: KeeperFactory | None,
        on_beat: Callable[[], None] | None,
        stop: threading.Event | None,
        owner: ClaimOwner | None,
    ) -> RunResult:
        if owner is None:
            claimed = self.store.tasks.claim(task_id, self.worker_id, self.config.lease_seconds)
        else:
            claimed = self.store.tasks.claim(task_id, self.worker_id, self.config.lease_seconds, owner=owner)
        if claimed is None:
            return RunResult(task_id, "not_claimed")
        lease, task = claimed
        observe.bind(lease_epoch=lease.epoch)
        crash_point("after_claim")
        # The lease is kept alive from here, before the reads that rebuild the session: on a
        # loaded store they can take a good part of the lease.
        held = LeaseState(lease=lease, tenant=task.tenant)
        session = Session(held=held, task=task, steps=[], messages=[], deadline=deadline, stop=stop)
        guard = (
            keeper(held)
            if keeper
            else LeaseKeeper(self.store.tasks, held, self.config.lease_seconds, self.config.heartbeat_interval, on_beat)
        )
        resumed_from = 0
        with guard, observe.otel.task_run(task, self.worker_id, task.step):
            try:
                # What the claim found committed, from the latest compaction on: nothing before
                # it is sent again, so nothing before it is read.
                steps = self.store.steps.load(task_id, upto=task.step, since=task.compacted_at)
                resumed_from = steps[-1].number if steps else 0
                session.steps = list(steps)
                session.earlier_turns = task.llm_steps - session.llm_turns
                session.goal = self._goal(task)
                session.messages = conversation(session.goal, steps, task.submission.output_schema)
                session.limits = self.windows.limits(task.tenant)
                # The user's day is counted, capped or not, while a rule of the tenant reads it.
                counting = bool(task.user) and self.policy.counts_user_spend(task.tenant)
                session.caps = self.windows.caps_of(task, count_user=counting)
                session.inbox = Inbox(task.messages_received, task.messages_delivered, task.interrupt_at)
                self._holds.take_over(session)
                self._workspaces.open(session)  # the files as the last committed step left them
                result = self._loop(session)
                if observe.otel.enabled():  # one read, for the trace only
                    with contextlib.suppress(TaskNotFound):  # deleted meanwhile: nothing to show
                        observe.otel.budget_after_run(self.store.budgets.get(session.task.budget_id))
            except HoldsInFlight as exc:
                result = self._defer(session, exc)
            except LeaseLost as exc:
                self._superseded(lease)
                self._holds.release_unsent(session)
                if "stopping" in exc.details:  # a stop's mark: the lease goes back for the next delivery
                    with contextlib.suppress(LeaseLost):
                        self.store.tasks.release(session.lease)
                result = lease_lost(task_id, exc)
            except DETERMINISTIC_FAULTS as exc:
                result = self._fail_on_fault(session, exc)
            except Exception:  # an outage: give the lease back, so the redelivery can claim at once
                with contextlib.suppress(Exception):  # a stalled run taken over: its span was sent for it
                    self._superseded(lease)
                self._give_back(session)
                raise
            finally:
                try:
                    self._workspaces.close(session)
                finally:
                    if session.credentials is not None:  # its values no longer held in the redactor
                        session.credentials.close()
        result.steps_committed = session.committed
        result.resumed_from_step = resumed_from
        result.claimed = task
        if result.status is not None and (
            (result.status.terminal and result.outcome == "finished") or result.status is TaskStatus.IDLE
        ):
            self._invocation_ended(session.task, result)  # its flush sends the run's spans too
        else:
            observe.otel.flush(metrics=False)  # the run's spans, once (a Lambda's metrics: its handler's flush)
        if result.status is not None and (result.status.terminal or result.outcome == "waiting"):
            # Ended, or parked until a message of its own (idle, paused, waiting): no claim
            # comes for these holds at their deadline, so the dispatcher's ``release_holds``
            # message does. An idle conversation may never be claimed again.
            live = [h.until for h in session.task.lapsed_holds.values() if h.until]
            result.lapsed_until = max(live, default=None)
        return result

    def _superseded(self, lease: Lease) -> None:
        """The run lost its lease: when a later claim took the task over, that claim sent this
        run's span for it (``observe.otel.lost_run``), and this run sends none. One read, for the
        trace only."""
        if not observe.otel.enabled():
            return
        with contextlib.suppress(TaskNotFound):
            if self.store.tasks.get(lease.task_id).lease_epoch > lease.epoch:
                observe.otel.superseded()

    def _invocation_ended(self, claimed: Task, result: RunResult) -> None:
        """This run ended the task's invocation (an answer, a failure, an interrupt's ``idle``):
        its ``invoke_agent`` span, with the tokens it used (read back: its earlier runs count)."""
        if not observe.otel.enabled() or result.status is None:
            return
        try:
            now = self.store.tasks.get(claimed.task_id)
        except Exception:
            observe.otel.flush(metrics=False)  # the run's spans, as the span of its end is not sent
            raise
        observe.otel.task_ended(claimed, result.status.value, result.error, tokens=(now.tokens_in, now.tokens_out))
        try:  # after the flush: a worker killed before it leaves the span to the redelivery (dispatch._ended)
            self.store.tasks.note_traced(claimed.task_id, claimed.invocation)
        except Exception:  # the span went out; a redelivery may send it again
            log.warning("could not note the trace of task %s's end", claimed.task_id, exc_info=True)

    def _loop(self, s: Session) -> RunResult:
        while True:
            observe.bind(step=s.next_step)
            s.held.check()
            if self._message_turn.due(s):
                idle = self._message_turn.run(s)
                if idle is not None:
                    return idle
                continue
            if self._grade_turn.due(s):  # an answer of a task with an outcome: graded before it ends
                with observe.otel.step(s.next_step, "grade"):
                    ended = self._grade_turn.run(s)
                if ended is not None:
                    return ended
                continue
            last = s.steps[-1].body if s.steps else None
            if isinstance(last, LLMStep) and last.tool_uses():
                with observe.otel.step(s.next_step, "tools"):
                    parked = self._tool_turn.run(s, last)
                if parked is not None:
                    return parked
                if s.task.status.terminal:
                    return RunResult(s.task_id, "finished", status=s.task.status)
                continue
            if isinstance(last, LLMStep) and not (
                s.task.submission.output_schema is not None and not s.task.status.terminal
            ):  # already finished: committed with its terminal status
                if s.task.status.terminal:
                    return RunResult(s.task_id, "finished", status=s.task.status)
                ended = self._end_on_copied_answer(s, last)  # a fork's copied answer, which no commit of its own ended
                if ended is not None:
                    return ended
                continue  # a message came in since the claim: delivered, and answered
            stop = stop_reason(s, self.config.slice_margin_seconds)
            if stop == "slice":
                # The next call will not start under this lease: its hold goes back now, known
                # unspent, rather than counted until its deadline by the next claim.
                self._holds.hand_back(s)
                return RunResult(s.task_id, "continue")
            if stop is TaskStatus.TIMED_OUT and waited_on(s) is not None:
                # Timed out while its batch ran: the provider billed that batch, so its answer is
                # read and charged (cut, not committed) before the task ends; ended first, its
                # hold went back and the batch was charged nothing.
                with observe.otel.step(s.next_step, "llm"):
                    return self._llm_turn.run(s, cut=stop) or RunResult(s.task_id, "finished", status=stop)
            if stop is not None:
                return finish_without_step(self.store.tasks, self._holds, s, stop)
            with observe.otel.step(s.next_step, "llm"):
                ended = self._llm_turn.run(s)
            if ended is not None:
                return ended

    def _end_on_copied_answer(self, s: Session, last: LLMStep) -> RunResult | None:
        """A fork at the model's answer (``control.operations.fork``) starts where its source's run
        ended, but the commit that ended it was the source's: the fork ends now, as that commit
        ended its source: ``succeeded`` with that answer (a message sent to it goes on from there,
        as one sent to its source would), or ``failed`` when the answer was cut off at the output
        limit (``output_truncated``: its dependents and callback must not take a cut answer for a
        result), refused or cut off at the context window (``_llm_answer.stopped_early``). Read as
        already ended, the fork stayed ``running`` for good, its lease held.

        Either move ends the turn, so it is refused while a message waits (ARCHITECTURE 11, as a
        commit that ends the task is: ``storage.steps._heeds_messages``): one accepted after the
        claim read the inbox (while the fork's workspace was restored) was taken by the running
        fork, and ending over it left it never answered. None then: the loop delivers it, and the
        model answers it, as after a turn that ended the task for a message that came in."""
        self._holds.release(s)
        error = stopped_early(last)
        if last.stop_reason == "max_tokens":
            error = {
                "code": "output_truncated",
                "message": "the answer this fork starts from was cut off at the output limit: fork at the step "
                "before it with a higher constraints.max_output_tokens to have it answered again",
            }
        to = TaskStatus.FAILED if error is not None else TaskStatus.SUCCEEDED
        result = final_text(s.messages) if error is None else None
        try:
            self.store.tasks.transition(
                s.task_id, to, lease=s.lease, result=result, error=error, delivered=s.inbox.delivered
            )
        except ConversationMoved as moved:
            s.inbox = dataclasses.replace(s.inbox, received=moved.received)
            log.info("task %s: a message came in before its copied answer ended it: answering it", s.task_id)
            return None
        s.task = s.task.model_copy(update={"status": to})
        return RunResult(s.task_id, "finished", status=to)

    def _goal(self, task: Task) -> str:
        """The task's goal, followed by the results of the tasks it depends on (immutable once
        they succeeded, so every claim rebuilds the same first message)."""
        if not task.submission.depends_on:
            return task.submission.goal
        found = {t.task_id: t for t in self.store.tasks.get_many(task.submission.depends_on)}
        return dependency_goal(task.submission.goal, [found[i] for i in task.submission.depends_on if i in found])

    def spend_lapsed_holds(self, task: Task) -> float:
        """Count as spent the lapsed holds of ``task`` (ended or not) whose calls can no longer
        complete (their outcome is unknown: see ``_holds``); the seconds until the last live
        one can (0: none is left)."""
        return max(self._holds.spend_lapsed(task).live, default=0.0)

    def _defer(self, s: Session, why: HoldsInFlight) -> RunResult:
        """Give the lease back and come back later: when a lapsed hold's call can no longer
        complete, or (``UnknownUsage``) to look again whether calls of unknown outcome were
        reported or the cap raised.

        The lease may have been taken over meanwhile (the wait is for an older epoch's call, so
        this run may itself be slow): then there is nothing to give back, and the run ends
        ``lease_lost`` like any other fenced-out run (an expected race: one log line)."""
        try:
            self.store.tasks.release(s.lease)
        except LeaseLost as lost:
            log.info("task %s: lease taken over while deferring (%s)", s.task_id, why.code)
            return lease_lost(s.task_id, lost)
        log.info("task %s deferred %.1fs: %s", s.task_id, why.wait, why)
        return RunResult(s.task_id, "deferred", error={"code": why.code, "message": str(why), "retry_after": why.wait})

    def _fail_on_fault(self, s: Session, exc: Exception) -> RunResult:
        """A fault that running the task again would meet again (``DETERMINISTIC_FAULTS``):
        the task ends ``failed`` with it now, so its status says why and a parent wakes. The
        hold goes back only if its call never went out (``BudgetHolds.give_up``): a fault met
        reading a reply came after the provider billed it."""
        log.exception("task %s failed: %s", s.task_id, type(exc).__name__)
        error = fault_error(exc)
        try:
            self._holds.give_up(s)
            self.store.tasks.transition(
                s.task_id, TaskStatus.FAILED, lease=s.lease, result=final_text(s.messages), error=error
            )
        except LeaseLost as lost:
            return lease_lost(s.task_id, lost)
        s.task = s.task.model_copy(update={"status": TaskStatus.FAILED})
        return RunResult(s.task_id, "finished", status=TaskStatus.FAILED, error=error)

    def _give_back(self, s: Session) -> None:
        """The lease back, so the redelivery can claim at once, and the hold with it only if its
        call never went out (``BudgetHolds.leave``): one that was sent may have been billed, and
        is counted as spent, never returned."""
        try:
            self._holds.leave(s)
        except Exception:  # lost, or the store is what failed: the lease lapses by itself
            log.debug("could not give task %s back", s.task_id, exc_info=True)
