"""Dead letters against moto server: poison messages go straight to the tier's DLQ with the
reason and change nothing; a task whose provider keeps failing ends ``failed`` with its last
error and its message in the DLQ, its committed steps intact; a redrive resumes it from its
checkpoint; the ``agentq dlq`` CLI lists and redrives."""

from __future__ import annotations

import hashlib
import json
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import pytest

from agentq.cli.main import main
from agentq.control.conversations import send_message
from agentq.control.submit import submit
from agentq.core.engine import Engine, EngineConfig
from agentq.core.errors import IllegalTransition
from agentq.core.models import LLMStep, TaskStatus, TaskSubmission, ToolsStep
from agentq.core.providers.anthropic_provider import AnthropicProvider
from agentq.core.providers.retry import RetryPolicy
from agentq.queueing.dispatch import Action, RetryBackoff, _failures
from agentq.queueing.dlq import list_dead_letters, redrive
from agentq.queueing.queues import DEAD_LETTER_ID, DEAD_LETTER_REASON, TaskMessage
from agentq.runtime import Settings, build_queues, build_registry, build_store
from agentq.worker import Worker, WorkerConfig
from agentq_dev.moto_server import LOCAL_CREDENTIALS, MotoServer

from tests.fake_messages_api import FakeMessagesAPI, invalid_request, overloaded, text_reply, tool_use_reply
from tests.helpers import deployment, dynamo, queue_depth, s3_payloads, wait_for

MAX_RECEIVES = 2
# The worker tests run on the high tier so that they do not depend on how the slot pool shares
# a small worker between tiers (tests/test_priority.py covers that).
TIER = "high"


def _deployment(moto_server: MotoServer, **queue_settings: Any) -> Settings:
    return deployment(moto_server, **queue_settings)  # type: ignore[no-any-return]


def _wait_for(predicate: Callable[[], Any], timeout: float = 60, what: str = "condition") -> Any:
    return wait_for(predicate, timeout, what, interval=0.05)


def _table_items(settings: Settings, store: Any) -> list[dict[str, Any]]:
    return list(dynamo(store).client.scan(TableName=settings.table, ConsistentRead=True)["Items"])


@contextmanager
def _running(worker: Worker) -> Iterator[list[tuple[str, Action]]]:
    """Start the worker and record every action it applies to a message."""
    applied: list[tuple[str, Action]] = []
    apply = worker._apply

    def recording(tier: str, message: dict[str, Any], action: Action) -> None:
        applied.append((tier, action))
        apply(tier, message, action)

    worker._apply = recording  # type: ignore[method-assign]
    worker.start()
    try:
        yield applied
    finally:
        worker.shutdown()


# --------------------------------------------------------------------------- poison


def test_poison_messages_go_straight_to_the_dlq_with_the_reason_and_write_nothing(moto_server: MotoServer) -> None:
    settings = _deployment(moto_server)
    store = build_store(settings)
    queues = build_queues(settings)
    poison = {
        "this is not json {": "poison: not a task message",
        json.dumps({"hello": "world"}): "poison: not a task message",
        TaskMessage(task_id="no-such-task").model_dump_json(): "poison: unknown task 'no-such-task'",
    }
    for body in poison:
        queues.sqs.send_message(QueueUrl=queues.url(TIER), MessageBody=body)

    worker = Worker(settings, WorkerConfig(concurrency=4, max_receive_count=5))
    with _running(worker) as applied:
        dead: dict[str, dict[str, Any]] = {}

        def all_dead_lettered() -> bool:
            resp = queues.sqs.receive_message(
                QueueUrl=queues.dlq_url(TIER),
                MaxNumberOfMessages=10,
                VisibilityTimeout=60,
                MessageAttributeNames=["All"],
            )
            for m in resp.get("Messages", []):
                dead[m["Body"]] = m
            return len(dead) == len(poison)

        _wait_for(all_dead_lettered, what="three messages in the DLQ")
        _wait_for(lambda: queue_depth(queues, queues.url(TIER)) == 0, what="the source queue emptied")

    for body, why in poison.items():
        reason = dead[body]["MessageAttributes"][DEAD_LETTER_REASON]["StringValue"]
        assert reason.startswith(why), (body, reason)
    # each handled once, on its first receive: no retries, no backoff
    assert sorted(a.kind for _, a in applied) == ["dead_letter"] * 3
    for tier in ("normal", "low"):
        assert queue_depth(queues, queues.dlq_url(tier)) == 0
    assert _table_items(settings, store) == []  # no task, budget, step: nothing written
    assert s3_payloads(store).s3.list_objects_v2(Bucket=settings.bucket).get("KeyCount", 0) == 0


def test_a_poison_message_whose_dead_letter_sqs_refuses_goes_to_the_dlq_once_as_a_description_with_the_reason(
    moto_server: MotoServer,
) -> None:
    """SQS may refuse a dead letter as it is: in AWS a body near the size limit, which the
    ``agentq-reason`` attribute pushes over it (attributes count); here the DLQ's limit is lowered
    to stand for that, since moto counts the body only. A description of the body (size, digest,
    first characters, SQS's refusal) goes instead, with the reason, and the original is deleted.
    Before, the worker's send raised into its thread pool, where the exception was lost: the
    message was neither deleted nor dead-lettered, was handled again every visibility timeout
    (6 times in 12 s), and reached the DLQ only by SQS's own move, without a reason."""
    settings = _deployment(moto_server, visibility_timeout=2)
    queues = build_queues(settings)
    queues.sqs.set_queue_attributes(QueueUrl=queues.dlq_url(TIER), Attributes={"MaximumMessageSize": "1024"})
    body = "x" * 1500
    queues.sqs.send_message(QueueUrl=queues.url(TIER), MessageBody=body)
    worker = Worker(settings, WorkerConfig(concurrency=2, max_receive_count=5, visibility_seconds=2))
    with _running(worker) as applied:
        _wait_for(lambda: queue_depth(queues, queues.dlq_url(TIER)) == 1, timeout=20, what="a dead letter")
        time.sleep(5)  # past two visibility timeouts: a message left in the queue is handled again
    assert [a.kind for _, a in applied] == ["dead_letter"], [(a.kind, a.reason) for _, a in applied]
    assert queue_depth(queues, queues.url(TIER)) == 0
    (dead,) = _dlq_messages(queues)
    reason = dead["MessageAttributes"][DEAD_LETTER_REASON]["StringValue"]
    assert reason.startswith("poison: not a task message") and "body was refused by the DLQ" in reason, reason
    described = json.loads(dead["Body"])["refused_body"]
    assert (described["bytes"], described["sha256"], described["head"]) == (
        1500, hashlib.sha256(body.encode()).hexdigest(), "x" * 200)  # fmt: skip
    assert described["refused"].startswith("InvalidParameterValue: "), described


# ------------------------------------------------------------ retryable failures


def _failing_worker(settings: Settings, fake: FakeMessagesAPI) -> Worker:
    config = WorkerConfig(
        concurrency=4, lease_seconds=3, heartbeat_seconds=1, visibility_seconds=10, max_receive_count=MAX_RECEIVES
    )
    engine = Engine(
        build_store(settings),
        worker_id="dlq-test-worker",
        tools=build_registry(settings),
        providers=lambda submission: AnthropicProvider(
            base_url=fake.base_url, api_key="k", retry=RetryPolicy(max_attempts=1)
        ),
        config=EngineConfig(lease_seconds=config.lease_seconds, heartbeat_seconds=config.heartbeat_seconds),
    )
    worker = Worker(settings, config, engine=engine)
    worker.dispatcher.backoff = RetryBackoff(base_seconds=1, cap_seconds=1)
    return worker


def _submission() -> TaskSubmission:
    return TaskSubmission.model_validate(
        {
            "goal": "look something up, then answer",
            "provider": "anthropic",
            "constraints": {"tools": ["lookup"]},
            "priority": TIER,
        }
    )


def _fail_into_dlq(settings: Settings, fake: FakeMessagesAPI) -> str:
    """A task whose first turn works (a tool call) and whose provider then only answers 529:
    returns its id once it is failed and its message sits in the DLQ."""
    fake.enqueue(tool_use_reply("lookup", {"query": "x"}, text="let me look"), *[overloaded()] * MAX_RECEIVES)
    store = build_store(settings)
    queues = build_queues(settings)
    task = submit(store, build_registry(settings), _submission(), tenant="t", queues=queues)
    _wait_for(lambda: store.tasks.get(task.task_id).status is TaskStatus.FAILED, what="task failed")
    _wait_for(lambda: queue_depth(queues, queues.dlq_url(TIER)) == 1, what="message in the DLQ")
    return task.task_id


def test_a_task_that_keeps_failing_retryably_ends_failed_with_its_error_in_the_dlq_and_keeps_its_steps(
    moto_server: MotoServer,
) -> None:
    settings = _deployment(moto_server, max_receive_count=MAX_RECEIVES, visibility_timeout=10)
    store = build_store(settings)
    queues = build_queues(settings)
    with FakeMessagesAPI() as fake:
        worker = _failing_worker(settings, fake)
        with _running(worker) as applied:
            task_id = _fail_into_dlq(settings, fake)
            _wait_for(lambda: queue_depth(queues, queues.url(TIER)) == 0, what="the source queue emptied")
        assert fake.unexpected == []
        assert len(fake.requests) == 1 + MAX_RECEIVES  # one tool turn, then one 529 per receive

    kinds = [a.kind for _, a in applied if a.task_id == task_id]
    assert kinds == ["retry"] * (MAX_RECEIVES - 1) + ["dead_letter"]

    task = store.tasks.get(task_id)
    assert task.status is TaskStatus.FAILED
    assert task.error is not None
    assert task.error["code"] == "overloaded" and task.error["status_code"] == 529
    assert "overloaded (529)" in task.error["message"]
    assert task.error["attempts"] == MAX_RECEIVES
    assert task.claim_count == MAX_RECEIVES and task.lease_expires == 0
    assert store.budgets.get(task_id).reserved == 0  # the failed calls hold no tokens

    # No step lost: the turn committed before the failures is still there, as committed.
    steps = store.steps.load(task_id)
    assert [(s.number, s.epoch, s.body.kind) for s in steps] == [(1, 1, "llm"), (2, 1, "tools")]
    assert isinstance(steps[0].body, LLMStep) and steps[0].body.tool_uses()[0]["name"] == "lookup"
    assert isinstance(steps[1].body, ToolsStep) and steps[1].body.results[0].content.startswith("result for x")
    assert task.step == 2

    letters = list_dead_letters(queues, store)
    assert [(d.tier, d.task_id, d.task_status) for d in letters] == [(TIER, task_id, "failed")]
    assert letters[0].reason.startswith(f"failed after {MAX_RECEIVES} attempts") and "529" in letters[0].reason
    # Its message is in the DLQ, so a person who writes to it is told to redrive it (or fork it).
    assert task.error["dead_lettered"] is True
    with pytest.raises(IllegalTransition) as refused:
        send_message(store, queues, task_id, "go on", tenant="t")
    assert "dead-letter queue" in refused.value.message and "redrive" in refused.value.message


def test_an_outage_that_outlasts_every_delivery_fails_the_task_with_its_error_instead_of_leaving_it_running(
    moto_server: MotoServer,
) -> None:
    """A fault of no known kind escaping a run is retried like an overload, and on the last
    delivery the task ends failed with it (before, SQS dead-lettered the message while the
    task still said running)."""
    settings = _deployment(moto_server, max_receive_count=MAX_RECEIVES, visibility_timeout=10)
    store = build_store(settings)

    class Unreachable:
        name = "unreachable"

        def complete(self, request: Any) -> Any:
            raise ConnectionResetError("connection reset by peer")

    with FakeMessagesAPI() as fake:
        worker = _failing_worker(settings, fake)
        worker.dispatcher.engine.providers = lambda submission: Unreachable()
        with _running(worker) as applied:
            task = submit(store, build_registry(settings), _submission(), tenant="t", queues=build_queues(settings))
            _wait_for(lambda: store.tasks.get(task.task_id).status is TaskStatus.FAILED, what="task failed")
            _wait_for(lambda: any(a.kind == "dead_letter" for _, a in applied), what="message dead-lettered")
    assert [a.kind for _, a in applied if a.task_id == task.task_id] == ["retry"] * (MAX_RECEIVES - 1) + ["dead_letter"]
    failed = store.tasks.get(task.task_id)
    assert failed.error == {
        "code": "worker_error",
        "message": "ConnectionResetError: connection reset by peer",
        "attempts": MAX_RECEIVES,
        "dead_lettered": True,
    }
    assert failed.lease_expires == 0 and store.budgets.get(task.task_id).reserved == 0


def test_a_redriven_task_resumes_from_its_checkpoint_and_succeeds(moto_server: MotoServer) -> None:
    settings = _deployment(moto_server, max_receive_count=MAX_RECEIVES, visibility_timeout=10)
    store = build_store(settings)
    queues = build_queues(settings)
    with FakeMessagesAPI() as fake:
        worker = _failing_worker(settings, fake)
        with _running(worker) as applied:
            task_id = _fail_into_dlq(settings, fake)
            fake.enqueue(text_reply("the answer, at last"))  # the provider is back

            reports = redrive(queues)

            def resumed_and_done() -> bool:
                task = store.tasks.get(task_id)
                return task.status.terminal and task.claim_count > MAX_RECEIVES

            _wait_for(resumed_and_done, what="the task claimed again and finished")
            _wait_for(lambda: queue_depth(queues, queues.url(TIER)) == 0, what="the source queue emptied")
        assert fake.unexpected == []
        resumed_request = fake.requests[-1].body
        assert len(fake.requests) == 1 + MAX_RECEIVES + 1

    # moto has no StartMessageMoveTask: the fallback moved the message, and says so
    assert {r.method for r in reports} == {"receive/send/delete"}
    assert {r.tier: r.moved for r in reports} == {tier: int(tier == TIER) for tier in ("high", "normal", "low")}

    final = store.tasks.get(task_id)
    assert final.status is TaskStatus.SUCCEEDED and final.result == "the answer, at last"
    runs = [a.run for _, a in applied if a.task_id == task_id and a.run is not None and a.run.outcome == "finished"]
    assert len(runs) == 1 and runs[0].resumed_from_step == 2

    steps = store.steps.load(task_id)
    redrive_epoch = MAX_RECEIVES + 1
    assert [(s.number, s.epoch, s.body.kind) for s in steps] == [
        (1, 1, "llm"),
        (2, 1, "tools"),
        (3, redrive_epoch, "llm"),
    ]
    # The resumed call saw the conversation rebuilt from the checkpoint, not a fresh start.
    assert [m["role"] for m in resumed_request["messages"]] == ["user", "assistant", "user"]
    assert resumed_request["messages"][2]["content"][0]["type"] == "tool_result"

    assert list_dead_letters(queues, store) == []
    assert queue_depth(queues, queues.dlq_url(TIER)) == 0
    budget = store.budgets.get(task_id)
    assert budget.reserved == 0 and budget.used == final.tokens_in + final.tokens_out
    # the redrive requeued it "from its checkpoint, error cleared": a success shows no failure
    assert final.error is None, f"a succeeded task still carries the error of its failure: {final.error}"


def test_a_redriven_message_delivered_again_after_its_task_failed_again_leaves_that_failure_alone(
    moto_server: MotoServer,
) -> None:
    """SQS delivers at least once: a copy of a redriven message can come back after the task it
    resumed failed once more and was dead-lettered again. That copy must not resume the task
    (before, it did: the task ran while the DLQ listed its new dead letter); nor may a copy of
    the message the task first failed on. A redrive of the new dead letter still resumes it."""
    settings = _deployment(moto_server, max_receive_count=MAX_RECEIVES, visibility_timeout=10)
    store = build_store(settings)
    queues = build_queues(settings)
    with FakeMessagesAPI() as fake:
        worker = _failing_worker(settings, fake)
        with _running(worker) as applied:
            task_id = _fail_into_dlq(settings, fake)
            (first,) = _dlq_messages(queues)  # what its redrive sends back, attributes and all
            fake.enqueue(overloaded())  # the provider is still down when it resumes
            redrive(queues)
            _wait_for(
                lambda: store.tasks.get(task_id).status is TaskStatus.FAILED and queue_depth(queues, queues.dlq_url(TIER)) == 1
                and store.tasks.get(task_id).claim_count == MAX_RECEIVES + 1,
                what="the resumed task failed again and its message dead-lettered again",
            )  # fmt: skip
            failed_again = store.tasks.get(task_id)
            requests = len(fake.requests)
            fake.enqueue(text_reply("resumed by its second redrive"))  # for the second redrive only

            # The redriven message again (as SQS may deliver it), and the one it first failed on.
            seen = len(applied)
            queues.sqs.send_message(
                QueueUrl=queues.url(TIER), MessageBody=first["Body"], MessageAttributes=first["MessageAttributes"]
            )
            queues.sqs.send_message(QueueUrl=queues.url(TIER), MessageBody=first["Body"])
            _wait_for(lambda: len(applied) >= seen + 2, what="both copies handled")
            now = store.tasks.get(task_id)
            assert now.status is TaskStatus.FAILED and now.claim_count == failed_again.claim_count, now.status
            assert now.error == failed_again.error and len(fake.requests) == requests
            handled = sorted(a.reason for _, a in applied[seen:] if a.kind == "delete")  # in either order
            assert len(applied) == seen + 2 and len(handled) == 2, applied[seen:]
            assert handled[0].startswith("task already failed"), handled
            assert "failed again since this dead letter was redriven" in handled[1], handled
            letters = list_dead_letters(queues, store)
            assert [(d.task_id, d.task_status) for d in letters] == [(task_id, "failed")]

            # Its new dead letter, redriven, resumes it.
            redrive(queues)
            _wait_for(
                lambda: store.tasks.get(task_id).status is TaskStatus.SUCCEEDED, what="resumed by the new redrive"
            )
        assert fake.unexpected == []
    assert store.tasks.get(task_id).result == "resumed by its second redrive"


def test_a_copy_of_a_redriven_message_leaves_a_task_that_then_failed_outside_the_dlq_alone(
    moto_server: MotoServer,
) -> None:
    """DEPLOY.md: a redriven message for a task that failed meanwhile "for a reason that did not
    come through the DLQ" is deleted and nothing changes. The redrive's requeue takes the task out
    of the failure it was dead-lettered for (META's ``dead_letter``): before, it kept that id, so
    a second delivery of the redriven message (SQS is at least once; the CLI's send-then-delete
    may duplicate) matched it, requeued the task that had since failed on a 400, and re-ran it."""
    settings = _deployment(moto_server, max_receive_count=MAX_RECEIVES, visibility_timeout=10)
    store = build_store(settings)
    with FakeMessagesAPI() as fake:
        dispatcher = _failing_worker(settings, fake).dispatcher
        fake.enqueue(tool_use_reply("lookup", {"query": "x"}, text="let me look"), overloaded(), overloaded(),
                     invalid_request("bad request"), text_reply("must never be asked for"))  # fmt: skip
        task = submit(store, build_registry(settings), _submission(), tenant="t", queues=None)
        body = TaskMessage(task_id=task.task_id).model_dump_json()
        assert dispatcher.handle(body, tier=TIER, receive_count=1).kind == "retry"
        dead = dispatcher.handle(body, tier=TIER, receive_count=2)
        assert dead.kind == "dead_letter" and dead.dead_letter_id
        attrs = {DEAD_LETTER_REASON: {"DataType": "String", "StringValue": dead.reason},
                 DEAD_LETTER_ID: {"DataType": "String", "StringValue": dead.dead_letter_id}}  # fmt: skip
        # Redriven: it resumes, and fails for a reason that never reaches the DLQ (a 400).
        assert dispatcher.handle(body, tier=TIER, receive_count=1, attributes=attrs).kind == "delete"
        failed = store.tasks.get(task.task_id)
        assert failed.status is TaskStatus.FAILED and not (failed.error or {}).get("dead_lettered"), failed.error
        asked = len(fake.requests)
        # SQS delivers the redriven message again.
        again = dispatcher.handle(body, tier=TIER, receive_count=2, attributes=attrs)
        now = store.tasks.get(task.task_id)
        assert (now.status, now.claim_count, len(fake.requests)) == (TaskStatus.FAILED, failed.claim_count, asked), (
            again.kind, again.reason, now.status, now.result)  # fmt: skip
        assert again.kind == "delete" and "failed again since this dead letter was redriven" in again.reason


def test_two_deliveries_failing_the_same_task_dead_letter_it_once(
    moto_server: MotoServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A duplicate delivery can claim the task as soon as a failing run gives its lease back, and
    fail it first: the run that then finds it failed deletes its copy instead of dead-lettering a
    second one (listed, and redriven, as a failure of its own)."""
    settings = _deployment(moto_server, max_receive_count=MAX_RECEIVES, visibility_timeout=10)
    store = build_store(settings)
    with FakeMessagesAPI() as fake:
        dispatcher = _failing_worker(settings, fake).dispatcher
        fake.enqueue(tool_use_reply("lookup", {"query": "x"}, text="let me look"), *[overloaded()] * 3)
        task = submit(store, build_registry(settings), _submission(), tenant="t", queues=None)
        body = TaskMessage(task_id=task.task_id).model_dump_json()
        assert dispatcher.handle(body, tier=TIER, receive_count=1).kind == "retry"  # failure 1
        count = _failures.count_failure
        actions: list[Action] = []
        raced: list[bool] = []

        def duplicate_first(ctx: Any, run: Any) -> int:
            """Delivery A counted its failure; delivery B (a duplicate) runs, fails and ends first."""
            counted = count(ctx, run)
            if not raced:
                raced.append(True)
                actions.append(dispatcher.handle(body, tier=TIER, receive_count=2))
            return counted

        monkeypatch.setattr(_failures, "count_failure", duplicate_first)
        actions.append(dispatcher.handle(body, tier=TIER, receive_count=2))
        assert fake.unexpected == []
    assert sorted(a.kind for a in actions) == ["dead_letter", "delete"], [(a.kind, a.reason) for a in actions]
    assert store.tasks.get(task.task_id).status is TaskStatus.FAILED


def _dlq_messages(queues: Any) -> list[dict[str, Any]]:
    """The DLQ's messages (received, then made visible again), with their attributes."""
    url = queues.dlq_url(TIER)
    got = queues.sqs.receive_message(
        QueueUrl=url, MaxNumberOfMessages=10, VisibilityTimeout=30, MessageAttributeNames=["All"]
    ).get("Messages", [])
    for m in got:
        queues.sqs.change_message_visibility(QueueUrl=url, ReceiptHandle=m["ReceiptHandle"], VisibilityTimeout=0)
    return list(got)


# --------------------------------------------------------------------------- CLI


@dataclass
class Ran:
    returncode: int
    stdout: str
    stderr: str


def _cli(settings: Settings, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], *args: str) -> Ran:
    """``agentq dlq ...``: the CLI's own main(), in this process, with a worker's environment
    (the command reads its settings from it, as it does in another shell)."""
    for name, value in {**LOCAL_CREDENTIALS, **settings.env()}.items():
        monkeypatch.setenv(name, value)
    capsys.readouterr()
    code = main(["dlq", *args])
    out, err = capsys.readouterr()
    return Ran(code, out, err)


def test_the_dlq_cli_lists_dead_letters_as_json_and_redrives_them(
    moto_server: MotoServer, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    settings = _deployment(moto_server)
    store = build_store(settings)
    queues = build_queues(settings)
    task = store.tasks.create(_submission(), tenant="t")
    task_body = TaskMessage(task_id=task.task_id).model_dump_json()
    queues.dead_letter("normal", task_body, "failed after 5 attempts: anthropic overloaded (529)")
    queues.dead_letter("low", "garbage", "poison: not a task message (Invalid JSON)")

    listed = _cli(settings, monkeypatch, capsys, "list", "--json")
    assert listed.returncode == 0, listed.stderr[-2000:]
    letters = sorted(json.loads(listed.stdout), key=lambda d: d["tier"])
    assert [(d["tier"], d["task_id"], d["task_status"], d["reason"]) for d in letters] == [
        ("low", None, None, "poison: not a task message (Invalid JSON)"),
        ("normal", task.task_id, "queued", "failed after 5 attempts: anthropic overloaded (529)"),
    ]
    assert letters[0]["body"] == repr("garbage")

    only_normal = _cli(settings, monkeypatch, capsys, "redrive", "--tier", "normal")
    assert only_normal.returncode == 0, only_normal.stderr[-2000:]
    assert only_normal.stdout.split() == "normal 1 message(s) back to the normal queue (receive/send/delete)".split()
    assert queue_depth(queues, queues.dlq_url("normal")) == 0 and queue_depth(queues, queues.dlq_url("low")) == 1

    rest = _cli(settings, monkeypatch, capsys, "redrive")
    assert rest.returncode == 0, rest.stderr[-2000:]
    lines = [line.split() for line in rest.stdout.strip().splitlines()]
    assert lines == [
        f"{tier} {n} message(s) back to the {tier} queue (receive/send/delete)".split()
        for tier, n in (("high", 0), ("normal", 0), ("low", 1))
    ]

    assert list_dead_letters(queues, store) == []
    # the messages are back on their own tier queues, the agentq reason still attached
    back = queues.sqs.receive_message(QueueUrl=queues.url("normal"), MessageAttributeNames=["All"], WaitTimeSeconds=1)[
        "Messages"
    ]
    assert [m["Body"] for m in back] == [task_body]
    assert back[0]["MessageAttributes"][DEAD_LETTER_REASON]["StringValue"].startswith("failed after 5 attempts")
    assert queue_depth(queues, queues.url("low")) == 1


def test_a_cli_redrive_moves_each_dead_letter_once_and_returns_while_a_worker_dead_letters_them_again(
    moto_server: MotoServer,
) -> None:
    """``agentq dlq redrive`` (its receive/send/delete path: moto, or StartMessageMoveTask
    refused) moves what the DLQ held when it began, once: the poison a live worker sends straight
    back is left for the next redrive. Before, it moved those copies again until the workers
    stopped (3,890 dead-letterings in 120 s for 200 messages; with 40, it reported 45 moved)."""
    settings = _deployment(moto_server)
    queues = build_queues(settings)
    n = 200
    for i in range(n):
        queues.dead_letter(TIER, f"garbage {i}", "poison: not a task message")
    reports: list[Any] = []
    mover = threading.Thread(target=lambda: reports.extend(redrive(queues, tier=TIER)), daemon=True)
    with _running(Worker(settings, WorkerConfig(concurrency=8, max_receive_count=5))) as applied:
        mover.start()
        mover.join(timeout=60)
        finished = not mover.is_alive()
        _wait_for(lambda: len(applied) >= n and queue_depth(queues, queues.url(TIER)) == 0, what="every copy handled")
    mover.join(timeout=120)  # before, it ended only once the worker had stopped
    assert finished, "the redrive was still moving messages after 60 s"
    assert [(r.method, r.moved) for r in reports] == [("receive/send/delete", n)], reports
    assert len(applied) == n and {a.kind for _, a in applied} == {"dead_letter"}  # each handled once
    assert queue_depth(queues, queues.dlq_url(TIER)) == n


def test_the_runbooks_console_redrive_names_the_tier_queue_as_its_destination_not_the_source_queues() -> None:
    """Most messages in a tier DLQ were sent there by agentq, with their reason
    (``TaskQueues.dead_letter``), not moved by the queue's redrive policy; SQS's "redrive to
    source" sends a message back to the queue it was moved from, which it knows only for a
    message its redrive policy moved. So the console step an operator follows names the tier
    queue as a custom destination, as ``agentq dlq redrive`` does (``DestinationArn``)."""
    from pathlib import Path

    runbook = (
        (Path(__file__).resolve().parent.parent / "docs" / "DEPLOY.md")
        .read_text()
        .split("## Runbook: redriving a DLQ", 1)[1]
        .split("\n## ", 1)[0]
    )
    console = " ".join(runbook.split("**Redrive from the console:**", 1)[1].split("\n\n", 1)[0].split())
    assert "*Redrive to a custom destination* → the tier's queue, `{prefix}-{tier}`" in console, console
    assert "`{prefix}-workspace-{tier}` for a workspace DLQ" in console, console
