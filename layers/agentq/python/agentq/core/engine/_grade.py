"""The grade turn: an answer of a task with an outcome is graded before the task ends, as a
durable step (ARCHITECTURE 3, the grade).

The answer's LLM step commits without ending the task (``_llm_answer.turn_outcome``); the loop
then finds an ungraded answer (``GradeTurn.due``) and runs this turn, which follows the protocol
of every recorded operation (``_operation``): the grade's effect record is begun, fenced, before
any judge runs (crash point ``after_grade_begin``), the judges run once, and their grade is
finished onto the record (crash point ``after_grade``) before the ``GradeStep`` commits. A worker
killed anywhere resumes from what is stored: no record, it grades; a finished one, it commits the
recorded grade (``replayed``) without running a judge again; one begun and never finished, its
judges may have run, so they are not run again: the grade fails ``grader_interrupted``, like a
side effect's unknown outcome. The grading model's call is a model call like any other: it is
checked against the policy rules first (``_policy``, kind ``model``: a rule that denies or asks
for it ends the task ``failed`` with ``policy_denied`` before anything is held or begun, the
answer kept as the result), then it holds the task tree's budget and every window the agent's
calls hold before the grade is begun (``_grade_budget``); the grade step's commit settles that
hold to the call's tokens and dollars, in the same write, and puts the grade on META.

The step ends the task ``succeeded`` (passed), or leaves the feedback as the agent's next
message (below the bar, attempts left: ``conversation``), or ends it ``failed_outcome`` with
the answer kept (the attempts spent, or a judge that failed). A task sampled by its alias for
online evaluation is graded by the same step, which then only observes (``_online``).
"""

from __future__ import annotations

import dataclasses
import json
import time
from decimal import Decimal
from typing import Any, ClassVar

from agentq import observe
from agentq.core.engine._commit import StepWriter
from agentq.core.engine._grade_budget import GradeBudget, GradingCall, usage_of
from agentq.core.engine._llm_call import call_cost
from agentq.core.engine._online import count, grading_outcome, observes_only, skipped
from agentq.core.engine._operation import RecordedOperation
from agentq.core.engine._policy import PolicyGate, refusal, refuse_model_call
from agentq.core.engine._session import Session
from agentq.core.engine.conversation import final_text
from agentq.core.engine.result import RunResult
from agentq.core.errors import ConversationMoved, LeaseLost
from agentq.core.faults import crash_point
from agentq.core.graders import GradeInput, WorkspaceFiles
from agentq.core.grading import (
    RUBRIC_SYSTEM,
    GradeError,
    feedback_message,
    judge_fault,
    parse_rubric_grade,
    rubric_prompt,
    score_of,
    within,
)
from agentq.core.models import (
    GradeCheck,
    GradeStep,
    LLMStep,
    MessageStep,
    OutcomeSpec,
    TaskStatus,
    TaskSubmission,
    ToolOutcome,
    Usage,
)
from agentq.core.output import answer_of
from agentq.core.policies import ALLOWED, PolicyCall, Verdict
from agentq.core.ports import EffectLog, QualityBook
from agentq.core.pricing import PriceTable, dollars
from agentq.core.providers import LLMProvider, LLMRequest, ProviderFactory
from agentq.core.providers.base import RemoteProvider, StreamingProvider
from agentq.core.records import EffectRecord
from agentq.core.tools import ToolRegistry

GRADE = "grade"  # the effect record's tool name; its id is ``grade-<step>``


def answered(sub: TaskSubmission, step: LLMStep) -> tuple[bool, Any]:
    """Whether this turn is the task's answer (as it would end the task without an outcome),
    and the parsed answer with an output schema."""
    if step.no_answer():  # cut off or refused: as the turn's commit ends the task (``_llm_answer.turn_end``)
        return False, None
    if sub.output_schema is not None:
        return answer_of(sub.output_schema, step.content)
    return not step.tool_uses(), None


class GradeTurn:
    def __init__(
        self,
        effects: EffectLog,
        providers: ProviderFactory,
        prices: PriceTable,
        tools: ToolRegistry,
        writer: StepWriter,
        budget: GradeBudget,
        quality: QualityBook,
        policy: PolicyGate | None = None,
    ) -> None:
        self.effects, self.providers, self.prices, self.tools, self.writer = effects, providers, prices, tools, writer
        self.budget, self.quality, self.policy = budget, quality, policy

    def due(self, s: Session) -> bool:
        """An answer of a task with an outcome (or sampled for online evaluation), not graded yet."""
        sub = s.task.submission
        if grading_outcome(sub) is None or s.task.status.terminal or not s.steps:
            return False
        last = s.steps[-1].body
        return isinstance(last, LLMStep) and answered(sub, last)[0]

    def run(self, s: Session) -> RunResult | None:
        """Grade the answer once and commit the grade (None: the agent answers again)."""
        sub = s.task.submission
        outcome = grading_outcome(sub)
        assert outcome is not None
        last = s.steps[-1].body
        assert isinstance(last, LLMStep)
        parsed = answered(sub, last)[1]
        if sub.output_schema is not None:
            answer = json.dumps(parsed, ensure_ascii=False)
        else:
            answer = final_text(s.messages) or ""
        observing = observes_only(sub)
        attempt = 1 if observing else self.attempt(s)
        call = None
        if outcome.rubric is not None and self.effects.get(s.task_id, f"grade-{s.next_step}") is None:
            call = self.grading_call(s, outcome, answer, attempt)
            verdict = self.checked(s, call)  # before anything of it is held or begun, as any model call
            if verdict.effect != "allow":  # nothing sent: the task ends naming the rule, its answer kept
                if observing:  # an online grade never stops the task: no grade
                    return self.commit(s, skipped(outcome, refusal(verdict, "grading model call")), answer, None, None)
                return refuse_model_call(
                    self.budget.tasks, self.budget.holds, s, verdict, what="grading model call", result=answer
                )
            if observing:  # an online grade never stops the task: without the budget for it, no grade
                if not self.budget.try_hold(s, call):
                    why = "the task's budget (or its tenant's hour) could not cover the grading model's call"
                    return self.commit(s, skipped(outcome, why), answer, None, None)
            else:
                stopped = self.budget.hold(s, call, answer)  # held before the grade is begun, as any call
                if stopped is not None:
                    return stopped
        grading = Grading(self, s, outcome, answer, parsed, attempt, call)
        try:
            step = grading.run()
        except BaseException:  # a lost lease at the begin, the cover or the record: this run settles its windows
            self.budget.abandoned(call)
            raise
        try:
            return self.commit(s, step, answer, call, grading.prior_epoch)
        except BaseException:  # the grade is recorded: its call's usage is known, whoever commits it
            self.budget.settle_window(call, step.usage.total, usage_of(step).used_micros)
            raise

    def checked(self, s: Session, call: GradingCall) -> Verdict:
        """The policy rules' verdict on the grading model's call: a model call like the agent's
        (``LLMTurn.run``), of the grading model, estimated at the hold it will take."""
        if self.policy is None:
            return ALLOWED
        _, tokens, money = self.budget.estimate(call)
        return self.policy.check(
            s, PolicyCall("model", model=call.model, estimated_tokens=tokens, estimated_usd_micros=money)
        )

    def grading_call(self, s: Session, outcome: OutcomeSpec, answer: str, attempt: int) -> GradingCall:
        """The grading model's call of this grade, as it will be sent."""
        sub = s.task.submission
        assert outcome.rubric is not None
        provider, model = outcome.grading_model(sub.provider, sub.model)
        grading = sub.model_copy(
            update={"provider": provider, "model": model, "script": outcome.script if provider == "scripted" else None,
                    "fallbacks": []}
        )  # fmt: skip
        request = LLMRequest(
            model=model, system=RUBRIC_SYSTEM, max_tokens=outcome.max_output_tokens, task_id=f"{s.task_id}/grade",
            messages=rubric_history(s, outcome.rubric, answer, attempt),
        )  # fmt: skip
        return GradingCall(provider, model, grading, request)

    def attempt(self, s: Session) -> int:
        """Which answer of this round this is: one more than the last grade's, unless a person's
        message was delivered since (a new round of the conversation)."""
        prior = s.task.grade
        if prior and prior.get("delivered") == s.inbox.delivered and not prior.get("passed"):
            return int(prior.get("attempt", 0)) + 1
        return 1

    def judge(
        self, s: Session, outcome: OutcomeSpec, answer: str, parsed: Any, attempt: int, call: GradingCall | None
    ) -> GradeStep:
        """Run the outcome's judges: the code check, then (if it passes) the rubric's model."""
        started = time.time()
        checks: list[GradeCheck] = []
        error: dict[str, Any] | None = None
        if outcome.grader is not None:
            check, error = self.code_check(s, outcome, answer, parsed, attempt)
            checks.append(check)
        if call is not None and error is None and all((c.score or 0) >= outcome.bar for c in checks):
            check, error = self.rubric_check(s, outcome, call)
            checks.append(check)
        usage = sum_usage([c.usage for c in checks if c.usage is not None])
        score = None if error is not None else min(c.score or 0.0 for c in checks)
        held = s.task.inflight if call is not None else None
        return GradeStep(
            attempt=attempt,
            max_attempts=outcome.max_attempts,
            bar=outcome.bar,
            score=score,
            passed=score is not None and score >= outcome.bar,
            feedback="\n\n".join(c.feedback for c in checks if c.feedback),
            checks=checks,
            error=error,
            usage=usage,
            cost_usd=sum((c.cost_usd for c in checks), Decimal(0)),
            reserved_tokens=held.amount if held else 0,
            reserved_micros=held.micros if held else 0,
            may_be_billed=call is not None and call.may_be_billed,
            started_at=started,
            duration_ms=int((time.time() - started) * 1000),
        )

    def code_check(
        self, s: Session, outcome: OutcomeSpec, answer: str, parsed: Any, attempt: int
    ) -> tuple[GradeCheck, dict[str, Any] | None]:
        name = outcome.grader
        assert name is not None
        started = time.time()
        try:
            spec = self.tools.grader(name)
            if spec is None:
                known = ", ".join(sorted(self.tools.grader_names())) or "(none)"
                raise GradeError("grader_unknown", f"no grader named {name!r} in this worker's tool modules: {known}")
            ws = s.workspace
            given = GradeInput(
                task_id=s.task_id, goal=s.goal or s.task.submission.goal, answer=answer, output=parsed,
                attempt=attempt, files=WorkspaceFiles(ws.directory) if ws is not None else None,
            )  # fmt: skip
            score, feedback = score_of(within(outcome.timeout_seconds, f"grader {name!r}", lambda: spec(given)))
        except Exception as exc:  # a GradeError, or a fault no check foresaw: recorded, never a crash of the run
            failed = judge_fault(exc, f"grader {name!r}")
            took = int((time.time() - started) * 1000)
            return GradeCheck(kind="code", name=name, feedback=failed.message, duration_ms=took), failed.to_dict()
        took = int((time.time() - started) * 1000)
        return GradeCheck(kind="code", name=name, score=score, feedback=feedback, duration_ms=took), None

    def rubric_check(
        self, s: Session, outcome: OutcomeSpec, call: GradingCall
    ) -> tuple[GradeCheck, dict[str, Any] | None]:
        """The grading model's verdict. Its call is a model call like the agent's in the telemetry
        too (``observe.llm_call``): a ``chat`` span with the conventions' attributes, marked
        ``agentq.grade``, a point of each GenAI client metric, its tokens in the EMF metrics."""
        provider, model, grading, request = call.provider, call.model, call.submission, call.request
        name = f"{provider}/{model}"
        started = time.time()
        try:
            chosen: LLMProvider = within(outcome.timeout_seconds, "the grading model", lambda: self.providers(grading))
            self.budget.sending(s)
            with observe.llm_call(
                provider=provider, model=model, max_tokens=request.max_tokens, task_id=s.task_id, step=s.next_step,
                endpoint=chosen.endpoint if isinstance(chosen, RemoteProvider) else None,
                streams=isinstance(chosen, StreamingProvider) and chosen.streams(request),
            ) as observed:  # fmt: skip
                if observed.otel_span is not None:
                    observed.otel_span.set_attribute("agentq.grade", True)
                call.may_be_billed = True  # until it answers: a failed or abandoned call may have been billed
                try:
                    response = within(outcome.timeout_seconds, "the grading model",
                                      lambda: self.budget.attempts(s, call, lambda: chosen.complete(request)))  # fmt: skip
                finally:
                    self.budget.gave_up(call)
                call.may_be_billed = False
                observed.answered(response)
        except GradeError as exc:
            took = int((time.time() - started) * 1000)
            return GradeCheck(kind="rubric", name=name, feedback=exc.message, duration_ms=took), exc.to_dict()
        held = s.task.inflight  # the grading call's hold, priced at the grading model's price
        cost = call_cost(self.prices, provider, response.model or model, model, response,
                         hold_usd=dollars(held.micros) if held else None, task_id=s.task_id)  # fmt: skip
        took = int((time.time() - started) * 1000)
        spent = {"usage": response.usage, "cost_usd": cost, "duration_ms": took}
        try:
            text = "\n".join(b["text"] for b in response.content if b.get("type") == "text" and b.get("text"))
            score, feedback = parse_rubric_grade(text)
        except Exception as exc:  # not a grade, or a fault reading it: the tokens were spent all the same, counted
            failed = judge_fault(exc, "reading the grading model's answer")
            return GradeCheck(kind="rubric", name=name, feedback=failed.message, **spent), failed.to_dict()
        return GradeCheck(kind="rubric", name=name, score=score, feedback=feedback, **spent), None

    def commit(
        self, s: Session, step: GradeStep, answer: str, call: GradingCall | None, prior_epoch: int | None
    ) -> RunResult | None:
        """The grade as the next step, the grading call's hold settled to its usage in the same write."""
        finish: TaskStatus | None = None
        error: dict[str, Any] | None = None
        observing = observes_only(s.task.submission)
        if step.passed or observing:  # an online grade observes: the answer ends the task as it would
            finish = TaskStatus.SUCCEEDED
        elif not step.retries:
            finish = TaskStatus.FAILED_OUTCOME
            error = step.error or {
                "code": "outcome_failed",
                "message": f"the answer's grade {step.score:.2f} stayed below the bar {step.bar:.2f} after "
                f"{step.attempt} attempt(s)",
            }
            error = {**error, "grade": step.score, "feedback": step.feedback[:1000]}
        settle, counted = self.budget.settlement(s, call, step, prior_epoch)
        meta = self.meta(s, step)
        if observing:
            meta["online"] = s.task.submission.online.alias if s.task.submission.online else None
        if finish is not None:  # the grade that ends the task is its version's, counted once
            counts = count(self.quality, s, step, meta)  # never raises: a count it cannot make is kept
            if counts is not None:
                meta.update(counts)
        retries = step.retries and not observing
        messages = [*s.messages, feedback_message(s.messages, step)] if retries else s.messages
        result = answer if finish is not None else None
        try:
            record = self.writer.commit(
                s, step, settle=settle, counted=counted, finish=finish, result=result, error=error, grade=meta
            )
        except ConversationMoved as moved:  # a message came in while grading: the agent goes on with it
            s.inbox = dataclasses.replace(s.inbox, received=moved.received)
            finish, error = None, None
            record = self.writer.commit(s, step, settle=settle, counted=counted, grade=meta)
        self.budget.settled(s, call, settle)
        self.writer.committed(s, record, messages)
        s.task = s.task.model_copy(update={"grade": meta, **({"status": finish} if finish else {})})
        observe.graded(s.task, step, record.number)
        crash_point("after_grade_commit")
        if finish is not None:
            return RunResult(s.task_id, "finished", status=finish, error=error)
        return None

    def meta(self, s: Session, step: GradeStep) -> dict[str, Any]:
        """The grade as META keeps it: this grade, and the grading's totals for the task."""
        prior = s.task.grade or {}
        return {
            "step": s.next_step,
            "attempt": step.attempt,
            "max_attempts": step.max_attempts,
            "score": step.score,
            "bar": step.bar,
            "passed": step.passed,
            "feedback": step.feedback[:1000],
            "error": step.error,
            "delivered": s.inbox.delivered,
            "grades": int(prior.get("grades", 0)) + 1,
            "tokens_in": int(prior.get("tokens_in", 0)) + step.usage.input_total,
            "tokens_out": int(prior.get("tokens_out", 0)) + step.usage.output_tokens,
            "cost_usd": str(Decimal(str(prior.get("cost_usd", "0"))) + step.cost_usd),
            # a sampled task: what its counts added to its version's buckets, and those not made yet (``_online``)
            **{k: prior[k] for k in ("counted", "uncounted") if k in prior},
        }


class Grading(RecordedOperation[EffectRecord, GradeStep]):
    """The judges of one answer, run at most once: begin (fenced; answers with an earlier
    worker's record if there is one), crash point, then judge and finish, or act on the record."""

    after_create: ClassVar[str | None] = "after_grade_begin"

    def __init__(
        self, turn: GradeTurn, s: Session, outcome: OutcomeSpec, answer: str, parsed: Any, attempt: int,
        call: GradingCall | None,
    ) -> None:  # fmt: skip
        self.turn, self.s, self.outcome, self.answer, self.parsed, self.attempt = (
            turn,
            s,
            outcome,
            answer,
            parsed,
            attempt,
        )
        self.call = call
        self.key = f"grade-{s.next_step}"
        self._prior: EffectRecord | None = None
        self.prior_epoch: int | None = None  # the epoch of an earlier worker's record of this grade

    def check(self) -> EffectRecord | None:
        return None  # the begin is the check: one conditional write that answers with a prior record

    def create(self) -> None:
        self._prior = self.turn.effects.begin(self.s.lease, self.key, GRADE)

    def check_again(self) -> EffectRecord | None:
        return self._prior

    def act(self, record: EffectRecord | None) -> GradeStep:
        if record is not None:
            return self.recorded(record)
        started = time.time()
        step = self.turn.judge(self.s, self.outcome, self.answer, self.parsed, self.attempt, self.call)
        kept = ToolOutcome(
            tool_use_id=self.key, name=GRADE, content=step.model_dump_json(), started_at=started,
            duration_ms=step.duration_ms,
        )  # fmt: skip
        try:
            self.turn.effects.finish(self.s.lease, self.key, kept)
        except LeaseLost:  # the grade goes unrecorded: what its call used is settled once, here
            self.turn.budget.orphaned(self.s, self.call, step)
            raise
        crash_point("after_grade")
        return step

    def recorded(self, record: EffectRecord) -> GradeStep:
        """An earlier worker's grade of this answer: committed as it was, or (begun, never
        finished) failed, its judges not run again."""
        self.prior_epoch = record.epoch
        if record.state == "done" and record.content:
            return GradeStep.model_validate_json(record.content).model_copy(update={"replayed": True})
        return GradeStep(
            attempt=self.attempt, max_attempts=self.outcome.max_attempts, bar=self.outcome.bar, score=None,
            passed=False, replayed=True, started_at=time.time(), duration_ms=0,
            error={"code": "grader_interrupted", "message": "the grade was started by a worker that stopped before "
                   "recording it; it was not run again (a grader runs at most once an answer)"},
        )  # fmt: skip


def rubric_history(s: Session, rubric: str, answer: str, attempt: int) -> list[dict[str, Any]]:
    """The grading model's conversation: its earlier grades of this round's answers as its
    earlier turns (it grades the next answer knowing what it asked for), then this answer."""
    messages: list[dict[str, Any]] = []
    answer_before: str | None = None
    for record in s.steps:
        body = record.body
        if isinstance(body, MessageStep):
            messages, answer_before = [], None
        elif isinstance(body, LLMStep):
            answer_before = body.text()
        elif isinstance(body, GradeStep):
            rubric_grade = next((c for c in body.checks if c.kind == "rubric" and c.score is not None), None)
            if rubric_grade is not None and body.attempt < attempt:
                said = rubric_prompt(rubric, s.goal or s.task.submission.goal, answer_before or "", body.attempt)
                grade = json.dumps({"score": rubric_grade.score, "feedback": rubric_grade.feedback})
                messages += [{"role": "user", "content": said}, {"role": "assistant", "content": grade}]
    prompt = rubric_prompt(rubric, s.goal or s.task.submission.goal, answer, attempt)
    return [*messages, {"role": "user", "content": prompt}]


def sum_usage(usages: list[Usage]) -> Usage:
    return Usage(
        input_tokens=sum(u.input_tokens for u in usages),
        output_tokens=sum(u.output_tokens for u in usages),
        cache_creation_input_tokens=sum(u.cache_creation_input_tokens for u in usages),
        cache_read_input_tokens=sum(u.cache_read_input_tokens for u in usages),
        cache_creation_1h_input_tokens=sum(u.cache_creation_1h_input_tokens for u in usages),
    )
