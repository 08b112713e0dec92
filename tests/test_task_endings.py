"""Every way a task ends (but the two ``queueing.endings`` names: an unreadable task, a child its
parent's fan-out timed out) goes through one function, ``queueing.endings.task_ended``, and each
of its four consequences happens exactly once: its slots go back (the task parked behind it is
woken once), its fan-out parent is told once (through the callback token its message carried),
its callback is posted once, and the task that depends on it moves on once.

Each path runs on a fresh in-memory store with the real queues on moto server, the queues' and
the fan-out's calls counted as they pass. A path whose task holds no slot (skipped at its
admission, cancelled for a dependency) has no slot to give back and wakes nobody; a path with no
parent to tell yet (a submission skipped at once, a dependent that never ran) or whose parent
learns of the end from the child's own message (a cancel) tells none; a task skipped at its
submission has no dependent yet (one submitted later is cancelled by its own submitter's look).
A cancel gives back the slots of what it cancelled ``queued`` itself, before anything that may
raise, and only then calls ``task_ended``: the last test makes those later steps raise.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

import pytest

from agentq.control.operations import cancel
from agentq.control.submit import submit_once
from agentq.core.engine import Engine, EngineConfig
from agentq.core.errors import ProviderError
from agentq.core.models import Task, TaskStatus, TaskSubmission
from agentq.core.providers import LLMRequest, LLMResponse, default_provider_factory
from agentq.core.quality import hour_of
from agentq.core.tools import ToolRegistry
from agentq.queueing import endings
from agentq.queueing.dispatch import Dispatcher
from agentq.queueing.queues import TaskMessage, TaskQueues
from agentq.runtime import build_dispatcher, build_queues
from agentq.storage import keys
from agentq.storage.container import Storage, memory_storage
from agentq.storage.table import Update
from agentq_dev.moto_server import MotoServer

from tests.helpers import call, deployment, scripted

TIER = "normal"
MAX_RECEIVES = 2
NOTIFY = {"url": "https://hooks.example.com/agentq", "events": ["succeeded", "failed", "cancelled", "cost_exceeded",
                                                                 "timed_out"]}  # fmt: skip


class CountingQueues:
    """The real queues; each run message and each callback counted by task."""

    def __init__(self, inner: TaskQueues) -> None:
        self._inner = inner
        self.sent: Counter[str] = Counter()
        self.callbacks: Counter[str] = Counter()
        self.deliveries: dict[str, list[str]] = {}  # each callback's agentq-delivery, by task

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def send(self, task_id: str, tier: str, kind: Any = "run", delay_seconds: int = 0, *, tenant: str | None) -> str:
        self.sent[task_id] += 1
        return self._inner.send(task_id, tier, kind, delay_seconds, tenant=tenant)

    def send_webhook(self, body: str) -> None:
        delivery = json.loads(body)
        self.callbacks[delivery["payload"]["task_id"]] += 1
        self.deliveries.setdefault(delivery["payload"]["task_id"], []).append(delivery["delivery_id"])
        self._inner.send_webhook(body)


@dataclass
class CountingFanout:
    told: Counter[str] = field(default_factory=Counter)

    def start(self, **_: Any) -> str:
        return "arn:aws:states:local:000000000000:execution:fanout:1"

    def child_finished(self, task_token: str, task_id: str, status: TaskStatus) -> None:
        self.told[task_id] += 1

    def stop(self, execution_arn: str, cause: str) -> None:
        pass


def _providers(submission: TaskSubmission) -> Any:
    if submission.goal in ("overloaded", "refused"):
        error = ProviderError(submission.goal, retryable=submission.goal == "overloaded", status_code=529)

        class Failing:
            name = "scripted"

            def complete(self, request: LLMRequest) -> LLMResponse:
                raise error

        return Failing()
    return default_provider_factory(submission)


@dataclass
class Path:
    queues: CountingQueues
    registry: ToolRegistry
    store: Storage = field(default_factory=memory_storage)
    fanout: CountingFanout = field(default_factory=CountingFanout)
    ended: list[str] = field(default_factory=list)  # task_ended's calls, by task
    dependents: dict[str, str] = field(default_factory=dict)  # task -> the task made to depend on it
    sampled: dict[str, Any] = field(default_factory=dict)  # an agent version and its alias's online sample, or none

    def dispatcher(self, **kwargs: Any) -> Dispatcher:
        engine = Engine(self.store, worker_id="w", tools=self.registry, providers=_providers,
                        config=EngineConfig(lease_seconds=30), fanout=self.fanout)  # fmt: skip
        return build_dispatcher(engine, self.store, self.queues, max_receive_count=MAX_RECEIVES, **kwargs)  # type: ignore[arg-type]

    def create(self, goal: str = "test goal", turns: list[Any] | None = None, **extra: Any) -> Task:
        body = scripted(turns or [{"text": "done"}], tools=extra.pop("tools", None), **extra.pop("constraints", {}))
        sub = TaskSubmission.model_validate({**body.model_dump(exclude_none=True), "goal": goal, "notify": NOTIFY,
                                             **self.sampled, **extra})  # fmt: skip
        task = self.store.tasks.create(sub, tenant="t", blocked=bool(sub.depends_on))
        dependent = sub.model_copy(update={"depends_on": [task.task_id]})
        self.dependents[task.task_id] = self.store.tasks.create(dependent, tenant="t", blocked=True).task_id
        return task

    def holding_with_waiter(self, task: Task, dispatcher: Dispatcher) -> Task:
        """``task`` admitted to its tenant's one slot, another task parked behind it."""
        assert dispatcher.fair.admit(task, TIER).waits is None
        waiter = self.create()
        assert dispatcher.fair.admit(waiter, TIER).waits is not None
        return waiter

    def deliver(self, dispatcher: Dispatcher, task: Task, receives: int = 1) -> None:
        body = TaskMessage(task_id=task.task_id, task_token="token").model_dump_json()
        dispatcher.handle(body, tier=TIER, receive_count=receives, keeper=lambda _: contextlib.nullcontext())


def _run_to(goal: str, **constraints: Any) -> Callable[[Path], tuple[Task, Task | None]]:
    """A run through the dispatcher that ends the task (its tenant's one slot held, a waiter parked)."""

    def drive(p: Path) -> tuple[Task, Task | None]:
        dispatcher = p.dispatcher(default_max_running=1)
        options = dict(constraints)  # each drive its own: a path is driven by more than one test
        turns = options.pop("turns", None)
        task = p.create(goal, turns, **options)
        waiter = p.holding_with_waiter(task, dispatcher)
        if goal == "timed out":  # started an hour ago, with a minute to run
            p.store.table.update(keys.meta_key(task.task_id), Update(set={"started_at": Decimal(time.time() - 3600)}))
        for receive in range(1, MAX_RECEIVES + 1):
            p.deliver(dispatcher, task, receive)
            if p.store.tasks.get(task.task_id).status.terminal:
                break
        return task, waiter

    return drive


def _skipped_at_the_dispatcher(p: Path) -> tuple[Task, Task | None]:
    concurrency = {"key": "k", "limit": 1, "on_conflict": "skip"}
    dispatcher = p.dispatcher()
    holder = p.create(concurrency=concurrency)
    assert dispatcher.fair.admit(holder, TIER).waits is None
    task = p.create(concurrency=concurrency)
    p.deliver(dispatcher, task)
    return task, None


def _skipped_at_its_submission(p: Path) -> tuple[Task, Task | None]:
    concurrency = {"key": "k", "limit": 1, "on_conflict": "skip"}
    holder = p.create(concurrency=concurrency)
    assert p.dispatcher().fair.admit(holder, TIER).waits is None
    body = {"goal": "test goal", "provider": "scripted", "script": {"turns": [{"text": "done"}]},
            "notify": NOTIFY, "concurrency": concurrency}  # fmt: skip
    return submit_once(p.store, p.registry, body, tenant="t", queues=p.queues).task, None  # type: ignore[arg-type]


def _cancelled_queued(p: Path) -> tuple[Task, Task | None]:
    dispatcher = p.dispatcher(default_max_running=1)
    task = p.create()
    waiter = p.holding_with_waiter(task, dispatcher)
    cancel(p.store, task.task_id, queues=p.queues, slots=dispatcher.fair.slots)  # type: ignore[arg-type]
    return task, waiter


def _dependency_failed(p: Path) -> tuple[Task, Task | None]:
    first = p.create("refused")
    task = p.create(depends_on=[first.task_id])  # ends cancelled when ``first`` fails
    p.deliver(p.dispatcher(), first)
    return task, None


LOOKUPS = [{"text": f"turn {i} {'n' * 800}", "tool_calls": [call("lookup", query=f"q{i}")]} for i in range(10)]
PATHS: dict[str, tuple[Callable[[Path], tuple[Task, Task | None]], TaskStatus, bool]] = {
    # name: (how it ends, the status, whether a parent is told)
    "succeeded": (_run_to("test goal"), TaskStatus.SUCCEEDED, True),
    "failed": (_run_to("refused"), TaskStatus.FAILED, True),
    "cost_exceeded": (
        _run_to(
            "budget", turns=LOOKUPS, tools=["lookup"], constraints={"max_tokens": 2_600, "max_output_tokens": 1_000}
        ),
        TaskStatus.COST_EXCEEDED,
        True,
    ),
    "timed_out": (_run_to("timed out", constraints={"timeout_seconds": 60}), TaskStatus.TIMED_OUT, True),
    "dead_lettered": (_run_to("overloaded"), TaskStatus.FAILED, True),
    "skipped_at_the_dispatcher": (_skipped_at_the_dispatcher, TaskStatus.CANCELLED, True),
    "skipped_at_its_submission": (_skipped_at_its_submission, TaskStatus.CANCELLED, False),
    "cancelled_queued": (_cancelled_queued, TaskStatus.CANCELLED, False),
    "dependency_failed": (_dependency_failed, TaskStatus.CANCELLED, False),
}


@pytest.fixture(scope="module")
def queues(moto_server: MotoServer) -> TaskQueues:
    return build_queues(deployment(moto_server))


def test_every_ending_gives_back_tells_posts_and_releases_exactly_once(
    queues: TaskQueues, memory_registry: ToolRegistry, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = endings.task_ended
    for name, (drive, status, has_parent) in PATHS.items():
        p = Path(CountingQueues(queues), memory_registry)

        def counted(store: Storage, q: Any, task: Task, st: TaskStatus, *, p: Path = p, **kw: Any) -> None:
            p.ended.append(task.task_id)
            real(store, q, task, st, **kw)

        for module in ("agentq.queueing.endings", "agentq.queueing.dispatch._context", "agentq.control.subtrees",
                       "agentq.control.submit"):  # fmt: skip
            monkeypatch.setattr(f"{module}.task_ended", counted)
        task, waiter = drive(p)
        dependent = p.dependents.get(task.task_id)  # none for a task ended at its submission: none existed
        assert p.store.tasks.get(task.task_id).status is status, name
        assert p.ended.count(task.task_id) == 1, f"{name}: ended {p.ended.count(task.task_id)} times"
        assert p.queues.callbacks[task.task_id] == 1, f"{name}: {p.queues.callbacks[task.task_id]} callbacks"
        assert p.fanout.told[task.task_id] == (1 if has_parent else 0), f"{name}: parent told {p.fanout.told}"
        if dependent is not None:
            moved = p.store.tasks.get(dependent).status
            assert moved is (TaskStatus.QUEUED if status is TaskStatus.SUCCEEDED else TaskStatus.CANCELLED), name
            assert p.queues.sent[dependent] + p.queues.callbacks[dependent] == 1, f"{name}: dependent moved twice"
        if waiter is not None:
            assert p.store.tasks.get(task.task_id).slots == [], f"{name}: slots kept"
            assert p.queues.sent[waiter.task_id] == 1, f"{name}: waiter woken {p.queues.sent[waiter.task_id]} times"


@pytest.mark.parametrize("name", list(PATHS))
def test_a_duplicate_message_of_an_ended_task_queues_its_callback_again_under_the_same_delivery_id(
    name: str, queues: TaskQueues, memory_registry: ToolRegistry
) -> None:
    """A copy of an ended task's message (SQS's at least once, a second swept message, a redrive
    of a message SQS moved) reports the end again, callback included; a receiver de-duplicates
    on ``agentq-delivery`` (ARCHITECTURE, Callbacks), so every report of one end carries the same
    id, whoever made the first (the run, the dead letter, a cancel, a skip, a dependency's
    cancel). It was a fresh uuid each time: two ends, to the receiver."""
    p = Path(CountingQueues(queues), memory_registry)
    drive, _, _ = PATHS[name]
    task, _ = drive(p)
    for receives in (1, 2):  # two duplicates after the end
        p.deliver(p.dispatcher(), task, receives)
    ids = p.queues.deliveries[task.task_id]
    assert len(ids) == 3 and len(set(ids)) == 1, f"{name}: {ids}"


def test_a_later_end_of_the_same_status_is_posted_under_a_new_delivery_id(
    queues: TaskQueues, memory_registry: ToolRegistry
) -> None:
    """The id names one end, not the task's status: a task redriven out of its failure that
    fails again ends anew, and its receiver must not drop that callback as a duplicate."""
    p = Path(CountingQueues(queues), memory_registry)
    task, _ = _run_to("refused")(p)
    p.store.tasks.transition(task.task_id, TaskStatus.QUEUED, error=None, reopen=True)  # a redrive's requeue
    time.sleep(0.01)
    p.store.tasks.transition(task.task_id, TaskStatus.FAILED, error={"code": "again", "message": "again"})
    p.deliver(p.dispatcher(), task)  # its message reports the second end
    first, second = p.queues.deliveries[task.task_id]
    assert first != second


SPAWN = [{"text": "splitting", "tool_calls": [call("spawn_subagents", subagents=[{"goal": "one", "script": {"turns": [
    {"text": "child done"}]}}])]}, {"text": "all done"}]  # fmt: skip


@pytest.mark.parametrize("step", ["the budget's fold of a child", "a dependent's release"])
def test_a_cancel_gives_back_the_slots_of_its_queued_children_whatever_a_later_step_raises(
    step: str, queues: TaskQueues, memory_registry: ToolRegistry, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A child cancelled ``queued`` while holding its tenant's one slot has it back, and the task
    parked behind it is woken, even when what follows the cancel's writes raises: folding a child's
    budget into its parent (``settle_child`` gives up on a budget that keeps changing) or looking at
    a dependent. Its message may never come (one the fleet's waker could not send), and the sweeper
    never lists an ended task: a give-back left for later would hold the slot for good."""
    p = Path(CountingQueues(queues), memory_registry)
    dispatcher = p.dispatcher(default_max_running=1)
    root = p.create(turns=SPAWN, tools=["spawn_subagents"])
    engine = Engine(p.store, worker_id="w", tools=p.registry, providers=_providers,
                    config=EngineConfig(lease_seconds=30), fanout=p.fanout)  # fmt: skip
    engine.run(root.task_id, keeper=lambda _: contextlib.nullcontext())
    [spawn] = p.store.spawns.list(root.task_id)
    child = p.store.tasks.get(spawn.children[0])
    waiter = p.holding_with_waiter(child, dispatcher)

    def boom(*_: Any) -> Any:
        raise RuntimeError(f"{step}: keeps changing")

    if step == "a dependent's release":
        monkeypatch.setattr(p.store.tasks, "dependents", boom)
    else:
        monkeypatch.setattr(p.store.budgets, "settle_child", boom)
    with pytest.raises(RuntimeError, match="keeps changing"):
        cancel(p.store, root.task_id, queues=p.queues, slots=dispatcher.fair.slots)  # type: ignore[arg-type]

    assert p.store.tasks.get(child.task_id).status is TaskStatus.CANCELLED
    assert p.store.tasks.get(child.task_id).slots == []
    assert dispatcher.fair.slots.usage("t").running == 0
    assert p.queues.sent[waiter.task_id] == 1  # woken to take it


SAMPLED = {"agent": "support@2", "online": {"alias": "prod", "grade": {"grader": "says_done"}}}


def _cancelled_waiting(p: Path) -> tuple[Task, Task | None]:
    """Cancelled from control after its run began: it is paused for a person's approval of a call."""
    dispatcher = p.dispatcher()
    ask = [{"text": "", "tool_calls": [call("lookup", query="q")]}]
    task = p.create("ask first", ask, tools=["lookup"], constraints={"tool_policies": {"lookup": "ask"}})
    p.deliver(dispatcher, task)
    assert p.store.tasks.get(task.task_id).status is TaskStatus.PAUSED
    cancel(p.store, task.task_id, queues=p.queues, slots=dispatcher.fair.slots)  # type: ignore[arg-type]
    return task, None


@pytest.mark.parametrize(
    ("name", "unanswered"),
    [("cost_exceeded", 1), ("failed", 1), ("timed_out", 1), ("dead_lettered", 1), ("cancelled_waiting", 1),
     ("dependency_failed", 1), ("cancelled_queued", 0), ("skipped_at_the_dispatcher", 0), ("succeeded", 0)],
)  # fmt: skip
def test_a_sampled_task_that_ends_without_an_answer_counts_once_for_its_version_as_unanswered(
    name: str, unanswered: int, queues: TaskQueues, memory_registry: ToolRegistry
) -> None:
    """Online evaluation compares a canary with its stable version: a canary whose sampled tasks
    end without an answer (its run's cost_exceeded, failed, timed_out; the dispatcher's dead
    letter; a cancel from control after it began) counts each once as unanswered, a fail of its
    pass rate, with what it spent; a redelivery that reports the end again counts nothing more.
    A task its version never ran (cancelled queued, skipped, the dependent of a failed task: the
    dependency counts) is not the version's to answer for; an answered one counts as graded."""
    p = Path(CountingQueues(queues), memory_registry, sampled=SAMPLED)
    drive, status, _ = PATHS.get(name, (_cancelled_waiting, TaskStatus.CANCELLED, False))
    task, _ = drive(p)
    assert p.store.tasks.get(task.task_id).status is status
    p.deliver(p.dispatcher(), task)  # the end reported again (a redelivery)
    now = hour_of(time.time())
    buckets = p.store.quality.read("t", "support", now - 1, now + 1)
    assert sum(b.unanswered for b in buckets) == unanswered, buckets
    if not unanswered:  # an answer is graded ("done" is not the grader's DONE): a fail of the pass rate, once
        assert [(b.graded, b.pass_rate) for b in buckets] == ([(1, 0.0)] if status is TaskStatus.SUCCEEDED else [])
        return
    (bucket,) = buckets
    counted = p.store.tasks.get(task.submission.depends_on[0] if task.submission.depends_on else task.task_id)
    assert (bucket.version, bucket.graded, bucket.passed, bucket.pass_rate) == (2, 0, 0, 0.0)
    assert bucket.task_cost_usd == counted.cost_usd.quantize(Decimal("0.000001"))
    assert bucket.mean_task_cost_usd == bucket.task_cost_usd
