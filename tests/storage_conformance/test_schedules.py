"""A schedule's writes on both backends (``storage.schedules``): a claim is taken by one of two
fires that read the same schedule, released only while it stands, and a fire (made or skipped)
is counted once per fire time."""

from __future__ import annotations

from agentq.core.schedules import ScheduleSpec
from agentq.storage.container import Storage

SPEC = ScheduleSpec(name="nightly", expression="rate(1 hour)", submission={"goal": "g"})


def test_of_two_fires_that_read_the_same_schedule_one_claims_it_and_its_release_puts_back_what_it_read(
    backend: Storage,
) -> None:
    backend.schedules.put("acme", SPEC, 3600.0)
    read = backend.schedules.get("acme", "nightly")
    assert backend.schedules.claim(read, "first", at=10.0)
    assert not backend.schedules.claim(read, "second", at=10.5)  # read before the first claimed
    claimed = backend.schedules.get("acme", "nightly")
    assert (claimed.last_task_id, claimed.claimed_at) == ("first", 10.0)
    assert backend.schedules.claim(claimed, "first", at=11.0)  # its own redelivery claims it again

    backend.schedules.release(read, "second")  # not the claim standing: nothing changes
    assert backend.schedules.get("acme", "nightly").last_task_id == "first"
    backend.schedules.release(read, "first")
    back = backend.schedules.get("acme", "nightly")
    assert (back.last_task_id, back.claimed_at) == (None, None)


def test_a_fire_is_counted_once_for_its_fire_time(backend: Storage) -> None:
    backend.schedules.put("acme", SPEC, 3600.0)
    assert backend.schedules.record_fire("acme", "nightly", 3600.0)
    assert not backend.schedules.record_fire("acme", "nightly", 3600.0)  # a repeated delivery
    assert backend.schedules.record_fire("acme", "nightly", 7200.0, task_id="t2")
    kept = backend.schedules.get("acme", "nightly")
    assert (kept.fired, kept.last_task_id) == (2, "t2")
    backend.schedules.delete("acme", "nightly")
    assert not backend.schedules.record_fire("acme", "nightly", 10800.0)  # deleted meanwhile: nothing written
    assert backend.schedules.list() == []


def test_a_skip_is_counted_once_for_its_fire_time(backend: Storage) -> None:
    backend.schedules.put("acme", SPEC, 3600.0)
    assert backend.schedules.record_skip("acme", "nightly", 3600.0)
    assert not backend.schedules.record_skip("acme", "nightly", 3600.0)
    assert backend.schedules.record_skip("acme", "nightly", 7200.0)
    kept = backend.schedules.get("acme", "nightly")
    assert (kept.skipped, kept.last_skipped_slot) == (2, 7200.0)


def test_the_next_fire_moves_on_and_never_back(backend: Storage) -> None:
    backend.schedules.put("acme", SPEC, 3600.0)
    backend.schedules.move_on("acme", "nightly", 7200.0)
    backend.schedules.move_on("acme", "nightly", 3600.0)  # an earlier fire delivered again
    assert backend.schedules.get("acme", "nightly").next_fire_at == 7200.0
