"""Finished tasks expire: META carries ``expires_at`` exactly while the task is terminal, and the
reaper purges everything else of a task once DynamoDB TTL has deleted its META.

Against moto server. moto runs no TTL process, so a test deletes META itself and adds the
``userIdentity`` DynamoDB puts on a TTL deletion's stream record; the record itself is read
back from moto's DynamoDB Streams.
"""

from __future__ import annotations

import dataclasses
import json
import signal
import time
import uuid
from collections.abc import Iterator
from datetime import datetime
from typing import Any

import pytest
from moto.events.models import EventPattern

from agentq.control import operations as control
from agentq.control.defaults import ConfigurationError
from agentq.control.retention import expired_task_id, purge_task, ttl_removal_pattern
from agentq.core.engine import Engine, EngineConfig
from agentq.core.errors import IllegalTransition, LeaseLost, TaskNotFound
from agentq.core.models import ALLOWED_TRANSITIONS, REOPENED_BY_MESSAGE, TaskStatus
from agentq.resources import table_definition
from agentq.runtime import RETENTION_VARIABLE, Settings, build_registry, build_store, client, retention_days_from_env
from agentq.storage.container import Storage
from agentq.storage.dynamodb import DynamoTable
from agentq.storage.keys import META, payload_prefix, task_pk
from agentq.storage.serdes import from_item, to_item, to_values
from agentq.storage.tasks import DAY_SECONDS, FORK_PENDING_SECONDS

from tests.conftest import child_env
from tests.helpers import call, dynamo, dynamodb_partitions, run_python, s3_payloads, scripted
from tests.lambda_support import FakeLambdaContext, load_handler

RETENTION_DAYS = 2
RETENTION = RETENTION_DAYS * DAY_SECONDS
TTL_IDENTITY = {"type": "Service", "principalId": "dynamodb.amazonaws.com"}
LOOKUPS = [{"text": f"turn {i}", "tool_calls": [call("lookup", query=str(i), size=300)]} for i in range(3)] + [
    {"text": "done"}
]


class _Queues:
    """Stands in for TaskQueues where a test only needs to see what was enqueued."""

    def __init__(self) -> None:
        self.sent: list[str] = []

    def send(self, task_id: str, priority: Any, **_: Any) -> None:
        self.sent.append(task_id)


@pytest.fixture
def retained(settings: Settings) -> Settings:
    """The conftest deployment with a retention of its own and payloads offloaded from 64 bytes,
    so every task leaves S3 objects behind."""
    return dataclasses.replace(settings, task_retention_days=RETENTION_DAYS, offload_threshold=64)


@pytest.fixture
def rstore(retained: Settings) -> Storage:
    return build_store(retained)


def _meta(store: Storage, task_id: str) -> dict[str, Any]:
    resp = dynamo(store).client.get_item(
        TableName=store.table.name, Key=to_item({"pk": task_pk(task_id), "sk": META}), ConsistentRead=True
    )
    return dict(resp["Item"])


def _assert_expires_for(item: dict[str, Any], before: float, after: float) -> None:
    assert set(item["expires_at"]) == {"N"}, "TTL needs a Number attribute"
    expires = int(item["expires_at"]["N"])
    assert int(before + RETENTION) <= expires <= int(after + RETENTION)
    assert abs(expires - (after + RETENTION)) <= 1 + (after - before)


def _engine(store: Storage, settings: Settings) -> Engine:
    return Engine(store, worker_id="w1", tools=build_registry(settings), config=EngineConfig(lease_seconds=5))


def _force_status(store: Storage, task_id: str, status: TaskStatus) -> None:
    """Put a task in ``status`` the way the store leaves it (expires_at only when terminal or idle)."""
    values: dict[str, Any] = {":s": status.value}
    sets, removes = "#s = :s", ""
    if status.terminal or status is TaskStatus.IDLE:
        sets += ", expires_at = :e"
        values[":e"] = store.tasks.expiry(time.time())
    else:
        removes = " REMOVE expires_at"
    dynamo(store).client.update_item(
        TableName=store.table.name,
        Key=to_item({"pk": task_pk(task_id), "sk": META}),
        UpdateExpression=f"SET {sets}{removes}",
        ExpressionAttributeNames={"#s": "status"},
        ExpressionAttributeValues=to_values(values),
    )


# -- configuration -----------------------------------------------------------------------------


def test_retention_comes_from_the_environment_with_a_30_day_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(RETENTION_VARIABLE, raising=False)
    assert retention_days_from_env() == 30
    assert Settings.from_env().task_retention_days == 30
    monkeypatch.setenv(RETENTION_VARIABLE, "7")
    settings = Settings.from_env()
    assert settings.task_retention_days == 7
    assert settings.env()[RETENTION_VARIABLE] == "7"  # child workers inherit it


@pytest.mark.parametrize("raw", ["abc", "0", "-3", "1.5", "30d"])
def test_an_invalid_retention_fails_naming_the_variable(monkeypatch: pytest.MonkeyPatch, raw: str) -> None:
    monkeypatch.setenv(RETENTION_VARIABLE, raw)
    with pytest.raises(
        ConfigurationError, match=f"{RETENTION_VARIABLE}: must be a whole number of days >= 1 \\(got '{raw}'\\)"
    ) as err:
        Settings.from_env()
    assert err.value.field == RETENTION_VARIABLE


def test_the_store_expires_tasks_after_the_configured_retention(rstore: Storage) -> None:
    assert rstore.tasks.retention_seconds == RETENTION
    with pytest.raises(ValueError, match="at least one day"):
        Storage(DynamoTable(dynamo(rstore).client, rstore.table.name), rstore.payloads, retention_seconds=3600)


# -- expires_at follows the status -------------------------------------------------------------

LEGAL_TRANSITIONS = sorted((src, dst) for src, dsts in ALLOWED_TRANSITIONS.items() for dst in dsts)


@pytest.mark.parametrize(
    ("source", "target"), LEGAL_TRANSITIONS, ids=[f"{s.value}->{t.value}" for s, t in LEGAL_TRANSITIONS]
)
def test_every_legal_transition_leaves_expires_at_on_terminal_tasks_only(
    rstore: Storage, source: TaskStatus, target: TaskStatus
) -> None:
    task_id = rstore.tasks.create(scripted([{"text": "x"}]), tenant="t").task_id
    _force_status(rstore, task_id, source)
    before = time.time()
    if target is TaskStatus.QUEUED and source in REOPENED_BY_MESSAGE:
        with pytest.raises(IllegalTransition):  # only a person's message reopens a conversation
            rstore.tasks.transition(task_id, target)
        rstore.messages.accept(task_id, "a follow-up")
    else:
        rstore.tasks.transition(task_id, target)
    after = time.time()
    item = _meta(rstore, task_id)
    assert item["status"]["S"] == target.value
    if target.terminal or target is TaskStatus.IDLE:  # an interrupted conversation expires too
        _assert_expires_for(item, before, after)
    else:
        assert "expires_at" not in item, f"{source.value} -> {target.value} left expires_at on a live task"


def test_a_new_task_and_a_claimed_one_carry_no_expiry(rstore: Storage) -> None:
    task_id = rstore.tasks.create(scripted([{"text": "x"}]), tenant="t").task_id
    assert "expires_at" not in _meta(rstore, task_id)
    rstore.tasks.claim(task_id, "w", 30)
    assert "expires_at" not in _meta(rstore, task_id)


def test_a_task_the_engine_finishes_expires_after_the_retention(rstore: Storage, retained: Settings) -> None:
    task = rstore.tasks.create(scripted(LOOKUPS, tools=["lookup"]), tenant="t")
    before = time.time()
    assert _engine(rstore, retained).run(task.task_id).status is TaskStatus.SUCCEEDED
    after = time.time()
    _assert_expires_for(_meta(rstore, task.task_id), before, after)  # set by commit_step(finish=...)
    assert rstore.tasks.get(task.task_id).expires_at == int(_meta(rstore, task.task_id)["expires_at"]["N"])


def test_a_budget_raise_that_resumes_a_cost_exceeded_task_removes_its_expiry(
    rstore: Storage, retained: Settings
) -> None:
    task = rstore.tasks.create(scripted(LOOKUPS, tools=["lookup"], max_steps=1), tenant="t")
    before = time.time()
    assert _engine(rstore, retained).run(task.task_id).status is TaskStatus.COST_EXCEEDED
    _assert_expires_for(_meta(rstore, task.task_id), before, time.time())

    queues = _Queues()
    resumed = control.raise_budget(rstore, queues, task.task_id, add_tokens=1000, add_steps=10)  # type: ignore[arg-type]
    assert resumed.status is TaskStatus.QUEUED and resumed.expires_at is None
    assert "expires_at" not in _meta(rstore, task.task_id) and queues.sent == [task.task_id]

    before = time.time()
    assert _engine(rstore, retained).run(task.task_id).status is TaskStatus.SUCCEEDED
    _assert_expires_for(_meta(rstore, task.task_id), before, time.time())


def test_cancel_stamps_the_expiry_in_the_cancelling_write(rstore: Storage) -> None:
    task_id = rstore.tasks.create(scripted([{"text": "x"}]), tenant="t").task_id
    before = time.time()
    assert control.cancel(rstore, task_id) == [task_id]
    _assert_expires_for(_meta(rstore, task_id), before, time.time())


def test_a_dlq_redrive_of_a_failed_task_removes_its_expiry(rstore: Storage) -> None:
    task_id = rstore.tasks.create(scripted([{"text": "x"}]), tenant="t").task_id
    lease, _ = rstore.tasks.claim(task_id, "w", 30)  # type: ignore[misc]
    rstore.tasks.transition(
        task_id, TaskStatus.FAILED, lease=lease, error={"code": "provider_error", "message": "overloaded"}
    )
    assert "expires_at" in _meta(rstore, task_id)
    rstore.tasks.transition(task_id, TaskStatus.QUEUED, error=None)  # what dispatch._ended._requeue_redriven writes
    item = _meta(rstore, task_id)
    assert item["status"]["S"] == "queued" and "expires_at" not in item and "error" not in item


def test_a_task_past_its_retention_cannot_be_brought_back(rstore: Storage) -> None:
    """TTL may be deleting it at any moment: resuming it could leave a live task for the reaper."""
    task_id = rstore.tasks.create(scripted([{"text": "x"}]), tenant="t").task_id
    _force_status(rstore, task_id, TaskStatus.FAILED)
    dynamo(rstore).client.update_item(
        TableName=rstore.table.name, Key=to_item({"pk": task_pk(task_id), "sk": META}),
        UpdateExpression="SET expires_at = :past", ExpressionAttributeValues=to_values({":past": int(time.time()) - 5}),
    )  # fmt: skip
    with pytest.raises(IllegalTransition, match="retention ran out"):
        rstore.tasks.transition(task_id, TaskStatus.QUEUED)
    assert _meta(rstore, task_id)["status"]["S"] == "failed"


# -- purge ---------------------------------------------------------------------------------------


def _finished_task_with_everything(store: Storage, settings: Settings) -> str:
    """A task that leaves every kind of item behind: steps (offloaded), an effect, a note, an
    approval, an orphaned call, more than one BatchWriteItem's worth of items, its budget (on
    META), and S3 payloads (step bodies, the effect's result, the final result)."""
    task = store.tasks.create(scripted(LOOKUPS, tools=["lookup"]), tenant="t")
    assert _engine(store, settings).run(task.task_id).status is TaskStatus.SUCCEEDED
    steps = store.steps.load(task.task_id)
    for i in range(30):
        dynamo(store).client.put_item(
            TableName=store.table.name,
            Item=to_item({"pk": task_pk(task.task_id), "sk": f"NOTE#k{i:02d}", "value": "v"}),
        )
    for sk in ("EFFECT#toolu_1", "APPROVAL#toolu_2", "SPAWN#toolu_3", "ORPHAN#000009#e0001"):
        dynamo(store).client.put_item(
            TableName=store.table.name, Item=to_item({"pk": task_pk(task.task_id), "sk": sk, "state": "done"})
        )
    store.payloads.encode(f"{payload_prefix(task.task_id)}effects/toolu_1-e1.txt", "e" * 200)
    assert len(steps) == 7
    return task.task_id


def _everything_of(store: Storage, task_id: str) -> tuple[list[str], bool, list[str]]:
    """The task's items, whether it still has a budget, and its S3 payloads."""
    items = [i["sk"]["S"] for i in store.steps.raw_items(task_id)]
    try:
        budget = store.budgets.get(task_id) is not None
    except TaskNotFound:
        budget = False
    listing = s3_payloads(store).s3.list_objects_v2(Bucket=s3_payloads(store).bucket, Prefix=payload_prefix(task_id))
    return items, budget, [o["Key"] for o in listing.get("Contents", [])]


def test_purge_deletes_every_item_budget_and_payload_of_a_finished_task_and_nothing_of_others(
    rstore: Storage, retained: Settings
) -> None:
    doomed = _finished_task_with_everything(rstore, retained)
    neighbour = _finished_task_with_everything(rstore, retained)
    items, budget, objects = _everything_of(rstore, doomed)
    assert len(items) == 1 + 1 + 1 + 7 + 30 + 4 and budget  # META, its submission, one claim, ... and len(objects) >= 8
    neighbour_before = _everything_of(rstore, neighbour)

    result = purge_task(rstore, doomed)

    assert (result.items, result.objects) == (len(items), len(objects))
    assert _everything_of(rstore, doomed) == ([], False, [])
    assert _everything_of(rstore, neighbour) == neighbour_before
    assert rstore.tasks.get(neighbour).status is TaskStatus.SUCCEEDED


def test_purging_twice_finds_nothing_left_and_is_fine(rstore: Storage, retained: Settings) -> None:
    task_id = _finished_task_with_everything(rstore, retained)
    first = purge_task(rstore, task_id)
    assert first.items > 0
    second = purge_task(rstore, task_id)
    assert (second.items, second.objects) == (0, 0)


def test_purge_after_ttl_deleted_meta_removes_the_rest(rstore: Storage, retained: Settings) -> None:
    task_id = _finished_task_with_everything(rstore, retained)
    items, _, objects = _everything_of(rstore, task_id)
    dynamo(rstore).client.delete_item(
        TableName=rstore.table.name, Key=to_item({"pk": task_pk(task_id), "sk": META})
    )  # what TTL does (the budget goes with META)
    result = purge_task(rstore, task_id)
    assert (result.items, result.objects) == (len(items) - 1, len(objects))
    assert _everything_of(rstore, task_id) == ([], False, [])


@pytest.mark.parametrize("status", [TaskStatus.QUEUED, TaskStatus.RUNNING, TaskStatus.PAUSED, TaskStatus.WAITING])
def test_purge_refuses_a_live_task_and_deletes_nothing(rstore: Storage, status: TaskStatus) -> None:
    task_id = rstore.tasks.create(scripted([{"text": "x"}]), tenant="t").task_id
    _force_status(rstore, task_id, status)
    with pytest.raises(IllegalTransition, match=f"is {status.value}; only a finished task is purged"):
        purge_task(rstore, task_id)
    assert rstore.tasks.get(task_id).status is status
    assert rstore.budgets.get(task_id).cap > 0


def _held(store: Storage, task_id: str, **attributes: Any) -> None:
    """META as a worker that has not let go of its task yet leaves it (slots, owner)."""
    from agentq.storage.table import Update

    store.table.update({"pk": task_pk(task_id), "sk": META}, Update(set=attributes))


def test_purge_refuses_a_cancelled_task_whose_worker_still_holds_its_slots_and_deletes_nothing(
    rstore: Storage, retained: Settings, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Cancelled while its worker waits on a model call: the worker gives the slots back (read
    from META) only after its refused commit. A purge before lost them for good."""
    from agentq.cli.main import main

    task_id = rstore.tasks.create(scripted([{"text": "x"}]), tenant="t").task_id
    _force_status(rstore, task_id, TaskStatus.CANCELLED)
    _held(rstore, task_id, slots=["TENANT#t"])
    items = rstore.steps.raw_items(task_id)
    refusal = (f"task {task_id} is cancelled but its worker has not let go of it yet: it still holds running slots "
               "(TENANT#t); nothing was deleted; purge it again once its worker lets go")  # fmt: skip
    with pytest.raises(IllegalTransition) as refused:
        purge_task(rstore, task_id)
    assert str(refused.value) == refusal and rstore.steps.raw_items(task_id) == items
    for name, value in retained.env().items():
        monkeypatch.setenv(name, value)
    assert main(["purge", task_id]) == 1  # the command says so and exits 1
    assert refusal in capsys.readouterr().err and rstore.steps.raw_items(task_id) == items


def test_purge_refuses_a_finished_task_a_live_worker_owns_and_purges_it_once_that_worker_is_dead(
    rstore: Storage,
) -> None:
    """A task whose worker process has not let go of it (its ``owner`` attributes, removed when it
    lets the message go) may still get that worker's writes; a dead worker's, none."""
    task_id = rstore.tasks.create(scripted([{"text": "x"}]), tenant="t").task_id
    _force_status(rstore, task_id, TaskStatus.CANCELLED)
    life = rstore.tasks.workers.start("w-live", 60)
    _held(rstore, task_id, owner_worker="w-live", owner_epoch=life.epoch, owner_task=task_id)
    items = rstore.steps.raw_items(task_id)
    with pytest.raises(IllegalTransition, match="but its worker w-live has not let go of it yet; nothing was deleted"):
        purge_task(rstore, task_id)
    assert rstore.steps.raw_items(task_id) == items
    rstore.tasks.workers.stop(life)  # it left (or died): its liveness is gone
    assert purge_task(rstore, task_id).items == len(items)
    assert rstore.steps.raw_items(task_id) == []


@pytest.mark.parametrize("text", ["short", "x" * 500_000], ids=["inline", "in s3"])
def test_a_worker_whose_task_was_purged_under_it_writes_nothing_back(rstore: Storage, text: str) -> None:
    """A per-task lease (no owner process, no slot: nothing for the purge to wait on) cancelled
    mid-call and purged: its step commit (one that ends the task too, its result put first), its
    side effect's outcome and its orphan are refused and leave no item or payload in the purged
    task (each is put before the fenced write that finds the task gone)."""
    from agentq.core.models import ToolOutcome

    from tests.storage_conformance._builders import llm_step

    task_id = rstore.tasks.create(scripted([{"text": "x"}]), tenant="t").task_id
    claimed = rstore.tasks.claim(task_id, "w1", 60)
    assert claimed is not None
    lease = claimed[0]
    assert rstore.effects.begin(lease, "toolu_1", "send_report") is None
    control.cancel(rstore, task_id)
    assert purge_task(rstore, task_id).items > 0
    step = llm_step(text=text)
    with pytest.raises(LeaseLost, match="no longer exists"):
        rstore.effects.finish(lease, "toolu_1", ToolOutcome(tool_use_id="toolu_1", name="send_report",
                                                            content=text, started_at=0.0, duration_ms=1))  # fmt: skip
    with pytest.raises(LeaseLost, match="no longer exists"):
        rstore.steps.commit(lease, 1, step, root_id=task_id)
    with pytest.raises(LeaseLost, match="no longer exists"):
        rstore.steps.commit(lease, 1, step, root_id=task_id, finish=TaskStatus.SUCCEEDED, result=text)
    rstore.steps.record_orphan(lease, 1, step)
    assert _everything_of(rstore, task_id) == ([], False, [])


class _Throttled:
    """A DynamoDB client whose BatchWriteItem leaves all but the first request of each call
    unprocessed ``times`` times, as a throttled table does."""

    def __init__(self, ddb: Any, times: int) -> None:
        self._ddb, self.left, self.calls = ddb, times, 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._ddb, name)

    def batch_write_item(self, RequestItems: dict[str, list[Any]]) -> dict[str, Any]:
        self.calls += 1
        ((table, requests),) = RequestItems.items()
        if self.left <= 0 or len(requests) == 1:
            return dict(self._ddb.batch_write_item(RequestItems=RequestItems))
        self.left -= 1
        self._ddb.batch_write_item(RequestItems={table: requests[:1]})
        return {"UnprocessedItems": {table: requests[1:]}}


def test_unprocessed_batch_deletes_are_retried_until_done(rstore: Storage, retained: Settings) -> None:
    task_id = _finished_task_with_everything(rstore, retained)
    items, _, _ = _everything_of(rstore, task_id)
    throttled = _Throttled(dynamo(rstore).client, times=3)
    slept: list[float] = []
    store = Storage(DynamoTable(throttled, rstore.table.name), rstore.payloads, retention_seconds=RETENTION)
    result = purge_task(store, task_id, sleep=slept.append)
    assert result.items == len(items)
    assert _everything_of(rstore, task_id)[0] == []
    assert len(slept) == 3 and throttled.calls > len(items) // 25 + 1


def test_deletes_still_unprocessed_after_the_attempts_fail_the_purge(rstore: Storage, retained: Settings) -> None:
    task_id = _finished_task_with_everything(rstore, retained)
    store = Storage(
        DynamoTable(_Throttled(dynamo(rstore).client, times=100), rstore.table.name),
        rstore.payloads,
        retention_seconds=RETENTION,
    )
    with pytest.raises(RuntimeError, match="still unprocessed after 3 attempts"):
        purge_task(store, task_id, attempts=3, sleep=lambda _: None)
    assert purge_task(rstore, task_id).items > 0  # a retry of the record finishes the job


def test_a_fork_keeps_its_own_payloads_when_its_source_is_purged(rstore: Storage, retained: Settings) -> None:
    source_id = _finished_task_with_everything(rstore, retained)
    source = rstore.tasks.get(source_id)
    steps = rstore.steps.load(source_id)[:4]  # through a tools step: a fork never ends on a turn asking for calls
    fork = rstore.tasks.fork(source, source.submission, steps, tenant="t")
    refs = [from_item(i).get("ref") for i in rstore.steps.raw_items(fork.task_id) if i["sk"]["S"].startswith("STEP#")]
    assert refs and all(r and r.startswith(payload_prefix(fork.task_id)) for r in refs)
    purge_task(rstore, source_id)
    assert [s.body for s in rstore.steps.load(fork.task_id)] == [s.body for s in steps]


# What a fork request runs (``Tasks.fork``), in a process of its own that the test kills at a crash point.
_FORKER = """
import sys
from agentq.runtime import Settings, build_store
store = build_store(Settings.from_env())
source = store.tasks.get(sys.argv[1])
store.tasks.fork(source, source.submission, store.steps.load(source.task_id)[:4], tenant=source.tenant)
"""


def test_a_fork_cut_short_leaves_nothing_that_nothing_will_delete(rstore: Storage, retained: Settings) -> None:
    """A fork SIGKILLed once its steps and their payloads are copied: it used to write META
    last, so what it copied sat under a task id with no META (no TTL, no purge, invisible to
    every listing) for ever. META is its first write now, a placeholder with a near expiry: no
    read or listing shows the fork, TTL deletes the placeholder, and the purge that follows takes
    everything else the fork wrote; the source keeps all it had."""
    source_id = _finished_task_with_everything(rstore, retained)
    source_had = _everything_of(rstore, source_id)
    client = dynamo(rstore).client

    def task_pks() -> set[str]:
        pages = client.get_paginator("scan").paginate(TableName=rstore.table.name, ProjectionExpression="pk")
        return {i["pk"]["S"] for page in pages for i in page["Items"] if i["pk"]["S"].startswith(task_pk(""))}

    before = task_pks()
    killed = run_python(["-c", _FORKER, source_id], child_env(retained, AGENTQ_CRASH_AT="after_fork_steps"), 60)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    (pk,) = task_pks() - before
    fork_id = pk.removeprefix(task_pk(""))
    items, _, objects = _everything_of(rstore, fork_id)
    assert META in items and [i for i in items if i.startswith("STEP#")] and objects  # was: steps, no META
    meta = _meta(rstore, fork_id)
    assert time.time() < int(meta["expires_at"]["N"]) <= time.time() + FORK_PENDING_SECONDS  # TTL collects it
    with pytest.raises(TaskNotFound):
        rstore.tasks.get(fork_id)
    assert fork_id not in [t.task_id for t in rstore.tasks.list_for_tenant("t", limit=100)[0]]
    with pytest.raises(IllegalTransition, match="still being copied"):
        purge_task(rstore, fork_id)  # not before its expiry: it may still be copying

    client.delete_item(TableName=rstore.table.name, Key=to_item({"pk": pk, "sk": META}))  # what TTL does
    purge_task(rstore, fork_id)  # what the reaper does on that deletion's stream record
    assert _everything_of(rstore, fork_id) == ([], False, [])
    assert _everything_of(rstore, source_id) == source_had


# -- the stream record and the reaper ---------------------------------------------------------


def _lambda_record(record: dict[str, Any], stream_arn: str, *, by_ttl: bool) -> dict[str, Any]:
    """A GetRecords record as Lambda hands it over: JSON, with the event source ARN, and the
    userIdentity DynamoDB sets on a TTL deletion (moto runs no TTL, so it never does)."""
    out: dict[str, Any] = json.loads(
        json.dumps(record, default=lambda v: v.timestamp() if isinstance(v, datetime) else str(v))
    )
    out["eventSourceARN"] = stream_arn
    if by_ttl:
        out["userIdentity"] = dict(TTL_IDENTITY)
    return out


@pytest.fixture
def streamed(retained: Settings) -> Iterator[tuple[Settings, Storage, str]]:
    """A table of this test's own with the stream the deployed table has (KEYS_ONLY)."""
    table = f"{retained.prefix}-streamed-{uuid.uuid4().hex[:6]}"
    ddb = client(retained, "dynamodb")
    desc = ddb.create_table(**table_definition(table, stream=True))["TableDescription"]
    ddb.update_time_to_live(TableName=table, TimeToLiveSpecification={"Enabled": True, "AttributeName": "expires_at"})
    settings = dataclasses.replace(retained, table=table)
    yield settings, build_store(settings), desc["LatestStreamArn"]
    ddb.delete_table(TableName=table)


def _stream_records(settings: Settings, stream_arn: str) -> list[dict[str, Any]]:
    streams = client(settings, "dynamodbstreams")
    records: list[dict[str, Any]] = []
    for shard in streams.describe_stream(StreamArn=stream_arn)["StreamDescription"]["Shards"]:
        iterator = streams.get_shard_iterator(
            StreamArn=stream_arn, ShardId=shard["ShardId"], ShardIteratorType="TRIM_HORIZON"
        )
        records += streams.get_records(ShardIterator=iterator["ShardIterator"])["Records"]
    return records


def _removal_of(records: list[dict[str, Any]], pk: str, sk: str) -> dict[str, Any]:
    (found,) = [
        r for r in records if r["eventName"] == "REMOVE" and r["dynamodb"]["Keys"] == {"pk": {"S": pk}, "sk": {"S": sk}}
    ]
    return found


@pytest.fixture
def reaper(streamed: tuple[Settings, Storage, str], monkeypatch: pytest.MonkeyPatch) -> Any:
    """functions/reaper/handler.py, configured from the environment as in Lambda."""
    settings = streamed[0]
    for name, value in settings.env().items():
        monkeypatch.setenv(name, value)
    return load_handler("reaper")


def test_the_reaper_purges_a_task_from_the_stream_record_of_its_ttl_deletion(
    streamed: tuple[Settings, Storage, str], reaper: Any
) -> None:
    settings, store, stream_arn = streamed
    doomed = _finished_task_with_everything(store, settings)
    survivor = _finished_task_with_everything(store, settings)
    survivor_before = _everything_of(store, survivor)
    dynamo(store).client.delete_item(
        TableName=store.table.name, Key=to_item({"pk": task_pk(doomed), "sk": META})
    )  # TTL's deletion

    record = _removal_of(_stream_records(settings, stream_arn), task_pk(doomed), META)
    assert record["dynamodb"]["StreamViewType"] == "KEYS_ONLY" and "OldImage" not in record["dynamodb"]
    event = {"Records": [_lambda_record(record, stream_arn, by_ttl=True)]}
    assert reaper.lambda_handler(event, FakeLambdaContext(60)) == {"batchItemFailures": []}

    assert _everything_of(store, doomed) == ([], False, [])
    assert _everything_of(store, survivor) == survivor_before
    # ...and delivered again (a retried batch), it is a no-op.
    assert reaper.lambda_handler(event, FakeLambdaContext(60)) == {"batchItemFailures": []}


def test_the_reaper_touches_the_table_only_in_the_expired_tasks_partition(
    streamed: tuple[Settings, Storage, str], reaper: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The reaper's role may delete only in ``TASK#`` partitions (``infra/background.py``), not a
    tenant's API keys, limits, secrets or vault items: every table call of a purge (the rest of
    the partition queried and batch-deleted, META's conditional delete) names the expired task's
    partition and no other."""
    settings, store, stream_arn = streamed
    doomed = _finished_task_with_everything(store, settings)
    dynamo(store).client.delete_item(TableName=store.table.name, Key=to_item({"pk": task_pk(doomed), "sk": META}))
    record = _removal_of(_stream_records(settings, stream_arn), task_pk(doomed), META)
    calls = dynamodb_partitions(monkeypatch, store.table.name)
    event = {"Records": [_lambda_record(record, stream_arn, by_ttl=True)]}
    assert reaper.lambda_handler(event, FakeLambdaContext(60)) == {"batchItemFailures": []}
    reaper_calls = list(calls)  # the checks below read the table too
    assert _everything_of(store, doomed) == ([], False, [])
    assert {op for op, _ in reaper_calls} >= {"Query", "BatchWriteItem", "DeleteItem"}
    assert all(pks == {task_pk(doomed)} for _, pks in reaper_calls), reaper_calls


def test_the_reaper_ignores_inserts_updates_other_removals_and_deletes_by_callers(
    streamed: tuple[Settings, Storage, str], reaper: Any
) -> None:
    settings, store, stream_arn = streamed
    task_id = _finished_task_with_everything(store, settings)
    idem = {"pk": f"IDEMP#t#{uuid.uuid4().hex}", "sk": META, "task_id": task_id}
    dynamo(store).client.put_item(TableName=store.table.name, Item=to_item(idem))
    dynamo(store).client.delete_item(TableName=store.table.name, Key=to_item({"pk": idem["pk"], "sk": META}))
    dynamo(store).client.delete_item(
        TableName=store.table.name, Key=to_item({"pk": task_pk(task_id), "sk": "NOTE#k00"})
    )
    before = _everything_of(store, task_id)
    records = _stream_records(settings, stream_arn)
    others = [
        next(r for r in records if r["eventName"] == "INSERT" and r["dynamodb"]["Keys"]["sk"]["S"] == META),
        next(r for r in records if r["eventName"] == "MODIFY"),
        _removal_of(records, task_pk(task_id), "NOTE#k00"),  # a non-META item, even by TTL
        _removal_of(records, idem["pk"], META),  # an idempotency record's own TTL expiry
    ]
    lambda_records = [_lambda_record(r, stream_arn, by_ttl=r["eventName"] == "REMOVE") for r in others]
    caller_delete = _lambda_record(_removal_of(records, idem["pk"], META), stream_arn, by_ttl=False)
    caller_delete["dynamodb"]["Keys"] = {"pk": {"S": task_pk(task_id)}, "sk": {"S": META}}  # META deleted by a caller
    lambda_records.append(caller_delete)

    assert reaper.lambda_handler({"Records": lambda_records}, FakeLambdaContext(60)) == {"batchItemFailures": []}
    assert _everything_of(store, task_id) == before
    pattern = EventPattern.load(json.dumps(ttl_removal_pattern()))
    # moto annotates matches_event for EventBridge events only; its matcher takes any JSON object (a stream record here).
    matched = [r for r in lambda_records if pattern.matches_event(r)]  # type: ignore[arg-type]
    assert not matched, "the mapping's filter would let one through"


def test_a_record_whose_purge_fails_is_reported_alone_and_the_others_are_purged(
    streamed: tuple[Settings, Storage, str], reaper: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings, store, stream_arn = streamed
    ok, failing = (_finished_task_with_everything(store, settings) for _ in range(2))
    for task_id in (ok, failing):
        dynamo(store).client.delete_item(TableName=store.table.name, Key=to_item({"pk": task_pk(task_id), "sk": META}))
    records = _stream_records(settings, stream_arn)
    event = {
        "Records": [
            _lambda_record(_removal_of(records, task_pk(t), META), stream_arn, by_ttl=True) for t in (failing, ok)
        ]
    }
    real = reaper.purge_task

    def purge(store_: Storage, task_id: str) -> Any:
        if task_id == failing:
            raise RuntimeError("throttled")
        return real(store_, task_id)

    monkeypatch.setattr(reaper, "purge_task", purge)
    response = reaper.lambda_handler(event, FakeLambdaContext(60))
    assert response == {"batchItemFailures": [{"itemIdentifier": event["Records"][0]["dynamodb"]["SequenceNumber"]}]}
    assert _everything_of(store, ok) == ([], False, [])
    assert _everything_of(store, failing)[0]  # kept for the retry


def test_the_filter_pattern_admits_a_ttl_removal_of_task_meta_and_the_handler_agrees(
    streamed: tuple[Settings, Storage, str],
) -> None:
    settings, store, stream_arn = streamed
    task_id = store.tasks.create(scripted([{"text": "x"}]), tenant="t").task_id
    store.tasks.transition(task_id, TaskStatus.CANCELLED)
    dynamo(store).client.delete_item(TableName=store.table.name, Key=to_item({"pk": task_pk(task_id), "sk": META}))
    record = _lambda_record(
        _removal_of(_stream_records(settings, stream_arn), task_pk(task_id), META), stream_arn, by_ttl=True
    )
    assert EventPattern.load(json.dumps(ttl_removal_pattern())).matches_event(record)  # type: ignore[arg-type]  # (as above)
    assert expired_task_id(record) == task_id


def test_the_purge_command_deletes_a_finished_task_and_refuses_a_live_one(
    rstore: Storage, retained: Settings, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The reaper DLQ runbook's tool: purge the tasks of a batch the reaper gave up on."""
    from agentq.cli.main import main

    for name, value in retained.env().items():
        monkeypatch.setenv(name, value)
    finished = _finished_task_with_everything(rstore, retained)
    live = rstore.tasks.create(scripted([{"text": "x"}]), tenant="t").task_id
    assert main(["purge", task_pk(finished), "--json"]) == 0
    (result,) = json.loads(capsys.readouterr().out)
    assert result["task_id"] == finished and result["items"] > 0 and result["objects"] > 0
    assert _everything_of(rstore, finished) == ([], False, [])
    assert main(["purge", live]) == 1
    assert "is queued; only a finished task is purged" in capsys.readouterr().err
    assert rstore.tasks.get(live).status is TaskStatus.QUEUED


def test_the_purge_command_says_a_task_it_finds_nothing_of_is_not_found_exits_1_and_purges_the_others(
    rstore: Storage, retained: Settings, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from agentq.cli.main import main

    for name, value in retained.env().items():
        monkeypatch.setenv(name, value)
    finished = _finished_task_with_everything(rstore, retained)
    capsys.readouterr()
    assert main(["purge", "nosuch", finished]) == 1
    out, err = capsys.readouterr()
    assert "agentq purge: no task 'nosuch': nothing of it is stored" in err and "nosuch" not in out
    assert out.startswith(f"{finished}: ") and _everything_of(rstore, finished) == ([], False, [])
    assert main(["purge", task_pk(finished), "--json"]) == 1  # purged already: nothing of it is left
    out, err = capsys.readouterr()
    assert json.loads(out) == [] and f"no task {finished!r}" in err


def test_a_budget_raise_on_a_task_past_its_retention_is_refused_and_changes_nothing(
    rstore: Storage, retained: Settings
) -> None:
    task = rstore.tasks.create(scripted(LOOKUPS, tools=["lookup"], max_steps=1), tenant="t")
    assert _engine(rstore, retained).run(task.task_id).status is TaskStatus.COST_EXCEEDED
    dynamo(rstore).client.update_item(
        TableName=rstore.table.name, Key=to_item({"pk": task_pk(task.task_id), "sk": META}),
        UpdateExpression="SET expires_at = :past", ExpressionAttributeValues=to_values({":past": int(time.time()) - 1}),
    )  # fmt: skip
    cap, steps = rstore.budgets.get(task.task_id).cap, rstore.tasks.get(task.task_id).submission.constraints.max_steps
    queues = _Queues()
    with pytest.raises(IllegalTransition, match="retention ran out"):
        control.raise_budget(rstore, queues, task.task_id, add_tokens=1000, add_steps=5)  # type: ignore[arg-type]
    assert rstore.budgets.get(task.task_id).cap == cap and queues.sent == []
    assert rstore.tasks.get(task.task_id).submission.constraints.max_steps == steps
