"""The task event log (storage/events.py) on both backends: commit order, resumption from any
event with nothing lost or repeated, and a transition racing a step commit."""

from __future__ import annotations

import itertools
import time
from typing import Any

import pytest

from agentq.core.errors import IllegalTransition
from agentq.core.models import RetryState, TaskStatus
from agentq.storage import keys
from agentq.storage.container import Storage
from agentq.storage.event_writes import NewEvent, logged_transact
from agentq.storage.events import CREATED, RANK_EVENT, LogEvent, Position
from agentq.storage.table import Action, Check, Update, present

from ._builders import claimed, llm_step, new_task, tools_step


def _all(store: Storage, task_id: str, after: Position | None = None, limit: int = 200) -> list[LogEvent]:
    head = store.events.head(task_id)
    assert head is not None
    return store.events.read(task_id, head, after, limit=limit)


def _kinds(events: list[LogEvent]) -> list[str]:
    return [e.type + (f":{e.step.number}" if e.step else "") + (f":{e.data['status']}" if "status" in e.data else "")
            for e in events]  # fmt: skip


def _retry(step: int) -> RetryState:
    now = time.time()
    return RetryState(step=step, scope="call", attempt=1, max_attempts=3, code="rate_limited", message="429",
                      at=now, next_at=now + 1)  # fmt: skip


def _a_finished_task(backend: Storage) -> str:
    lease = claimed(backend)
    backend.steps.commit(lease, 1, llm_step(), root_id=lease.task_id)
    backend.tasks.record_retry(lease.task_id, _retry(2), lease=lease)
    backend.steps.commit(lease, 2, tools_step(), root_id=lease.task_id)
    backend.steps.commit(lease, 3, llm_step(text="done"), root_id=lease.task_id, finish=TaskStatus.SUCCEEDED,
                         result="done")  # fmt: skip
    return lease.task_id


def test_a_task_log_holds_creation_claim_steps_retry_and_end_in_commit_order(backend: Storage) -> None:
    task_id = _a_finished_task(backend)
    events = _all(backend, task_id)
    assert _kinds(events) == [
        "task.created:queued",
        "task.status:running",
        "step:1",
        "task.retry",
        "step:2",
        "step:3",
        "task.status:succeeded",
    ]
    assert events[0].position == CREATED
    assert [e.position for e in events] == sorted(e.position for e in events)
    assert len({e.position for e in events}) == len(events)


def test_reading_after_any_event_yields_exactly_the_events_after_it(backend: Storage) -> None:
    task_id = _a_finished_task(backend)
    everything = _all(backend, task_id)
    for i, event in enumerate(everything):
        rest = _all(backend, task_id, Position.parse(str(event.position)))
        assert [e.position for e in rest] == [e.position for e in everything[i + 1 :]]


def test_pages_of_any_size_put_together_are_the_whole_log(backend: Storage) -> None:
    task_id = _a_finished_task(backend)
    everything = [e.position for e in _all(backend, task_id)]
    for size in (1, 2, 3):
        got: list[Position] = []
        after: Position | None = None
        while True:
            page = _all(backend, task_id, after, limit=size)
            if not page:
                break
            got += [e.position for e in page]
            after = page[-1].position
        assert got == everything, size


def test_a_takeover_is_a_second_running_event_after_what_the_first_holder_committed(backend: Storage) -> None:
    task_id = new_task(backend)
    first = backend.tasks.claim(task_id, "w1", 0.05)
    assert first is not None
    backend.steps.commit(first[0], 1, llm_step(), root_id=task_id)
    time.sleep(0.1)
    second = backend.tasks.claim(task_id, "w2", 30)
    assert second is not None
    backend.steps.commit(second[0], 2, tools_step(), root_id=task_id)
    events = _all(backend, task_id)
    assert _kinds(events) == ["task.created:queued", "task.status:running", "step:1", "task.status:running", "step:2"]
    claims = [e for e in events if e.type == "task.status"]
    assert [(c.data["worker"], c.data["epoch"], c.data["takeover"]) for c in claims] == [
        ("w1", 1, False),
        ("w2", 2, True),
    ]


class _StepCommitsFirst:
    """A table whose first transaction is preceded by a step commit of another writer: the
    event's META write then finds ``step`` moved and must go after that step."""

    def __init__(self, table: Any, commit: Any) -> None:
        self._table = table
        self._commit = commit

    def __getattr__(self, name: str) -> Any:
        return getattr(self._table, name)

    def transact(self, actions: list[Action], **kwargs: Any) -> None:
        if self._commit is not None:
            commit, self._commit = self._commit, None
            commit()
        self._table.transact(actions, **kwargs)


def test_an_event_racing_a_step_commit_is_written_once_after_that_step(backend: Storage) -> None:
    lease = claimed(backend)
    backend.steps.commit(lease, 1, llm_step(), root_id=lease.task_id)
    racing = _StepCommitsFirst(
        backend.table, lambda: backend.steps.commit(lease, 2, tools_step(), root_id=lease.task_id)
    )
    logged_transact(
        racing,  # type: ignore[arg-type]
        lease.task_id,
        [Check("meta", keys.meta_key(lease.task_id), present())],
        NewEvent("task.note", {"n": 1}),
    )
    events = _all(backend, lease.task_id)
    assert _kinds(events)[-3:] == ["step:1", "step:2", "task.note"]
    logged = backend.table.query(keys.task_pk(lease.task_id), prefix=keys.EVENT)
    assert [(int(i["seq"]), int(i["after_step"])) for i in logged] == [(1, 2)]


def test_events_logged_by_one_write_take_the_next_places_in_order_after_a_step_it_raced(backend: Storage) -> None:
    lease = claimed(backend)
    backend.steps.commit(lease, 1, llm_step(), root_id=lease.task_id)
    racing = _StepCommitsFirst(
        backend.table, lambda: backend.steps.commit(lease, 2, tools_step(), root_id=lease.task_id)
    )
    logged_transact(
        racing,  # type: ignore[arg-type]
        lease.task_id,
        [Check("meta", keys.meta_key(lease.task_id), present())],
        [NewEvent("budget.raised", {"n": 1}), NewEvent("message.received", {"n": 2})],  # a message with its raise
    )
    events = _all(backend, lease.task_id)
    assert [(e.type, e.data.get("n")) for e in events[-4:]] == [
        ("step", None), ("step", None), ("budget.raised", 1), ("message.received", 2),
    ]  # fmt: skip
    logged = backend.table.query(keys.task_pk(lease.task_id), prefix=keys.EVENT)
    assert [(int(i["seq"]), int(i["after_step"])) for i in logged] == [(1, 2), (2, 2)]
    for i, event in enumerate(events):  # each one a place of its own to resume from
        rest = _all(backend, lease.task_id, Position.parse(str(event.position)))
        assert [e.position for e in rest] == [e.position for e in events[i + 1 :]]


def test_a_refused_transition_logs_nothing(backend: Storage) -> None:
    task_id = _a_finished_task(backend)
    before = _all(backend, task_id)
    with pytest.raises(IllegalTransition):
        backend.tasks.transition(task_id, TaskStatus.WAITING)
    assert [e.position for e in _all(backend, task_id)] == [e.position for e in before]


def test_a_cursor_past_the_end_or_not_issued_by_the_log_is_refused(backend: Storage) -> None:
    task_id = _a_finished_task(backend)
    head = backend.events.head(task_id)
    assert head is not None
    with pytest.raises(ValueError, match="past the end"):
        backend.events.read(task_id, head, Position(head.step + 1, 0, 0))
    for bad in ("1e400", "1.2.3", "1.2.9.0", "-1.0.0.0", "1.0.0.0 ", "", "1.0.0.0\n", "\u0661.0.0.0", "1.0.0.\uff10"):
        with pytest.raises(ValueError):
            Position.parse(bad)


def test_a_position_the_log_calls_consistent_resumes_exactly_and_every_one_it_issued_is(backend: Storage) -> None:
    """``EventLog.consistent`` (what ``Watch.open`` asks of a cursor): every position the log
    returned is consistent, and any position near them that it calls consistent resumes exactly
    after the last real event at or before it. A position whose seq is ahead of its step (``1.3.2.0``
    where event 3 followed step 2) made a read start at the wrong events."""
    task_id = new_task(backend)
    first = backend.tasks.claim(task_id, "w1", 0.05)
    assert first is not None
    backend.steps.commit(first[0], 1, llm_step(), root_id=task_id)
    backend.tasks.record_retry(task_id, _retry(2), lease=first[0])
    backend.steps.commit(first[0], 2, tools_step(), root_id=task_id)
    logged_transact(backend.table, task_id, [Check("meta", keys.meta_key(task_id), present())],
                    [NewEvent("budget.raised", {"n": 1}), NewEvent("message.received", {"n": 2})])  # fmt: skip
    time.sleep(0.1)
    second = backend.tasks.claim(task_id, "w2", 30)  # a takeover at (2, 3)
    assert second is not None
    backend.steps.commit(second[0], 3, llm_step(), root_id=task_id)
    backend.tasks.record_retry(task_id, _retry(4), lease=second[0])
    backend.steps.commit(second[0], 4, llm_step(text="done"), root_id=task_id, finish=TaskStatus.SUCCEEDED,
                         result="done")  # fmt: skip
    head = backend.events.head(task_id)
    assert head is not None
    everything = _all(backend, task_id)
    real = [e.position for e in everything]
    assert all(backend.events.consistent(task_id, head, p) for p in real)
    near = {Position(max(0, p.step + a), max(0, p.seq + b), rank, sub)
            for p in real for a in (-1, 0, 1) for b in (-1, 0, 1) for rank in range(4) for sub in (0, 1, 2)}  # fmt: skip
    refused = 0
    for q in sorted(q for q in near if q <= head.position):
        if not backend.events.consistent(task_id, head, q):
            refused += 1
            continue
        rest = [e.position for e in _all(backend, task_id, q)]
        assert rest == [p for p in real if p > q], (
            f"{q} resumes at {rest[:2]}, not after {max(p for p in real if p <= q)}"
        )
    assert (
        refused
        and Position(1, 3, RANK_EVENT) in near
        and not backend.events.consistent(task_id, head, Position(1, 3, RANK_EVENT))
    )


def _moved_since_read(backend: Storage, how: str) -> tuple[str, dict[str, Any]]:
    """A task read (as a stop's batch read reads it), then moved by ``how`` before a write made
    from that read: its id and the status the write will replace."""
    lease = claimed(backend) if how in ("committed", "logged") else None
    task_id = lease.task_id if lease else new_task(backend)
    ((_, read),) = backend.tasks.read_many([task_id])
    if how == "claimed":  # queued -> running, without moving seq or step
        assert backend.tasks.claim(task_id, "w2", 30) is not None
    elif how == "committed" and lease:  # step moves
        backend.steps.commit(lease, 1, llm_step(), root_id=task_id)
    elif how == "logged":  # seq moves
        backend.tasks.record_retry(task_id, _retry(1))
    return task_id, read


@pytest.mark.parametrize("how", ["nothing", "claimed", "committed", "logged"])
def test_a_transition_written_from_an_earlier_read_returns_the_status_it_replaced(backend: Storage, how: str) -> None:
    """``transition(read=)`` (a stop's fence, written from its batch read, no read of its own)
    reports the status its write replaced, not the one read, whatever moved META in between:
    a claim (status, not seq), a step commit, another event; and logs its event once, last."""
    task_id, read = _moved_since_read(backend, how)
    before = backend.tasks.get(task_id).status.value
    assert backend.tasks.transition(task_id, TaskStatus.CANCELLED, read=read) == before
    assert _kinds(_all(backend, task_id))[-1] == "task.status:cancelled"
    logged = [i["data"].get("status") for i in backend.table.query(keys.task_pk(task_id), prefix=keys.EVENT)]
    assert logged.count("cancelled") == 1


def test_tasks_moved_together_are_each_written_from_their_read_or_left_out_if_they_moved(backend: Storage) -> None:
    """``move_together`` (a stop's fences, one transaction a batch): of tasks read together,
    those unchanged since are moved, each reporting the status it left and logging its event
    once; one claimed, one that committed a step, one that logged an event, one that ended
    since the read are left out (None), unwritten, for the caller to move from a new read."""
    untouched = [new_task(backend), claimed(backend).task_id]
    movers = {how: _moved_since_read(backend, how) for how in ("claimed", "committed", "logged")}
    ended = new_task(backend)
    reads = [m for _, m in backend.tasks.read_many([*untouched, ended])]
    backend.tasks.transition(ended, TaskStatus.CANCELLED)
    everything = [*reads[:2], *(read for _, read in movers.values()), reads[2]]
    before = {tid: len(backend.table.query(keys.task_pk(tid), prefix=keys.EVENT)) for tid in [*untouched, ended]}
    before.update({tid: len(backend.table.query(keys.task_pk(tid), prefix=keys.EVENT)) for tid, _ in movers.values()})
    error = {"code": "cancelled", "message": "stopped"}
    assert backend.tasks.move_together(everything, TaskStatus.CANCELLED, error=error) == [
        "queued", "running", None, None, None, None,
    ]  # fmt: skip
    for tid in untouched:
        assert backend.tasks.get(tid).status is TaskStatus.CANCELLED
        assert _kinds(_all(backend, tid))[-1] == "task.status:cancelled"
    for tid in [*untouched, ended, *(t for t, _ in movers.values())]:
        grown = len(backend.table.query(keys.task_pk(tid), prefix=keys.EVENT)) - before[tid]
        assert grown == (1 if tid in untouched else 0), tid
    for tid, _ in movers.values():
        assert backend.tasks.get(tid).status is TaskStatus.RUNNING


def test_a_transition_from_an_earlier_read_retried_from_a_fresh_read_still_sees_a_claim_in_between(
    backend: Storage,
) -> None:
    """The first attempt (from the caller's read) is refused because an event moved ``seq``; the
    retry writes from a fresh read, and a claim lands between that read and its write. The retry
    is pinned to the status it read too, so it is refused again and written from a third read:
    what it returns is the status it replaced (running), not the one its second read saw."""
    task_id = new_task(backend)
    ((_, read),) = backend.tasks.read_many([task_id])
    backend.tasks.record_retry(task_id, _retry(1))  # seq moves: the first attempt is refused
    table = backend.tasks.table
    original_get = table.get
    gets: list[int] = []

    def get_then_claim(key: Any, *args: Any, **kwargs: Any) -> Any:
        item = original_get(key, *args, **kwargs)
        gets.append(1)
        if len(gets) == 2:  # the retry's fresh read, as a claim comes in right after it
            table.get = original_get  # type: ignore[method-assign]
            assert backend.tasks.claim(task_id, "w2", 30) is not None
        return item

    table.get = get_then_claim  # type: ignore[method-assign]
    try:
        assert backend.tasks.transition(task_id, TaskStatus.CANCELLED, read=read) == "running"
    finally:
        table.get = original_get  # type: ignore[method-assign]
    assert backend.tasks.get(task_id).status is TaskStatus.CANCELLED


def _claim_epochs(events: list[LogEvent]) -> list[int]:
    return [int(e.data["epoch"]) for e in events if e.type == "task.status" and "epoch" in e.data]


def test_a_claim_whose_claimer_died_before_its_record_stays_in_the_log_it_was_read_from(
    backend: Storage, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A claim is in the log from its META write on (a stream may send it then); a claimer
    killed before writing its record (or any record) must not take it out again when the next
    claim replaces META's: every event read at any time is in every later read of the log."""
    task_id = new_task(backend)
    got = backend.tasks.claim(task_id, "w1", 0.001)
    assert got is not None
    backend.steps.commit(got[0], 1, llm_step(), root_id=task_id)
    time.sleep(0.002)
    put = backend.table.put

    def killed_before_its_records(item: Any, **kw: Any) -> None:
        if str(item["sk"]).startswith(keys.CLAIM):
            raise SystemExit("SIGKILL")  # the claimer dies here: nothing of it after its META write
        put(item, **kw)

    monkeypatch.setattr(backend.table, "put", killed_before_its_records)
    with pytest.raises(SystemExit):
        backend.tasks.claim(task_id, "w2", 0.001)
    monkeypatch.setattr(backend.table, "put", put)
    reads = [_all(backend, task_id)]  # what a watcher received meanwhile: epoch 2's claim among it
    assert _claim_epochs(reads[0]) == [1, 2]
    for epoch, worker in ((3, "w3"), (4, "w4")):  # taken over; then again, once 3's record is written
        time.sleep(0.002)
        assert backend.tasks.claim(task_id, worker, 0.001) is not None
        reads.append(_all(backend, task_id))
        assert _claim_epochs(reads[-1]) == list(range(1, epoch + 1))
    _each_read_holds_the_one_before(reads)
    assert [c.epoch for c in backend.tasks.claims(task_id)] == [1, 2, 3, 4]  # epoch 2's record, written by 3
    assert [c.worker for c in backend.tasks.claims(task_id)] == ["w1", "w2", "w3", "w4"]


def test_claims_whose_claimers_died_one_after_another_before_their_records_all_stay_in_the_log(
    backend: Storage, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two claimers in a row killed after their claim's META write and before any record: the
    first one's claim, which a watcher read from META, stays in the log when the third claim
    takes it out of META (written as a record first); and once more with a step between."""
    task_id = new_task(backend)
    got = backend.tasks.claim(task_id, "w1", 0.001)
    assert got is not None
    backend.steps.commit(got[0], 1, llm_step(), root_id=task_id)
    put = backend.table.put

    def killed_before_its_records(item: Any, **kw: Any) -> None:
        if str(item["sk"]).startswith(keys.CLAIM):
            raise SystemExit("SIGKILL")
        put(item, **kw)

    reads = [_all(backend, task_id)]
    for worker in ("w2", "w3"):  # each dies after its META write, before any record
        time.sleep(0.002)
        monkeypatch.setattr(backend.table, "put", killed_before_its_records)
        with pytest.raises(SystemExit):
            backend.tasks.claim(task_id, worker, 0.001)
        monkeypatch.setattr(backend.table, "put", put)
        reads.append(_all(backend, task_id))  # what a watcher was sent meanwhile
    assert _claim_epochs(reads[-1]) == [1, 2, 3]
    time.sleep(0.002)
    last = backend.tasks.claim(task_id, "w4", 0.001)
    assert last is not None
    reads.append(_all(backend, task_id))
    backend.steps.commit(last[0], 2, tools_step(), root_id=task_id)  # drops META's copy of claim 3
    reads.append(_all(backend, task_id))
    _each_read_holds_the_one_before(reads)
    assert _claim_epochs(reads[-1]) == [1, 2, 3, 4]
    assert [(c.epoch, c.worker) for c in backend.tasks.claims(task_id)] == [(1, "w1"), (2, "w2"), (3, "w3"), (4, "w4")]


def _each_read_holds_the_one_before(reads: list[list[LogEvent]]) -> None:
    """Every event of a read is in every later read, in the same order, none new before its last."""
    for earlier, later in itertools.pairwise(reads):
        assert [e for e in later if e.position <= earlier[-1].position] == earlier


def test_claims_made_before_claims_had_positions_never_enter_the_log_afterwards(backend: Storage) -> None:
    """A task claimed before claims had positions (no ``claim_step`` on META or its records) is
    claimed again after: the claims before stay out of the log, none appears before a step it
    has returned and then leaves it."""
    task_id = new_task(backend)
    got = backend.tasks.claim(task_id, "w1", 0.001)
    assert got is not None
    backend.steps.commit(got[0], 1, llm_step(), root_id=task_id)
    meta_key = {"pk": f"TASK#{task_id}", "sk": "META"}
    backend.table.update(meta_key, Update(remove=["claim_step", "claim_seq", "claimed_from"]))  # as it was written then
    backend.table.update(keys.item_key(task_id, keys.claim_sk(1)), Update(remove=["step", "seq", "claimed_from"]))
    reads = [_all(backend, task_id)]
    for worker in ("w2", "w3", "w4"):
        time.sleep(0.002)
        assert backend.tasks.claim(task_id, worker, 0.001) is not None
        reads.append(_all(backend, task_id))
    _each_read_holds_the_one_before(reads)
    assert _claim_epochs(reads[-1]) == [2, 3, 4]


def test_the_first_step_commit_of_a_claim_drops_the_claim_before_it_from_meta_and_the_log_keeps_it(
    backend: Storage,
) -> None:
    task_id = new_task(backend)
    for worker in ("w1", "w2"):
        got = backend.tasks.claim(task_id, worker, 0.001)
        assert got is not None
        time.sleep(0.002)
    assert got is not None
    meta_key = {"pk": f"TASK#{task_id}", "sk": "META"}
    held = backend.table.get(meta_key)
    assert held is not None and held["pc_w"] == "w1"  # until its record is sure to exist
    before = _all(backend, task_id)
    backend.steps.commit(got[0], 1, llm_step(), root_id=task_id)
    meta = backend.table.get(meta_key)
    assert meta is not None and not {"pc_w", "pc_at", "pc_n", "pc_s", "pc_f"} & set(meta)
    after = _all(backend, task_id)
    _each_read_holds_the_one_before([before, after])
    assert _claim_epochs(after) == [1, 2]


def test_a_fork_at_the_last_step_of_a_finished_task_never_logs_the_sources_ending_as_its_own(
    backend: Storage,
) -> None:
    task_id = _a_finished_task(backend)
    source = backend.tasks.get(task_id)
    fork = backend.tasks.fork(source, source.submission, backend.steps.load(task_id, upto=3), tenant=source.tenant)
    assert backend.tasks.get(fork.task_id).status is TaskStatus.QUEUED
    # the source's ending stays in its own log; the fork's has the copied steps and no ending yet
    assert _kinds(_all(backend, task_id))[-1] == "task.status:succeeded"
    assert _kinds(_all(backend, fork.task_id)) == ["task.created:queued", "step:1", "step:2", "step:3"]


class _StepReads:
    """The event log's table, recording the STEP items each query returns."""

    def __init__(self, table: Any) -> None:
        self.table = table
        self.steps: list[str] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.table, name)

    def query(self, *args: Any, **kwargs: Any) -> Any:
        items = self.table.query(*args, **kwargs)
        self.steps += [str(i["sk"]) for i in items if str(i["sk"]).startswith(keys.STEP)]
        return items


def test_a_read_of_a_new_step_reads_no_step_item_already_returned(backend: Storage) -> None:
    lease = claimed(backend)
    for n in (1, 2):
        backend.steps.commit(lease, n, llm_step(text=f"turn {n}"), root_id=lease.task_id)
    head = backend.events.head(lease.task_id)
    assert head is not None
    at_step = _all(backend, lease.task_id)[-1].position  # a client's cursor: the step 2 event it got
    backend.steps.commit(lease, 3, llm_step(text="turn 3"), root_id=lease.task_id)
    recording = _StepReads(backend.events.table)
    backend.events.table = recording
    # a reader that read up to META (the hub's poller) reads the new step alone
    assert _kinds(_all(backend, lease.task_id, head.position)) == ["step:3"]
    assert recording.steps == ["STEP#000003"]
    recording.steps.clear()
    # a cursor at a step reads that step again: its finish, a second event, may follow it
    assert _kinds(_all(backend, lease.task_id, at_step)) == ["step:3"]
    assert recording.steps == ["STEP#000002", "STEP#000003"]
