"""The table core: the few primitives every storage backend implements, and the conditions
the repositories build from.

Repositories (tasks, steps, budgets, ...) are written once against ``Table``; a backend
(``DynamoTable`` on DynamoDB, ``MemoryTable`` in memory) implements only these primitives.
So the invariants live in one place: a condition is data (``boto3.dynamodb.conditions``),
rendered to an expression by one backend and evaluated by the other, and the conformance
suite (tests/storage_conformance) runs every repository over both.

Transactions name their actions. A cancelled transaction raises ``TransactionCancelled``
with the names of the actions whose condition failed, so a caller says "the budget refused"
by name instead of decoding a list of reasons by position.

Items cross this seam as plain dicts of DynamoDB-typed Python values: numbers come back as
``Decimal`` (``plain`` turns them into int/float), ``None`` attributes are not stored.

Light to import on purpose: importing this module loads neither boto3 nor pydantic (the
condition helpers import boto3's condition classes when first called). The authorizer Lambda
reads API keys through this seam, and boto3 (with s3transfer and multiprocessing) and the models
are about 200 ms of a cold start it has no use for (``bench/import_time.py``).
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import TYPE_CHECKING, Any, Literal, Protocol, TypeAlias

from agentq.core.status import TaskStatus

if TYPE_CHECKING:
    from boto3.dynamodb.conditions import ConditionBase

    from agentq.core.models import Lease

Item: TypeAlias = dict[str, Any]
Key: TypeAlias = dict[str, str]
Returns = Literal["NONE", "ALL_NEW", "ALL_OLD", "UPDATED_NEW"]

MAX_TRANSACTION_ACTIONS = 100


class ConditionFailed(Exception):
    """A single write's condition was false; ``old`` is the item as it was (None if absent)."""

    def __init__(self, old: Item | None) -> None:
        super().__init__("the condition of the write was not met")
        self.old = old


class IdempotentParameterMismatch(Exception):
    """A transaction token was reused for a different transaction (DynamoDB keeps a token
    for ten minutes): a caller bug, never an answer about the data."""


class TransactionCancelled(Exception):
    """A transaction wrote nothing because the conditions of ``failed`` (action names) were false."""

    def __init__(self, failed: frozenset[str]) -> None:
        super().__init__(f"transaction cancelled by {', '.join(sorted(failed)) or 'a conflict'}")
        self.failed = failed


class TransactionConflict(Exception):
    """A transaction lost a race with another write to one of its items (DynamoDB's
    ``TransactionConflict`` reason): nothing was written, and trying again may succeed."""


@dataclass(frozen=True)
class Update:
    """What an update does to one item. ``add`` adds to a number (a missing attribute counts as
    0, like DynamoDB's ``ADD``); ``set_if_absent`` sets only attributes not yet present. Every
    operand is read from the item as it was before the write, as in DynamoDB."""

    set: Mapping[str, Any] = field(default_factory=dict)
    add: Mapping[str, int | Decimal] = field(default_factory=dict)
    remove: Sequence[str] = ()
    set_if_absent: Mapping[str, Any] = field(default_factory=dict)
    # target -> (source, default): the source attribute's value before this write, else default
    copy_from: Mapping[str, tuple[str, Any]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        seen: set[str] = set()
        for names in (self.set, self.add, self.remove, self.set_if_absent, self.copy_from):
            overlap = seen & set(names)
            if overlap:
                raise ValueError(f"attribute(s) {sorted(overlap)} updated twice in one write")
            seen |= set(names)


@dataclass(frozen=True)
class Put:
    name: str
    item: Item
    condition: ConditionBase | None = None


@dataclass(frozen=True)
class Patch:
    name: str
    key: Key
    update: Update
    condition: ConditionBase | None = None


@dataclass(frozen=True)
class Delete:
    name: str
    key: Key
    condition: ConditionBase | None = None


@dataclass(frozen=True)
class Check:
    name: str
    key: Key
    condition: ConditionBase


Action: TypeAlias = Put | Patch | Delete | Check


@dataclass(frozen=True)
class Page:
    items: list[Item]
    last_key: Item | None  # where the next page starts; None at the end


class Table(Protocol):
    """The primitives. Reads are strongly consistent; a write's ``condition`` is evaluated on
    the item as stored (an absent item has no attributes)."""

    name: str

    def get(self, key: Key, *, consistent: bool = True) -> Item | None: ...

    def query(
        self,
        pk: str,
        *,
        prefix: str | None = None,
        between: tuple[str, str] | None = None,
        descending: bool = False,
        limit: int | None = None,
        keys_only: bool = False,
        after: str | None = None,
        attributes: Sequence[str] | None = None,
    ) -> list[Item]:
        """Items of partition ``pk`` in sort-key order (all pages, or the first ``limit``).
        ``after``: only those past this sort key (in the query's direction; a page of a listing
        goes on from its last item's key, whether or not that item still exists).
        ``attributes``: only these attributes of each item (a projection: a listing that needs
        no large attribute reads it neither from the table nor over the wire)."""
        ...

    def query_index(
        self,
        index: str,
        partition: tuple[str, str],
        *,
        descending: bool,
        limit: int,
        filter: ConditionBase | None = None,
        start: Item | None = None,
    ) -> Page:
        """One page of a global secondary index (``limit`` items read before ``filter``)."""
        ...

    def put(self, item: Item, *, condition: ConditionBase | None = None) -> None: ...

    def update(
        self, key: Key, update: Update, *, condition: ConditionBase | None = None, returns: Returns = "NONE"
    ) -> Item | None: ...

    def delete(self, key: Key, *, condition: ConditionBase | None = None) -> Item | None:
        """Delete and return the old item (None if there was none)."""
        ...

    def transact(self, actions: Sequence[Action], *, token: str | None = None) -> None:
        """All or nothing. ``token`` makes a retry of a transaction that went through a no-op."""
        ...

    def batch_get(self, keys: Sequence[Key]) -> list[Item]: ...

    def batch_delete(
        self, keys: Sequence[Key], *, attempts: int = 8, sleep: Callable[[float], None] = time.sleep
    ) -> None:
        """Delete many items; what the table leaves unprocessed (throttling) is retried with
        backoff up to ``attempts`` times, then a RuntimeError says so."""
        ...


# A stop's mark on META (``control.stops``): the stop's scope, set before the task is moved to
# ``cancelled`` and taken off by that move (any status change) or by the next claim.
STOPPING = "stopping"


def fence(lease: Lease) -> ConditionBase:
    """The lease fence: the writer still holds the epoch it claimed, the task still runs, and no
    stop has marked it (``STOPPING``).

    Every write a worker makes on behalf of a task carries it (directly or as a ``Check`` in
    the same transaction), so a zombie woken after a takeover can write nothing, and neither
    can a worker once a stop marked its task: the mark is a write that pins nothing, so no step
    committed meanwhile can refuse it (the transition to ``cancelled`` that follows pins META's
    ``seq`` and ``step``, which nothing then moves).
    """
    from boto3.dynamodb.conditions import Attr

    return (
        Attr("lease_epoch").eq(lease.epoch) & Attr("status").eq(TaskStatus.RUNNING.value) & Attr(STOPPING).not_exists()
    )


def fence_holds(item: Mapping[str, Any] | None, lease: Lease) -> bool:
    """Whether ``item`` (a META as read, or as a refused write found it) still passes ``fence``."""
    return (
        item is not None
        and item.get("lease_epoch") == lease.epoch
        and item.get("status") == TaskStatus.RUNNING.value
        and STOPPING not in item
    )


def merge(name: str, *writes: Patch | Check) -> Patch:
    """Several writes to one item as one write: their updates together, their conditions all.

    A transaction may touch an item only once, and one conditional write of one item is a
    fraction of the price of a transaction (a transactional write costs twice, per item). The
    price is that a refusal no longer says which of the conditions failed: the caller reads the
    item to tell (``ConditionFailed.old``, or a read after a cancelled transaction).
    """
    key = writes[0].key
    sets: dict[str, Any] = {}
    adds: dict[str, int | Decimal] = {}
    removes: list[str] = []
    if_absent: dict[str, Any] = {}
    copies: dict[str, tuple[str, Any]] = {}
    condition: ConditionBase | None = None
    for write in writes:
        if write.key != key:
            raise ValueError(f"cannot merge writes to {key} and {write.key}")
        if isinstance(write, Patch):
            update = write.update
            twice = (set(sets) | set(adds) | set(removes) | set(if_absent) | set(copies)) & (
                set(update.set)
                | set(update.add)
                | set(update.remove)
                | set(update.set_if_absent)
                | set(update.copy_from)
            )
            if twice:
                raise ValueError(f"attribute(s) {sorted(twice)} updated by two of the merged writes")
            sets.update(update.set)
            adds.update(update.add)
            removes += update.remove
            if_absent.update(update.set_if_absent)
            copies.update(update.copy_from)
        if write.condition is not None:
            condition = write.condition if condition is None else condition & write.condition
    merged = Update(set=sets, add=adds, remove=removes, set_if_absent=if_absent, copy_from=copies)
    return Patch(name, key, merged, condition)


def absent() -> ConditionBase:
    """The item does not exist yet (a put never overwrites)."""
    from boto3.dynamodb.conditions import Attr

    return Attr("pk").not_exists()


def present() -> ConditionBase:
    from boto3.dynamodb.conditions import Attr

    return Attr("pk").exists()


def status_in(statuses: Iterable[TaskStatus]) -> ConditionBase:
    from boto3.dynamodb.conditions import Attr

    return Attr("status").is_in([s.value for s in statuses])


def plain(item: Mapping[str, Any], *, keep_decimal: frozenset[str] = frozenset()) -> Item:
    """Numbers as int or float (Decimal kept for ``keep_decimal``), recursively."""
    return {k: (v if k in keep_decimal else _plain(v)) for k, v in item.items()}


def _plain(value: Any) -> Any:
    if isinstance(value, Decimal):
        return int(value) if value == value.to_integral_value() else float(value)
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def chunks(actions: Sequence[Action], size: int = MAX_TRANSACTION_ACTIONS) -> Iterable[Sequence[Action]]:
    for i in range(0, len(actions), size):
        yield actions[i : i + size]


def transact_leaving_out(table: Table, parts: int, actions_of: Callable[[int], Sequence[Action]]) -> list[bool]:
    """The actions of ``parts`` parts (each its own task's, say) in one transaction, built by
    ``actions_of(i)`` each round: a part any of whose actions' conditions failed is left out and
    the others tried again, until one transaction goes through. Which parts were written, in
    order; none on a ``TransactionConflict`` (nothing was written: the caller writes them its
    own way), nor when a refusal names no part's action."""
    pending = list(range(parts))
    while pending:
        batch = [(i, action) for i in pending for action in actions_of(i)]
        try:
            table.transact([action for _, action in batch])
            break
        except TransactionCancelled as exc:
            failed = {i for i, action in batch if action.name in exc.failed}
            if not failed:
                return [False] * parts
            pending = [i for i in pending if i not in failed]
        except TransactionConflict:
            return [False] * parts
    return [i in pending for i in range(parts)]


RELEASE_ATTEMPTS = 5
RELEASE_BACKOFF_SECONDS = 0.02  # the first retry's ceiling; doubles each time (full jitter)


def transact_through_conflicts(table: Table, actions: Sequence[Action]) -> None:
    """A transaction that gives running slots back (a release's, a deleted submission's), or adds
    to an hour's quality bucket (``storage.quality``), retried while it meets a
    TransactionConflict. A conflict says another transaction was writing the hot item at the
    same moment (the slot item every admission and release of the tenant writes; the bucket every
    grade of a version that hour adds to), not that the write was made: dropping a release would
    lose the slot for good. Bounded, with jitter (at most ~0.3 s of waits); still conflicting, the
    conflict is raised, for the caller to leave for later (the message not deleted, its next
    delivery releases; the count kept on the task for its ending to make). A memory store's
    deletion uses it too (``storage.memory_items.finish_deletion``: every delete checks the
    store's one item, as a concurrent deleter's do; still conflicting, the caller is told to try
    again)."""
    for attempt in range(RELEASE_ATTEMPTS):
        try:
            table.transact(actions)
            return
        except TransactionConflict:
            if attempt == RELEASE_ATTEMPTS - 1:
                raise
            time.sleep(random.uniform(0, RELEASE_BACKOFF_SECONDS * 2**attempt))
