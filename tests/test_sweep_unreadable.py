"""One unreadable task does not stop the sweeper's pass (queueing/sweeper.py): a task stored as
no code of ours reads it (here a submission that is not JSON, as a hand edit or a release that
wrote what this one refuses leaves it) was read with the rest of the pass's tasks in one batch,
and its error failed the whole pass, every pass: in AWS the scheduled sweeper failing every five
minutes and no stranded task anywhere re-enqueued. Now it is left out, named in a warning, and
the others are swept. On moto server, the store and queues the sweeper uses in AWS."""

from __future__ import annotations

import logging

import pytest

from agentq.queueing.queues import TaskQueues
from agentq.queueing.sweeper import sweep
from agentq.runtime import build_queues
from agentq.storage import keys
from agentq.storage.container import Storage
from agentq.storage.table import Update
from agentq_dev.moto_server import MotoServer

from tests.helpers import deployment, scripted

STALE_AFTER = 60.0


@pytest.fixture(scope="module")
def queues(moto_server: MotoServer) -> TaskQueues:
    return build_queues(deployment(moto_server))


def test_a_task_no_code_reads_is_left_out_of_a_sweep_and_the_others_are_swept(
    store: Storage, queues: TaskQueues, caplog: pytest.LogCaptureFixture
) -> None:
    stranded = [store.tasks.create(scripted([{"text": "done"}]), tenant="sweepbad") for _ in range(3)]
    broken = stranded[1]
    store.table.update(keys.submission_key(broken.task_id), Update(set={"submission": "{not json"}))
    later = max(store.tasks.metas([t.task_id for t in stranded]), key=lambda m: float(m["updated_at"]))
    with caplog.at_level(logging.WARNING, logger="agentq.sweeper"):
        report = sweep(store, queues, stale_after=STALE_AFTER, now=float(later["updated_at"]) + 10 * STALE_AFTER)
    assert set(report.swept) >= {stranded[0].task_id, stranded[2].task_id}
    assert broken.task_id not in report.swept
    assert any(broken.task_id in r.getMessage() and "cannot be read" in r.getMessage() for r in caplog.records)
