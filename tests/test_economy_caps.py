"""Economy (Message Batches) under every window that caps a task's calls: its tenant's hour and
its end user's, agent's and API key's caps, each per hour and per day, in tokens and in dollars
(ARCHITECTURE 4, "spend <= cap at every scope"). A batch's call holds on them from before it is
sent until its outcome is known (``core.engine._llm_batch``): the answer settles that hold to its
usage, an errored or expired request gives it back, and a batch the API no longer knows, or a
task stopped while its batch runs, counts it as spent, once, whoever meets it.

The park used to give the hold back. While a batch ran its windows held nothing for it, so a
capped user's second economy task sent a batch too and both were billed (4,080 tokens on a
3,000-token day); a task cancelled while its batch ran was billed and counted on no window, as
often as a user's token cared to submit and cancel. The real ``anthropic`` SDK against
tests/fake_messages_api.py, on the in-memory store."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import pytest

from agentq.control import operations as control
from agentq.control.stops import resume, stop
from agentq.core.caps import CapLimits
from agentq.core.engine import Engine, EngineConfig, RunResult
from agentq.core.models import LLMStep, TaskStatus, TaskSubmission
from agentq.core.pricing import micros
from agentq.core.stops import StopScope
from agentq.core.tenancy import TenantLimits
from agentq.core.tools import ToolRegistry
from agentq.storage.container import Storage

from tests.fake_messages_api import FakeMessagesAPI, RecordedRequest, invalid_request, message_reply, point_anthropic_at
from tests.helpers import wait_for

STORAGE = "memory"
MAX_OUT = 2000


@dataclass(frozen=True)
class Window:
    """One window that caps a task's calls: a scope's (``tenant``: the tenant's own hour)."""

    scope: str
    window: str  # hour or day
    metric: str  # tokens or usd

    def __str__(self) -> str:
        return f"{self.scope}-{self.window}-{self.metric}"


WINDOWS = [
    *(Window(scope, window, metric) for scope in ("user", "agent", "key") for window in ("hour", "day")
      for metric in ("tokens", "usd")),
    *(Window("tenant", "hour", metric) for metric in ("tokens", "usd")),
]  # fmt: skip
USER_DAY, TENANT_HOUR = Window("user", "day", "tokens"), Window("tenant", "hour", "tokens")


def _answer(request: RecordedRequest) -> Any:
    """The whole output allowance, as a long answer uses it: a call bills about its hold."""
    return message_reply([{"type": "text", "text": "done"}], usage={"input_tokens": 20, "output_tokens": MAX_OUT - 10})


@pytest.fixture
def api(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeMessagesAPI]:
    with FakeMessagesAPI(responder=_answer, batch_seconds=0.3) as server:
        server.within_max_tokens = True  # like the real API: never more output than max_tokens
        point_anthropic_at(server, monkeypatch.setenv)
        yield server


def _task(store: Storage, scope: str = "user", tenant: str = "acme") -> str:
    """An economy task acting for ``alice`` in ``scope`` (the tenant's: any of them)."""
    raw: dict[str, Any] = {
        "goal": "answer", "provider": "anthropic", "model": "claude-sonnet-4-6",
        "constraints": {"economy": True, "max_output_tokens": MAX_OUT, "max_tokens": 1_000_000},
    }  # fmt: skip
    if scope in ("user", "tenant"):
        raw["user"] = "alice"
    if scope == "agent":
        raw["agent"] = "alice"
    sub = TaskSubmission.model_validate(raw)
    return store.tasks.create(sub, tenant=tenant, key_id="alice" if scope == "key" else None).task_id


def _engine(store: Storage, registry: ToolRegistry) -> Engine:
    return Engine(store, worker_id="w", tools=registry, config=EngineConfig(lease_seconds=30))


def _one_hold(store: Storage, registry: ToolRegistry) -> tuple[int, int]:
    """What one of these tasks' batch holds (tokens, millionths of a dollar), as another
    tenant's task sends it: the caps below are sized on it."""
    task_id = _task(store, tenant="probe")
    assert _engine(store, registry).run(task_id).outcome == "waiting"
    held = store.tasks.get(task_id).inflight
    assert held is not None and held.micros > 0
    return held.amount, held.micros


def _cap(store: Storage, w: Window, amount: int) -> None:
    """Cap ``w`` at ``amount`` (tokens, or millionths of a dollar)."""
    value: Any = amount if w.metric == "tokens" else Decimal(amount).scaleb(-6)
    if w.scope == "tenant":
        store.windows.set_limits("acme", TenantLimits.model_validate({f"hourly_{w.metric}": value}))
    else:
        prefix = "hourly" if w.window == "hour" else "daily"
        store.caps.put("acme", w.scope, "alice", CapLimits.model_validate({f"{prefix}_{w.metric}": value}))  # type: ignore[arg-type]


def _counted(store: Storage, w: Window) -> tuple[int, int]:
    """``w``'s counters: held and spent (what its condition weighs), and settled."""
    if w.scope == "tenant":
        usage = store.windows.usage("acme") if w.metric == "tokens" else store.windows.money_usage("acme")
        return usage["held"], usage["used"]
    usage = store.caps.usage("acme", w.scope, "alice")  # type: ignore[arg-type]
    return usage[f"{w.window}_{w.metric}"], usage[f"{w.window}_used_{w.metric}"]


def _of(w: Window, tokens: int, money: int) -> int:
    return tokens if w.metric == "tokens" else money


def _refused_at(result: RunResult, w: Window) -> bool:
    """The run was put off by ``w``'s cap, holding nothing."""
    error = result.error or {}
    if w.scope == "tenant":
        return result.outcome == "retry" and error.get("code") == "tenant_hourly_cap"
    return (result.outcome, error.get("code"), error.get("scope"), error.get("window")) == (
        "deferred", "cap_reached", w.scope, w.window
    )  # fmt: skip


def _batches_end(api: FakeMessagesAPI) -> None:
    last = max(b["created"] for b in api.batches.values())
    wait_for(lambda: time.time() >= last + api.batch_seconds, what="the batches' end")


def _read(store: Storage, registry: ToolRegistry, task_id: str) -> RunResult:
    store.tasks.transition(task_id, TaskStatus.QUEUED)  # what the batch's poll message does
    return _engine(store, registry).run(task_id)


def _billed(store: Storage, task_id: str) -> tuple[int, int]:
    """What the task's committed calls used (tokens, millionths of a dollar)."""
    calls = [s.body for s in store.steps.load(task_id) if isinstance(s.body, LLMStep)]
    return sum(c.usage.total for c in calls), sum(micros(c.cost_usd) for c in calls)


@pytest.mark.parametrize("w", WINDOWS, ids=str)
def test_a_batch_holds_every_window_that_caps_it_while_it_runs_and_its_answer_settles_it_to_its_usage(
    api: FakeMessagesAPI, store: Storage, registry: ToolRegistry, w: Window
) -> None:
    """One call's hold fits the cap, two do not: the second task of the scope waits while the
    first's batch runs, and after its answer, instead of sending a second billed batch."""
    tokens, money = _one_hold(store, registry)
    hold = _of(w, tokens, money)
    _cap(store, w, hold + hold // 2)
    first, second = _task(store, w.scope), _task(store, w.scope)
    assert _engine(store, registry).run(first).outcome == "waiting"
    assert _counted(store, w) == (hold, 0)  # held while the batch runs, to be billed
    sent = len(api.batches)
    refused = _engine(store, registry).run(second)
    assert _refused_at(refused, w), refused
    assert len(api.batches) == sent  # no second batch went out
    _batches_end(api)
    assert _read(store, registry, first).status is TaskStatus.SUCCEEDED
    used = _of(w, *_billed(store, first))
    assert 0 < used <= hold and _counted(store, w) == (used, used)  # settled to its usage, once
    assert _refused_at(_engine(store, registry).run(second), w)  # what is left is still too little
    assert len(api.batches) == sent


@pytest.mark.parametrize("ending", ["cancel", "stop"])
@pytest.mark.parametrize("w", WINDOWS, ids=str)
def test_a_task_ended_while_its_batch_runs_leaves_that_batch_counted_as_spent_on_every_window(
    api: FakeMessagesAPI, store: Storage, registry: ToolRegistry, w: Window, ending: str
) -> None:
    """What a user's token may do on its own (``economy`` is a constraint it may set; cancel is a
    route it reaches): send a turn as a batch and cancel. The provider runs and bills the batch;
    no run will read it, so its hold is counted as spent, and the next batch of the scope waits
    for the window. Before, the windows counted nothing of it, and it could be done again and
    again."""
    tokens, money = _one_hold(store, registry)
    hold = _of(w, tokens, money)
    cap = hold + hold // 2
    _cap(store, w, cap)
    sent = len(api.delivered_usage)
    task_id = _task(store, w.scope)
    assert _engine(store, registry).run(task_id).outcome == "waiting"
    if ending == "cancel":
        assert control.cancel(store, task_id, tenant="acme") == [task_id]
    else:
        assert task_id in stop(store, "acme", StopScope("tenant", "acme")).cancelled
        resume(store, "acme", StopScope("tenant", "acme"))
    assert _counted(store, w) == (hold, hold)  # spent at its hold: the most the batch can bill
    billed = [u["input_tokens"] + u["output_tokens"] for u in api.delivered_usage[sent:]]
    assert len(billed) == 1 and (w.metric != "tokens" or billed[0] <= hold)
    again = _task(store, w.scope)
    assert _refused_at(_engine(store, registry).run(again), w)  # no second batch past the cap
    assert len(api.delivered_usage) == sent + 1 and _counted(store, w)[0] <= cap


def _errored(api: FakeMessagesAPI) -> None:
    api.enqueue(invalid_request("messages.0.content: too long for this model"))


def _expired(api: FakeMessagesAPI) -> None:
    """The batch's request expired (its 24 hours passed): not billed; the turn goes out again."""
    _batches_end(api)
    for batch in api.batches.values():
        batch["results"] = [{**r, "result": {"type": "expired"}} for r in batch["results"]]


def _gone(api: FakeMessagesAPI) -> None:
    """The API no longer knows the batch (404): whether it ran, and was billed, is unknown."""
    _batches_end(api)
    api.batches.clear()


@pytest.mark.parametrize(
    ("outcome", "ends", "spent"),
    [("errored", TaskStatus.FAILED, False), ("expired", None, False), ("gone", TaskStatus.FAILED, True)],
)
def test_a_batch_whose_outcome_is_known_unbilled_gives_its_hold_back_and_one_unknown_keeps_it_counted_once(
    api: FakeMessagesAPI, store: Storage, registry: ToolRegistry, outcome: str, ends: TaskStatus | None, spent: bool
) -> None:
    """On the tenant's hour and the user's day at once (the two parts of a call's hold). A task
    failed on its batch forgets it (its outcome is all it will say) and, redriven, sends the
    turn anew under a hold of its own: the failed batch settles nothing a second time."""
    store.windows.set_limits("acme", TenantLimits(hourly_tokens=1_000_000))
    store.caps.put("acme", "user", "alice", CapLimits(daily_tokens=1_000_000))
    if outcome == "errored":
        _errored(api)
    task_id = _task(store)
    assert _engine(store, registry).run(task_id).outcome == "waiting"
    hold = store.tasks.get(task_id).inflight
    assert hold is not None
    {"errored": _batches_end, "expired": _expired, "gone": _gone}[outcome](api)
    result = _read(store, registry, task_id)
    if ends is None:  # tried again: the turn is sent as a new batch, under a hold of its own
        assert result.outcome == "retry" and store.tasks.get(task_id).batch is None, result
    else:
        assert result.status is ends, result
    after = (hold.amount, hold.amount) if spent else (0, 0)
    assert _counted(store, USER_DAY) == _counted(store, TENANT_HOUR) == after
    if ends is not None:  # a redrive (as from the DLQ) sends the turn anew, never reads the failed batch
        store.tasks.transition(task_id, TaskStatus.QUEUED)
        assert _engine(store, registry).run(task_id).outcome == "waiting"
        again = store.tasks.get(task_id).inflight
        assert again is not None
        held = (after[0] + again.amount, after[1])
        assert _counted(store, USER_DAY) == _counted(store, TENANT_HOUR) == held


@pytest.mark.parametrize("wakes", [False, True], ids=["killed", "paused"])
def test_a_run_that_read_the_batchs_answer_and_lost_its_lease_leaves_the_hold_to_the_next_claim_settled_once(
    api: FakeMessagesAPI, store: Storage, registry: ToolRegistry, monkeypatch: pytest.MonkeyPatch, wakes: bool
) -> None:
    """Killed, or paused past its lease and woken after the next claim committed the answer: the
    next claim reads the batch again and settles its recorded hold to its usage; the run that
    lost its lease gives nothing back (it would count the batch on no window)."""
    from tests.stopped_worker import resume as resume_run
    from tests.stopped_worker import stopped_at

    store.windows.set_limits("acme", TenantLimits(hourly_tokens=1_000_000))
    store.caps.put("acme", "user", "alice", CapLimits(daily_tokens=1_000_000))
    task_id = _task(store)
    assert _engine(store, registry).run(task_id).outcome == "waiting"
    _batches_end(api)
    store.tasks.transition(task_id, TaskStatus.QUEUED)
    lost = Engine(store, worker_id="lost", tools=registry, config=EngineConfig(lease_seconds=1))
    with stopped_at(lost, task_id, "after_llm_call:1", monkeypatch, wakes=wakes):
        successor = Engine(store, worker_id="successor", tools=registry, config=EngineConfig(lease_seconds=1))
        assert resume_run(successor, task_id, wait_seconds=30).status is TaskStatus.SUCCEEDED
    used, _ = _billed(store, task_id)
    assert used > 0 and store.steps.orphans(task_id) == []
    assert _counted(store, USER_DAY) == _counted(store, TENANT_HOUR) == (used, used)


def test_a_batchs_answer_discarded_by_an_interrupt_is_counted_once_on_the_windows_and_never_read_again(
    api: FakeMessagesAPI, store: Storage, registry: ToolRegistry
) -> None:
    """An interrupt asked for as the batch's answer is read: the answer is discarded (settled as
    an orphan, the windows' hold with it) and the batch forgotten, so the run after the next
    message sends the turn anew under a hold of its own; the discarded one is not counted again."""
    from agentq.control.conversations import interrupt, send_message

    from tests.test_conversations import Queues

    store.caps.put("acme", "user", "alice", CapLimits(daily_tokens=1_000_000))
    task_id = _task(store)
    assert _engine(store, registry).run(task_id).outcome == "waiting"
    _batches_end(api)
    store.tasks.transition(task_id, TaskStatus.QUEUED)  # what the batch's poll message does
    interrupt(store, task_id, tenant="acme")
    assert _engine(store, registry).run(task_id).status is TaskStatus.IDLE
    [orphan] = store.steps.orphans(task_id)
    used = orphan.call.usage.total
    assert _counted(store, USER_DAY) == (used, used)
    send_message(store, Queues(), task_id, "go on", tenant="acme")
    assert _engine(store, registry).run(task_id).outcome == "waiting"  # the turn sent anew
    assert [s.body.kind for s in store.steps.load(task_id)] == ["message"]  # the discarded answer not committed
    held = store.tasks.get(task_id).inflight
    assert held is not None
    assert _counted(store, USER_DAY) == (used + held.amount, used)  # the answer once; the next batch held
