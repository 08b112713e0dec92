"""Fault injection for crash tests: SIGKILL this process at a named point between two writes.

``AGENTQ_CRASH_AT=after_llm_commit:2`` kills the worker the second time it passes that point.
Real SIGKILL, not an exception: nothing gets to clean up, exactly like a dead Lambda or a
pulled plug. Costs one dict lookup per point when unset.
"""

from __future__ import annotations

import os
import signal
from collections import Counter

CRASH_POINTS = (
    "after_claim",  # lease taken, nothing else written
    "after_reserve",  # tokens held on the budget, no LLM call yet
    "after_llm_call",  # provider answered (tokens spent), step not committed
    "after_batch_submit",  # a batch job submitted (its id recorded), its result not fetched
    "after_step_put",  # a step's item written, META not yet pointing at it (every step commit passes here)
    "after_llm_commit",  # assistant turn with tool intents durable, no tool run yet
    "after_compaction",  # compaction step durable (the summary the conversation goes on from)
    "after_effect_begin",  # side-effect intent recorded, tool not run
    "after_remote_send",  # a remote A2A agent took the message, its task's id not recorded
    "after_remote_recorded",  # the remote task's id recorded on the effect, the task not parked
    "after_tool_run",  # tool ran, its outcome not recorded anywhere
    "after_effect_finish",  # side-effect outcome recorded, tools step not committed
    "after_tools_commit",  # tool results durable (with the next reservation)
    "after_message_commit",  # a person's messages delivered (their step committed), the next call not made
    "after_spawn_record",  # SPAWN record written and shares taken, children not yet written
    "after_spawn",  # children and SPAWN record written, execution not started
    "after_grade_begin",  # an answer's grade begun (effect record), no grader run yet
    "after_grade",  # the grade recorded on its effect record, grade step not committed
    "after_grade_commit",  # grade step durable (the task ended, or the feedback is its next message)
    "after_online_count",  # an online grade counted on its alias's counters, its grade step not committed
    "after_stop_marks",  # a stop marked every task of its scope, none moved to cancelled yet
    "after_fork_steps",  # a fork's placeholder META and copied steps written, its objects and task not yet
)

_passes: Counter[str] = Counter()


def crash_point(name: str) -> None:
    target = os.environ.get("AGENTQ_CRASH_AT")
    if not target:
        return
    _passes[name] += 1
    point, _, nth = target.partition(":")
    if point == name and _passes[name] == int(nth or 1):
        os.kill(os.getpid(), signal.SIGKILL)
