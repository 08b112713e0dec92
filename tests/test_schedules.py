"""Schedules: EventBridge Scheduler's expressions give the next fire time; a due schedule fires
one task per fire time (a repeated fire makes none), skips while its previous task is live
(overlap skip) or not (allow); bad input names its field and writes nothing; in AWS the API
creates a Scheduler schedule whose message, delivered to the tier queue, fires the task."""

from __future__ import annotations

import hashlib
import json
import threading
import time
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import boto3
import pytest
from botocore.exceptions import ClientError, EndpointConnectionError

from agentq.control.schedules import create_schedule, delete_schedule, fire, fire_due
from agentq.control.submit import submit_once
from agentq.core.errors import ValidationError
from agentq.core.models import TaskStatus
from agentq.core.schedules import fire_task_id, last_fire, next_fire
from agentq.runtime import build_queues, build_registry, build_store
from agentq_dev.moto_server import MotoServer

from tests.helpers import deployment, queue_depth
from tests.lambda_support import LAMBDA_RESPONSE_BYTES, lambda_pages
from tests.test_api_routes import Api, api

__all__ = ["api"]  # the deployment of tests/test_api_routes.py: the Lambda handler, its own table


def _at(text: str) -> float:
    return datetime.fromisoformat(text).replace(tzinfo=UTC).timestamp()


def _iso(at: float) -> str:
    """A fire time as the Scheduler writes it in a message."""
    return datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def test_cron_and_rate_expressions_give_the_next_fire_time() -> None:
    now = _at("2026-11-25T10:00:00")  # a Wednesday
    assert next_fire("rate(5 minutes)", now) == _at("2026-11-25T10:05:00")
    assert next_fire("rate(1 day)", now) == _at("2026-11-26T00:00:00")
    assert next_fire("cron(0 9 ? * MON-FRI *)", now) == _at("2026-11-26T09:00:00")
    assert next_fire("cron(30 8 ? * 2 *)", now) == _at("2026-11-30T08:30:00")  # 2 is Monday, as in EventBridge
    assert next_fire("cron(0 12 1 * ? *)", now) == _at("2026-12-01T12:00:00")
    assert last_fire("rate(5 minutes)", now) == now and last_fire("rate(1 day)", now) == _at("2026-11-25T00:00:00")
    assert last_fire("cron(0 9 ? * MON-FRI *)", now) == _at("2026-11-25T09:00:00")
    assert last_fire("cron(30 8 ? * 2 *)", now) == _at("2026-11-23T08:30:00")  # the latest at or before


def test_an_expression_that_never_fires_or_names_a_year_is_refused_saying_so() -> None:
    now = _at("2026-11-25T10:00:00")
    for never in ("cron(0 9 31 2 ? *)", "cron(0 9 30 2 ? *)", "cron(0 9 31 4,6,9,11 ? *)"):
        with pytest.raises(ValueError, match=r"no date matches .* it never fires"):
            next_fire(never, now)
    with pytest.raises(ValueError, match=r"the year must be '\*' .* not '1999'"):
        next_fire("cron(0 9 ? * MON-FRI 1999)", now)
    assert next_fire("cron(0 9 29 2 ? *)", now) == _at("2028-02-29T09:00:00")  # rare, not never


def test_a_numbered_nth_weekday_fires_on_the_day_eventbridge_means() -> None:
    """EventBridge numbers the days of the week 1-7 from Sunday, so ``3#2`` is the second
    Tuesday, as ``TUE#2`` is. The number before '#' once stayed as written, and croniter (0-6
    from Sunday) read the second Wednesday: the local ticker fired a day late and
    ``next_fire_at`` showed that day, locally and in AWS."""
    nov_1 = _at("2026-11-01T00:00:00")
    assert next_fire("cron(0 9 ? * TUE#2 *)", nov_1) == _at("2026-11-10T09:00:00")
    assert next_fire("cron(0 9 ? * 3#2 *)", nov_1) == _at("2026-11-10T09:00:00")
    assert next_fire("cron(0 9 ? * 1#1 *)", nov_1) == _at("2026-11-01T09:00:00")  # the first Sunday
    assert next_fire("cron(0 9 ? * 7#1 *)", nov_1) == _at("2026-11-07T09:00:00")  # the first Saturday


def test_eventbridges_last_and_weekday_wildcards_give_the_day_eventbridge_means() -> None:
    nov_1 = _at("2026-11-01T00:00:00")  # a Sunday
    assert next_fire("cron(0 9 ? * 7 *)", nov_1) == _at("2026-11-07T09:00:00")  # 7 is Saturday
    assert next_fire("cron(0 9 ? * L *)", nov_1) == _at("2026-11-07T09:00:00")  # the week's last day
    assert next_fire("cron(0 9 ? * 6L *)", nov_1) == _at("2026-11-27T09:00:00")  # the month's last Friday
    assert next_fire("cron(0 9 L * ? *)", nov_1) == _at("2026-11-30T09:00:00")  # the month's last day
    assert next_fire("cron(0 9 7W * ? *)", nov_1) == _at("2026-11-06T09:00:00")  # the weekday nearest the 7th
    assert next_fire("cron(0/20 9 ? JAN-MAR,NOV sun-TUE *)", nov_1) == _at("2026-11-01T09:00:00")
    assert next_fire("cron(*/20 10-11/1 ? JUL WED *)", nov_1) == _at("2027-07-07T10:00:00")


@pytest.mark.parametrize(
    "expression",
    [
        "cron(0 9 ? * 0 *)",  # day-of-week is 1-7: croniter read 0 as Saturday
        "cron(0 9 ? * 8 *)",  # read as Sunday
        "cron(0 9 ? * 99999999999999999999 *)",  # read modulo 7
        "cron(0 9 ? * MON-99 *)",
        "cron(0 9 ? * 1/0 *)",  # a step of 0, rewritten to '0/6'
        "cron(0/0 9 * * ? *)",
        "cron(R 9 * * ? *)",  # croniter's random minute: every next_fire differed
        "cron(H 9 * * ? *)",  # croniter's hashed minute
        "cron(0 9 ? * 3#1,6#3 *)",  # EventBridge: '#' only as the field's one expression
        "cron(0 9 ? * 3#6 *)",
        "cron(60 9 * * ? *)",
        "cron(0 24 * * ? *)",
        "cron(0 9 0 * ? *)",
        "cron(0 9 32 * ? *)",
        "cron(0 9 1 13 ? *)",
        "cron(0 9 * * ? ?)",  # the year takes no '?'
        "cron(0 9 5-1 * ? *)",
        "cron(0 9 ?,1 * MON *)",
        "cron(0 9 1W,2 * ? *)",
    ],
)
def test_a_cron_eventbridge_refuses_is_refused_naming_the_expression(expression: str) -> None:
    """EventBridge's grammar, checked field by field before croniter reads the expression:
    croniter took these, and either EventBridge refuses them (in AWS the schedule could not be
    made) or they meant something else locally."""
    with pytest.raises(ValueError, match=r"^cron\(\): "):
        next_fire(expression, 0.0)


def _spec(name: str = "nightly", expression: str = "rate(1 minute)", **extra: Any) -> dict[str, Any]:
    return {"name": name, "expression": expression,
            "submission": {"goal": "report", "script": {"turns": [{"text": "report done"}]}}, **extra}  # fmt: skip


def test_a_due_schedule_fires_one_task_per_fire_time_and_skips_while_the_previous_one_is_live(
    moto_server: MotoServer,
) -> None:
    settings = deployment(moto_server)
    store, tools, queues = build_store(settings), build_registry(settings), build_queues(settings)
    schedule = create_schedule(store, tools, _spec(), tenant="acme")
    first_time = schedule.next_fire_at
    assert first_time > time.time() and fire_due(store, tools, queues, now=first_time - 1) == []

    [first] = fire_due(store, tools, queues, now=first_time + 1)
    assert first == fire_task_id("acme", "nightly", first_time)
    assert fire_due(store, tools, queues, now=first_time + 2) == []  # the next fire is a minute on
    assert fire(store, tools, queues, tenant="acme", name="nightly", fire_time=first_time) == first  # a repeat
    task = store.tasks.get(first)
    assert task.status is TaskStatus.QUEUED and task.submission.goal == "report" and task.tenant == "acme"
    assert queue_depth(queues, queues.url("normal")) == 1

    assert fire_due(store, tools, queues, now=first_time + 61) == []  # the first task is still queued: skipped
    kept = store.schedules.get("acme", "nightly")
    assert (kept.fired, kept.skipped, kept.last_task_id) == (1, 1, first)

    store.tasks.transition(first, TaskStatus.CANCELLED)
    [second] = fire_due(store, tools, queues, now=first_time + 121)
    assert second != first and store.schedules.get("acme", "nightly").fired == 2

    create_schedule(store, tools, _spec("always", overlap="allow"), tenant="acme")
    always = store.schedules.get("acme", "always").next_fire_at
    fired = [fire_due(store, tools, queues, now=always + 60 * i + 1) for i in range(3)]
    assert [len(f) for f in fired] == [1, 1, 1]  # allow: a task per fire, live or not
    assert [s.spec.name for s in store.schedules.list("acme")] == ["always", "nightly"]
    assert store.schedules.list("other") == []


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        (_spec(expression="every day"), "expression"),
        (_spec(expression="cron(0 9 * * MON *)"), "expression"),
        (_spec(expression="cron(0 9 ? * 0 *)"), "expression"),
        (_spec(name="Bad Name"), "name"),
        (_spec(overlap="queue"), "overlap"),
        (
            {
                **_spec(),
                "submission": {
                    "goal": "g",
                    "script": {"turns": [{"text": "x"}]},
                    "constraints": {"tools": ["no_such_tool"]},
                },
            },
            "submission.constraints.tools[0]",
        ),
        ({**_spec(), "submission": {"goal": ""}}, "submission.goal"),
    ],
)
def test_a_bad_schedule_is_refused_naming_the_field_and_nothing_is_written(
    moto_server: MotoServer, spec: dict[str, Any], field: str
) -> None:
    settings = deployment(moto_server)
    store, tools = build_store(settings), build_registry(settings)
    with pytest.raises(ValidationError) as refused:
        create_schedule(store, tools, spec, tenant="acme")
    assert refused.value.field == field, refused.value
    assert store.schedules.list() == []


def test_in_aws_a_scheduler_schedule_is_made_and_its_message_fires_the_task(
    moto_server: MotoServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    from agentq.core.engine import Engine
    from agentq.runtime import build_dispatcher

    settings = deployment(moto_server)
    store, tools, queues = build_store(settings), build_registry(settings), build_queues(settings)
    scheduler = boto3.client("scheduler", endpoint_url=moto_server.endpoint_url, region_name="us-east-1")
    scheduler.create_schedule_group(Name=f"{settings.prefix}-schedules")
    queue_arn = queues.sqs.get_queue_attributes(QueueUrl=queues.url("normal"), AttributeNames=["QueueArn"])
    monkeypatch.setenv("AGENTQ_SCHEDULER_GROUP", f"{settings.prefix}-schedules")
    monkeypatch.setenv("AGENTQ_SCHEDULE_TARGET_ARN", queue_arn["Attributes"]["QueueArn"])
    monkeypatch.setenv("AGENTQ_SCHEDULER_ROLE_ARN", "arn:aws:iam::123456789012:role/agentq-scheduler")
    monkeypatch.setenv("AWS_ENDPOINT_URL_SCHEDULER", moto_server.endpoint_url)
    dlq_arn = queues.sqs.get_queue_attributes(QueueUrl=queues.dlq_url("normal"), AttributeNames=["QueueArn"])
    monkeypatch.setenv("AGENTQ_SCHEDULE_DLQ_ARN", dlq_arn["Attributes"]["QueueArn"])

    create_schedule(store, tools, _spec(expression="cron(0 9 ? * MON-FRI *)"), tenant="acme")
    [made] = scheduler.list_schedules(GroupName=f"{settings.prefix}-schedules")["Schedules"]
    described = scheduler.get_schedule(Name=made["Name"], GroupName=f"{settings.prefix}-schedules")
    assert described["ScheduleExpression"] == "cron(0 9 ? * MON-FRI *)"
    assert described["Target"]["Arn"] == queue_arn["Attributes"]["QueueArn"]
    assert described["Target"]["DeadLetterConfig"] == {
        "Arn": dlq_arn["Attributes"]["QueueArn"]
    }  # a fire it could not send

    # What the Scheduler sends at 09:00: its Input, the time filled in (the next 09:00: a past
    # one that a later fire time followed would fire as that one, ``fire``).
    at = next_fire("cron(0 9 ? * MON-FRI *)", time.time())
    body = described["Target"]["Input"].replace("<aws.scheduler.scheduled-time>", _iso(at))
    dispatcher = build_dispatcher(Engine(store, worker_id="w", tools=tools), store, queues, max_receive_count=5)
    action = dispatcher.handle(body, tier="normal", receive_count=1)
    fired = fire_task_id("acme", "nightly", at)
    assert action.kind == "delete" and action.task_id == fired
    assert dispatcher.handle(body, tier="normal", receive_count=2).task_id == fired  # a repeated delivery
    assert store.tasks.get(fired).submission.goal == "report"
    assert json.loads(body)["kind"] == "schedule"

    delete_schedule(store, tenant="acme", name="nightly")
    assert scheduler.list_schedules(GroupName=f"{settings.prefix}-schedules")["Schedules"] == []
    assert store.schedules.list() == []


class _FlakyQueues:
    """Enough of TaskQueues for a fire on the in-memory twin: ``send`` fails while ``down``."""

    workspace_pool = pool = None
    fair = False

    def __init__(self) -> None:
        self.down, self.sent = True, list[str]()

    def pool_for(self, submission: Any) -> None:
        return None

    def send(self, task_id: str, tier: str, kind: str = "run", delay_seconds: int = 0, **_: Any) -> str:
        if self.down:
            raise ConnectionError("SQS unreachable")
        self.sent.append(task_id)
        return "m"


def test_a_fire_retried_after_its_enqueue_failed_makes_its_task() -> None:
    """The enqueue fails, so ``submit_once`` deletes the task again. The retry (the worker's in
    5 s, the next local tick in 1 s) creates the same id: under the same ClientRequestToken
    with other parameters (its ``created_at``), DynamoDB (and the in-memory twin, which models
    it; moto ignores tokens) refused it as IdempotentParameterMismatch for the token's ten
    minutes, and 25 receives 5 s apart dead-lettered the fire: its slot was lost."""
    from agentq.core.tools import ToolRegistry
    from agentq.storage.container import memory_storage

    store, tools, queues = memory_storage(), ToolRegistry(), _FlakyQueues()
    due = create_schedule(store, tools, _spec(), tenant="acme").next_fire_at
    with pytest.raises(ConnectionError):
        fire(store, tools, queues, tenant="acme", name="nightly", fire_time=due)  # type: ignore[arg-type]
    queues.down = False
    made = fire(store, tools, queues, tenant="acme", name="nightly", fire_time=due)  # type: ignore[arg-type]
    assert made == fire_task_id("acme", "nightly", due) and queues.sent == [made]
    assert store.tasks.get(made).status is TaskStatus.QUEUED


def test_a_fire_whose_stored_submission_is_refused_is_counted_failed_dead_lettered_and_the_others_still_fire(
    moto_server: MotoServer, caplog: pytest.LogCaptureFixture
) -> None:
    """The memory store a schedule attaches is deleted after the schedule was made: each fire is
    refused the same way, so the local ticker counts it on the schedule (without a traceback) and
    fires the tenant's other schedules, and the executor dead-letters the fire's message with the
    reason at once instead of retrying it until SQS gives up; re-creating the store heals it."""
    from agentq.api.routes.schedules import view
    from agentq.core.engine import Engine
    from agentq.core.memory import MemoryStoreSpec
    from agentq.runtime import build_dispatcher

    settings = deployment(moto_server)
    store, tools, queues = build_store(settings), build_registry(settings), build_queues(settings)
    store.memory_stores.create_store("acme", MemoryStoreSpec(name="notes"))
    archive = _spec("archive")  # listed before "nightly": a refusal must not stop the tick
    archive["submission"] = {**archive["submission"], "memory": [{"store": "notes"}]}
    due = create_schedule(store, tools, archive, tenant="acme").next_fire_at
    create_schedule(store, tools, _spec("nightly"), tenant="acme")
    store.memory_stores.delete_store("acme", "notes")

    [fired] = fire_due(store, tools, queues, now=due + 1)
    assert fired == fire_task_id("acme", "nightly", due)
    refused = store.schedules.get("acme", "archive")
    assert (refused.fired, refused.skipped, refused.failed) == (0, 0, 1)
    assert refused.last_error is not None and "memory[0].store: no memory store 'notes'" in refused.last_error
    assert view(refused).failed == 1 and view(refused).last_error == refused.last_error  # what GET /schedules shows
    assert not any(r.exc_info for r in caplog.records), "a refused fire is logged without a traceback"
    assert store.tasks.get_many([fire_task_id("acme", "archive", due)]) == []

    # In AWS the Scheduler's message reaches an executor: dead-lettered at once, with the reason.
    dispatcher = build_dispatcher(Engine(store, worker_id="w", tools=tools), store, queues, max_receive_count=5)
    at = next_fire("rate(1 minute)", time.time() + 3600)  # a fire time no later one has followed yet
    message = {"task_id": "schedule:acme#archive", "kind": "schedule", "schedule": "acme#archive",
               "scheduled_time": _iso(at)}  # fmt: skip
    action = dispatcher.handle(json.dumps(message), tier="normal", receive_count=1)
    assert action.kind == "dead_letter", action
    assert action.reason.startswith("poison: schedule archive: memory[0].store: no memory store 'notes'")
    assert store.schedules.get("acme", "archive").failed == 2

    store.memory_stores.create_store("acme", MemoryStoreSpec(name="notes"))  # its owner fixes the cause
    healed = dispatcher.handle(json.dumps(message), tier="normal", receive_count=1)
    assert healed.kind == "delete" and healed.task_id == fire_task_id("acme", "archive", at)
    after = store.schedules.get("acme", "archive")
    assert (after.fired, after.failed, after.last_error) == (1, 2, None)


def test_a_local_fire_cut_short_by_an_outage_fires_its_slot_on_the_next_tick(moto_server: MotoServer) -> None:
    """``agentq dev``'s ticker moves ``next_fire_at`` on, then fires. A fire an outage cuts short
    (SQS unreachable: the submission's enqueue raises, its task is taken back) propagates, and
    the dev stack's loop tries the next tick; that tick fires the slot it moved past (it was
    lost: the schedule had moved on). Once: the tick after makes nothing more."""
    import dataclasses

    settings = deployment(moto_server)
    store, tools, queues = build_store(settings), build_registry(settings), build_queues(settings)
    due = create_schedule(store, tools, _spec(expression="rate(1 hour)"), tenant="acme").next_fire_at
    unreachable = build_queues(dataclasses.replace(settings, endpoint_url="http://127.0.0.1:9"))
    with pytest.raises(Exception, match="Could not connect"):
        fire_due(store, tools, unreachable, now=due + 1)
    assert store.tasks.get_many([fire_task_id("acme", "nightly", due)]) == []  # nothing made
    assert fire_due(store, tools, queues, now=due + 2) == [fire_task_id("acme", "nightly", due)]
    assert fire_due(store, tools, queues, now=due + 3) == []
    kept = store.schedules.get("acme", "nightly")
    assert (kept.fired, kept.pending_fire, kept.next_fire_at) == (1, None, due + 3600)
    assert queue_depth(queues, queues.url("normal")) == 1


def test_a_local_fire_whose_scheduler_died_after_moving_the_schedule_on_fires_its_slot_once(
    moto_server: MotoServer,
) -> None:
    """A scheduler killed between moving ``next_fire_at`` on and firing (its move noted the fire
    time as pending) leaves the slot to the next tick of any scheduler; a slot fired already (its
    task made, the pending mark not yet taken off) is not fired twice."""
    settings = deployment(moto_server)
    store, tools, queues = build_store(settings), build_registry(settings), build_queues(settings)
    spec = _spec(expression="rate(1 hour)", overlap="allow")  # the first task is still queued at the second fire
    due = create_schedule(store, tools, spec, tenant="acme").next_fire_at
    schedule = store.schedules.get("acme", "nightly")
    assert store.schedules.advance(schedule, due + 3600, firing=due)  # the killed tick's first step
    assert fire_due(store, tools, queues, now=due + 5) == [fire_task_id("acme", "nightly", due)]
    # Killed after the fire this time, before its pending mark came off.
    schedule = store.schedules.get("acme", "nightly")
    assert store.schedules.advance(schedule, due + 7200, firing=due + 3600)
    fire(store, tools, queues, tenant="acme", name="nightly", fire_time=due + 3600)
    assert fire_due(store, tools, queues, now=due + 3605) == [fire_task_id("acme", "nightly", due + 3600)]
    assert store.schedules.get("acme", "nightly").fired == 2  # two slots, each fired once
    assert queue_depth(queues, queues.url("normal")) == 2


def test_a_fire_whose_process_died_before_counting_it_is_counted_by_its_redelivery_so_the_next_fire_skips(
    moto_server: MotoServer,
) -> None:
    """Killed after its task was made and before the schedule counted it: the redelivered fire
    finds the task, counts it and makes it the schedule's latest, so the next fire (overlap
    ``skip``) skips while it is live."""
    settings = deployment(moto_server)
    store, tools, queues = build_store(settings), build_registry(settings), build_queues(settings)
    due = create_schedule(store, tools, _spec(expression="rate(1 hour)"), tenant="acme").next_fire_at
    made = fire_task_id("acme", "nightly", due)
    submission = store.schedules.get("acme", "nightly").spec.submission
    submit_once(store, tools, submission, tenant="acme", queues=queues, task_id=made)  # ... then killed
    assert fire(store, tools, queues, tenant="acme", name="nightly", fire_time=due) == made  # redelivered
    assert store.tasks.get(made).status is TaskStatus.QUEUED  # still live
    kept = store.schedules.get("acme", "nightly")
    assert (kept.last_task_id, kept.fired) == (made, 1)
    assert fire(store, tools, queues, tenant="acme", name="nightly", fire_time=due + 3600) is None  # skipped
    assert fire(store, tools, queues, tenant="acme", name="nightly", fire_time=due) == made  # once more: counted once
    assert store.schedules.get("acme", "nightly").fired == 1


def test_a_fire_killed_before_sending_its_tasks_message_has_it_sent_by_its_redelivery(moto_server: MotoServer) -> None:
    """The task made, its message not sent: the redelivery sends it (as a repeated POST /tasks
    does), once; a fire that finished sends nothing more."""
    settings = deployment(moto_server)
    store, tools, queues = build_store(settings), build_registry(settings), build_queues(settings)
    due = create_schedule(store, tools, _spec(expression="rate(1 hour)"), tenant="acme").next_fire_at
    made = fire_task_id("acme", "nightly", due)
    submission = store.schedules.get("acme", "nightly").spec.submission
    submit_once(store, tools, submission, tenant="acme", queues=None, task_id=made)  # ... killed before its send
    assert queue_depth(queues, queues.url("normal")) == 0
    for _ in range(2):
        assert fire(store, tools, queues, tenant="acme", name="nightly", fire_time=due) == made
    assert queue_depth(queues, queues.url("normal")) == 1


def test_two_fires_of_an_overlap_skip_schedule_handled_at_once_leave_one_live_task(moto_server: MotoServer) -> None:
    """Two fire times delivered together (a backlog after downtime, two executors): the second
    runs while the first has submitted and not yet counted its task; the first's claim on the
    schedule holds it off."""
    settings = deployment(moto_server)
    store, tools, queues = build_store(settings), build_registry(settings), build_queues(settings)
    due = create_schedule(store, tools, _spec(expression="rate(1 hour)"), tenant="acme").next_fire_at
    record = store.schedules.record_fire
    other: list[str | None] = []
    started: list[bool] = []

    def the_other_fire_runs_now(*args: Any, **kwargs: Any) -> bool:
        if not started:  # the second fire runs between the first's submit and its count
            started.append(True)
            other.append(fire(store, tools, queues, tenant="acme", name="nightly", fire_time=due + 3600))
        return record(*args, **kwargs)

    store.schedules.record_fire = the_other_fire_runs_now  # type: ignore[method-assign]
    first = fire(store, tools, queues, tenant="acme", name="nightly", fire_time=due)
    live = [t for t in (first, *other) if t is not None and not store.tasks.get(t).status.terminal]
    assert live == [first] and store.schedules.get("acme", "nightly").skipped == 1


def test_a_fire_killed_after_claiming_holds_the_next_fires_off_until_its_claim_lapses(moto_server: MotoServer) -> None:
    """Its task not made, a claim is in flight (its own redelivery, claiming again, still makes
    the task) for ``CLAIM_SECONDS``, then a later fire takes it over."""
    from agentq.control.schedules import CLAIM_SECONDS

    settings = deployment(moto_server)
    store, tools, queues = build_store(settings), build_registry(settings), build_queues(settings)
    due = create_schedule(store, tools, _spec(expression="rate(1 hour)"), tenant="acme").next_fire_at
    schedule = store.schedules.get("acme", "nightly")
    assert store.schedules.claim(schedule, fire_task_id("acme", "nightly", due), at=time.time())  # ... then killed
    assert fire(store, tools, queues, tenant="acme", name="nightly", fire_time=due + 3600) is None  # in flight
    made = fire(store, tools, queues, tenant="acme", name="nightly", fire_time=due)  # its redelivery
    assert made == fire_task_id("acme", "nightly", due) and store.schedules.get("acme", "nightly").last_task_id == made

    store.tasks.transition(made, TaskStatus.CANCELLED)
    schedule = store.schedules.get("acme", "nightly")
    assert store.schedules.claim(schedule, fire_task_id("acme", "nightly", due + 3600), at=time.time() - CLAIM_SECONDS)
    later = fire(store, tools, queues, tenant="acme", name="nightly", fire_time=due + 7200)  # the claim lapsed
    assert later == fire_task_id("acme", "nightly", due + 7200)
    assert store.schedules.get("acme", "nightly").last_task_id == later


def test_a_redelivered_fire_that_was_skipped_is_counted_skipped_once(moto_server: MotoServer) -> None:
    """A fire time is skipped once: delivered again, while the first task is live or after it
    ended, it skips again without counting (it never also fires)."""
    settings = deployment(moto_server)
    store, tools, queues = build_store(settings), build_registry(settings), build_queues(settings)
    due = create_schedule(store, tools, _spec(expression="rate(1 hour)"), tenant="acme").next_fire_at
    first = fire(store, tools, queues, tenant="acme", name="nightly", fire_time=due)
    for _ in range(2):  # one fire time, delivered twice, while the first task is live
        assert fire(store, tools, queues, tenant="acme", name="nightly", fire_time=due + 3600) is None
    kept = store.schedules.get("acme", "nightly")
    assert (kept.fired, kept.skipped) == (1, 1)
    assert first is not None
    store.tasks.transition(first, TaskStatus.CANCELLED)
    assert fire(store, tools, queues, tenant="acme", name="nightly", fire_time=due + 3600) is None  # once more
    kept = store.schedules.get("acme", "nightly")
    assert (kept.fired, kept.skipped) == (1, 1)


def test_replacing_a_schedule_keeps_its_overlap_skip_for_the_task_still_live(moto_server: MotoServer) -> None:
    """POST /schedules with the name of one that exists replaces its definition (here a goal's
    wording), not what its fires left: the first fire after it still skips while the task the
    schedule made is live, and the counts go on."""
    settings = deployment(moto_server)
    store, tools, queues = build_store(settings), build_registry(settings), build_queues(settings)
    made = create_schedule(store, tools, _spec(expression="rate(1 hour)"), tenant="acme")
    first = fire(store, tools, queues, tenant="acme", name="nightly", fire_time=made.next_fire_at)
    changed = _spec(expression="rate(1 hour)")
    changed["submission"]["goal"] = "report, v2"
    replaced = create_schedule(store, tools, changed, tenant="acme")
    assert (replaced.last_task_id, replaced.fired, replaced.created_at) == (first, 1, made.created_at)
    assert replaced.spec.submission["goal"] == "report, v2"
    assert first is not None and not store.tasks.get(first).status.terminal
    assert fire(store, tools, queues, tenant="acme", name="nightly", fire_time=made.next_fire_at + 3600) is None
    assert store.schedules.get("acme", "nightly").skipped == 1


def test_a_missed_hour_makes_as_many_tasks_locally_as_in_aws(moto_server: MotoServer) -> None:
    """Three hourly fire times missed (overlap ``allow``): the local ticker fires once, for the
    latest; in AWS the Scheduler's three messages, waiting in SQS while no executor ran, are
    received late and make one task too, the latest's, counted once."""
    from agentq.core.engine import Engine
    from agentq.runtime import build_dispatcher

    settings = deployment(moto_server)
    store, tools, queues = build_store(settings), build_registry(settings), build_queues(settings)
    spec = {"expression": "rate(1 hour)", "overlap": "allow"}
    local = create_schedule(store, tools, _spec("local", **spec), tenant="acme").next_fire_at
    made_locally = fire_due(store, tools, queues, now=local + 2 * 3600 + 1)  # three fire times passed
    assert made_locally == [fire_task_id("acme", "local", local + 2 * 3600)]

    create_schedule(store, tools, _spec("aws", **spec), tenant="acme")
    dispatcher = build_dispatcher(Engine(store, worker_id="w", tools=tools), store, queues, max_receive_count=5)
    latest = last_fire("rate(1 hour)", time.time())
    made_in_aws = set()
    for at in (latest - 7200, latest - 3600, latest):  # the three messages the Scheduler sent while no executor ran
        body = {"task_id": "schedule:acme#aws", "kind": "schedule", "schedule": "acme#aws", "scheduled_time": _iso(at)}
        made_in_aws.add(dispatcher.handle(json.dumps(body), tier="normal", receive_count=1).task_id)
    assert made_in_aws == {fire_task_id("acme", "aws", latest)}
    assert [s.fired for s in store.schedules.list("acme")] == [1, 1]


def test_in_aws_the_listed_next_fire_moves_on_after_each_fire(
    moto_server: MotoServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No local ticker runs in AWS: the fire the Scheduler's message makes moves the schedule's
    ``next_fire_at`` on (``GET /schedules``), never back (a repeated delivery of an earlier fire)."""
    from agentq.core.engine import Engine
    from agentq.runtime import build_dispatcher

    settings = deployment(moto_server)
    store, tools, queues = build_store(settings), build_registry(settings), build_queues(settings)
    first = create_schedule(store, tools, _spec(expression="rate(1 hour)"), tenant="acme").next_fire_at
    dispatcher = build_dispatcher(Engine(store, worker_id="w", tools=tools), store, queues, max_receive_count=5)
    for at, then in ((first, first + 3600), (first + 3600, first + 7200), (first, first + 7200)):
        message = {"task_id": "schedule:acme#nightly", "kind": "schedule", "schedule": "acme#nightly",
                   "scheduled_time": _iso(at)}  # fmt: skip
        assert dispatcher.handle(json.dumps(message), tier="normal", receive_count=1).kind == "delete"
        assert store.schedules.get("acme", "nightly").next_fire_at == then


def test_the_scheduler_name_of_a_schedule_with_the_longest_allowed_name_fits_eventbridges_64_characters() -> None:
    """A schedule's name may be 64 characters (``core.schedules.NAME_PATTERN``); EventBridge
    Scheduler's names are 1-64 (botocore's model; moto does not enforce it), so in AWS a name
    over 51 was refused. Names that fit keep the form they were made under (found again to
    replace and delete), and no two tenants' or names' Scheduler names meet."""
    from botocore.session import get_session

    from agentq.control.schedules import _aws_name

    limit = get_session().get_service_model("scheduler").shape_for("Name").metadata["max"]
    assert len(_aws_name("acme", "n" * 64)) <= limit == 64
    assert _aws_name("acme", "nightly") == "nightly-" + hashlib.sha256(b"acme").hexdigest()[:12]  # as first made
    names = {
        _aws_name(t, n) for t in ("acme", "other") for n in ("n" * 51, "n" * 52, "n" * 63, "n" * 64, "n" * 63 + "m")
    }
    assert len(names) == 10 and all(len(n) <= 64 for n in names)


class _RefusingScheduler(ThreadingHTTPServer):
    """EventBridge Scheduler's wire protocol (rest-json), answering every call as AWS answers
    an expression croniter takes and EventBridge does not (moto takes any)."""

    def __init__(self) -> None:
        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length", 0)))
                body = json.dumps({"Message": "Invalid Schedule Expression cron(0 9 L * ? *)."}).encode()
                self.send_response(400)
                self.send_header("x-amzn-ErrorType", "ValidationException")
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        super().__init__(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


def _in_aws(settings: Any, queues: Any, monkeypatch: pytest.MonkeyPatch, scheduler_url: str, group: str) -> None:
    queue_arn = queues.sqs.get_queue_attributes(QueueUrl=queues.url("normal"), AttributeNames=["QueueArn"])
    monkeypatch.setenv("AGENTQ_SCHEDULER_GROUP", group)
    monkeypatch.setenv("AGENTQ_SCHEDULE_TARGET_ARN", queue_arn["Attributes"]["QueueArn"])
    monkeypatch.setenv("AGENTQ_SCHEDULER_ROLE_ARN", "arn:aws:iam::123456789012:role/agentq-scheduler")
    monkeypatch.setenv("AWS_ENDPOINT_URL_SCHEDULER", scheduler_url)


def test_in_aws_a_schedule_the_scheduler_refuses_is_not_left_written(
    moto_server: MotoServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The Scheduler's schedule is made before the stored one: refused there (a group that does
    not exist, an outage), nothing is stored, where it stayed listed with a next fire that
    never came; an expression EventBridge refuses is a ValidationError naming ``expression``
    (a 422), and a replace it refuses leaves the schedule as it was."""
    settings = deployment(moto_server)
    store, tools, queues = build_store(settings), build_registry(settings), build_queues(settings)
    _in_aws(settings, queues, monkeypatch, moto_server.endpoint_url, f"{settings.prefix}-no-such-group")
    with pytest.raises(ClientError):  # moto answers 500 for a missing group; AWS, ResourceNotFoundException
        create_schedule(store, tools, _spec(), tenant="acme")
    assert store.schedules.list() == []

    boto3.client("scheduler", endpoint_url=moto_server.endpoint_url, region_name="us-east-1").create_schedule_group(
        Name=f"{settings.prefix}-schedules"
    )
    monkeypatch.setenv("AGENTQ_SCHEDULER_GROUP", f"{settings.prefix}-schedules")
    create_schedule(store, tools, _spec("kept"), tenant="acme")
    with _RefusingScheduler() as scheduler:
        monkeypatch.setenv("AWS_ENDPOINT_URL_SCHEDULER", scheduler.url)
        with pytest.raises(ValidationError) as refused:
            create_schedule(store, tools, _spec(expression="cron(0 9 ? * MON-FRI *)"), tenant="acme")
        with pytest.raises(ValidationError):  # a replace
            create_schedule(store, tools, _spec("kept", expression="cron(0 9 ? * MON-FRI *)"), tenant="acme")
        scheduler.shutdown()
    assert refused.value.field == "expression" and "Invalid Schedule Expression" in refused.value.message
    assert [(s.spec.name, s.spec.expression) for s in store.schedules.list()] == [("kept", "rate(1 minute)")]


def test_in_aws_a_delete_the_scheduler_fails_leaves_the_schedule_listed_for_a_delete_again(
    moto_server: MotoServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The Scheduler's schedule is deleted before the stored one: an outage between leaves the
    schedule listed (DELETE again finishes it), never a Scheduler schedule firing on for one
    no DELETE can reach (it answers 404)."""
    settings = deployment(moto_server)
    store, tools, queues = build_store(settings), build_registry(settings), build_queues(settings)
    scheduler = boto3.client("scheduler", endpoint_url=moto_server.endpoint_url, region_name="us-east-1")
    scheduler.create_schedule_group(Name=f"{settings.prefix}-schedules")
    _in_aws(settings, queues, monkeypatch, moto_server.endpoint_url, f"{settings.prefix}-schedules")
    create_schedule(store, tools, _spec(), tenant="acme")
    monkeypatch.setenv("AWS_ENDPOINT_URL_SCHEDULER", "http://127.0.0.1:9")  # unreachable
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")
    with pytest.raises(EndpointConnectionError):
        delete_schedule(store, tenant="acme", name="nightly")
    assert [s.spec.name for s in store.schedules.list()] == ["nightly"]
    monkeypatch.setenv("AWS_ENDPOINT_URL_SCHEDULER", moto_server.endpoint_url)
    delete_schedule(store, tenant="acme", name="nightly")
    assert store.schedules.list() == []
    assert scheduler.list_schedules(GroupName=f"{settings.prefix}-schedules")["Schedules"] == []


def test_a_schedule_stored_before_its_expression_was_refused_is_listed_counted_failed_at_each_fire_and_deletable(
    moto_server: MotoServer,
) -> None:
    """The expression check grew stricter (EventBridge's grammar): a schedule stored before it
    with an expression it now refuses (day-of-week 0, which croniter read as Sunday) made every
    read of the schedules raise, for every tenant: the local ticker and GET /schedules failed.
    Now it is read back as stored, each fire of it is counted failed naming what is wrong (no
    task, the others still fire), the local ticker tries it again a day on, and it can be
    deleted."""
    from agentq.core.schedules import STORED, ScheduleSpec

    settings = deployment(moto_server)
    store, tools, queues = build_store(settings), build_registry(settings), build_queues(settings)
    due = create_schedule(store, tools, _spec("nightly"), tenant="acme").next_fire_at
    old = ScheduleSpec.model_validate(_spec("old", expression="cron(0 9 ? * 0 *)"), context={STORED: True})
    store.schedules.put("acme", old, due)
    with pytest.raises(ValueError, match="day-of-week"):
        ScheduleSpec.model_validate(_spec("old", expression="cron(0 9 ? * 0 *)"))  # refused where made

    assert [s.spec.name for s in store.schedules.list()] == ["nightly", "old"]
    assert fire_due(store, tools, queues, now=due + 1) == [fire_task_id("acme", "nightly", due)]
    kept = store.schedules.get("acme", "old")
    assert (kept.fired, kept.failed) == (0, 1) and kept.last_error is not None
    assert kept.last_error.startswith("expression: ") and "day-of-week '0'" in kept.last_error
    assert kept.next_fire_at >= due + 1 + 86_400 - 1  # tried again a day on, not every tick
    assert fire_due(store, tools, queues, now=due + 2) == []
    assert store.schedules.get("acme", "old").failed == 1

    assert fire(store, tools, queues, tenant="acme", name="old", fire_time=due) is None  # the Scheduler's message
    assert store.schedules.get("acme", "old").failed == 2
    assert store.tasks.get_many([fire_task_id("acme", "old", due)]) == []
    delete_schedule(store, tenant="acme", name="old")
    assert [s.spec.name for s in store.schedules.list()] == ["nightly"]


def test_the_schedules_are_listed_in_pages_each_within_one_lambda_answer(api: Api) -> None:
    """32 schedules of a 200 KB submission were 6.4 MB in one answer: past the 6 MB a Lambda may
    answer (API Gateway's 502, and no cursor to read less). Pages stop at ?limit= or 2 MB, and
    following next_cursor lists each schedule once, by name."""
    import uuid

    tenant = f"t-{uuid.uuid4().hex[:8]}"
    names = [f"big{i:02d}" for i in range(32)]
    for name in names:
        sub = {"goal": "g", "provider": "scripted", "script": {"turns": [{"text": "y" * 200_000}]}}
        made = api.call("POST", "/schedules", {"name": name, "expression": "rate(1 day)", "submission": sub},
                        tenant=tenant)  # fmt: skip
        assert made[0] == 201, made[1]
    listed, sizes = lambda_pages(api, "/schedules", "schedules", tenant)
    assert [s["name"] for s in listed] == names
    assert len(sizes) > 1 and max(sizes) < LAMBDA_RESPONSE_BYTES / 2, sizes
    listed, sizes = lambda_pages(api, "/schedules?limit=10", "schedules", tenant)
    assert [s["name"] for s in listed] == names and len(sizes) == 4
    for limit in (0, 101, "x"):
        status, body, _ = api.call("GET", f"/schedules?limit={limit}", tenant=tenant)
        assert (status, body["error"]["field"]) == (422, "limit"), body
    from agentq.api.cursors import encode_cursor

    for cursor in (encode_cursor("agent_versions", ["big", 2]), encode_cursor("schedules", "A#b"), "e30", "no!"):
        status, body, _ = api.call("GET", f"/schedules?cursor={cursor}", tenant=tenant)
        assert (status, body["error"]["code"], body["error"]["field"]) == (400, "invalid_cursor", "cursor"), body
