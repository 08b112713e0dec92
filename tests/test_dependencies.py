"""Task dependencies: a task naming ``depends_on`` waits ``blocked`` (no message, no compute)
until every dependency succeeded, then runs with their results in its first message; one that
fails or is cancelled cancels it with ``dependency_failed``, cascading; a dependency that ends
while the dependent is being submitted is never missed; bad references change nothing."""

from __future__ import annotations

import dataclasses
import itertools
import threading
import time
from collections import Counter
from typing import Any

import pytest

from agentq.control.operations import cancel
from agentq.control.submit import submit, submit_once
from agentq.core.engine import Engine
from agentq.core.errors import ValidationError
from agentq.core.models import TaskStatus
from agentq.core.tools import ToolRegistry
from agentq.queueing.endings import release_dependents
from agentq.runtime import build_queues, build_registry, build_store
from agentq.storage.container import memory_storage
from agentq_dev.moto_server import MotoServer
from agentq_dev.stack import LocalStack

from tests.helpers import call, deployment, queue_depth, wait_for


def _scripted(text: str, *, latency: float = 0.0, after: list[str] | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {"goal": f"say {text}", "provider": "scripted",
                            "script": {"turns": [{"text": text, "latency_seconds": latency}]}}  # fmt: skip
    if after:
        body["depends_on"] = after
    return body


@pytest.fixture(scope="module")
def stack() -> Any:
    with LocalStack(prefix="deps", workers=2, api=False, tool_modules=("tests.effect_tools",)) as s:
        yield s


def test_a_dependent_waits_blocked_until_its_dependencies_succeed_then_runs_with_their_results(
    stack: LocalStack,
) -> None:
    assert stack.settings is not None
    store, registry, queues = stack.store(), build_registry(stack.settings), stack.queues()
    # a and b are enqueued only once c is in: on a loaded machine they could otherwise both end
    # before c's submission reads them, and c would (rightly) be queued at once.
    a = submit(store, registry, _scripted("alpha facts", latency=1.5), tenant="t")
    b = submit(store, registry, _scripted("beta facts", latency=0.5), tenant="t")
    c = submit(store, registry, _scripted("combined", after=[a.task_id, b.task_id]), tenant="t", queues=queues)
    assert c.status is TaskStatus.BLOCKED
    blocked = store.tasks.get(c.task_id)
    assert blocked.status is TaskStatus.BLOCKED and blocked.claim_count == 0  # no compute, no message
    from agentq.api.views import task_view

    assert (task_view(store, blocked).activity or "").startswith("blocked: ")
    assert task_view(store, blocked).depends_on == [a.task_id, b.task_id]
    for dependency in (a, b):
        queues.send(dependency.task_id, "normal", tenant="t")

    done = wait_for(lambda: (t := store.tasks.get(c.task_id)).status.terminal and t, timeout=60, what="c to end")
    assert done.status is TaskStatus.SUCCEEDED and done.result == "combined"
    first, second = store.tasks.get(a.task_id), store.tasks.get(b.task_id)
    assert (done.first_claimed_at or 0) >= max(first.finished_at or 0, second.finished_at or 0)
    from agentq.api.views import trace_page

    events = trace_page(store, done, limit=100, cursor=None).events
    blocked = [e for e in events if e.type == "transition" and e.event == "blocked"]
    assert len(blocked) == 1 and blocked[0].detail == {"depends_on": [a.task_id, b.task_id]}
    goal = Engine(store, worker_id="probe", tools=registry)._goal(done)
    assert goal.startswith("say combined") and "alpha facts" in goal and "beta facts" in goal


def test_a_failed_or_cancelled_dependency_cancels_its_dependents_with_dependency_failed_down_the_chain(
    stack: LocalStack,
) -> None:
    assert stack.settings is not None
    store, registry, queues = stack.store(), build_registry(stack.settings), stack.queues()
    slow = {"goal": "slow", "provider": "scripted", "constraints": {"tools": ["lookup"]}, "script": {"turns": [
        {"text": f"t{i}", "latency_seconds": 0.3, "tool_calls": [call("lookup", query="q")]} for i in range(40)]}}  # fmt: skip
    a = submit(store, registry, slow, tenant="t", queues=queues)
    b = submit(store, registry, _scripted("b", after=[a.task_id]), tenant="t", queues=queues)
    c = submit(store, registry, _scripted("c", after=[b.task_id]), tenant="t", queues=queues)
    assert cancel(store, a.task_id) == [a.task_id]
    for dependent, cause in ((b, a), (c, b)):
        ended = store.tasks.get(dependent.task_id)
        assert ended.status is TaskStatus.CANCELLED and ended.error is not None
        assert ended.error["code"] == "dependency_failed" and ended.error["dependency"] == cause.task_id
        assert ended.claim_count == 0

    # A dependency that already ended badly: the dependent is cancelled at once; one that
    # succeeded: it is queued at once.
    late = submit(store, registry, _scripted("late", after=[a.task_id]), tenant="t", queues=queues)
    assert late.status is TaskStatus.CANCELLED
    ok = submit(store, registry, _scripted("fine"), tenant="t", queues=queues)
    wait_for(lambda: store.tasks.get(ok.task_id).status is TaskStatus.SUCCEEDED, timeout=30, what="ok to succeed")
    after_ok = submit(store, registry, _scripted("after ok", after=[ok.task_id]), tenant="t", queues=queues)
    # Queued at once: by the time submit reads it back a worker may already hold it (or be done).
    assert after_ok.status in {TaskStatus.QUEUED, TaskStatus.RUNNING, TaskStatus.SUCCEEDED}
    wait_for(lambda: store.tasks.get(after_ok.task_id).status is TaskStatus.SUCCEEDED, timeout=30, what="it to run")


def test_an_unknown_foreign_or_repeated_dependency_is_refused_naming_it_and_writes_nothing(
    moto_server: MotoServer,
) -> None:
    settings = deployment(moto_server)
    store, registry, queues = build_store(settings), build_registry(settings), build_queues(settings)
    mine = store.tasks.create(submit_body := _scripted_body("mine"), tenant="t")
    theirs = store.tasks.create(submit_body, tenant="other")
    before = len(list(store.tasks.live_task_ids()))
    for after, field in (
        ([mine.task_id, "no-such-task"], "depends_on[1]"),
        ([theirs.task_id], "depends_on[0]"),
        ([mine.task_id, mine.task_id], "depends_on"),
        ([f"t{i}" for i in range(51)], "depends_on"),
        (["../etc"], "depends_on[0]"),
    ):
        with pytest.raises(ValidationError) as refused:
            submit(store, registry, _scripted("x", after=after), tenant="t", queues=queues)
        assert refused.value.field == field, (after, refused.value)
    assert len(list(store.tasks.live_task_ids())) == before
    assert store.tasks.dependents(mine.task_id) == []
    assert queue_depth(queues, queues.url("normal")) == 0


def test_a_dependency_ending_while_its_dependent_is_submitted_is_never_missed(moto_server: MotoServer) -> None:
    """The submitter writes the edge then looks; the ender writes its status then looks: in
    every interleaving one of them sees the other, and the dependent moves exactly once."""
    settings = deployment(moto_server)
    store, registry, queues = build_store(settings), build_registry(settings), build_queues(settings)
    for round_ in range(15):
        dep = store.tasks.create(_scripted_body(f"dep {round_}"), tenant="t")
        ending = TaskStatus.CANCELLED if round_ % 2 else TaskStatus.FAILED
        made = _race(lambda d=dep.task_id, e=ending: _end(store, queues, d, e),
                     lambda d=dep.task_id: submit(store, registry, _scripted("d", after=[d]), tenant="t", queues=queues))  # fmt: skip
        final = store.tasks.get(made.task_id)
        assert final.status is TaskStatus.CANCELLED, (round_, final.status)
        assert final.error is not None and final.error["code"] == "dependency_failed"


def test_a_failed_head_cancels_every_task_of_a_long_dependency_chain() -> None:
    """A chain of 400 tasks, each depending on the one before: cancelling the head cancels every
    one (dependency_failed, naming the link before it). The cascade once recursed a call per
    link (``task_ended -> release_dependents -> resolve -> task_ended``): RecursionError near
    link 315, the cancel failed, and the rest stayed ``blocked`` for good."""
    store, registry = memory_storage(), ToolRegistry()
    chain = [submit(store, registry, _scripted("x"), tenant="t").task_id]
    for _ in range(400):
        chain.append(submit(store, registry, _scripted("x", after=[chain[-1]]), tenant="t").task_id)
    assert cancel(store, chain[0], tenant="t") == [chain[0]]
    ended = [store.tasks.get(t) for t in chain[1:]]
    assert {t.status for t in ended} == {TaskStatus.CANCELLED}, Counter(t.status.value for t in ended)
    assert [(t.error or {}).get("dependency") for t in ended] == chain[:-1]


def test_a_dependency_cascade_cut_short_is_finished_by_the_next_report_of_the_end() -> None:
    """An ender killed part way down a chain (or a read that failed) leaves the rest ``blocked``,
    which nothing else looks at (no message; the sweeper skips blocked tasks). The next report of
    the head's end (its redelivered message) walks through the dependents already cancelled
    ``dependency_failed`` and cancels the rest, a diamond below them too."""
    store, registry = memory_storage(), ToolRegistry()
    chain = [submit(store, registry, _scripted("x"), tenant="t").task_id]
    for _ in range(12):
        chain.append(submit(store, registry, _scripted("x", after=[chain[-1]]), tenant="t").task_id)
    left, right = (submit(store, registry, _scripted(s, after=[chain[-1]]), tenant="t").task_id for s in "lr")
    bottom = submit(store, registry, _scripted("x", after=[left, right]), tenant="t").task_id
    store.tasks.transition(chain[0], TaskStatus.FAILED)
    for before, link in itertools.pairwise(chain[:6]):  # the ender got this far
        store.tasks.transition(link, TaskStatus.CANCELLED, error={"code": "dependency_failed", "dependency": before})
    assert store.tasks.get(chain[6]).status is TaskStatus.BLOCKED
    release_dependents(store, None, chain[0])  # the head's end reported again
    statuses = Counter(store.tasks.get(t).status.value for t in [*chain[1:], left, right, bottom])
    assert statuses == {"cancelled": len(chain) + 2}, statuses
    assert (store.tasks.get(chain[7]).error or {})["dependency"] == chain[6]


def test_a_cancel_whose_dependency_walk_was_cut_short_leaves_no_dependent_blocked_for_good(
    moto_server: MotoServer,
) -> None:
    """Cancel a blocked task (no message: nothing reports its end again) whose walk fails part
    way (a throttled Query, the API Lambda timing out on a long chain): the cancel answers 5xx,
    a second cancel is a 409, and the rest of the chain waited ``blocked`` for good, as the
    sweeper skipped blocked tasks. The sweep now looks at a blocked task quiet past
    ``stale_after`` whose dependency ended as long ago, and moves it on as the walk would have:
    cancelled down the chain here, queued (and sent) when its dependencies succeeded; one whose
    dependencies still run is left to wait."""
    from agentq.queueing.sweeper import sweep

    settings = deployment(moto_server)
    store, registry, queues = build_store(settings), build_registry(settings), build_queues(settings)
    head = submit(store, registry, _scripted("head"), tenant="t")  # queued, never run
    a = submit(store, registry, _scripted("a", after=[head.task_id]), tenant="t").task_id
    b = submit(store, registry, _scripted("b", after=[a]), tenant="t").task_id
    c = submit(store, registry, _scripted("c", after=[b]), tenant="t").task_id
    dependents = store.tasks.dependents

    def throttled(task_id: str) -> list[str]:
        if task_id == b:
            raise ConnectionError("throttled")
        return dependents(task_id)

    store.tasks.dependents = throttled  # type: ignore[method-assign]
    with pytest.raises(ConnectionError):
        cancel(store, a, tenant="t", queues=queues)
    store.tasks.dependents = dependents  # type: ignore[method-assign]
    assert store.tasks.get(b).status is TaskStatus.CANCELLED
    assert store.tasks.get(c).status is TaskStatus.BLOCKED

    done = submit(store, registry, _scripted("done"), tenant="t").task_id
    after_done = submit(store, registry, _scripted("after done", after=[done]), tenant="t").task_id
    assert Engine(store, worker_id="w", tools=registry).run(done).status is TaskStatus.SUCCEEDED  # no walk after it
    waiting = submit(store, registry, _scripted("waiting", after=[head.task_id]), tenant="t").task_id

    sweep(store, queues, stale_after=60)  # all of it just happened: too soon to tell a walk cut short
    assert store.tasks.get(c).status is TaskStatus.BLOCKED
    report = sweep(store, queues, stale_after=60, now=time.time() + 61)
    ended = store.tasks.get(c)
    assert ended.status is TaskStatus.CANCELLED and (ended.error or {}).get("dependency") == b
    assert store.tasks.get(after_done).status is TaskStatus.QUEUED
    assert store.tasks.get(waiting).status is TaskStatus.BLOCKED  # its dependency is still queued
    assert sorted(report.released) == sorted([c, after_done])
    assert report.swept == [head.task_id]  # queued with no message all along
    assert queue_depth(queues, queues.url("normal")) == 2  # its swept message, and after_done's


def test_a_dependent_whose_enqueue_fails_leaves_nothing_behind(moto_server: MotoServer) -> None:
    """A task without dependencies whose enqueue fails is deleted again, so the caller's retry
    makes one task. One whose dependencies already succeeded is queued by the submitter's look
    (``endings.resolve``), whose send raised out of ``submit_once``: the caller got an error, and
    the task stayed, to be run by the sweeper beside the retry's; with an Idempotency-Key, the
    retry returned it and sent nothing. Now it goes as the plain one does: an error means
    nothing was made, so any retry is safe, with a key or without."""
    settings = deployment(moto_server)
    store, registry, queues = build_store(settings), build_registry(settings), build_queues(settings)
    done = submit(store, registry, _scripted("done"), tenant="t")
    Engine(store, worker_id="w", tools=registry).run(done.task_id)
    assert store.tasks.get(done.task_id).status is TaskStatus.SUCCEEDED
    before = set(store.tasks.live_task_ids())
    unreachable = build_queues(dataclasses.replace(settings, endpoint_url="http://127.0.0.1:9"))
    body = _scripted("after", after=[done.task_id])
    for key in (None, "retry-me"):
        with pytest.raises(Exception, match="Could not connect"):
            submit_once(store, registry, body, tenant="t", queues=unreachable, idempotency_key=key)
    left = [store.tasks.get(t) for t in set(store.tasks.live_task_ids()) - before]
    assert [t.task_id for t in left if not t.status.terminal] == []
    assert store.tasks.dependents(done.task_id) == []  # its edge went with it

    retried = submit_once(store, registry, body, tenant="t", queues=queues, idempotency_key="retry-me")
    assert retried.created and retried.task.status is TaskStatus.QUEUED
    assert store.tasks.dependents(done.task_id) == [retried.task.task_id]
    assert queue_depth(queues, queues.url("normal")) == 1


def test_a_dependents_retry_with_its_idempotency_key_sends_the_message_its_first_request_never_sent(
    moto_server: MotoServer,
) -> None:
    """The first request queued the dependent (its dependency had succeeded) and died before
    the send (here: it had no queues to send to). The retry with its key finds it queued and
    never claimed, and sends its message, as a plain task's retry does (a duplicate is dropped
    by the dispatcher); it used to return the task and send nothing, leaving it to the sweeper."""
    settings = deployment(moto_server)
    store, registry, queues = build_store(settings), build_registry(settings), build_queues(settings)
    done = submit(store, registry, _scripted("done"), tenant="t")
    Engine(store, worker_id="w", tools=registry).run(done.task_id)
    body = _scripted("after", after=[done.task_id])
    first = submit_once(store, registry, body, tenant="t", queues=None, idempotency_key="k")
    assert first.created and first.task.status is TaskStatus.QUEUED
    assert queue_depth(queues, queues.url("normal")) == 0
    again = submit_once(store, registry, body, tenant="t", queues=queues, idempotency_key="k")
    assert not again.created and again.task.task_id == first.task.task_id
    assert queue_depth(queues, queues.url("normal")) == 1


def test_a_dependency_walk_passes_over_a_dependent_deleted_since_it_was_listed() -> None:
    """A dependent whose submission is undone (its enqueue failed) goes with its edge, but a walk
    that listed the edge just before reads a task that is gone: it used to raise TaskNotFound
    and leave the dependency's other dependents blocked."""
    store, registry = memory_storage(), ToolRegistry()
    dep = submit(store, registry, _scripted("dep"), tenant="t").task_id
    gone, kept = (submit(store, registry, _scripted(s, after=[dep]), tenant="t").task_id for s in "gk")
    store.tasks.delete_unstarted(gone)  # its edge left, as a walk that listed it before sees it
    store.tasks.transition(dep, TaskStatus.FAILED)
    release_dependents(store, None, dep)
    assert store.tasks.get(kept).status is TaskStatus.CANCELLED


def _end(store: Any, queues: Any, task_id: str, status: TaskStatus) -> None:
    store.tasks.transition(task_id, status)
    release_dependents(store, queues, task_id)


def _race(first: Any, second: Any) -> Any:
    """Run both at once (a barrier releases them together); returns what ``second`` returned."""
    go = threading.Barrier(2)
    out: list[Any] = []

    def run_first() -> None:
        go.wait()
        first()

    def run_second() -> None:
        go.wait()
        out.append(second())

    threads = [threading.Thread(target=run_first), threading.Thread(target=run_second)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    return out[0]


def _scripted_body(text: str) -> Any:
    from agentq.control.submit import parse_submission

    return parse_submission(_scripted(text))
