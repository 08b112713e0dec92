"""What the dispatcher does with each kind of message in each state of its task, pinned: a
restructuring of ``queueing.dispatch`` must not change it.

A table of messages (every kind a tier queue carries, with the redrive's dead-letter attributes
where it has them) is run against a table of task states (queued to succeed, to fail for good,
to fail retryably, held by another worker, waiting on its children, paused for an approval due
or not, ended every way, over its tenant's limit, refused by its concurrency key, blocked on a
dependency, ...). For each pair the line records the ``Action`` the dispatcher answered, what it
sent (messages, callbacks, the fan-out parent's report) and the whole table afterwards, and the
lines are compared with ``tests/golden/dispatch/<kind>.txt``. The poison messages, a schedule's
fires and the receive-count edges are ``special.txt``. Each case runs on a fresh in-memory store
(``storage.memory``) with the real queues on moto server (their calls recorded as they pass).
``AGENTQ_UPDATE_GOLDEN=1`` rewrites the files; a difference must be explained in the commit that
changes one.

The clock is the case's own (``Clock``): a lease's time left, an approval's time to its due
moment and a retry's delay are read off it, so a loaded machine's second between a case's setup
and its dispatch cannot change a recorded delay (``int(remaining) + 1``, ``ceil(due - now)``).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import random
import re
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any, get_args

import pytest

from agentq.control.operations import cancel
from agentq.core.engine import Engine, EngineConfig
from agentq.core.errors import ProviderError
from agentq.core.models import Script, Task, TaskStatus, TaskSubmission
from agentq.core.providers import LLMRequest, LLMResponse, default_provider_factory
from agentq.core.providers.scripted import ScriptedProvider
from agentq.core.schedules import ScheduleSpec, next_fire
from agentq.core.tools import ToolRegistry
from agentq.queueing.dispatch import HANDLERS, Action, Dispatcher
from agentq.queueing.queues import DEAD_LETTER_ID, DEAD_LETTER_REASON, MessageKind, TaskMessage, TaskQueues
from agentq.runtime import build_dispatcher, build_queues
from agentq.storage import keys
from agentq.storage.container import Storage, memory_storage
from agentq.storage.table import Update
from agentq_dev.moto_server import MotoServer

from tests.engine_recording import TIME_FIELDS, Recorder
from tests.helpers import call, deployment, scripted

GOLDEN = Path(__file__).parent / "golden" / "dispatch"
TIER = "normal"
MAX_RECEIVES = 3
NOTIFY = {"url": "https://hooks.example.com/agentq", "events": ["succeeded", "failed", "cancelled", "cost_exceeded"]}
# Item attributes that hold a clock reading (besides the engine recording's): blanked.
CLOCK = TIME_FIELDS | {"next_fire_at", "sent_at", "ttl", "hb", "beat_at", "last_fire_at", "scheduled_time"}
# A shard picked at random (storage.task_listing); a sort key led by the creation time; a logged
# write's attempt id, on its first event (storage.event_writes.logged_transact).
VARIES = frozenset({"live_pk", "gsi1sk", "write"})
STAMP = re.compile(r"\d{10}\.\d+")  # a clock reading in a key (a waiting list's order)


# ----------------------------------------------------------------------------- the recording


class RecordingQueues:
    """The real ``TaskQueues`` (moto server), each send logged as it passes."""

    def __init__(self, inner: TaskQueues, recorder: Recorder) -> None:
        self._inner, self._recorder = inner, recorder

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def send(
        self, task_id: str, tier: str, kind: str = "run", delay_seconds: int = 0, *, tenant: str | None, **pool: Any
    ) -> str:
        r = self._recorder
        where = f", pool={pool['pool']}" if pool.get("pool") is not None else ""  # a queue pool (only when named)
        r.note(f"  queues.send({r.alias(task_id)}, {tier}, kind={kind}, delay={delay_seconds}, tenant={tenant}{where})")
        return self._inner.send(task_id, tier, kind, delay_seconds, tenant=tenant, **pool)  # type: ignore[arg-type]

    def send_body(self, tier: str, body: str, delay_seconds: int = 0, *, tenant: str | None, **pool: Any) -> str:
        shown = _json(self._recorder, json.loads(body))
        where = f", pool={pool['pool']}" if pool.get("pool") is not None else ""
        self._recorder.note(f"  queues.send_body({tier}, {shown}, delay={delay_seconds}, tenant={tenant}{where})")
        return self._inner.send_body(tier, body, delay_seconds, tenant=tenant, **pool)

    def send_webhook(self, body: str) -> None:
        delivery = json.loads(body)
        delivery.pop("delivery_id", None)
        self._recorder.note(f"  queues.send_webhook({_json(self._recorder, delivery)})")
        self._inner.send_webhook(body)


class RecordingFanout:
    """The fan-out launcher's calls, logged (as ``test_engine_characterisation`` does)."""

    def __init__(self, recorder: Recorder) -> None:
        self.recorder = recorder

    def start(self, *, parent: Task, spawn_id: str, children: list[Any], max_concurrency: int) -> str:
        self.recorder.note(f"  fanout.start({self.recorder.alias(parent.task_id)}, {len(children)} children)")
        return "arn:aws:states:local:000000000000:execution:fanout:1"

    def child_finished(self, task_token: str, task_id: str, status: TaskStatus) -> None:
        self.recorder.note(f"  fanout.child_finished({task_token}, {self.recorder.alias(task_id)}, {status.value})")

    def stop(self, execution_arn: str, cause: str) -> None:
        self.recorder.note(f"  fanout.stop({cause!r})")


def _json(recorder: Recorder, value: Any) -> str:
    if isinstance(value, dict):
        inner = ", ".join(f"{k}={'<t>' if k in CLOCK else _json(recorder, v)}" for k, v in sorted(value.items()))
        return "{" + inner + "}"
    if isinstance(value, list):
        return "[" + ", ".join(_json(recorder, v) for v in value) + "]"
    if isinstance(value, float):
        return "<float>"
    if isinstance(value, str) and len(value) > 80:  # a step's body, a submission: their fields are the item's
        return repr(recorder.alias(value)[:60] + "...")
    return recorder.render(value)


# ----------------------------------------------------------------------------- one case


class Clock:
    """``time.time`` for one case: from a fixed moment, a microsecond on at each reading. It moves
    (a loop waiting for a moment ends, readings keep their order) but never by a second, so the
    delays computed from it are the same on a loaded machine as on an idle one."""

    START = 1_800_000_000.0  # a whole second: ``due - now`` is exact

    def __init__(self) -> None:
        self._ticks = itertools.count()
        self._lock = threading.Lock()

    def __call__(self) -> float:
        with self._lock:
            return self.START + next(self._ticks) / 1_000_000


BATCHES: dict[str, LLMRequest] = {}  # the economy provider's batches: custom_id -> request


class Batches:
    """An economy task's provider (the batch API's shape), answered by a script; a batch of the
    goal "batch pending" never ends."""

    name = "anthropic"

    def __init__(self, submission: TaskSubmission) -> None:
        self.submission = submission

    def complete(self, request: LLMRequest) -> LLMResponse:
        raise AssertionError("an economy task's calls go through batches")

    def submit_batch(self, request: LLMRequest, custom_id: str) -> str:
        BATCHES[custom_id] = request
        return f"batch-{custom_id}"

    def batch_result(self, batch_id: str, custom_id: str) -> LLMResponse | None:
        if self.submission.goal == "batch pending":
            return None
        return ScriptedProvider(Script.model_validate({"turns": ONE_TURN})).complete(BATCHES[custom_id])


def _providers(submission: TaskSubmission) -> Any:
    """Scripted, but for goals that name a failure (raised by the provider's call) or a batch."""
    if submission.goal.startswith("batch"):
        return Batches(submission)
    if submission.goal == "overloaded":
        raise_it: Exception = ProviderError("overloaded", retryable=True, status_code=529, code="overloaded")
    elif submission.goal == "refused":
        raise_it = ProviderError("bad request", retryable=False, status_code=400, code="invalid_request")
    else:
        return default_provider_factory(submission)

    class Failing:
        name = "scripted"

        def complete(self, request: LLMRequest) -> LLMResponse:
            raise raise_it

    return Failing()


@dataclass
class Case:
    """One fresh store, its engine and dispatcher, and what the state's setup made."""

    recorder: Recorder
    queues: Any
    registry: ToolRegistry
    store: Storage = field(default_factory=memory_storage)
    fanout: RecordingFanout | None = None
    task: Task | None = None
    spawn_id: str | None = None
    attributes: dict[str, Any] | None = None
    dispatcher_kwargs: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.fanout = RecordingFanout(self.recorder)

    def engine(self, worker: str = "w1") -> Engine:
        return Engine(self.store, worker_id=worker, tools=self.registry, providers=_providers,
                      config=EngineConfig(lease_seconds=30), fanout=self.fanout)  # fmt: skip

    def dispatcher(self) -> Dispatcher:
        return build_dispatcher(self.engine(), self.store, self.queues, max_receive_count=MAX_RECEIVES,
                                **self.dispatcher_kwargs)  # fmt: skip

    def create(self, submission: TaskSubmission | dict[str, Any], *, tenant: str = "t", **kwargs: Any) -> Task:
        sub = submission if isinstance(submission, TaskSubmission) else TaskSubmission.model_validate(submission)
        task = self.store.tasks.create(sub, tenant=tenant, **kwargs)
        self.recorder.alias(task.task_id)  # aliased in the order made, not in the dump's order
        return task

    def run(self, task_id: str, worker: str = "w0") -> None:
        self.engine(worker).run(task_id, keeper=lambda _: contextlib.nullcontext())

    def dump(self) -> None:
        r = self.recorder
        lines = []
        for item in self.store.table.items():  # type: ignore[attr-defined]
            shown = {
                k: "<t>" if k in CLOCK and v is not None else "<varies>" if k in VARIES else v
                for k, v in item.items()
                if k not in ("pk", "sk")
            }
            pk, sk = (STAMP.sub("<t>", r.alias(str(item[k]))) for k in ("pk", "sk"))
            lines.append(f"    {pk} {sk} {_json(r, _plain(shown))}")
        r.lines += sorted(lines)


def _plain(value: Any) -> Any:
    if isinstance(value, Decimal):
        return int(value) if value == int(value) else float(value)
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        items = [_plain(v) for v in value]
        return sorted(items, key=str) if isinstance(value, set | frozenset) else items
    if isinstance(value, bytes):
        return f"<{len(value)} bytes>"
    return value


def _action(r: Recorder, action: Action) -> str:
    run = action.run
    ran = (
        f" run={run.outcome}/{run.status.value if run.status else '-'}/{(run.error or {}).get('code', '')}"
        f"/committed={run.steps_committed}"
        if run is not None
        else ""
    )
    failure = " dead_letter_id=<set>" if action.dead_letter_id else ""
    return (
        f"  -> {action.kind} {r.alias(action.reason)!r} delay={action.delay_seconds} attempts={action.attempts}"
        f"{failure}{ran}"
    )


# ----------------------------------------------------------------------------- the task states

ONE_TURN = [{"text": "done"}]
SPAWN = [
    {
        "text": "splitting",
        "tool_calls": [
            call(
                "spawn_subagents",
                subagents=[
                    {"goal": "one", "script": {"turns": [{"text": "child done"}]}},
                ],
            )
        ],
    },
    {"text": "all done"},
]
APPROVAL = [{"text": "asking", "tool_calls": [call("request_approval", question="go?")]}, {"text": "went"}]


def _sub(turns: list[Any] | None = None, goal: str = "test goal", **constraints: Any) -> dict[str, Any]:
    body = scripted(turns or ONE_TURN, **constraints).model_dump(mode="json", exclude_none=True)
    body.update(goal=goal, notify=NOTIFY)
    return body


def _with_dependent(c: Case, task: Task) -> Task:
    c.create({**_sub(), "depends_on": [task.task_id]}, blocked=True)
    return task


def s_queued(c: Case) -> None:
    c.task = _with_dependent(c, c.create(_sub()))


def s_queued_marked_by_a_dead_stop(c: Case) -> None:
    """A stop's mark left by a stop killed before its move, the scope resumed (no stop stored):
    the claim takes the mark off and the task runs."""
    c.task = c.create(_sub())
    assert c.store.tasks.mark_stopping([c.task.task_id], "user 'alice'") == [True]


def s_queued_retryable(c: Case) -> None:
    c.task = _with_dependent(c, c.create(_sub(goal="overloaded")))


def s_queued_last_attempt(c: Case) -> None:
    c.task = _with_dependent(c, c.create(_sub(goal="overloaded")))
    for _ in range(MAX_RECEIVES - 1):
        c.store.tasks.record_failure(c.task.task_id, 1)


def s_queued_refused(c: Case) -> None:
    c.task = _with_dependent(c, c.create(_sub(goal="refused")))


def s_queued_over_tokens(c: Case) -> None:
    turns = [{"text": f"turn {i} {'n' * 800}", "tool_calls": [call("lookup", query=f"q{i}")]} for i in range(10)]
    c.task = _with_dependent(c, c.create(_sub(turns, tools=["lookup"], max_tokens=3_200, max_output_tokens=1_000)))


def s_leased_elsewhere(c: Case) -> None:
    c.task = c.create(_sub())
    c.store.tasks.claim(c.task.task_id, "w2", 30)


def s_waiting_on_children(c: Case) -> None:
    c.task = c.create(_sub(SPAWN, tools=["spawn_subagents"]))
    c.run(c.task.task_id)
    [spawn] = c.store.spawns.list(c.task.task_id)
    c.spawn_id = spawn.spawn_id


def _paused(c: Case, timeout: int) -> None:
    c.task = c.create(_sub(APPROVAL, tools=["request_approval"], approval_timeout_seconds=timeout))
    c.run(c.task.task_id)


def s_paused_approval_due(c: Case) -> None:
    _paused(c, 1)
    assert c.task is not None
    pending = c.store.approvals.pending(c.task.task_id)
    assert pending is not None
    item = keys.item_key(c.task.task_id, f"{keys.APPROVAL}{pending.use_id}")
    c.store.table.update(item, Update(set={"asked_at": Decimal(repr(time.time() - 60))}))  # asked a minute ago


def s_paused_approval_not_due(c: Case) -> None:
    _paused(c, 600)


def s_succeeded(c: Case) -> None:
    c.task = _with_dependent(c, c.create(_sub()))
    c.run(c.task.task_id)


def s_failed(c: Case) -> None:
    c.task = _with_dependent(c, c.create(_sub(goal="refused")))
    c.run(c.task.task_id)
    c.attributes = {DEAD_LETTER_REASON: {"DataType": "String", "StringValue": "by hand"}}


def s_failed_dead_lettered(c: Case) -> None:
    """Failed by the dispatcher on its last attempt, its message dead-lettered with the failure."""
    s_queued_last_attempt(c)
    assert c.task is not None
    c.dispatcher().handle(TaskMessage(task_id=c.task.task_id).model_dump_json(), tier=TIER, receive_count=1)
    failure = c.store.tasks.metas([c.task.task_id])[0].get("dead_letter")
    c.attributes = {DEAD_LETTER_REASON: {"DataType": "String", "StringValue": "failed after 3 attempts"},
                    DEAD_LETTER_ID: {"DataType": "String", "StringValue": str(failure)}}  # fmt: skip


def s_failed_dead_lettered_again(c: Case) -> None:
    """A copy of an older redrive: the task failed again since, under another dead letter."""
    s_failed_dead_lettered(c)
    assert c.attributes is not None
    c.attributes[DEAD_LETTER_ID] = {"DataType": "String", "StringValue": "an-older-failure"}


def s_cancelled(c: Case) -> None:
    c.task = _with_dependent(c, c.create(_sub()))
    cancel(c.store, c.task.task_id, reason="by hand")


def s_cost_exceeded(c: Case) -> None:
    s_queued_over_tokens(c)
    assert c.task is not None
    c.run(c.task.task_id)


def s_blocked(c: Case) -> None:
    first = c.create(_sub())
    c.task = c.create({**_sub(), "depends_on": [first.task_id]}, blocked=True)


def s_tenant_full(c: Case) -> None:
    holder = c.create(_sub())
    c.dispatcher_kwargs = {"default_max_running": 1}
    assert c.dispatcher().fair.admit(holder, TIER).waits is None
    c.task = _with_dependent(c, c.create(_sub()))


def _key_full(c: Case, on_conflict: str) -> None:
    concurrency = {"key": "k", "limit": 1, "on_conflict": on_conflict}
    holder = c.create({**_sub(), "concurrency": concurrency})
    assert c.dispatcher().fair.admit(holder, TIER).waits is None
    c.store.tasks.claim(holder.task_id, "w2", 30)
    c.task = _with_dependent(c, c.create({**_sub(), "concurrency": concurrency}))


def _batched(c: Case, goal: str, *, look_due_in: float = 0.0) -> None:
    """Parked on its batch, its next look due in ``look_due_in`` seconds (the park sets it a
    poll interval ahead; 0: the time has come, as when the park's own look arrives)."""
    body = {"goal": goal, "provider": "anthropic", "model": "claude-sonnet-4-5", "notify": NOTIFY,
            "constraints": {"economy": True, "max_cost_usd": "1"}}  # fmt: skip
    c.task = c.create(body)
    c.run(c.task.task_id)
    parked = c.store.tasks.get(c.task.task_id).look_due
    assert c.store.tasks.next_look(c.task.task_id, time.time() + look_due_in, after=parked)
    c.task = c.store.tasks.get(c.task.task_id)


def s_waiting_on_a_batch_that_ended(c: Case) -> None:
    _batched(c, "batch ready")


def s_waiting_on_a_batch_still_running(c: Case) -> None:
    _batched(c, "batch pending")


def s_waiting_on_a_batch_its_next_look_not_yet_due(c: Case) -> None:
    """A look arriving now is a stray (the sweeper's, or a late one of an earlier look)."""
    _batched(c, "batch ready", look_due_in=600)


def s_tenant_limited_with_a_waiter(c: Case) -> None:
    """Holding its tenant's only slot, with another task of the tenant parked behind it."""
    c.dispatcher_kwargs = {"default_max_running": 1}
    c.task = _with_dependent(c, c.create(_sub()))
    assert c.dispatcher().fair.admit(c.task, TIER).waits is None
    waiter = c.create(_sub())
    assert c.dispatcher().fair.admit(waiter, TIER).waits is not None
    c.task = c.store.tasks.get(c.task.task_id)


def s_key_full_skip(c: Case) -> None:
    _key_full(c, "skip")


def s_key_full_cancel_running(c: Case) -> None:
    _key_full(c, "cancel_running")


def s_fleet_full(c: Case) -> None:
    holder = c.create(_sub(), tenant="u")
    c.dispatcher_kwargs = {"fleet_capacity": 1}
    assert c.dispatcher().fair.admit(holder, TIER).waits is None
    c.task = c.create(_sub())


STATES: dict[str, Callable[[Case], None]] = {
    name[2:]: fn for name, fn in sorted(globals().items()) if name.startswith("s_") and callable(fn)
}
KINDS = ("run", "continue", "wake", "redrive", "safety_net", "release_holds", "renewed", "swept", "recovered",
         "approval_due", "batch_poll", "remote_poll")  # fmt: skip


# ----------------------------------------------------------------------------- running the table


@pytest.fixture(scope="module")
def queues(moto_server: MotoServer) -> TaskQueues:
    return build_queues(deployment(moto_server))


@pytest.fixture
def make_case(
    queues: TaskQueues, memory_registry: ToolRegistry, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Callable[[Recorder], Case]]:
    def make(recorder: Recorder) -> Case:
        monkeypatch.setattr(time, "time", Clock())  # each case from the same moment
        return Case(recorder, RecordingQueues(queues, recorder), memory_registry)

    yield make


def _handle(c: Case, body: str, *, receives: int = 1, attributes: dict[str, Any] | None = None) -> None:
    random.seed(7)  # the retry backoff's jitter
    action = c.dispatcher().handle(body, tier=TIER, receive_count=receives, attributes=attributes)
    c.recorder.note(_action(c.recorder, action))
    c.recorder.note("  table:")
    c.dump()


def _check(name: str, recorder: Recorder) -> None:
    path = GOLDEN / f"{name}.txt"
    text = "\n".join(recorder.lines) + "\n"
    if os.environ.get("AGENTQ_UPDATE_GOLDEN") == "1":
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    assert path.exists(), f"no recording for {name}: run with AGENTQ_UPDATE_GOLDEN=1 once"
    expected, got = path.read_text().splitlines(), text.splitlines()
    for i, (want, have) in enumerate(zip(expected, got, strict=False)):
        assert want == have, f"{name}: line {i + 1} differs\n  recorded: {want}\n  now:      {have}"
    assert len(expected) == len(got), f"{name}: {len(expected)} lines recorded, {len(got)} now"


@pytest.mark.parametrize("kind", KINDS)
def test_each_state_of_a_task_meets_a_message_of_this_kind(kind: str, make_case: Callable[[Recorder], Case]) -> None:
    recorder = Recorder()
    for state, setup in STATES.items():
        c = make_case(recorder)
        mark = len(recorder.lines)
        setup(c)
        del recorder.lines[mark:]  # the setup's own sends are not the dispatcher's
        assert c.task is not None
        recorder.note(f"== {state} <- {kind}")
        message = TaskMessage(task_id=c.task.task_id, kind=kind, task_token="token-1",  # type: ignore[arg-type]
                              spawn_id=c.spawn_id if kind == "wake" else None)  # fmt: skip
        _handle(c, message.model_dump_json(), attributes=c.attributes if kind == "redrive" else None)
    _check(kind, recorder)


def test_poison_schedules_and_receive_counts(make_case: Callable[[Recorder], Case]) -> None:
    recorder = Recorder()

    def case(title: str) -> Case:
        c = make_case(recorder)
        c.recorder.note(f"== {title}")
        return c

    _handle(case("not json"), "not json")
    _handle(case("not a task message"), json.dumps({"kind": "run"}))
    _handle(case("an unknown task"), TaskMessage(task_id="f" * 32).model_dump_json())

    c = case("a task that cannot be read")
    task = c.create(_sub())
    c.store.table.update(keys.item_key(task.task_id, "META#SUBMISSION"), Update(set={"submission": "{not json"}))
    _handle(c, TaskMessage(task_id=task.task_id, task_token="token-1").model_dump_json())

    c = case("over the receives: renewed")
    task = c.create(_sub())
    _handle(c, TaskMessage(task_id=task.task_id).model_dump_json(), receives=MAX_RECEIVES + 1)

    c = case("a retryable failure at the last receive: counted on the task, not the message")
    task = c.create(_sub(goal="overloaded"))
    _handle(c, TaskMessage(task_id=task.task_id).model_dump_json(), receives=MAX_RECEIVES)

    c = case("leased elsewhere at the last receive")
    task = c.create(_sub())
    c.store.tasks.claim(task.task_id, "w2", 30)
    _handle(c, TaskMessage(task_id=task.task_id).model_dump_json(), receives=MAX_RECEIVES)

    for overlap, live in (("skip", True), ("skip", False), ("allow", True)):
        c = case(f"a schedule's fire (overlap {overlap}, previous task {'live' if live else 'ended'})")
        spec = ScheduleSpec(name="nightly", expression="rate(1 hour)", submission=_sub(), overlap=overlap)  # type: ignore[arg-type]
        c.store.schedules.put("t", spec, next_fire(spec.expression, time.time()))
        previous = c.create(_sub())
        if not live:
            c.run(previous.task_id)
        c.store.schedules.record_fire("t", "nightly", 0.0, task_id=previous.task_id)
        body = TaskMessage(task_id="schedule:t#nightly", kind="schedule", schedule="t#nightly",
                           scheduled_time="2030-01-01T00:00:00Z").model_dump_json()  # fmt: skip
        _handle(c, body)
        _handle(c, body)  # delivered again: the same task

    for title, schedule, at in (
        ("a schedule that is gone", "t#gone", "2030-01-01T00:00:00Z"),
        ("a schedule message with no valid time", "t#nightly", "soon"),
        ("a schedule message naming no schedule", "t#", "2030-01-01T00:00:00Z"),
    ):
        c = case(title)
        fire = TaskMessage(task_id="schedule:x", kind="schedule", schedule=schedule, scheduled_time=at)
        _handle(c, fire.model_dump_json())
    _check("special", recorder)


def test_every_kind_of_message_has_its_handler_and_its_recording() -> None:
    """A kind added to ``MessageKind`` without a handler would fail at its first message (a
    ``KeyError`` in ``Dispatcher.handle``), and one without a line in ``KINDS`` would go unpinned.
    A schedule's fire names no task: the dispatcher hands it to ``_schedule`` before the table."""
    kinds = set(get_args(MessageKind))
    assert "schedule" not in HANDLERS
    assert set(HANDLERS) | {"schedule"} == kinds
    assert set(KINDS) == set(HANDLERS)
