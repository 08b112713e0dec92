"""Online grades counted per agent version and hour (``core.quality``), in the tenant's
partition: item ``QUALITY#<agent>#<hour>#V#<version>`` of ``TENANT#t`` holds the counters
(``graded``, ``passed``, ``errors``, ``unanswered``, ``score_sum``, ``task_cost_usd``,
``grade_cost_usd``, ``grade_tokens``), each added to by one grade, or by one sampled task that
ended without an answer (``unanswered``).

A grade is counted at most once, whoever counts it and however often: the count is one
transaction of the bucket's ADD and a create-only marker ``ONLINE#<step>`` in the task's
partition. A worker killed after counting and before committing the grade step counts again on
resume, and the marker cancels it (``count`` answers False). An unanswered ending's marker is
``ONLINE#end``: once a task, whichever of its ending's paths counts it (its run's, a cancel's,
the dispatcher's dead letter, a redelivery's: ``queueing.endings``).

Every count of a version's hour adds to one item, and DynamoDB cancels a transaction that meets
another on it (``TransactionConflict``): a count is tried again with jittered backoff
(``table.transact_through_conflicts``), and still conflicting it raises, for the caller to leave
for later (the engine keeps it on META's grade, ``uncounted``, for the task's ending to count:
``core.engine._online``). So: one TransactWriteItems
per graded answer or unanswered task, and a read of an agent's quality over N hours is one Query
of the tenant's partition between two sort keys (the versions times N items, a page for a month
of two).
"""

from __future__ import annotations

from decimal import Decimal

from agentq.core.quality import GradeTally, QualityBucket, bucket_of
from agentq.storage import keys
from agentq.storage.table import (
    Item,
    Patch,
    Put,
    Table,
    TransactionCancelled,
    Update,
    absent,
    plain,
    transact_through_conflicts,
)

MICRO = Decimal("0.000001")


class Quality:
    def __init__(self, table: Table) -> None:
        self.table = table

    def count(self, tally: GradeTally) -> bool:
        """Add ``tally`` to its bucket, once (a grade's, or an unanswered ending's: ``step`` None):
        False when it was counted before."""
        answered = tally.step is not None
        sk = keys.online_counted_sk(tally.step) if tally.step is not None else keys.online_unanswered_sk()
        marker = Put(
            "marker", {**keys.item_key(tally.task_id, sk), "version": tally.version, "hour": tally.hour},
            condition=absent(),
        )  # fmt: skip
        scored = tally.score is not None
        adds: dict[str, int | Decimal] = {
            "graded": int(answered),
            "passed": int(tally.passed),
            "errors": int(answered and not scored),
            "unanswered": int(not answered),
            "score_sum": Decimal(str(tally.score)) if tally.score is not None else Decimal(0),
            "task_cost_usd": tally.task_cost_usd.quantize(MICRO),
            "grade_cost_usd": tally.grade_cost_usd.quantize(MICRO),
            "grade_tokens": tally.grade_tokens,
        }
        bucket = Patch(
            "bucket",
            {"pk": keys.tenant_pk(tally.tenant), "sk": keys.quality_sk(tally.agent, tally.hour, tally.version)},
            Update(set={"agent": tally.agent, "version": tally.version, "hour": tally.hour}, add=adds),
        )
        try:
            transact_through_conflicts(self.table, [marker, bucket])  # a busy hour: tried again, with jitter
        except TransactionCancelled as exc:
            if "marker" in exc.failed:
                return False  # counted already
            raise
        return True

    def read(self, tenant: str, agent: str, first_hour: int, last_hour: int) -> list[QualityBucket]:
        """Every version's buckets of ``agent`` from ``first_hour`` to ``last_hour``, by hour then
        version: one Query."""
        low = keys.quality_sk(agent, first_hour, 0)
        high = keys.quality_sk(agent, last_hour, 999_999_999)
        items = self.table.query(keys.tenant_pk(tenant), between=(low, high))
        return [_bucket(agent, raw) for raw in items]


def _bucket(agent: str, raw: Item) -> QualityBucket:
    item = plain(raw, keep_decimal=frozenset({"score_sum", "task_cost_usd", "grade_cost_usd"}))
    return bucket_of(
        agent, int(item["version"]), int(item["hour"]), graded=int(item.get("graded", 0)),
        passed=int(item.get("passed", 0)), errors=int(item.get("errors", 0)), unanswered=int(item.get("unanswered", 0)),
        score_sum=Decimal(item.get("score_sum", 0)), task_cost=Decimal(item.get("task_cost_usd", 0)),
        grade_cost=Decimal(item.get("grade_cost_usd", 0)), grade_tokens=int(item.get("grade_tokens", 0)),
    )  # fmt: skip
