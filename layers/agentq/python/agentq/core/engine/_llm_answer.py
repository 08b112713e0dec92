"""The answer of an LLM call, committed as the next step with the settlement of its hold in
the same write; or, when it cannot be (the lease lost, an interrupt), settled once as an orphan
(ARCHITECTURE 4) and kept in the trace. Whether the turn ends the task is decided here."""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from typing import Any

from agentq.core.context import resumed_goal
from agentq.core.engine._commit import StepWriter
from agentq.core.engine._history import task_tools
from agentq.core.engine._llm_call import Call, call_cost, settling, task_models
from agentq.core.engine._request import RequestBuilder
from agentq.core.engine._session import Session
from agentq.core.engine._spent import forgetting
from agentq.core.engine.conversation import assistant_turn, final_text
from agentq.core.engine.result import RunResult
from agentq.core.errors import ConversationMoved, LeaseLost
from agentq.core.faults import crash_point
from agentq.core.models import CallStep, CompactStep, LLMStep, TaskStatus, TaskSubmission
from agentq.core.models.steps import MALFORMED, REFUSED
from agentq.core.output import answer_of, feedback
from agentq.core.ports import BudgetLedger, FlowPort, StepLog, TaskLeases, TenantWindowsPort
from agentq.core.pricing import PriceTable, dollars
from agentq.core.providers import LLMResponse
from agentq.core.providers.base import BATCH_PRICE_RATIO
from agentq.core.records import BudgetDelta, OrphanReason

log = logging.getLogger("agentq.engine")


class Answers:
    def __init__(
        self,
        tasks: TaskLeases,
        steps: StepLog,
        budgets: BudgetLedger,
        flow: FlowPort,
        windows: TenantWindowsPort,
        prices: PriceTable,
        requests: RequestBuilder,
        writer: StepWriter,
    ) -> None:
        self.tasks, self.steps, self.budgets, self.flow, self.windows = tasks, steps, budgets, flow, windows
        self.prices, self.requests, self.writer = prices, requests, writer

    def commit(self, s: Session, call: Call, response: LLMResponse) -> RunResult | None:
        """Commit ``call``'s answer as the next step, settling its hold with what it used."""
        crash_point("after_llm_call")
        step, settle = self.answered(s, call, response)
        sub, held = s.task.submission, s.task.inflight
        messages: list[dict[str, Any]]
        if isinstance(step, CompactStep):
            summary = step.text()
            goal = s.goal or sub.goal
            messages = [{"role": "user", "content": resumed_goal(goal, summary)}] if summary else s.messages
            finish, result, error = None, None, None
        else:
            messages, finish, result, error = turn_outcome(s.messages, sub, step, call.max_out, response.finish_reason)
        if held is not None and held.until is not None and time.time() > held.until:
            log.warning("task %s: call answered after its hold's deadline; raise AGENTQ_MAX_CALL_SECONDS", s.task_id)
        try:
            self.admitted(s, call, response)
            s.held.check()  # the heartbeat may have learned first that the lease is lost
            try:
                record = self.writer.commit(s, step, settle=settle, finish=finish, result=result, error=error)
            except ConversationMoved as moved:
                if moved.interrupt_at is not None:
                    raise
                s.inbox = dataclasses.replace(s.inbox, received=moved.received)
                # A message came in while the model answered: the answer is a turn, not the end.
                # So is a turn that was no answer (refused, cut off, malformed): the model is asked
                # again with the message, and none of its tool calls is carried out
                # (``LLMStep.tool_uses``; the conversation holds it without them).
                if error is not None:
                    log.info("task %s: turn %d ended no task (%s): a message came in", s.task_id, s.next_step,
                             error["code"])  # fmt: skip
                finish, result, error = None, None, None
                record = self.writer.commit(s, step, settle=settle)
        except ConversationMoved as moved:
            # Interrupted: the answer is discarded, and paid for, as a lost lease's would be. A
            # batch's is forgotten with that charge: read again after the next message, it was
            # committed and charged a second time.
            s.inbox = dataclasses.replace(s.inbox, received=moved.received, interrupt_at=moved.interrupt_at)
            self.discard(s, step, settle, settling(self.tasks, s, call), reason="interrupted", forget_batch=s.economy)
            log.info("task %s: answer of step %d discarded (interrupted)", s.task_id, s.next_step)
            return None
        except LeaseLost:
            if isinstance(step, LLMStep) and step.batched:
                # A batch's answer is the next claim's to read and charge: it adopts the batch's
                # hold (the record names the hold's epoch), reads the batch again and settles the
                # windows' hold recorded with it. Settled here too, as an orphan, it was charged
                # twice; the windows' hold given back here, it was taken off them twice.
                s.task = s.task.model_copy(update={"inflight": None, "batch": None})
                raise
            # The provider answered, so the tokens are spent whoever owns the task now, and
            # whoever learned of the lost lease: the ledger gets them once, as an orphan.
            self.discard(s, step, settle, call.window, reason="lease_lost")
            raise
        except Exception:
            self.commit_failed(s, call, step, settle)
            raise
        if call.window is not None:
            self.windows.settle(call.window, settle.used, settle.used_micros)
        self.writer.committed(s, record, messages)
        update: dict[str, Any] = {"inflight": None, "batch": None, **({"status": finish} if finish else {})}
        if call.compact:
            update["compacted_at"] = record.number
        s.task = s.task.model_copy(update=update)
        crash_point("after_compaction" if call.compact else "after_llm_commit")
        if finish:
            return RunResult(s.task_id, "finished", status=finish)
        return None

    def cut(self, s: Session, call: Call, response: LLMResponse) -> None:
        """The answer of the batch the task waited on, read after the task's timeout passed:
        cut, as a call in flight at the timeout is, never committed, and charged once as the
        orphan it is (``timed_out``), the batch forgotten in that write. The task ended without
        reading it used to give the batch's hold back: billed by the provider, charged nothing."""
        crash_point("after_llm_call")
        step, settle = self.answered(s, call, response)
        self.admitted(s, call, response)
        self.discard(s, step, settle, settling(self.tasks, s, call), reason="timed_out", forget_batch=True)
        log.info("task %s: answer of batch step %d cut at the task's timeout", s.task_id, s.next_step)

    def answered(self, s: Session, call: Call, response: LLMResponse) -> tuple[LLMStep | CompactStep, BudgetDelta]:
        """``call``'s answer as the step it makes, and the settlement of its hold with what it used."""
        request, route, sub = call.asked, call.route, s.task.submission
        held = s.task.inflight
        # What the call's hold took, before a batch's discount (a reply naming a model the task
        # did not may be charged past it: the warning says by how much).
        hold_usd = dollars(held.micros) / (BATCH_PRICE_RATIO if s.economy else 1) if held else None
        cost = call_cost(self.prices, sub.provider, response.model or request.model, request.model, response,
                         named=task_models(sub), hold_usd=hold_usd, task_id=s.task_id)  # fmt: skip
        if s.economy:
            cost = cost * BATCH_PRICE_RATIO
        started = call.started
        answered = CallStep(
            content=response.content,
            stop_reason=response.stop_reason,
            model=response.model or request.model,
            usage=response.usage,
            cost_usd=cost,
            reserved_tokens=call.reserved,
            attempts=response.attempts,
            started_at=started,
            duration_ms=int((time.time() - started) * 1000),
            batched=s.economy,
            provider=route.provider(sub),
            fallback_from=route.fallback,
        )
        settle = BudgetDelta(
            reserved=call.reserved,
            used=response.usage.total,
            cost_usd=cost,
            tokens_in=response.usage.input_total,
            tokens_out=response.usage.output_tokens,
            reserved_micros=held.micros if held else 0,
        )
        step: LLMStep | CompactStep
        if call.compact:
            step = CompactStep(**dict(answered), summarised_through=s.next_step - 1, tools=task_tools(s, self.steps))
        else:
            step = LLMStep(**dict(answered), cleared_before=self.requests.context(s)[1])
        return step, settle

    def admitted(self, s: Session, call: Call, response: LLMResponse) -> None:
        """The fleet's flow control learns the call answered, and what it used of the provider's
        limits (the admission taken for it settled)."""
        route = call.route
        if route.admission is not None:
            usage = response.usage
            key = route.key(s.task.submission)
            self.flow.succeeded(key, route.admission)
            # Against a provider's input limit count uncached and cache-write tokens, not reads.
            self.flow.settle(
                key, route.admission, usage.input_tokens + usage.cache_creation_input_tokens, usage.output_tokens
            )

    def commit_failed(self, s: Session, call: Call, step: LLMStep | CompactStep, settle: BudgetDelta) -> None:
        """The store failed a write after the model answered (the step's commit, or the flow
        control's, throttled past the retries: an outage), and the run ends on that error. The
        provider billed the call, so its hold is never given back as unspent: this run, which
        holds the answer, charges it as known now, as an orphan (``commit_failed``), with the
        windows' hold for it. Only while the hold's ticket is on META (``ticketed``): a commit
        whose answer was lost after it landed settled the hold already, and is charged once.
        Best effort, the store may still be failing: the hold then stays on META, where the
        next claim sets it aside and counts it as spent at its deadline (``BudgetHolds.leave``).
        A batch's answer is left to the next claim, which adopts its hold and reads it again,
        as after a lost lease."""
        if s.economy:
            return
        try:
            self.discard(s, step, settle, call.window, reason="commit_failed", ticketed=True)
        except Exception:
            log.warning("task %s: could not charge the answer of step %d after the store failed; its hold stays "
                        "on the task for the next claim", s.task_id, s.next_step, exc_info=True)  # fmt: skip
        else:
            log.info("task %s: answer of step %d charged as an orphan: the store failed its commit", s.task_id,
                     s.next_step)  # fmt: skip

    def discard(
        self,
        s: Session,
        step: LLMStep | CompactStep,
        settle: BudgetDelta,
        window: Any,
        *,
        reason: OrphanReason,
        forget_batch: bool = False,
        ticketed: bool = False,
    ) -> None:
        """An answer that will not be committed: its usage is settled once, with the hold (and
        the tenant ``window``'s hold for it), and the call stays in the trace as an orphan, with
        why (``reason``). ``forget_batch``: it is a batch's answer, and the batch's record goes
        in the write that settles it, so no later run reads it again and charges it twice.
        ``ticketed``: charged only with its hold's ticket (``commit_failed``), as a batch's is."""
        # A batch's answer is one answer whoever reads it: only the run holding its hold's ticket
        # charges and records it (a paused run whose ticket the next claim adopted charges nothing).
        ticketed = ticketed or forget_batch
        settled = self.budgets.settle_orphan(
            s.task_id, s.task.budget_id, settle, inflight_epoch=s.lease.epoch, parent_id=s.task.parent_id,
            **forgetting(forget_batch), **({"ticketed": True} if ticketed else {}),
        )  # fmt: skip
        if settled or not ticketed:
            self.steps.record_orphan(s.lease, s.next_step, step, reason=reason)
        if window is not None:
            self.windows.settle(window, settle.used, settle.used_micros)
        s.task = s.task.model_copy(update={"inflight": None, "batch": None})


def turn_outcome(
    messages: list[dict[str, Any]],
    sub: TaskSubmission,
    step: LLMStep,
    max_out: int,
    finish_reason: str | None = None,
) -> tuple[list[dict[str, Any]], TaskStatus | None, str | None, dict[str, Any] | None]:
    """The conversation after an agent turn (``messages`` and the turn, as the conversation holds
    it: ``conversation.assistant_turn``), and whether (and how) the turn ends the task
    (``finish_reason``: the provider's own word for why it stopped). The result is the turn's
    own text, as the provider returned it."""
    finish, error = turn_end(step, max_out, shrunk=max_out < sub.constraints.max_output_tokens,
                             finish_reason=finish_reason)  # fmt: skip
    result = final_text([*messages, {"role": "assistant", "content": step.content}]) if finish else None
    messages = [*messages, assistant_turn(step)]
    schema = sub.output_schema
    if schema is not None and error is None:
        answered, answer = answer_of(schema, step.content)
        if answered:  # a valid final answer ends the task, whatever else the turn holds
            finish, result = TaskStatus.SUCCEEDED, json.dumps(answer, ensure_ascii=False)
        elif finish is TaskStatus.SUCCEEDED:  # text that is not a valid answer: the model is told why
            finish = None
            messages.append({"role": "user", "content": feedback(schema, step.content)})
    if finish is TaskStatus.SUCCEEDED and (sub.outcome is not None or sub.online is not None):
        finish, result = None, None  # an answer with an outcome (or sampled) ends the task once graded (_grade)
    return messages, finish, result, error


def stopped_early(step: LLMStep, finish_reason: str | None = None) -> dict[str, Any] | None:
    """The error of a turn that ends the task ``failed`` whatever the limits were: refused, or cut
    off at the model's context window (raising the output limit would not help). It names the
    provider's own word for why it stopped (``finish_reason``, else the step's stop reason), so a
    caller can tell a refusal from a filter. None for any other turn."""
    said = finish_reason or step.stop_reason
    who = step.provider or "the provider"
    if step.stop_reason == REFUSED:
        return {
            "code": "model_refused",
            "message": f"the model's turn was stopped as a refusal ({who} said {said!r}): the model declined to "
            "answer, or a content filter or guardrail stopped it",
            "finish_reason": said,
        }
    if step.stop_reason == "model_context_window_exceeded":
        return {
            "code": "context_window_exceeded",
            "message": f"the model's turn was cut off where the context window of {step.model} ran out ({who} said "
            f"{said!r}): lower constraints.context_threshold, or leave constraints.compaction on, so the "
            "conversation leaves room for the answer",
            "finish_reason": said,
        }
    if step.stop_reason == MALFORMED:
        return {
            "code": "model_output_malformed",
            "message": f"the model's turn was malformed ({who} said {said!r}): its text or tool call could not be "
            "read, so nothing of it was carried out",
            "finish_reason": said,
        }
    return None


def turn_end(
    step: LLMStep, max_out: int, *, shrunk: bool, finish_reason: str | None = None
) -> tuple[TaskStatus | None, dict[str, Any] | None]:
    """Whether this assistant turn ends the task: tool calls go on; an answer succeeds;
    an answer cut off at the output limit is a failure that says which limit to raise
    (a truncated tool call is dropped by the provider, so it cannot be carried out), or,
    when the limit was lowered to fit what was left of the budget, the budget ran out. A turn
    refused or cut off at the context window fails the task (``stopped_early``): it was taken
    for the answer before, and the task ended ``succeeded`` with a refusal, or nothing, for result."""
    if step.stop_reason == "max_tokens" and shrunk:
        return TaskStatus.COST_EXCEEDED, {
            "code": "budget_exceeded",
            "message": f"the budget ran out during the model's turn ({max_out} output tokens were left)",
        }
    if step.stop_reason == "max_tokens":
        return TaskStatus.FAILED, {
            "code": "output_truncated",
            "message": f"the model's turn was cut off at {max_out} output tokens; raise constraints.max_output_tokens",
        }
    error = stopped_early(step, finish_reason)
    if error is not None:
        return TaskStatus.FAILED, error
    if step.tool_uses():
        return None, None
    return TaskStatus.SUCCEEDED, None
