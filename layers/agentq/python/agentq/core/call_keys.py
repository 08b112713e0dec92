"""Which stored record is a tool call's own: its approval, its effect record, its spawn.

Each is keyed by the call's tool_use id (``APPROVAL#``, ``EFFECT#``, ``SPAWN#`` of the task),
and a turn that gives one id to two calls is never acted on (``models.repeated_tool_use_id``),
but nothing stops a later turn from using an id an earlier turn used: an OpenAI-compatible
server or a gateway that passes the model's own ids through does, and one that numbers each
reply's calls (``call_0`` every turn) does it every turn. Found by id alone, an approval the end
user gave a harmless ``request_approval`` then decided a later charge a tenant-only rule held,
and a later side-effecting call replayed the earlier one's recorded result instead of running.

So a record names the call it was written for: the LLM step that asked for it (``step``) and
its tool (``tool``), and a call acts only on a record of its own (``CallRef.owns``). A record
under the call's id that another call wrote leaves the id to it: the call's records go under
``agentq-<step>-<id>`` (``CallRef.qualified``), which only a call of that step with that id
can have. A call whose id is reused reads one record more; every other call reads and writes
exactly what it did before.

Keys agentq names itself begin with ``OWN_KEYS`` (a soft threshold's approval,
``core.caps.approval_id``), ``grade-`` (an outcome's grade, ``core.engine._grade``) or ``cap-``
(a soft threshold's approval asked before those moved under ``OWN_KEYS``): a call whose id
begins so never takes its id as a key (``RESERVED``), so no id a provider gives spells one.

A record written before records named their call (no ``step``: a task in flight at the
deploy) is the call's when it was written after the call's step was asked for (``since``,
the LLM call's start): every record of an earlier call was written before that turn's results
were committed, so before this call's turn was asked for.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from agentq.core.models import StepRecord

R = TypeVar("R")
OWN_KEYS = "agentq-"
RESERVED = (OWN_KEYS, "cap-", "grade-")


@dataclass(frozen=True)
class CallRef:
    """One tool call as its records are keyed and told apart."""

    use_id: str  # the tool_use id the model's turn gave it
    name: str  # its tool
    step: int  # the number of the LLM step that asked for it
    since: float  # when that step's call started (a record written before was an earlier call's)

    @property
    def first(self) -> str:
        """The key tried first: the id itself, unless it begins like a key agentq names."""
        return self.qualified if self.use_id.startswith(RESERVED) else self.use_id

    @property
    def qualified(self) -> str:
        """The key of the call's records when its id is another call's: one per step and id."""
        return f"{OWN_KEYS}{self.step}-{self.use_id}"

    def owns(self, step: int | None, tool: str | None, at: float) -> bool:
        """Whether a record under one of its keys, written for ``step``'s call of ``tool`` (None:
        written before records named them) at ``at``, is this call's."""
        if step is not None:
            return step == self.step and (tool is None or tool == self.name)
        return at >= self.since


def call_ref(use: dict[str, Any], step: StepRecord | None) -> CallRef:
    """``use``, a tool_use block of ``step``: the committed LLM step whose calls are being made
    (the last step while its calls are made). None: no step to name (every record is the call's
    that its id finds, as before records named their call)."""
    if step is None:
        return CallRef(str(use["id"]), str(use["name"]), 0, 0.0)
    return CallRef(str(use["id"]), str(use["name"]), step.number, float(getattr(step.body, "started_at", 0.0)))


def is_key_of(key: str, use_id: str, step: int) -> bool:
    """Whether ``key`` (a record's) is one of the keys of the call ``use_id`` of LLM step
    ``step``: what marks, among a turn's calls, the one an approval holds."""
    call = CallRef(use_id, "", step, 0.0)
    return key in (call.first, call.qualified)


def is_cap_approval(use_id: str) -> bool:
    """An approval asked to go past a cap's soft threshold (``core.caps.approval_id``), not of a
    call. ``cap-``: one asked before those moved under ``OWN_KEYS`` (no call's key begins so)."""
    return use_id.startswith((f"{OWN_KEYS}cap-", "cap-"))


def own_record(
    call: CallRef, find: Callable[[str], R | None], bound: Callable[[R], tuple[int | None, str | None, float]]
) -> tuple[str, R | None]:
    """The key of ``call``'s record of a kind, and the record (None: none yet). ``find`` reads
    (or begins, answering with the record already there) the record under a key; ``bound``
    tells what call a record was written for (its step, its tool, when). Under the call's id
    first; when another call's record is there, under its qualified key."""
    key = call.first
    record = find(key)
    if record is None or key == call.qualified or call.owns(*bound(record)):
        return key, record
    return call.qualified, find(call.qualified)
