"""Online evaluation (``core.aliases.OnlineEval``) on the in-memory twin, through the real
submission path and the real engine: an alias samples a fraction of its new tasks by a hash of
the task id (the same id, the same choice; over many ids, within a binomial bound of the rate);
an unsampled task makes no grading call; a sampled task's answer is graded once and lands in
the bucket of the version it ran; the grade observes (the task ends ``succeeded`` with its
answer whatever the grade, a failing grader, or a budget too small for the grading call) and
its tokens count in the task's budget, shown apart. Bad input and the HTTP/CLI surface are in
tests/test_online_eval_api.py; real SIGKILLs in tests/test_online_eval_processes.py."""

from __future__ import annotations

import json
import math
import uuid
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from agentq.control.submit import submit_once
from agentq.core.agents import AgentSpec
from agentq.core.aliases import AliasSpec, OnlineEval, sampled
from agentq.core.engine import Engine, EngineConfig
from agentq.core.models import GradeStep, LLMStep, OutcomeSpec, Script, TaskStatus
from agentq.core.quality import GradeTally, hour_of
from agentq.core.tools import ToolRegistry
from agentq.queueing.endings import task_ended
from agentq.storage.container import Storage
from agentq.storage.table import RELEASE_ATTEMPTS, TransactionConflict

STORAGE = "memory"
IDS = 4000
TENANT = "t"


@pytest.fixture(autouse=True)
def ledger(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "ledger.jsonl"
    monkeypatch.setenv("AGENTQ_TEST_LEDGER", str(path))
    return path


def grader_runs(ledger: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in ledger.read_text().splitlines()] if ledger.exists() else []


def _within(count: int, n: int, p: float) -> bool:
    """``count`` of ``n`` draws of probability ``p`` within 5 standard deviations."""
    return abs(count - n * p) <= 5 * math.sqrt(n * p * (1 - p)) + 1


def _ids(n: int) -> list[str]:
    return [uuid.uuid4().hex for _ in range(n)]


@pytest.mark.parametrize("rate", [0.0, 0.01, 0.1, 0.25, 0.5, 0.9, 1.0])
def test_the_sampled_share_of_each_rate_is_within_a_binomial_bound(rate: float) -> None:
    ids = _ids(IDS)
    chosen = sum(sampled(TENANT, "support", "prod", i, rate) for i in ids)
    assert _within(chosen, IDS, rate), (rate, chosen)
    if rate in (0.0, 1.0):
        assert chosen == IDS * rate


def test_a_task_id_makes_the_same_choice_every_time_and_a_higher_rate_only_adds_tasks() -> None:
    ids = _ids(2000)
    picked = {r: {i for i in ids if sampled(TENANT, "s", "prod", i, r)} for r in (0.05, 0.1, 0.3, 0.7)}
    assert picked[0.05] <= picked[0.1] <= picked[0.3] <= picked[0.7]
    assert all(sampled(TENANT, "s", "prod", i, 0.3) for i in picked[0.3])  # the same answer when asked again


def _agent(store: Storage, version_answer: str) -> None:
    store.agents.create(
        TENANT,
        AgentSpec(
            name="support",
            provider="scripted",
            script=Script.model_validate({"turns": [{"text": version_answer}]}),
            system="s",
        ),
    )


def _alias(store: Storage, rate: float, grade: dict[str, Any], *pairs: tuple[int, int]) -> None:
    versions = [{"version": v, "weight": w} for v, w in pairs or ((1, 100),)]
    spec = AliasSpec.model_validate({"versions": versions, "online": {"rate": rate, "grade": grade}})
    store.aliases.set(TENANT, "support", "prod", spec)


def _submit_and_run(store: Storage, registry: ToolRegistry, task_id: str, **extra: Any) -> Any:
    raw = {"goal": "do the job", "agent": "support@prod", **extra}
    submit_once(store, registry, raw, tenant=TENANT, task_id=task_id)
    return Engine(store, worker_id="w", tools=registry, config=EngineConfig(lease_seconds=10)).run(task_id)


def _grades(store: Storage, task_id: str) -> list[GradeStep]:
    return [s.body for s in store.steps.load(task_id) if isinstance(s.body, GradeStep)]


def _buckets(store: Storage) -> dict[int, Any]:
    now = hour_of(__import__("time").time())
    return {b.version: b for b in store.quality.read(TENANT, "support", now - 1, now + 1)}


def test_submissions_through_the_alias_carry_the_grade_exactly_when_their_id_is_sampled(
    store: Storage, registry: ToolRegistry
) -> None:
    _agent(store, "DONE")
    _alias(store, 0.3, {"grader": "says_done"})
    for task_id in _ids(200):
        task = submit_once(store, registry, {"goal": "g", "agent": "support@prod"}, tenant=TENANT, task_id=task_id).task
        want = sampled(TENANT, "support", "prod", task_id, 0.3)
        assert (task.submission.online is not None) is want, task_id
        assert store.tasks.get(task_id).submission.online == task.submission.online  # kept: a resume sees it


def test_an_unsampled_task_makes_no_grading_call_and_counts_nowhere(
    store: Storage, registry: ToolRegistry, ledger: Path
) -> None:
    _agent(store, "DONE")
    _alias(store, 0.5, {"grader": "says_done"})
    task_id = next(i for i in _ids(100) if not sampled(TENANT, "support", "prod", i, 0.5))
    result = _submit_and_run(store, registry, task_id)
    assert result.status is TaskStatus.SUCCEEDED
    assert grader_runs(ledger) == []
    assert _grades(store, task_id) == []
    assert [s.body.kind for s in store.steps.load(task_id)] == ["llm"]
    assert _buckets(store) == {}


def test_a_sampled_tasks_grade_lands_in_the_bucket_of_the_version_it_ran(
    store: Storage, registry: ToolRegistry, ledger: Path
) -> None:
    _agent(store, "DONE")  # v1 passes the grader
    _agent(store, "not finished")  # v2 does not
    _alias(store, 1.0, {"grader": "says_done"}, (1, 50), (2, 50))
    ran: dict[int, int] = {1: 0, 2: 0}
    for task_id in _ids(16):
        result = _submit_and_run(store, registry, task_id)
        task = store.tasks.get(task_id)
        # observed, never gated: succeeded with its own answer, whatever the grade, never asked again
        assert result.status is TaskStatus.SUCCEEDED, result
        version = int(str(task.submission.agent).split("@")[1])
        assert task.result == ("DONE" if version == 1 else "not finished")
        assert [s.body.kind for s in store.steps.load(task_id)] == ["llm", "grade"]
        (grade,) = _grades(store, task_id)
        assert grade.passed is (version == 1) and grade.max_attempts == 1
        assert task.grade is not None and task.grade["online"] == "prod"
        ran[version] += 1
    assert len(grader_runs(ledger)) == 16
    buckets = _buckets(store)
    assert {v: (b.graded, b.passed, b.errors) for v, b in buckets.items()} == {
        v: (n, n if v == 1 else 0, 0) for v, n in ran.items() if n
    }
    assert all(b.pass_rate == (1.0 if v == 1 else 0.0) for v, b in buckets.items())


@pytest.mark.parametrize("grader", ["grader_raises", "grader_nonsense"])
def test_a_sampled_grade_that_fails_keeps_the_answer_and_counts_as_an_error(
    store: Storage, registry: ToolRegistry, grader: str
) -> None:
    _agent(store, "my answer")
    _alias(store, 1.0, {"grader": grader})
    task_id = uuid.uuid4().hex
    result = _submit_and_run(store, registry, task_id)
    task = store.tasks.get(task_id)
    assert result.status is TaskStatus.SUCCEEDED and task.result == "my answer" and task.error is None
    (grade,) = _grades(store, task_id)
    assert grade.error is not None and grade.score is None
    (bucket,) = _buckets(store).values()
    assert (bucket.graded, bucket.passed, bucket.errors, bucket.pass_rate) == (1, 0, 1, None)


def test_the_grading_models_tokens_count_in_the_tasks_budget_and_are_shown_apart(
    store: Storage, registry: ToolRegistry
) -> None:
    _agent(store, "Blue.")
    _alias(store, 1.0, {"rubric": "Names a colour.", "script": {"turns": [{"text": '{"score": 0.3}'}]}})
    task_id = uuid.uuid4().hex
    result = _submit_and_run(store, registry, task_id)
    assert result.status is TaskStatus.SUCCEEDED  # below the bar: observed, not retried
    task = store.tasks.get(task_id)
    steps = store.steps.load(task_id)
    (grade,) = _grades(store, task_id)
    spent = grade.usage.total
    agent = sum(s.body.usage.total for s in steps if isinstance(s.body, LLMStep))
    assert spent > 0 and task.tokens_in + task.tokens_out == agent + spent
    assert task.grade is not None and task.grade["tokens_in"] + task.grade["tokens_out"] == spent
    assert store.budgets.get(task.budget_id).used == agent + spent
    (bucket,) = _buckets(store).values()
    assert bucket.grade_tokens == spent and bucket.grade_cost_usd == grade.cost_usd.quantize(Decimal("0.000001"))
    assert (bucket.graded, bucket.passed) == (1, 0)


def test_a_budget_too_small_for_the_grading_call_skips_the_grade_and_the_task_still_succeeds(
    store: Storage, registry: ToolRegistry
) -> None:
    _agent(store, "Blue.")
    rubric = {"rubric": "Names a colour.", "max_output_tokens": 8000, "script": {"turns": [{"text": '{"score": 1}'}]}}
    _alias(store, 1.0, rubric)
    task_id = uuid.uuid4().hex
    result = _submit_and_run(store, registry, task_id, constraints={"max_tokens": 3000})
    task = store.tasks.get(task_id)
    assert result.status is TaskStatus.SUCCEEDED and task.result == "Blue.", (result, task.error)
    (grade,) = _grades(store, task_id)
    assert grade.error is not None and grade.error["code"] == "grade_skipped"
    (bucket,) = _buckets(store).values()
    assert (bucket.graded, bucket.errors) == (1, 1)


def test_counting_the_same_grade_again_adds_nothing(store: Storage) -> None:
    tally = GradeTally(
        tenant=TENANT, agent="support", version=3, task_id="t-1", step=2, hour=hour_of(__import__("time").time()),
        passed=True, score=0.9, task_cost_usd=Decimal("0.01"), grade_cost_usd=Decimal("0.002"), grade_tokens=40,
    )  # fmt: skip
    assert store.quality.count(tally) is True
    assert store.quality.count(tally) is False
    (bucket,) = _buckets(store).values()
    assert (bucket.graded, bucket.passed, bucket.grade_tokens) == (1, 1, 40)


def test_an_online_grade_never_retries_even_when_max_attempts_is_sent() -> None:
    with pytest.raises(ValueError, match="max_attempts"):
        OnlineEval.model_validate({"rate": 0.5, "grade": {"grader": "g", "max_attempts": 3}})
    assert OnlineEval.model_validate({"rate": 0.5, "grade": {"grader": "g"}}).grade == OutcomeSpec(
        grader="g", max_attempts=1
    )


@pytest.mark.parametrize(("answers", "passed"), [(["not yet", "DONE"], 1), (["not yet", "still not"], 0)])
def test_a_sampled_task_with_its_own_outcome_counts_only_the_grade_that_ends_it(
    store: Storage, registry: ToolRegistry, ledger: Path, answers: list[str], passed: int
) -> None:
    spec = AgentSpec.model_validate({
        "name": "support", "provider": "scripted", "script": {"turns": [{"text": a} for a in answers]},
        "outcome": {"grader": "says_done", "max_attempts": 2},
    })  # fmt: skip
    store.agents.create(TENANT, spec)
    _alias(store, 1.0, {"grader": "says_done"})
    task_id = uuid.uuid4().hex
    result = _submit_and_run(store, registry, task_id)
    assert result.status is (TaskStatus.SUCCEEDED if passed else TaskStatus.FAILED_OUTCOME)  # its outcome gates it
    assert len(_grades(store, task_id)) == 2 and len(grader_runs(ledger)) == 2  # no second call for the sample
    (bucket,) = _buckets(store).values()
    assert (bucket.graded, bucket.passed) == (1, passed)


def _costs(store: Storage, task_id: str) -> tuple[Decimal, Decimal]:
    """What the task's own calls cost, and what grading its answers cost, from its steps."""
    steps = [s.body for s in store.steps.load(task_id)]
    agent = sum((b.cost_usd for b in steps if isinstance(b, LLMStep)), Decimal(0))
    grading = sum((b.cost_usd for b in steps if isinstance(b, GradeStep)), Decimal(0))
    return agent.quantize(Decimal("0.000001")), grading.quantize(Decimal("0.000001"))


def test_a_version_counts_its_tasks_cost_without_grading_and_every_grade_of_the_round(
    store: Storage, registry: ToolRegistry
) -> None:
    """A sampled task with an outcome of its own answers twice, graded twice by a priced model,
    and only the grade that ends it is counted: the bucket's task cost is what the agent's calls
    cost (no grade's), its grading cost what both grades cost (not the last one's alone)."""
    spec = AgentSpec.model_validate({
        "name": "support", "provider": "scripted", "script": {"turns": [{"text": "first"}, {"text": "second"}]},
        "outcome": {"rubric": "r", "max_attempts": 2, "script": {"turns": [
            {"text": '{"score": 0.1, "feedback": "no"}'}, {"text": '{"score": 0.9}'}]}},
    })  # fmt: skip
    store.agents.create(TENANT, spec)
    _alias(store, 1.0, {"grader": "says_done"})
    task_id = uuid.uuid4().hex
    assert _submit_and_run(store, registry, task_id).status is TaskStatus.SUCCEEDED
    agent, grading = _costs(store, task_id)
    assert len(_grades(store, task_id)) == 2 and agent > 0 and grading > 0
    (bucket,) = _buckets(store).values()
    assert (bucket.graded, bucket.passed) == (1, 1)
    assert (bucket.task_cost_usd, bucket.grade_cost_usd) == (agent, grading)
    assert bucket.grade_tokens == sum(g.usage.total for g in _grades(store, task_id))


def test_each_answer_of_a_sampled_conversation_counts_only_what_was_spent_since_the_last(
    store: Storage, registry: ToolRegistry
) -> None:
    """A sampled task answers, is graded and counted; a message reopens it, and its next answer
    is graded and counted too: the two counts add up to what the task spent, each dollar once."""
    store.agents.create(TENANT, AgentSpec.model_validate({
        "name": "support", "provider": "scripted", "system": "s",
        "script": {"turns": [{"text": "Blue."}, {"text": "Green."}]}}))  # fmt: skip
    _alias(store, 1.0, {"rubric": "Names a colour.", "script": {"turns": [{"text": '{"score": 1}'}]}})
    task_id = uuid.uuid4().hex
    assert _submit_and_run(store, registry, task_id).status is TaskStatus.SUCCEEDED
    store.messages.accept(task_id, "and another colour?", tenant=TENANT)
    engine = Engine(store, worker_id="w", tools=registry, config=EngineConfig(lease_seconds=10))
    assert engine.run(task_id).status is TaskStatus.SUCCEEDED
    assert len(_grades(store, task_id)) == 2
    (bucket,) = _buckets(store).values()
    assert (bucket.graded, bucket.passed) == (2, 2)
    assert (bucket.task_cost_usd, bucket.grade_cost_usd) == _costs(store, task_id)


def test_an_unanswered_task_is_a_fail_of_its_versions_pass_rate_counted_once_and_a_failed_grade_is_left_out(
    store: Storage,
) -> None:
    """The pass rate is passed / (graded - errors + unanswered): a sampled task that ended without
    an answer failed its user, a grade that failed says nothing of the answer. An unanswered end
    is counted once a task (its marker ``ONLINE#end``), whichever path reports it."""
    hour = hour_of(__import__("time").time())

    def tally(task_id: str, step: int | None, score: float | None) -> GradeTally:
        return GradeTally(
            tenant=TENANT, agent="support", version=2, task_id=task_id, step=step, hour=hour,
            passed=score is not None and score >= 0.8, score=score, task_cost_usd=Decimal("0.03"),
            grade_cost_usd=Decimal(0), grade_tokens=0,
        )  # fmt: skip

    assert store.quality.count(tally("passed", 2, 0.9))
    assert store.quality.count(tally("grader-failed", 2, None))
    assert store.quality.count(tally("never-answered", None, None))
    assert not store.quality.count(tally("never-answered", None, None))  # reported again: nothing more
    (bucket,) = _buckets(store).values()
    assert (bucket.graded, bucket.passed, bucket.errors, bucket.unanswered) == (2, 1, 1, 1)
    assert (bucket.pass_rate, bucket.mean_score) == (0.5, 0.9)
    assert (bucket.task_cost_usd, bucket.mean_task_cost_usd) == (Decimal("0.09"), Decimal("0.03"))


@pytest.mark.parametrize("busy_for", ["the run's count", "the run's count and the first report of the end"])
def test_a_grade_its_busy_bucket_cannot_take_never_fails_the_run_and_is_counted_once_by_the_tasks_end(
    store: Storage, registry: ToolRegistry, monkeypatch: pytest.MonkeyPatch, busy_for: str
) -> None:
    """Every grade of a version in an hour adds to one item, and DynamoDB cancels a transaction
    that meets another on it (TransactionConflict). Past the count's retries, an online grade
    still never stops its task: the run succeeds with its answer, the count is kept on the task,
    and the report of its end (``queueing.endings.task_ended``, as the dispatcher makes it) counts
    it, or, itself kept busy, the next report does; however often it is reported, once."""
    _agent(store, "DONE")
    _alias(store, 1.0, {"grader": "says_done"})
    original = store.table.transact
    conflicts = {"left": RELEASE_ATTEMPTS * (1 if busy_for == "the run's count" else 2)}

    def busy(actions: Any, *args: Any, **kwargs: Any) -> Any:
        if any(getattr(a, "name", None) == "marker" for a in actions) and conflicts["left"]:
            conflicts["left"] -= 1
            raise TransactionConflict("another grade of this hour's bucket")
        return original(actions, *args, **kwargs)

    monkeypatch.setattr(store.table, "transact", busy)
    task_id = uuid.uuid4().hex
    result = _submit_and_run(store, registry, task_id)
    task = store.tasks.get(task_id)
    assert result.status is TaskStatus.SUCCEEDED and task.result == "DONE", result
    assert _buckets(store) == {}
    assert task.grade is not None and [t["step"] for t in task.grade["uncounted"]] == [2]  # kept for its end
    task_ended(store, None, task, TaskStatus.SUCCEEDED)
    if busy_for != "the run's count":
        assert _buckets(store) == {} and conflicts["left"] == 0  # still busy: left on the task
        task_ended(store, None, task, TaskStatus.SUCCEEDED)  # a redelivery reports the end again
    task_ended(store, None, task, TaskStatus.SUCCEEDED)  # and again: nothing more
    (bucket,) = _buckets(store).values()
    assert (bucket.graded, bucket.passed, bucket.errors) == (1, 1, 0)


def test_an_online_grade_that_was_not_made_is_an_evaluation_named_for_its_alias_with_an_error_and_no_label(
    store: Storage, registry: ToolRegistry, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The OpenTelemetry ``gen_ai.evaluation.result`` of a sampled grade names its evaluation (the
    conventions require it): the alias that sampled it and its judges, the ones that ran or, a
    grade skipped for want of budget, the ones it names. A grade never made says nothing of the
    answer: ``error.type``, and neither a score nor a "fail" label (the buckets count it apart)."""
    from agentq.observe import otel

    from tests.otlp_receiver import OtlpReceiver

    _agent(store, "DONE")
    with OtlpReceiver() as receiver:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.endpoint)
        otel.reset()
        try:
            _alias(store, 1.0, {"grader": "grader_raises"})
            assert _submit_and_run(store, registry, uuid.uuid4().hex).status is TaskStatus.SUCCEEDED
            script = {"turns": [{"text": '{"score": 1}'}]}
            _alias(store, 1.0, {"rubric": "Says DONE.", "max_output_tokens": 8000, "script": script})
            too_small = {"constraints": {"max_tokens": 3000}}
            assert _submit_and_run(store, registry, uuid.uuid4().hex, **too_small).status is TaskStatus.SUCCEEDED
            _alias(store, 1.0, {"grader": "says_done"})
            assert _submit_and_run(store, registry, uuid.uuid4().hex).status is TaskStatus.SUCCEEDED
            otel.flush()
        finally:
            otel.reset()
        evaluations = [a for span in receiver.spans for name, a in span.events if name == "gen_ai.evaluation.result"]
    raised, skipped, passed = evaluations
    assert raised["gen_ai.evaluation.name"] == "online:prod grader_raises"
    assert skipped["gen_ai.evaluation.name"].startswith("online:prod scripted/")  # the rubric's grading model
    assert (raised["error.type"], skipped["error.type"]) == ("grader_failed", "grade_skipped")
    for never_made in (raised, skipped):
        assert "gen_ai.evaluation.score.label" not in never_made and "gen_ai.evaluation.score.value" not in never_made
    assert passed["gen_ai.evaluation.name"] == "online:prod says_done"
    assert (passed["gen_ai.evaluation.score.label"], passed["gen_ai.evaluation.score.value"]) == ("pass", 1.0)
