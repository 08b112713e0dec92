"""A deferred task is silent by design, and the sweeper (queueing/sweeper.py) leaves it alone
while its deferral is legitimate: a task put off at a cap waits for the window to roll over in
hops of SQS's longest delay (15 minutes), far longer than the local stack's sweep threshold
(120 s), and a sweep in between would "take over" a run no worker died in. On the local stack's
real workers, with a real cap: the deferral records until when its task is silent
(``silent_until``) and the sweeper counts from then, only a hop that never came is swept, the
claim after a deferral is no resume and no takeover, and a re-deferral keeps when the deferral
began; a call that can never fit under its cap says so."""

from __future__ import annotations

import time
import uuid
from typing import Any

from agentq.core.models import RetryState, TaskStatus
from agentq.core.status import DEFERRED_EPOCH, SILENT_UNTIL
from agentq.queueing.dispatch._context import MAX_DELAY
from agentq.queueing.sweeper import sweep
from agentq.storage.container import Storage

from tests.api_support import ApiStack
from tests.helpers import call, scripted

NOTES = "n" * 800
STALE = 120.0  # the local stack's threshold (LocalStack.sweep_stale_after)


def _long(user: str, turns: int = 30) -> dict[str, Any]:
    script = [{"text": f"turn {i} {NOTES}", "tool_calls": [call("lookup", query=f"q{i}")]} for i in range(turns)]
    return {"goal": "spend", "user": user, "provider": "scripted", "script": {"turns": [*script, {"text": "done"}]},
            "constraints": {"tools": ["lookup"], "max_steps": 100, "max_output_tokens": 300, "max_cost_usd": "5"}}  # fmt: skip


def _deferred(view: dict[str, Any]) -> bool:
    return bool((view.get("retry") or {}).get("error", {}).get("code") == "cap_reached")


def _meta(store: Storage, task_id: str) -> dict[str, Any]:
    return dict(store.tasks.metas([task_id])[0])


def _deferred_at_a_cap(api: ApiStack, prefix: str, daily_tokens: int) -> tuple[str, str, dict[str, Any]]:
    """A key, and a task of a user capped at ``daily_tokens`` a day, as it is first deferred."""
    key = api.stack.create_api_key(f"{prefix}-{uuid.uuid4().hex[:6]}", act_for_users=True)
    user = f"u{uuid.uuid4().hex[:8]}"
    assert api.http("PUT", f"/caps/user/{user}", {"daily_tokens": daily_tokens}, key=key)[0] == 200
    task_id = api.submit(_long(user), key=key)
    return key, task_id, api.until(task_id, _deferred, key=key)


def test_a_task_deferred_at_a_cap_is_not_swept_while_its_deferral_lasts_and_its_next_claim_is_no_resume(
    api_stack: ApiStack,
) -> None:
    api = api_stack
    key, task_id, view = _deferred_at_a_cap(api, "defer", 5_000)
    first = view["retry"]["failed_at"]
    hop_due = first + MAX_DELAY  # a day's deferral comes back in 15-minute hops
    store, queues = api.stack.store(), api.stack.queues()
    # Long past the threshold from its last write, but its hop is not overdue: left alone.
    assert task_id not in sweep(store, queues, stale_after=STALE, now=hop_due + STALE - 5).swept
    meta = _meta(store, task_id)  # silent until its first hop is due, deferred by its first claim
    silent_until = float(meta[SILENT_UNTIL])
    assert hop_due - 5 <= silent_until <= hop_due + 5
    assert int(meta[DEFERRED_EPOCH]) == int(meta["lease_epoch"]) == 1
    # Its hop lost (never came): swept once the hop is the threshold overdue, the backstop kept.
    assert task_id in sweep(store, queues, stale_after=STALE, now=silent_until + STALE + 1).swept
    # The swept message's claim takes a task waiting for its message: no run was taken over.
    api.until(task_id, lambda v: _deferred(v) and int(_meta(store, task_id).get(DEFERRED_EPOCH, 0)) == 2, key=key)
    task = store.tasks.get(task_id)
    assert task.status is TaskStatus.RUNNING and task.lease_epoch == 2
    assert task.resume_count == 0 and task.claimed_from is TaskStatus.QUEUED
    view = api.http("GET", f"/tasks/{task_id}", key=key)[1]
    assert view["retry"]["failed_at"] == first  # the deferral began at the first run, not the hop
    status, trace, _ = api.http("GET", f"/tasks/{task_id}/trace", key=key)
    assert status == 200
    deferrals = [e for e in trace["events"] if e.get("event") == "retry_scheduled"]
    assert [e["at"] for e in deferrals] == [first], deferrals
    claims = [e for e in trace["events"] if e.get("event") == "claimed"]
    assert [(c["epoch"], c["detail"].get("takeover")) for c in claims] == [(1, False), (2, False)], claims
    assert api.http("POST", f"/tasks/{task_id}/cancel", {}, key=key)[0] == 200


def test_a_call_that_can_never_fit_under_its_cap_says_so_while_it_waits(api_stack: ApiStack) -> None:
    api = api_stack
    key, task_id, view = _deferred_at_a_cap(api, "never", 100)
    message = view["retry"]["error"]["message"]
    assert "more than its cap of 100 tokens a day: it can never run under it" in message, message
    assert "raise the cap" in message and "never run under it" in view["activity"], view["activity"]
    assert view["status"] == "running" and time.time() < view["retry"]["next_attempt_at"]
    assert api.http("POST", f"/tasks/{task_id}/cancel", {}, key=key)[0] == 200


def test_a_claim_ends_the_silence_a_retry_kept(
    settings_store: Storage,
) -> None:
    """A retry's silence (a provider's Retry-After, a day) outlived its task's next claim, the
    message having come back early (SQS refuses a visibility past 12 hours): that run's worker
    dying then went unswept for the day. The claim removes it; the run's own writes say it lives."""
    store = settings_store
    task = store.tasks.create(scripted([{"text": "x"}]), tenant="t")
    now = time.time()
    state = RetryState(step=1, scope="delivery", attempt=1, max_attempts=5, code="rate_limited", message="429",
                       at=now, next_at=now + 86_400)  # fmt: skip
    assert store.tasks.record_retry(task.task_id, state, silent_until=now + 86_400)
    assert float(_meta(store, task.task_id)[SILENT_UNTIL]) > now + 80_000
    claimed = store.tasks.claim(task.task_id, "w1", 3.0)
    assert claimed is not None
    assert SILENT_UNTIL not in _meta(store, task.task_id)
