"""The event hub (api/event_hub.py) on the in-memory store: many subscribers of one task share
one poller's reads, idle streams get keep-alives, and the live text of a call in flight arrives
as uncommitted deltas that a committed step or a new lease starts over."""

from __future__ import annotations

import json
import queue
import threading
import time
from collections.abc import Iterator
from typing import Any

from agentq.api.event_hub import BUFFER_BYTES, EventHub
from agentq.api.events import Watch, read_once
from agentq.core.endusers import Caller
from agentq.core.models import Lease, TaskStatus, ToolOutcome, ToolsStep
from agentq.storage.container import Storage, memory_storage

from tests.helpers import scripted
from tests.storage_conformance._builders import claimed, llm_step, new_task, tools_step


class Subscriber:
    """A stream read on a thread of its own, its frames parsed as they come."""

    def __init__(self, hub: EventHub, watch: Watch) -> None:
        self.frames: queue.Queue[dict[str, str]] = queue.Queue()
        self.thread = threading.Thread(target=self._run, args=(hub.stream(watch),), daemon=True)
        self.thread.start()

    def _run(self, stream: Iterator[str]) -> None:
        for chunk in stream:
            for block in chunk.split("\n\n"):
                if block:
                    self.frames.put(dict(line.partition(": ")[::2] for line in block.splitlines()))

    def until(self, predicate: object, timeout: float = 5.0) -> list[dict[str, str]]:
        """Frames up to and including the first that ``predicate`` accepts."""
        seen = []
        deadline = time.monotonic() + timeout
        while True:
            frame = self.frames.get(timeout=max(0.01, deadline - time.monotonic()))
            seen.append(frame)
            if predicate(frame):  # type: ignore[operator]
                return seen


def _watch(hub: EventHub, store: Storage, task_id: str) -> Watch:
    return hub.open(Caller(store.tasks.get(task_id).tenant), task_id, None, tree=False, field="after")


def _event(frame: dict[str, str]) -> dict[str, Any]:
    return dict(json.loads(frame["data"]))


def test_a_hundred_subscribers_of_one_task_share_one_pollers_reads() -> None:
    store = memory_storage()
    lease = claimed(store)
    hub = EventHub(store, interval=0.02, keepalive=60)
    subscribers = [Subscriber(hub, _watch(hub, store, lease.task_id)) for _ in range(100)]
    for s in subscribers:
        s.until(lambda f: f.get("event") == "task.status")
    store.steps.commit(lease, 1, llm_step(text="one"), root_id=lease.task_id)
    store.steps.commit(lease, 2, llm_step(text="two"), root_id=lease.task_id, finish=TaskStatus.SUCCEEDED, result="x")
    for s in subscribers:
        got = s.until(lambda f: f.get("event") == "end")
        assert [f["event"] for f in got if "id" in f] == ["agent.message", "agent.message", "task.status"]
        s.thread.join(5)
    assert len(hub.pollers) == 1


def test_subscribers_of_one_task_do_not_multiply_the_reads_once_caught_up() -> None:
    store = memory_storage()
    lease = claimed(store)
    reads = Counting(store)
    hub = EventHub(store, interval=0.02, keepalive=60)
    subscribers = [Subscriber(hub, _watch(hub, store, lease.task_id)) for _ in range(100)]
    for s in subscribers:
        s.until(lambda f: f.get("event") == "task.status")
    before, started = reads.calls, time.monotonic()
    time.sleep(0.3)
    store.steps.commit(lease, 1, llm_step(text="one"), root_id=lease.task_id)
    for s in subscribers:
        s.until(lambda f: f.get("event") == "agent.message")
    ticks = (time.monotonic() - started) / 0.02
    assert reads.calls - before <= ticks + 10  # one META read a tick, one log read for the commit: not 100 of each


class Counting:
    """Counts the reads the event log makes of the table."""

    def __init__(self, store: Storage) -> None:
        self.calls = 0
        table = store.events.table
        outer = self

        class _Table:
            def __getattr__(self, name: str) -> object:
                attr = getattr(table, name)
                if name in ("get", "query"):

                    def counted(*args: object, **kwargs: object) -> object:
                        outer.calls += 1
                        return attr(*args, **kwargs)

                    return counted
                return attr

        store.events.table = _Table()  # type: ignore[assignment]


def test_an_idle_stream_gets_keep_alive_comments() -> None:
    store = memory_storage()
    lease = claimed(store)
    hub = EventHub(store, interval=0.02, keepalive=0.1)
    sub = Subscriber(hub, _watch(hub, store, lease.task_id))
    sub.until(lambda f: f.get("event") == "task.status")
    assert sub.until(lambda f: f.get("") == "keep-alive", timeout=2)[-1] == {"": "keep-alive"}


def test_live_text_arrives_as_uncommitted_deltas_and_starts_over_for_a_new_lease() -> None:
    store = memory_storage()
    task_id = new_task(store)
    got = store.tasks.claim(task_id, "w1", 0.2)
    assert got is not None
    lease = got[0]
    hub = EventHub(store, interval=0.02, keepalive=60)
    sub = Subscriber(hub, _watch(hub, store, task_id))
    sub.until(lambda f: f.get("event") == "task.status")

    def delta() -> dict[str, Any]:
        frame = sub.until(lambda f: f.get("event") == "agent.message_delta")[-1]
        assert "id" not in frame  # moves no cursor
        event = _event(frame)
        assert event["id"] is None and event["committed"] is False
        return dict(event["data"])

    store.tasks.extend_lease(lease, 0.2, live_text="Hello")
    assert delta() == {"step": 1, "epoch": 1, "text": "Hello", "reset": True}
    store.tasks.extend_lease(lease, 0.2, live_text="Hello, wor")
    assert delta() == {"step": 1, "epoch": 1, "text": ", wor", "reset": False}
    time.sleep(0.3)  # the first worker's lease lapses
    taken = store.tasks.claim(task_id, "w2", 30)
    assert taken is not None
    second: Lease = taken[0]
    store.tasks.extend_lease(second, 30, live_text="Hi again")
    frames = sub.until(lambda f: f.get("event") == "agent.message_delta" and "again" in f["data"])
    assert any(f.get("event") == "task.status" and _event(f)["data"]["takeover"] for f in frames)
    assert _event(frames[-1])["data"] == {"step": 1, "epoch": 2, "text": "Hi again", "reset": True}
    stale = [f for f in frames if f.get("event") == "agent.message_delta" and "Hello" in f["data"]]
    assert stale == []  # the dead lease's text is never shown as the new one's
    store.steps.commit(second, 1, llm_step(text="Hi again, done"), root_id=task_id)
    message = _event(sub.until(lambda f: f.get("event") == "agent.message")[-1])
    assert message["committed"] is True and message["data"]["text"] == "Hi again, done"


def test_subscribers_sharing_frames_each_get_a_tools_step_with_the_inputs_its_llm_step_asked_for() -> None:
    store = memory_storage()
    lease = claimed(store)
    hub = EventHub(store, interval=0.02, keepalive=60)
    subscribers = [Subscriber(hub, _watch(hub, store, lease.task_id)) for _ in range(5)]
    for s in subscribers:
        s.until(lambda f: f.get("event") == "task.status")
    asks = llm_step(text="looking")
    asks.content.append({"type": "tool_use", "id": "tu1", "name": "lookup", "input": {"query": "alpha"}})
    store.steps.commit(lease, 1, asks, root_id=lease.task_id)
    store.steps.commit(lease, 2, tools_step(), root_id=lease.task_id)
    for s in subscribers:
        frame = s.until(lambda f: f.get("event") == "agent.tool_results")[-1]
        [call] = _event(frame)["data"]["tool_calls"]
        assert (call["name"], call["input"]) == ("lookup", {"query": "alpha"})


def test_a_poller_stops_reading_once_its_last_subscriber_has_gone() -> None:
    store = memory_storage()
    lease = claimed(store)
    hub = EventHub(store, interval=0.02, keepalive=60, linger=0.1)
    sub = Subscriber(hub, _watch(hub, store, lease.task_id))
    sub.until(lambda f: f.get("event") == "task.status")
    store.steps.commit(lease, 1, llm_step(text="bye"), root_id=lease.task_id, finish=TaskStatus.SUCCEEDED, result="x")
    sub.until(lambda f: f.get("event") == "end")
    sub.thread.join(5)
    deadline = time.monotonic() + 5
    while hub.pollers and time.monotonic() < deadline:
        time.sleep(0.02)
    assert hub.pollers == {}
    reads = hub.reads
    time.sleep(0.2)
    assert hub.reads == reads  # nobody watches: no more reads


def test_a_stream_of_a_task_written_after_its_shared_poller_started_waits_for_the_next_read() -> None:
    """A tree's stream attaches a poller to a sub-agent as its ``task.spawned`` commits, which
    may be before the sub-agent is written: that poller reads "no such task". A stream of the
    sub-agent alone, opened once it exists, shares the poller; it must not take that older read
    as the task being gone (and end at once, empty), but send the task's events from the next."""
    store = memory_storage()
    hub = EventHub(store, interval=3600, keepalive=60)  # the poller reads only when the test says
    task_id = "0" * 26
    early = threading.Event()
    poller = hub.attach(task_id, early)  # before the task exists
    assert poller.snapshot(None).head is None
    store.tasks.create(scripted([{"text": "x"}]), tenant="t", task_id=task_id)
    subscriber = Subscriber(hub, _watch(hub, store, task_id))
    while len(poller.subscribers) < 2 and subscriber.thread.is_alive():  # attached: it looks at the stale read
        subscriber.thread.join(0.01)
    poller.poll()
    got = subscriber.until(lambda f: f.get("event") in {"task.created", "end"})
    assert got[-1]["event"] == "task.created"
    hub.detach(poller, early)


def _asks_for_a_lookup() -> Any:
    asks = llm_step(text="looking")
    asks.content.append({"type": "tool_use", "id": "tu1", "name": "lookup", "input": {"query": "alpha"}})
    return asks


def _id_of_the_llm_step(store: Storage, task_id: str) -> str:
    """The id its ``agent.message`` was sent with (as the API's page of events names it)."""
    events = read_once(Watch.open(store, store.tasks.get(task_id), None, tree=False, field="after"), limit=50)
    return str([e for e in events if e["type"] == "agent.message"][-1]["id"])


def test_a_stream_resumed_after_an_llm_step_on_a_warm_poller_gets_the_tools_step_with_its_inputs() -> None:
    store = memory_storage()
    lease = claimed(store)
    hub = EventHub(store, interval=3600, keepalive=60)  # the poller reads only when the test says
    warm = threading.Event()
    poller = hub.attach(lease.task_id, warm)  # another stream of the task keeps its poller warm
    store.steps.commit(lease, 1, _asks_for_a_lookup(), root_id=lease.task_id)
    poller.poll()
    # a client whose connection dropped during the tool call comes back with Last-Event-ID
    last_id = _id_of_the_llm_step(store, lease.task_id)
    resumed = Subscriber(hub, hub.open(Caller("t"), lease.task_id, last_id, tree=False, field="Last-Event-ID"))
    store.steps.commit(lease, 2, tools_step(), root_id=lease.task_id)
    poller.poll()
    [call] = _event(resumed.until(lambda f: f.get("event") == "agent.tool_results")[-1])["data"]["tool_calls"]
    assert call["input"] == {"query": "alpha"}
    hub.detach(poller, warm)


def test_a_stream_resumed_ahead_of_a_warm_poller_never_takes_the_tool_inputs_out_of_other_watchers_frames() -> None:
    """The frame of a tools step is made once per poller and shared: made by a resumed watch
    without the inputs, every other watcher of the task would be sent ``input: null`` too."""
    store = memory_storage()
    lease = claimed(store)
    hub = EventHub(store, interval=3600, keepalive=60)
    first = hub.stream(_watch(hub, store, lease.task_id))  # read by the test, after the resumed one
    assert "task.status" in next(first)
    poller = hub.pollers[lease.task_id]
    store.steps.commit(lease, 1, _asks_for_a_lookup(), root_id=lease.task_id)
    # a client that saw the LLM step on another server comes back here before this poller read it
    last_id = _id_of_the_llm_step(store, lease.task_id)
    resumed = Subscriber(hub, hub.open(Caller("t"), lease.task_id, last_id, tree=False, field="Last-Event-ID"))
    while len(poller.subscribers) < 2 and resumed.thread.is_alive():  # attached: it looks at the older read
        resumed.thread.join(0.01)
    store.steps.commit(lease, 2, tools_step(), root_id=lease.task_id)
    poller.poll()
    [call] = _event(resumed.until(lambda f: f.get("event") == "agent.tool_results")[-1])["data"]["tool_calls"]
    assert call["input"] == {"query": "alpha"}  # the resumed one made the shared frame first
    sent = next(first)
    assert "agent.message" in sent and '"input":{"query":"alpha"}' in sent, sent


def _held(poller: Any) -> int:
    """The bytes a poller holds: its buffered events (a step's record) and their frames."""
    events = sum(len(e.step.model_dump_json()) if e.step else len(json.dumps(e.data)) for e in poller.buffer)
    return events + sum(len(f) for f in poller.frames.values())


def _turn(store: Storage, lease: Lease, turn: int) -> int:
    """An LLM step asking for a lookup (4 KB of text), then its 20 KB result; the tools step's number."""
    asks = llm_step(text="x" * 4000)
    asks.content.append({"type": "tool_use", "id": f"tu{turn}", "name": "lookup", "input": {"q": "a"}})
    store.steps.commit(lease, 2 * turn - 1, asks, root_id=lease.task_id)
    result = ToolOutcome(
        tool_use_id=f"tu{turn}", name="lookup", content="y" * 20_000, started_at=time.time(), duration_ms=1
    )
    store.steps.commit(lease, 2 * turn, ToolsStep(results=[result]), root_id=lease.task_id)
    return 2 * turn


def test_a_pollers_memory_stays_bounded_over_a_long_task_whose_one_subscriber_keeps_up() -> None:
    store = memory_storage()
    lease = claimed(store)
    hub = EventHub(store, interval=3600, keepalive=60)  # the poller reads only when the test says
    sub = Subscriber(hub, _watch(hub, store, lease.task_id))
    sub.until(lambda f: f.get("event") == "task.status")
    poller = hub.pollers[lease.task_id]
    for turn in range(1, 101):  # 2.4 MB of steps
        step = _turn(store, lease, turn)
        poller.poll()
        sub.until(lambda f, step=step: f.get("event") == "agent.tool_results" and f'"step":{step},' in f["data"])
    # what the subscriber had at its last look: the last two turns' events and frames (~100 KB)
    assert len(poller.buffer) <= 4 and _held(poller) < 128_000, (len(poller.buffer), _held(poller))


def test_a_subscriber_the_pollers_byte_cap_passed_still_gets_every_event_in_order() -> None:
    store = memory_storage()
    lease = claimed(store)
    hub = EventHub(store, interval=3600, keepalive=60)
    slow = hub.stream(_watch(hub, store, lease.task_id))  # read by the test only at the end
    assert "task.status" in next(slow)
    fast = Subscriber(hub, _watch(hub, store, lease.task_id))
    fast.until(lambda f: f.get("event") == "task.status")
    poller = hub.pollers[lease.task_id]
    for turn in range(1, 101):
        step = _turn(store, lease, turn)
        poller.poll()
        fast.until(lambda f, step=step: f.get("event") == "agent.tool_results" and f'"step":{step},' in f["data"])
        assert _held(poller) < BUFFER_BYTES + 120_000  # the cap, and the last read's turn
    store.steps.commit(
        lease, 201, llm_step(text="done"), root_id=lease.task_id, finish=TaskStatus.SUCCEEDED, result="x"
    )
    poller.poll()
    sent = [f for chunk in slow for block in chunk.split("\n\n") if block and "id: " in block for f in [block]]
    steps = [json.loads(b.split("data: ", 1)[1])["data"].get("step") for b in sent]
    assert [s for s in steps if s is not None] == list(range(1, 202))
    assert sent[-1].splitlines()[1] == "event: task.status"


def test_a_tree_stream_on_a_fed_hub_stops_reading_sub_agents_that_have_ended_and_a_root_left_alone() -> None:
    from agentq.core.fanout import ChildPlan

    store = memory_storage()
    lease = claimed(store, max_tokens=10_000)
    parent = store.tasks.get(lease.task_id)
    plans = [ChildPlan(f"child{i}-{time.time_ns()}", scripted([{"text": "c"}]), 100, 60) for i in range(20)]
    assert store.spawns.create(lease, parent, "sp1", plans, [], 20)
    for plan in plans:  # every sub-agent runs and ends; the root goes on running
        got = store.tasks.claim(plan.task_id, "w1", 30)
        assert got is not None
        store.steps.commit(got[0], 1, llm_step(), root_id=lease.task_id, finish=TaskStatus.SUCCEEDED, result="x")
    hub = EventHub(store, interval=0.1, keepalive=60, idle_interval=30.0)  # fed by the table's stream
    sub = Subscriber(hub, hub.open(Caller("t"), lease.task_id, None, tree=True, field="after"))
    for _ in plans:
        sub.until(lambda f: f.get("event") == "task.status" and '"succeeded"' in f["data"], timeout=10)
    deadline = time.monotonic() + 5
    while any(p.eager for p in list(hub.pollers.values())) and time.monotonic() < deadline:
        time.sleep(0.01)  # the stream has taken the last sub-agent's end: its next look drops them
    before = hub.reads
    time.sleep(2.0)  # 20 of the pollers' intervals, nothing written to any task of the tree
    assert hub.reads - before <= 2, f"{hub.reads - before} table reads in 2 s of a tree of 20 ended sub-agents"
    store.steps.commit(lease, 1, llm_step(text="root goes on"), root_id=lease.task_id)
    hub.nudge({lease.task_id})  # as the table's stream does
    assert _event(sub.until(lambda f: f.get("event") == "agent.message" and "root goes on" in f["data"])[-1])
