"""Budgets: the token budget every task carries on its own META, and its settlements.

``used <= cap`` holds always because a reservation is a conditional write: ``available``
is kept as its own attribute (DynamoDB conditions cannot do arithmetic) and a hold succeeds
only if ``available >= amount``. A reservation also records an ``inflight`` ticket on the
task's META, and a hold is returned only together with removing the ticket of its epoch, so a
resumed worker and a zombie cannot both return it.

A ticket carries ``until``, the hold's deadline: the time after which the call it pays for can
no longer complete (the call's start, at the latest, plus the provider's maximum call time).
Until then the call may be in flight in a paused worker whose lease lapsed. A successor
therefore never returns an older epoch's live hold: it sets the ticket aside as
``lapsed_<epoch>`` (still counted in ``reserved``) and reserves on top of it when the budget
can cover both, so a resume after a crash does not wait. Only when it cannot does it wait for
the earliest lapsed deadline (the engine defers the task). Returned early instead, a zombie's
late usage would land on top of the successor's and push ``used`` past ``cap``. Whoever learns
of the call's end settles the hold once: the zombie with its usage (``settle_orphan`` finds its
ticket under any name), conditional on the ticket still being there.

A deadline passed with the call's outcome unknown does not mean the call did not happen: the
provider may have answered a worker that was paused (SIGSTOP, a long GC, a frozen VM) and will
report the answer when it wakes. So after its deadline a hold is counted as spent, never
returned (``spend_lapsed``: ``reserved`` moves to ``used``, ``available`` is unchanged, and the
ticket becomes ``spent_<epoch>``). If the call is ever reported, ``settle_orphan`` finds that
ticket and corrects ``used`` to the real usage (frees ``hold - actual``), once. ``used <= cap``
then holds always, and the ledger equals the provider's usage whenever every call's outcome is
known. ``extend_hold`` moves a deadline, fenced, when a call starts later than its reservation
allowed for: a zombie fails that write and never starts its call.

Why on META and not an item of its own: every task draws on its own budget (a root's is the
tree's cap, a child's the share its parent moved to it), and every step commit writes META
anyway. With the budget there, a step's settlement, its next reservation, the lease fence and
the step counter are one conditional write of one item: no second item in the step's
transaction (a transactional write costs two units per item), and still all or nothing. The
attributes are ``cap``, ``reserved``, ``used``, ``available``, the tree's spend
``budget_cost_usd``/``budget_tokens_in``/``budget_tokens_out`` (children folded in, orphaned
calls included: not the task's own ``cost_usd``/``tokens_in``/``tokens_out``) and, on a child
whose spend was folded into its parent, ``budget_settled``.

Money (``max_cost_usd``) is the same ledger in millionths of a dollar, kept beside the tokens
in the same writes: ``usd_cap``, ``usd_reserved``, ``usd_used``, ``usd_available``. A hold
takes the most its call can cost (``ModelPrice.hold_micros``: every input token at the dearest
input rate), the ticket carries it as ``usd``, and the settlement replaces it with the call's
priced cost, rounded up to the millionth: so ``usd_used <= usd_cap`` holds always, exactly as
``used <= cap`` does. A budget without ``max_cost_usd`` gets ``NO_MONEY_CAP``: both ledgers
always run, one code path. META written before money budgets has no ``usd_available``; its
holds pass (no cap was asked for).
"""

from __future__ import annotations

from typing import Any

from boto3.dynamodb.conditions import Attr

from agentq.core.errors import BudgetExceeded, TaskNotFound
from agentq.core.models import MAX_DEPTH, Lease
from agentq.core.pricing import NO_MONEY_CAP
from agentq.core.records import NO_USAGE, BudgetDelta, BudgetState, Reservation
from agentq.storage import keys
from agentq.storage.budget_folds import ANCESTOR, ancestor_fixes, folded_line
from agentq.storage.budget_items import (
    SETTLED,
    BudgetRaise,
    as_read,
    budget_state,
    lapsed_name,
    seen_ticket,
    spent_name,
    ticket_value,
)
from agentq.storage.budget_patches import (
    BUDGET,
    correction,
    if_folded,
    money_covers,
    seen_as_known,
    settle_and_reserve,
    summed,
    unless_folded,
)
from agentq.storage.event_writes import NewEvent, logged_transact
from agentq.storage.leases import why_fenced
from agentq.storage.table import (
    Check,
    ConditionFailed,
    Patch,
    Table,
    TransactionCancelled,
    Update,
    fence,
    fence_holds,
    merge,
    plain,
    present,
)

# A task's batch record (``Task.batch``) and the mark that its windows' hold was taken
# (``batch_settled``): removed in the write that settles a batch's hold when its answer will not
# be committed, so the settlement and the forgetting are one, and the batch is charged once
# whoever dies between them.
BATCH = ["batch", "batch_settled"]


class Budgets:
    def __init__(self, table: Table) -> None:
        self.table = table

    def get(self, budget_id: str) -> BudgetState:
        item = self.table.get(keys.meta_key(budget_id))
        if item is None or "cap" not in item:
            raise TaskNotFound(f"no budget for task {budget_id!r}", field="root_id")
        return budget_state(item)

    def reserve(
        self, lease: Lease, budget_id: str, amount: int, step: int, *, until: float | None = None, micros: int = 0
    ) -> Reservation:
        """Hold ``amount`` tokens (and ``micros`` millionths of a dollar) on the budget and
        record it on META, atomically and fenced.

        ``until`` is the hold's deadline (see the module), kept on the ticket.

        On the task's own budget that is one conditional UpdateItem; on another task's (the
        budget of a tree shared by racing tasks in tests) a transaction of the two.
        Raises BudgetExceeded when the budget has less than ``amount`` available.
        """
        ticket = Patch(
            "meta",
            keys.meta_key(lease.task_id),
            Update(set={"inflight": ticket_value(amount, lease.epoch, step, until, micros)}),
            fence(lease),
        )
        hold = settle_and_reserve(budget_id, NO_USAGE, amount, micros)
        if budget_id == lease.task_id:
            both = merge("meta", ticket, hold)
            try:
                self.table.update(both.key, both.update, condition=both.condition)
            except ConditionFailed as exc:
                if fence_holds(exc.old, lease):
                    raise BudgetExceeded(f"budget {budget_id} cannot cover {amount} tokens") from exc
                raise why_fenced(self.table, lease) from exc
            return Reservation(amount=amount, epoch=lease.epoch, step=step, until=until, micros=micros)
        try:
            self.table.transact([hold, ticket])
        except TransactionCancelled as exc:
            if BUDGET in exc.failed:
                raise BudgetExceeded(f"budget {budget_id} cannot cover {amount} tokens") from exc
            raise why_fenced(self.table, lease) from exc
        return Reservation(amount=amount, epoch=lease.epoch, step=step, until=until, micros=micros)

    def many(self, budget_ids: list[str]) -> dict[str, BudgetState]:
        """The budgets of many tasks (BatchGetItem of their METAs), by id; those without one left out."""
        items = self.table.batch_get([keys.meta_key(b) for b in budget_ids])
        return {keys.task_id_of(i["pk"]): budget_state(i) for i in items if "cap" in i}

    def inflight(self, task_id: str) -> Reservation | None:
        item = self.table.get(keys.meta_key(task_id))
        raw = plain(item or {}).get("inflight")
        return Reservation.from_ticket(raw) if raw else None

    def extend_hold(self, lease: Lease, held: Reservation, until: float) -> None:
        """Move this epoch's hold deadline to ``until`` before its call starts; fenced, so a
        worker that lost its lease learns it here and does not start the call."""
        condition = fence(lease) & Attr("inflight.epoch").eq(lease.epoch)
        ticket = ticket_value(held.amount, lease.epoch, held.step, until, held.micros)
        try:
            self.table.update(keys.meta_key(lease.task_id), Update(set={"inflight": ticket}), condition=condition)
        except ConditionFailed as exc:
            raise why_fenced(self.table, lease) from exc

    def adopt(self, lease: Lease, held: Reservation, batch: dict[str, Any]) -> None:
        """Make an older epoch's hold this epoch's own: the hold of a batched call (economy),
        whose worker parked the task and let go; its result is settled by whoever claims it
        next. ``batch``, the task's batch record, names this epoch in the same write: a run
        that dies after reading the answer leaves the next claim to adopt it again, not to take
        it for a lost worker's hold. Fenced, and only while that epoch's ticket is current."""
        condition = fence(lease) & Attr("inflight.epoch").eq(held.epoch)
        ticket = ticket_value(held.amount, lease.epoch, held.step, held.until, held.micros)
        update = Update(set={"inflight": ticket, "batch": {**batch, "epoch": lease.epoch}})
        try:
            self.table.update(keys.meta_key(lease.task_id), update, condition=condition)
        except ConditionFailed as exc:
            raise why_fenced(self.table, lease) from exc

    def set_aside(self, lease: Lease, held: Reservation) -> None:
        """Keep an older epoch's live hold counted under ``lapsed_<epoch>`` and free ``inflight``
        for this epoch's own; fenced, and only while that epoch's ticket is still current."""
        condition = fence(lease) & Attr("inflight.epoch").eq(held.epoch)
        try:
            self.table.update(keys.meta_key(lease.task_id), _set_aside(held), condition=condition)
        except ConditionFailed as exc:
            if fence_holds(exc.old, lease):
                return  # that ticket is gone already: its worker settled it
            raise why_fenced(self.table, lease) from exc

    def set_aside_at_end(self, task_id: str, held: Reservation) -> bool:
        """Keep the hold of a task that ended without its worker (cancelled) counted under
        ``lapsed_<epoch>``, as a successor would: its call may be in flight or answered, so it
        is neither returned nor lost with the ``inflight`` marker. Its worker, if it is alive,
        settles it as ever (``settle_orphan`` takes a lapsed ticket); else it is counted as spent
        at its deadline. Not fenced (the task has ended); only while that epoch's ticket is
        current. False when it is gone (settled meanwhile)."""
        try:
            self.table.update(keys.meta_key(task_id), _set_aside(held), condition=Attr("inflight.epoch").eq(held.epoch))
        except ConditionFailed:
            return False
        return True

    def spend_lapsed(
        self,
        task_id: str,
        budget_id: str,
        held: Reservation,
        *,
        parent_id: str | None = None,
        ticket: bool = True,
        forget_batch: bool = False,
    ) -> bool:
        """Count a hold whose call's outcome is unknown as spent: its ticket (``inflight`` of
        that epoch, or ``lapsed_<epoch>``) becomes ``spent_<epoch>`` and ``reserved`` moves to
        ``used`` (``available`` unchanged), and to ``unknown`` but for what the call was seen to
        bill (``held.seen``: known, in the tree's spend), once and by anyone: the task may have
        ended meanwhile. ``settle_orphan`` corrects it if the call is ever reported. False when
        no such ticket is left (settled already). ``ticket=False``: the call can never be
        reported (its attempt failed), so no ``spent_<epoch>`` is left for a later settlement
        of the epoch to match. ``forget_batch``: the hold is a batch's whose answer no run
        will read (``BATCH``): its record goes in the same write, so the batch is counted once.

        A child already folded into its parent needs no correction of the parent's ``used``:
        the fold counted ``used + reserved``, and moving between the two leaves that sum
        unchanged. Only what was seen moves, in the parent too, from unknown to known.
        """
        known = seen_as_known(held)
        spend = Patch(
            BUDGET, keys.meta_key(budget_id),
            Update(add={"reserved": -held.amount, "used": held.amount, "unknown": held.amount,
                        "usd_reserved": -held.micros, "usd_used": held.micros, "usd_unknown": held.micros}),
            None,
        )  # fmt: skip
        if held.seen:
            spend = Patch(BUDGET, spend.key, Update(add=summed(spend.update.add, known)), None)
        for name, condition in (
            ("inflight", Attr("inflight.epoch").eq(held.epoch)),
            (lapsed_name(held.epoch), Attr(lapsed_name(held.epoch)).exists()),
        ):
            gone = [name, *(BATCH if forget_batch else [])]
            update = Update(set={spent_name(held.epoch): seen_ticket(held)} if ticket else {}, remove=gone)
            moved = Patch("ticket", keys.meta_key(task_id), update, condition)
            if held.seen and parent_id is not None:
                if self._up_the_folds(task_id, budget_id, moved, spend, parent_id, known):
                    return True
            elif self._written(task_id, budget_id, [moved, spend]):
                return True
        return False

    def _written(self, task_id: str, budget_id: str, patches: list[Patch]) -> bool:
        """Write a ticket's patch and the budget's (and any more) at once: one update when both
        are the task's own META, else a transaction. False when the ticket's condition failed."""
        ticket, own, *rest = patches
        try:
            if budget_id == task_id and not rest:
                both = merge("ticket", ticket, own)
                self.table.update(both.key, both.update, condition=both.condition)
            elif budget_id == task_id:
                self.table.transact([merge("ticket", ticket, own), *rest])
            else:
                self.table.transact(patches)
            return True
        except ConditionFailed:
            return False
        except TransactionCancelled as exc:
            if "ticket" not in exc.failed:
                raise
            return False

    def _release(
        self,
        task_id: str,
        budget_id: str,
        release: Patch,
        delta: BudgetDelta,
        parent_id: str | None,
        *,
        spent: Reservation | None = None,
    ) -> bool:
        """Remove a hold's ticket and settle the hold with ``delta``, in one write; False when
        the ticket is gone (settled already). ``spent``: the hold was counted as spent (its
        ``spent_<epoch>`` ticket, with what was seen of its call): it is corrected, not settled.

        A child whose budget its parent already folded in (``settle_child`` took its ``used +
        reserved``, this hold counted as spent) passes its ``parent_id``: the parent then gets
        the difference in the same transaction (``used + actual - hold``), and so does each
        ancestor the folds carried it to (``_up_the_folds``), so the tree's ledger ends equal to
        what the calls used, not to what they were allowed.
        """
        # A hold counted as spent is corrected, not settled: ``used`` takes the difference
        # between the call's usage and the hold (``reserved`` gave it up already).
        settle = (
            Patch(BUDGET, keys.meta_key(budget_id), Update(add=correction(delta, spent)))
            if spent is not None
            else settle_and_reserve(budget_id, delta, 0)
        )
        if parent_id is None:
            return self._written(task_id, budget_id, [release, settle])
        return self._up_the_folds(task_id, budget_id, release, settle, parent_id, correction(delta, spent))

    def _up_the_folds(
        self, task_id: str, budget_id: str, ticket: Patch, own: Patch, parent_id: str, add: dict[str, Any]
    ) -> bool:
        """``ticket`` and ``own`` written, and ``add`` on every budget a fold carried the hold
        into: none while the task is not folded; else its parent, and each ancestor folded in
        turn up to the first that is not. False when the ticket is gone. A fold counts the hold
        at each level it reaches, so a correction that stopped at the parent left a grandparent
        charged the whole hold (a cancel or a timeout folds a subtree while its calls run). The
        topmost is written only if it is still not folded: a fold landing meanwhile fails the
        write and the next try goes one ancestor higher (a fold is for good, the tree at most
        ``MAX_DEPTH`` deep); one landing between the two ticket conditions, a round more."""
        rounds = folds = 0
        while rounds < 3 and folds <= MAX_DEPTH:
            if self._written(task_id, budget_id, [unless_folded(ticket), own]):
                return True
            try:
                fixes = ancestor_fixes(folded_line(self.table, parent_id), add)
                if self._written(task_id, budget_id, [if_folded(ticket), own, *fixes]):
                    return True
                rounds += 1
            except TransactionCancelled as exc:
                if not any(name.startswith(ANCESTOR) for name in exc.failed):
                    raise
                folds += 1
        return False

    def settle_orphan(
        self,
        task_id: str,
        budget_id: str,
        delta: BudgetDelta,
        *,
        inflight_epoch: int | None,
        parent_id: str | None = None,
        ticketed: bool = False,
        forget_batch: bool = False,
    ) -> bool:
        """Account for a reservation whose step will not be committed (lease lost, provider
        error, a crashed worker's leftover), exactly once.

        The task's ``inflight`` marker is the claim ticket: the hold is returned only together
        with removing the marker of ``inflight_epoch`` (current, or set aside as lapsed by a
        successor), in one write, so a resumed worker and a zombie cannot both return it. A
        marker counted as spent at its deadline (``spent_<epoch>``) is corrected to this usage
        instead, once. If no marker is left, only the usage is recorded (tokens a zombie spent
        are spent whoever holds the task). Not fenced by the lease for
        that reason. With ``inflight_epoch=None`` the caller owns the hold outright (no
        marker) and it is settled unconditionally. Returns whether the hold was returned.
        ``parent_id``: see ``_release``. ``ticketed``: the usage is recorded only with a ticket
        (its settlement may be tried again by a later worker: the ticket makes it once).
        ``forget_batch``: the hold is that of a batch whose answer will not be committed (an
        interrupt discarded it, the task's timeout cut it, its request failed): the batch's
        record is removed in the write that settles the hold, so no later run reads the batch
        again and charges it a second time (``BATCH``).
        """
        if inflight_epoch is None:
            self._apply(settle_and_reserve(budget_id, delta, 0))
            return True
        batch = BATCH if forget_batch else []
        current = Patch(
            "ticket",
            keys.meta_key(task_id),
            Update(remove=["inflight", *batch]),
            Attr("inflight.epoch").eq(inflight_epoch),
        )
        lapsed = Patch(
            "ticket", keys.meta_key(task_id), Update(remove=[lapsed_name(inflight_epoch), *batch]),
            Attr(lapsed_name(inflight_epoch)).exists(),
        )  # fmt: skip
        spent = Patch(
            "ticket", keys.meta_key(task_id), Update(remove=[spent_name(inflight_epoch), *batch]),
            Attr(spent_name(inflight_epoch)).exists(),
        )  # fmt: skip
        for release_ticket in (current, lapsed):  # set aside by a successor, or not
            if self._release(task_id, budget_id, release_ticket, delta, parent_id):
                return True
        counted = self._spent_hold(task_id, inflight_epoch)
        if counted is not None and self._release(task_id, budget_id, spent, delta, parent_id, spent=counted):
            return True  # counted as spent at its deadline: corrected to the real usage
        if not ticketed and (delta.used or delta.cost_usd):
            usage_only = BudgetDelta(
                reserved=0,
                used=delta.used,
                cost_usd=delta.cost_usd,
                tokens_in=delta.tokens_in,
                tokens_out=delta.tokens_out,
            )
            self._apply(settle_and_reserve(budget_id, usage_only, 0))
        return False

    def _spent_hold(self, task_id: str, epoch: int) -> Reservation | None:
        """The hold counted as spent for ``epoch``'s call (its ``spent_<epoch>`` ticket, with
        what was seen of it), or None. A spent ticket never changes, so the read cannot go
        stale before the write that removes it (conditional on it still being there)."""
        raw = plain(self.table.get(keys.meta_key(task_id)) or {}).get(spent_name(epoch))
        return Reservation.from_ticket(raw) if isinstance(raw, dict) else None

    def _apply(self, patch: Patch) -> None:
        """An unconditional settlement, on a META that exists (never a ghost item of budget only)."""
        try:
            self.table.update(patch.key, patch.update, condition=present())
        except ConditionFailed as exc:
            raise TaskNotFound(f"no task {patch.key['pk']!r} to settle a budget on", field="task_id") from exc

    def fund_children(self, parent_budget_id: str, total: int, total_micros: int = 0) -> Patch:
        """The budget side of a spawn: move ``total`` tokens (and ``total_micros`` of dollars)
        from available to reserved, if they are there."""
        return Patch(
            BUDGET,
            keys.meta_key(parent_budget_id),
            Update(
                add={
                    "available": -total,
                    "reserved": total,
                    "usd_available": -total_micros,
                    "usd_reserved": total_micros,
                }
            ),
            Attr("available").gte(total) & money_covers(total_micros),
        )

    def settle_child(self, parent_budget_id: str, child_id: str, *, lease: Lease | None = None) -> None:
        """Close a child's budget and fold what its subtree spent into the parent's, once.

        The share was moved to the parent's ``reserved`` at spawn; now ``reserved`` gives it
        back, ``used`` takes the child's real usage and the rest is available again. The
        ``budget_settled`` flag makes a repeat (a resumed parent) a no-op. ``lease``: the
        parent's worker folds it, fenced (a zombie folds nothing); a cancel is not a worker's.
        """
        for _ in range(5):
            child = self.get(child_id)
            if child.settled:
                return
            close = Patch(
                "child",
                keys.meta_key(child_id),
                Update(set={SETTLED: True, "available": 0}),
                Attr(SETTLED).not_exists() & as_read(child),  # the fold below is of this very budget
            )
            # A child funded before money budgets (or without a money share) has NO_MONEY_CAP:
            # the parent moved no dollars to it, so none come back.
            share_micros = child.cap_micros if child.cap_micros < NO_MONEY_CAP else 0
            spent_micros = child.used_micros + child.reserved_micros
            fold = Patch(
                "parent",
                keys.meta_key(parent_budget_id),
                Update(
                    add={
                        "reserved": -child.cap,
                        "used": child.used + child.reserved,
                        # What the child spent without knowing, and its holds still out: the
                        # parent counts both as used, but neither as known.
                        "unknown": child.unknown + child.reserved,
                        "available": child.cap - child.used - child.reserved,
                        "usd_reserved": -share_micros,
                        "usd_used": spent_micros,
                        "usd_unknown": child.unknown_micros + child.reserved_micros,
                        "usd_available": share_micros - spent_micros,
                        "budget_cost_usd": child.cost_usd,
                        "budget_tokens_in": child.tokens_in,
                        "budget_tokens_out": child.tokens_out,
                    }
                ),
            )
            fenced = [Check("lease", keys.meta_key(lease.task_id), fence(lease))] if lease is not None else []
            try:
                self.table.transact([close, merge("parent", fold, *fenced)])  # the parent's budget is on its META
                return
            except TransactionCancelled as exc:
                if lease is not None and "parent" in exc.failed:
                    raise why_fenced(self.table, lease) from exc
                if "child" not in exc.failed:
                    raise
        raise RuntimeError(f"could not settle the budget of child {child_id}: it keeps changing")

    def raise_cap(self, task_id: str, add_tokens: int, add_micros: int = 0) -> BudgetState:
        """Raise the task's own budget; logged as a ``budget.raised`` event with the write.
        Raises ``ConditionFailed`` when the task has no budget of its own left to raise."""
        more = BudgetRaise(tokens=add_tokens, micros=add_micros)
        raised = Patch("meta", keys.meta_key(task_id), more.update(), more.condition())
        event = NewEvent("budget.raised", more.event_data())
        try:
            logged_transact(self.table, task_id, [raised], event)
        except TransactionCancelled as exc:
            raise ConditionFailed(None) from exc
        return self.get(task_id)


def _set_aside(held: Reservation) -> Update:
    """``held``, its epoch's current hold, kept counted under ``lapsed_<epoch>`` with what its
    call was seen to bill, and ``inflight`` freed."""
    return Update(set={lapsed_name(held.epoch): seen_ticket(held)}, remove=["inflight"])
