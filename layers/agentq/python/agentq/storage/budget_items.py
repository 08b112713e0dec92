"""How a task's budget is laid out on its META: the attributes a new task starts with, the
tickets of its holds (``inflight``, ``lapsed_<epoch>`` for an older epoch's hold set aside,
and ``spent_<epoch>`` for one whose deadline passed with its outcome unknown) and how they all read back. Plain functions of items, no reads or writes: task creation and
decoding (``storage.tasks``, ``storage.task_items``) and the budget's own writes
(``storage.budgets``, where the invariants are) share them.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace
from decimal import Decimal
from typing import Any

from boto3.dynamodb.conditions import Attr, ConditionBase

from agentq.core.models import TaskSubmission
from agentq.core.pricing import NO_MONEY_CAP
from agentq.core.records import BudgetState, Reservation
from agentq.storage.table import Item, Update, plain, present

SETTLED = "budget_settled"


@dataclass(frozen=True)
class BudgetRaise:
    """More budget for a root task, checked (``control.operations.planned_raise``): ``tokens``
    and ``micros`` (millionths of a dollar) added to the budget on its META, and ``steps`` more
    steps and ``usd`` more dollars on its submission's caps (``raised``). Written by
    ``Budgets.raise_cap`` and ``Tasks.replace_submission``, or in the very write that accepts
    the message it comes with (``storage.messages``), so a refused message raises nothing and its
    retry nothing twice."""

    tokens: int = 0
    micros: int = 0
    steps: int = 0
    usd: Decimal = Decimal(0)

    @property
    def changes_submission(self) -> bool:
        """Whether the raise writes the submission (its step or money cap grows)."""
        return bool(self.steps or self.usd)

    def raised(self, submission: TaskSubmission) -> TaskSubmission:
        """``submission`` with its caps raised, checked still valid: the step cap its owner's now
        (so a move keeps it: ``control.aliases``). Made of the submission as the write that puts
        it reads it, never of an earlier read: a raise or a move between the two is kept."""
        raised = submission.model_copy(deep=True)
        raised.constraints.max_steps += self.steps
        if self.steps and raised.own_fields is not None:
            raised.own_fields = sorted({*raised.own_fields, "constraints.max_steps"})
        if self.usd and raised.constraints.max_cost_usd is not None:
            raised.constraints.max_cost_usd += self.usd
        return TaskSubmission.model_validate(raised.model_dump())  # the raised caps must still be valid

    def update(self) -> Update:
        """The ADDs to META's budget (``cap``/``available``, ``usd_cap``/``usd_available``)."""
        return Update(add={"cap": self.tokens, "available": self.tokens, "usd_cap": self.micros,
                           "usd_available": self.micros})  # fmt: skip

    @staticmethod
    def condition() -> ConditionBase:
        """The task has a budget of its own to raise (not one settled into its parent's)."""
        return present() & Attr("cap").exists() & Attr(SETTLED).not_exists()

    def event_data(self) -> dict[str, int]:
        """What its ``budget.raised`` event says."""
        return {"add_tokens": self.tokens, "add_usd_micros": self.micros}


def budget_attrs(cap: int, cap_micros: int = NO_MONEY_CAP) -> dict[str, Any]:
    """The budget attributes of a new task's META."""
    return {
        "cap": cap,
        "reserved": 0,
        "used": 0,
        "unknown": 0,
        "available": cap,
        "usd_cap": cap_micros,
        "usd_reserved": 0,
        "usd_used": 0,
        "usd_unknown": 0,
        "usd_available": cap_micros,
        "budget_cost_usd": Decimal(0),
        "budget_tokens_in": 0,
        "budget_tokens_out": 0,
    }


def _stored_time(seconds: float) -> Decimal:
    """A deadline as DynamoDB stores it: rounded up to the millisecond, never earlier."""
    return (Decimal(str(seconds)) * 1000).to_integral_value(rounding="ROUND_CEILING") / 1000


def ticket_value(amount: int, epoch: int, step: int, until: float | None, micros: int = 0) -> dict[str, Any]:
    """The ``inflight`` map on META: the hold (tokens, and dollars as ``usd``), its epoch and
    step, and its deadline."""
    ticket: dict[str, Any] = {"amount": amount, "epoch": epoch, "step": step}
    if micros:
        ticket["usd"] = micros
    if until is not None:
        ticket["until"] = _stored_time(until)
    return ticket


def seen_ticket(held: Reservation) -> dict[str, Any]:
    """The map of a hold set aside (``lapsed_<epoch>``) or counted as spent (``spent_<epoch>``):
    the ticket, with what its call was seen to bill (``seen_in``/``seen_out``/``seen_usd``), kept
    with it since META's ``seen`` goes with the next commit: spent, only the rest is unknown, and a
    later report of the call corrects only that."""
    ticket = ticket_value(held.amount, held.epoch, held.step, held.until, held.micros)
    if held.seen:
        ticket.update(seen_in=held.seen_in, seen_out=held.seen_out, seen_usd=held.seen_micros)
    return ticket


LAPSED_PREFIX = "lapsed_"  # META attribute of an older epoch's hold set aside: lapsed_<epoch>


def lapsed_name(epoch: int) -> str:
    return f"{LAPSED_PREFIX}{epoch}"


SPENT_PREFIX = "spent_"  # META attribute of a hold counted as spent at its deadline: spent_<epoch>


def spent_name(epoch: int) -> str:
    return f"{SPENT_PREFIX}{epoch}"


def lapsed_holds(data: dict[str, Any]) -> dict[int, dict[str, Any]]:
    """The holds of older epochs set aside on a META item (plain values), by epoch."""
    return {
        int(name.removeprefix(LAPSED_PREFIX)): value
        for name, value in data.items()
        if name.startswith(LAPSED_PREFIX) and name.removeprefix(LAPSED_PREFIX).isdigit()
    }


def budget_state(item: Item) -> BudgetState:
    data = plain(item, keep_decimal=frozenset({"budget_cost_usd"}))
    return BudgetState(
        cap=data["cap"],
        reserved=data["reserved"],
        used=data["used"],
        available=data["available"],
        cost_usd=data["budget_cost_usd"],
        tokens_in=data.get("budget_tokens_in", 0),
        tokens_out=data.get("budget_tokens_out", 0),
        settled=bool(data.get(SETTLED, False)),
        cap_micros=data.get("usd_cap", NO_MONEY_CAP),
        reserved_micros=data.get("usd_reserved", 0),
        used_micros=data.get("usd_used", 0),
        available_micros=data.get("usd_available", NO_MONEY_CAP),
        unknown=data.get("unknown", 0),
        unknown_micros=data.get("usd_unknown", 0),
    )


def with_unfolded(parent: BudgetState, children: Iterable[BudgetState]) -> BudgetState:
    """``parent``'s budget with what each of ``children`` (its direct sub-agents' budgets) has
    spent so far counted in, for those not folded in yet (``Budgets.settle_child`` folds a child
    only when its parent next runs, so a parent waiting on a slow sibling held a finished one's
    spend in ``reserved``, at the share it gave it): a view of the whole tree's spend, never
    written. A child's ``used`` (its folded sub-agents' included) moves from the share the
    parent reserved for it to ``used``, as the fold moves it; dollars likewise, out of
    ``available`` for a child given no money share. Its holds still out stay reserved (the fold
    counts them as spent; until then they may be returned). A folded child is the parent's
    already and is skipped, so a child folded between the reads of the two is missed in that
    one view, never counted twice. A sub-agent's own unfolded sub-agents are left out: each
    would be more reads, for every view."""
    for child in children:
        if child.settled:
            continue
        money_share = child.cap_micros < NO_MONEY_CAP
        parent = replace(
            parent,
            used=parent.used + child.used,
            reserved=parent.reserved - child.used,
            unknown=parent.unknown + child.unknown,
            cost_usd=parent.cost_usd + child.cost_usd,
            tokens_in=parent.tokens_in + child.tokens_in,
            tokens_out=parent.tokens_out + child.tokens_out,
            used_micros=parent.used_micros + child.used_micros,
            unknown_micros=parent.unknown_micros + child.unknown_micros,
            reserved_micros=parent.reserved_micros - (child.used_micros if money_share else 0),
            available_micros=parent.available_micros - (0 if money_share else child.used_micros),
        )
    return parent


def as_read(state: BudgetState) -> ConditionBase:
    """A condition that the budget's attributes are still the ones ``state`` was read from,
    each of them (an attribute a META written before it has none of reads as its default, and
    passes while absent): a write computed from the read (a child's fold into its parent) lands
    only on that budget, never on one a settlement moved in between, even one that left
    ``used`` and ``reserved`` as they were (a late report of exactly its hold's size)."""
    read: list[tuple[str, Any, Any]] = [
        ("cap", state.cap, None),
        ("reserved", state.reserved, None),
        ("used", state.used, None),
        ("budget_cost_usd", state.cost_usd, None),
        ("budget_tokens_in", state.tokens_in, 0),
        ("budget_tokens_out", state.tokens_out, 0),
        ("usd_cap", state.cap_micros, NO_MONEY_CAP),
        ("usd_reserved", state.reserved_micros, 0),
        ("usd_used", state.used_micros, 0),
        ("unknown", state.unknown, 0),
        ("usd_unknown", state.unknown_micros, 0),
    ]
    condition: ConditionBase = Attr("available").eq(state.available)
    for name, value, default in read:
        same = Attr(name).eq(value)
        condition &= same | Attr(name).not_exists() if value == default else same
    return condition
