"""A watcher on the events hub while a task is taken over claim after claim: every claim it was
sent stays in the task's event log, however many claimers die between their claim's META write
and its ``CLAIM#`` record (real worker processes, ``agentq.hub`` fed by moto's stream).

The task's first worker is paused (SIGSTOP) past its liveness: a peer declares it dead and hands
its task on, and it wakes later as a zombie that commits nothing. Each claimer after it is
SIGKILLed right after its claim's META write (``tests/claim_faults.py``), once the
watcher has been sent that claim, so the next peer takes the task over from a claim that has no
record. A last peer runs the task to its end. What the watcher was sent must be the log, read
afresh. A claim lost from the log shows as a watcher's list one event longer, with the lost
claim's id where the log has the next claim's: ``…:4.0.3.2`` where the log has ``…:4.0.3.3``
here (one dead claimer before the log kept META's previous claim, two dead claimers after), as
``…:20.0.3.2`` for ``…:20.0.3.3`` in ``test_events_hub_chaos`` once (docs/ARCHITECTURE.md, 10).
"""

from __future__ import annotations

import os
import signal
import threading
from functools import partial

import pytest

from agentq.api.client import Client
from agentq_dev.stack import LocalStack

from tests.helpers import wait_for
from tests.test_event_stream_kill import BODY

PYTHONPATH = os.pathsep.join(filter(None, [os.getcwd(), os.environ.get("PYTHONPATH", "")]))


class Watcher:
    """A client following the task through the hub: the committed ids it was sent, in order,
    and the epochs of the claims among them."""

    def __init__(self, url: str, task_id: str) -> None:
        self.ids: list[str] = []
        self.epochs: list[int] = []
        self.errors: list[BaseException] = []
        self.lock = threading.Lock()
        self.thread = threading.Thread(target=self._follow, args=(url, task_id), daemon=True)
        self.thread.start()

    def _follow(self, url: str, task_id: str) -> None:
        try:
            for event in Client(url).iter_events(task_id):
                if not event.committed:
                    continue
                with self.lock:
                    self.ids.append(str(event.id))
                    if event.type == "task.status" and "epoch" in event.data:
                        self.epochs.append(int(event.data["epoch"]))
        except BaseException as exc:
            self.errors.append(exc)

    def sent(self, epoch: int) -> bool:
        with self.lock:
            return epoch in self.epochs


@pytest.mark.parametrize("dead_claimers", [1, 2])
def test_every_claim_a_hub_watcher_was_sent_stays_in_the_log_when_claimers_die_before_their_records(
    dead_claimers: int,
) -> None:
    with LocalStack(prefix=f"hubtake{dead_claimers}", workers=0, events_hub=True, sweep_every=None,
                    tool_modules=("tests.effect_tools", "tests.claim_faults"),
                    # the zombie's call in flight is held 1 s, not 30: the last peer does not wait it out
                    extra_env={"PYTHONPATH": PYTHONPATH, "AGENTQ_MAX_CALL_SECONDS": "1"}) as stack:  # fmt: skip
        assert stack.api_server is not None and stack.api_server.hub is not None
        client = Client(stack.api_server.url)
        store = stack.store()
        zombie = stack.spawn_worker()
        task_id = client.submit(BODY).task_id
        watcher = Watcher(stack.api_server.url, task_id)
        wait_for(lambda: store.tasks.get(task_id).step >= 4, timeout=60, what="the first worker's steps")
        os.kill(zombie.pid, signal.SIGSTOP)  # past its liveness: declared dead, its task handed on
        try:
            for n in range(dead_claimers):
                claimer = stack.spawn_worker(AGENTQ_TEST_KILLED_AFTER_CLAIM_WRITE="1")
                assert claimer.wait(timeout=120) == -signal.SIGKILL  # killed at its claim of the task
                wait_for(partial(watcher.sent, n + 2), timeout=60, what=f"the watcher sent claim {n + 2}")
            stack.spawn_worker()  # takes over from the last dead claimer and runs the task to its end
            last = dead_claimers + 2
            wait_for(lambda: store.tasks.get(task_id).lease_epoch >= last, timeout=60, what=f"claim {last}")
        finally:
            os.kill(zombie.pid, signal.SIGCONT)  # it wakes while the task runs on elsewhere
        watcher.thread.join(timeout=120)
        assert not watcher.thread.is_alive() and not watcher.errors, watcher.errors[:1]
        log = list(client.iter_events(task_id, stream=False))  # the log read afresh, JSON pages
        assert log[-1].data["status"] == "succeeded"
        assert watcher.ids == [str(e.id) for e in log]  # every event sent is in the log, once, in order
        claims = [int(e.data["epoch"]) for e in log if e.type == "task.status" and "epoch" in e.data]
        assert claims[: dead_claimers + 2] == list(range(1, dead_claimers + 3))
        assert stack.api_server.hub.reads == 0  # the watcher was on the hub throughout
        assert zombie.poll() is None  # woken, it lives on; it only lost the task
