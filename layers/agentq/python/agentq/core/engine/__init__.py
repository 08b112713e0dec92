"""The agent loop: claim, rebuild from committed steps, and go on step by step.

Order of writes in one turn (each a crash point, see ``faults``):
reserve -> LLM call -> commit LLM step (tool intents durable) -> per side-effecting tool:
begin effect -> run -> finish effect -> [the workspace's changed content, then its manifest, to
S3 (``_workspace``)] -> commit tools step naming that manifest (+ reserve the next call).
An answer of a task with an outcome: commit LLM step (not ending the task) -> begin the grade's
effect -> judges run -> finish the effect with the grade -> commit grade step (its model's usage
settled, the task ended or the feedback its next message) (``_grade``).
A worker killed anywhere loses at most the step in flight; the next worker rebuilds the
conversation from the committed steps and continues. Knows nothing of SQS or Lambda: the
adapters pass a deadline and read the ``RunResult``.

The package, by module: ``_loop`` (``Engine``: claim, the loop, how a run ends), one module per
kind of turn (``_llm_turn``, ``_tool_turn``, ``_tool_call``, ``_approvals``, ``_spawn``, ``_grade``) over the
protocol they share (``_operation``), budget holds (``_holds``; ``_spent``, a hold counted as spent), the request (``_request``), the
step commit (``_commit``), why a call must not start (``_stops``), ending a task without a step
(``_finish``), the session and its lease (``_session``), the task's workspace (``_workspace``);
public: ``conversation`` (pure helpers ``control`` uses too), ``config``, ``result``. The LLM turn
orchestrates four modules, each owning what it touches: which model takes the call
(``_llm_route``: admission and fallbacks), the call on the wire (``_llm_call``: its attempts,
their holds, a cut at the timeout, a failure; ``Call`` is one call's own state), economy's
batches (``_llm_batch``), and the answer's commit (``_llm_answer``: the step with its settlement,
or an orphan).
"""

from agentq.core.engine._holds import HoldsInFlight
from agentq.core.engine._llm_batch import batch_poll_seconds, count_batch_hold_as_spent
from agentq.core.engine._loop import Engine
from agentq.core.engine._request import cache_ttl
from agentq.core.engine._session import KeeperFactory, LeaseKeeper, LeaseState, Session
from agentq.core.engine._spent import count_as_spent, spend_lapsed
from agentq.core.engine.config import EngineConfig
from agentq.core.engine.conversation import (
    conversation,
    estimate_input_tokens,
    final_text,
    offered_tools,
    task_tools,
)
from agentq.core.engine.result import Outcome, RunResult

__all__ = [
    "Engine",
    "EngineConfig",
    "HoldsInFlight",
    "KeeperFactory",
    "LeaseKeeper",
    "LeaseState",
    "Outcome",
    "RunResult",
    "Session",
    "batch_poll_seconds",
    "cache_ttl",
    "conversation",
    "count_as_spent",
    "count_batch_hold_as_spent",
    "estimate_input_tokens",
    "final_text",
    "offered_tools",
    "spend_lapsed",
    "task_tools",
]
