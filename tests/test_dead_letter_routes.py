"""The dead-letter routes of the HTTP API against the local stack: a tier's DLQ is shared by
every tenant, so what one tenant left there (an unreadable task's dead letter, a hundred dead
letters of its own) must neither break nor hide another tenant's listing and redrive."""

from __future__ import annotations

from agentq.core.models import TaskSubmission
from agentq.queueing.queues import TaskMessage, TaskQueues
from agentq.storage import keys
from agentq.storage.table import Update

from tests.api_support import ApiStack

TIER = "high"


def _submission() -> TaskSubmission:
    return TaskSubmission.model_validate(
        {"goal": "g", "provider": "scripted", "script": {"turns": [{"text": "hi"}]}, "priority": TIER}
    )


def _drain(queues: TaskQueues) -> None:
    """Empty the tier's DLQ for the next test of the shared stack (PurgeQueue allows one call a
    minute)."""
    url = queues.dlq_url(TIER)
    while got := queues.sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10).get("Messages", []):
        for m in got:
            queues.sqs.delete_message(QueueUrl=url, ReceiptHandle=m["ReceiptHandle"])


def test_the_redrive_route_answers_a_tenant_whose_tier_holds_an_unreadable_tasks_dead_letter(
    api_stack: ApiStack,
) -> None:
    """Before, the route answered every tenant 500 (pydantic's ValidationError from reading the
    unreadable task's owner in ``redrive_for_tenant``)."""
    stack = api_stack.stack
    store, queues = stack.store(), stack.queues()
    broken = store.tasks.create(_submission(), tenant="team-b")
    store.table.update(keys.item_key(broken.task_id, "META#SUBMISSION"), Update(set={"submission": "{not json"}))
    queues.dead_letter(TIER, TaskMessage(task_id=broken.task_id).model_dump_json(), "poison: unreadable")
    try:
        for key in (api_stack.key, api_stack.other_key):  # another tenant's, and its own tenant's
            status, body, _ = api_stack.http("POST", f"/dead-letters/{TIER}/redrive", key=key)
            assert (status, body) == (200, {"tier": TIER, "moved": 0, "task_ids": []}), (status, body)
            status, page, _ = api_stack.http("GET", f"/dead-letters?tier={TIER}", key=key)
            assert (status, page) == (200, {"dead_letters": []}), (status, page)
    finally:
        _drain(queues)


def test_a_tenant_sees_and_redrives_its_own_dead_letter_behind_a_hundred_of_another_tenants(
    api_stack: ApiStack,
) -> None:
    """A tier's DLQ is every tenant's: GET /dead-letters looks as far as the redrive does (1,000
    messages) and keeps the caller's. Before, it looked at the first 100 only: behind 100 of
    another tenant's dead letters a tenant's own was not listed, and the console's Redrive
    button (disabled on an empty list) could not be pressed."""
    stack = api_stack.stack
    store, queues = stack.store(), stack.queues()
    theirs = store.tasks.create(_submission(), tenant="team-b")
    for _ in range(100):
        queues.dead_letter(TIER, TaskMessage(task_id=theirs.task_id).model_dump_json(), "theirs")
    mine = store.tasks.create(_submission(), tenant="team-a")
    queues.dead_letter(TIER, TaskMessage(task_id=mine.task_id).model_dump_json(), "mine")
    try:
        status, page, _ = api_stack.http("GET", f"/dead-letters?tier={TIER}")
        assert status == 200, page
        assert [(d["task_id"], d["reason"]) for d in page["dead_letters"]] == [(mine.task_id, "mine")], page
        status, done, _ = api_stack.http("POST", f"/dead-letters/{TIER}/redrive")
        assert (status, done) == (200, {"tier": TIER, "moved": 1, "task_ids": [mine.task_id]}), (status, done)
        status, page, _ = api_stack.http("GET", f"/dead-letters?tier={TIER}", key=api_stack.other_key)
        assert status == 200 and len(page["dead_letters"]) == 100, (status, len(page["dead_letters"]))
    finally:
        _drain(queues)


def test_a_redrive_naming_message_ids_moves_those_only_and_never_another_tenants(api_stack: ApiStack) -> None:
    """The console's Redrive moved every dead letter of the tier at the click, one that came after
    the page's listing too, never shown to the person who pressed it: it names what it showed."""
    stack = api_stack.stack
    store, queues = stack.store(), stack.queues()
    shown, later = (store.tasks.create(_submission(), tenant="team-a") for _ in range(2))
    theirs = store.tasks.create(_submission(), tenant="team-b")
    queues.dead_letter(TIER, TaskMessage(task_id=shown.task_id).model_dump_json(), "shown")
    queues.dead_letter(TIER, TaskMessage(task_id=theirs.task_id).model_dump_json(), "theirs")
    try:
        status, page, _ = api_stack.http("GET", f"/dead-letters?tier={TIER}")
        assert status == 200 and [d["task_id"] for d in page["dead_letters"]] == [shown.task_id], page
        listed = [d["message_id"] for d in page["dead_letters"]]
        status, page, _ = api_stack.http("GET", f"/dead-letters?tier={TIER}", key=api_stack.other_key)
        their_ids = [d["message_id"] for d in page["dead_letters"]]
        queues.dead_letter(TIER, TaskMessage(task_id=later.task_id).model_dump_json(), "came after the listing")
        named = {"message_ids": [*listed, *their_ids]}  # another tenant's id too: not moved
        status, done, _ = api_stack.http("POST", f"/dead-letters/{TIER}/redrive", named)
        assert (status, done) == (200, {"tier": TIER, "moved": 1, "task_ids": [shown.task_id]}), (status, done)
        status, done, _ = api_stack.http("POST", f"/dead-letters/{TIER}/redrive", {"message_ids": listed})
        assert (status, done) == (200, {"tier": TIER, "moved": 0, "task_ids": []}), (status, done)  # gone already
        status, page, _ = api_stack.http("GET", f"/dead-letters?tier={TIER}", key=api_stack.other_key)
        assert [d["message_id"] for d in page["dead_letters"]] == their_ids, page
        status, done, _ = api_stack.http("POST", f"/dead-letters/{TIER}/redrive")  # no body: every one of ours
        assert (status, done) == (200, {"tier": TIER, "moved": 1, "task_ids": [later.task_id]}), (status, done)
    finally:
        _drain(queues)
