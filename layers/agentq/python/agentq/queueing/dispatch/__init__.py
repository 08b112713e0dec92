"""What to do with one queue message: the policy shared by the Lambda executor and the worker.

``Dispatcher.handle`` runs the task the message names and answers with an ``Action`` the
adapter carries out on SQS: delete it, return it later (retry with backoff), move it to the
DLQ, or leave it alone. Failure classes:

- retryable (provider overload, throttling): the message comes back with exponential backoff;
  on the last allowed attempt the task is marked ``failed`` with the error and the message
  goes to the DLQ, from where a redrive resumes it at its checkpoint, out of that failure only
  (its id, META's ``dead_letter``, rides on the dead letter); a delivery that finds the task
  failed by another (a duplicate) deletes its copy instead;
- permanent (bad request, budget, caps): the engine ends the task; the message is deleted;
- deterministic (``DETERMINISTIC_FAULTS``: a script that cannot load, a submission or step that
  no longer validates, a bug every run meets): the task ends ``failed`` with the error at once
  and its parent is told, never retried until SQS dead-letters a task whose status says running;
- poison (not JSON, not a task message, unknown task, a task that cannot be read): straight to
  the DLQ with the reason.

Any other exception escaping a run (an outage) is a retryable failure like a provider's.

The package, by module, top to bottom (a message's walk only goes down; pyproject's
``agentq-dispatch`` contract holds it): ``_dispatcher`` (``Dispatcher``: parse, then the
handler of the message's kind, ``HANDLERS``); one module per kind: ``_run`` (run, continue,
safety_net, renewed, swept, recovered, release_holds, redrive), ``_wake``, ``_approval_due``,
``_batch_poll``, ``_schedule``; what the kinds share: ``_arrival`` (read the task, its token,
renew a message worn by worker faults), ``_attempt`` (one run: gate, engine, ending, outcome)
and ``_looks`` (a stray look told from the due one); below them ``_ended`` (a message for an
ended task: a redelivery or a redrive), ``_outcome`` (the Action for a run's outcome, its
follow-up messages), ``_gate`` (fair share);
then ``_failures`` (counting failures, the last attempt's dead letter, a deterministic fault),
``_notes`` (retry and deferral notes), ``_poison``; and ``_context`` (``Context``, ``Delivery``,
``Action``, ``RetryBackoff``). A task's ending is ``queueing.endings.task_ended``.
Adding a kind is a module and its line in ``HANDLERS``.
"""

from agentq.queueing.dispatch._context import (
    DEFAULT_BACKOFF,
    MAX_DELAY,
    MAX_VISIBILITY,
    Action,
    ActionKind,
    Context,
    Delivery,
    RetryBackoff,
    delay_seconds,
)
from agentq.queueing.dispatch._dispatcher import HANDLERS, Dispatcher

__all__ = [
    "DEFAULT_BACKOFF",
    "HANDLERS",
    "MAX_DELAY",
    "MAX_VISIBILITY",
    "Action",
    "ActionKind",
    "Context",
    "Delivery",
    "Dispatcher",
    "RetryBackoff",
    "delay_seconds",
]
