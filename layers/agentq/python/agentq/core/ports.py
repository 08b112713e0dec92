"""What the engine needs from storage, as narrow protocols shaped by the engine's own use.

The core imports no storage code: ``storage.Storage`` (over DynamoDB or in memory) satisfies
``EngineStorage`` structurally, and mypy checks that where the two meet (``runtime``). Each
protocol lists only the calls the engine makes, so a reader sees the engine's whole contract
with the table here, and a test double needs only these.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from agentq.core.caps import Scope, ScopeCap
from agentq.core.endusers import Approver
from agentq.core.fanout import ChildPlan
from agentq.core.flow import Admission
from agentq.core.memory import Author, MemoryDocument, MemorySearchHit, SearchView
from agentq.core.models import (
    CommittedStep,
    CompactStep,
    Lease,
    LLMStep,
    RetryState,
    StepRecord,
    Task,
    TaskStatus,
    ToolOutcome,
    UserMessage,
)
from agentq.core.policies import PolicyDocument
from agentq.core.quality import GradeTally
from agentq.core.records import (
    ApprovalRecord,
    BudgetDelta,
    BudgetState,
    ClaimOwner,
    EffectRecord,
    Inbox,
    OrphanReason,
    Reservation,
    SpawnRecord,
)
from agentq.core.reservation import Seen
from agentq.core.tenancy import TenantLimits
from agentq.core.vault import CredentialInfo, StoredCredential
from agentq.core.workspace import WorkspaceRef


class TaskLeases(Protocol):
    def claim(
        self, task_id: str, worker: str, lease_seconds: float, *, owner: ClaimOwner | None = None
    ) -> tuple[Lease, Task] | None: ...

    def extend_lease(
        self, lease: Lease, lease_seconds: float, *, live_text: str | None = None, seen: Seen | None = None
    ) -> Lease: ...

    def release(self, lease: Lease, *, forget_batch: bool = False) -> None: ...

    def take_batch_hold(self, lease: Lease, batch_id: str) -> bool: ...

    def transition(
        self,
        task_id: str,
        to: TaskStatus,
        *,
        lease: Lease | None = None,
        result: str | None = None,
        error: dict[str, Any] | None = None,
        extra: dict[str, Any] | None = None,
        delivered: int | None = None,
    ) -> str: ...  # the status it moved from

    def get(self, task_id: str) -> Task: ...

    def get_many(self, task_ids: list[str]) -> list[Task]: ...

    def record_retry(self, task_id: str, state: RetryState, *, lease: Lease | None = None) -> bool: ...

    def start_workspace(self, lease: Lease, ref: WorkspaceRef) -> None: ...

    def note_traced(self, task_id: str, invocation: int) -> None: ...


class StepLog(Protocol):
    def load(self, task_id: str, upto: int | None = None, since: int = 1) -> list[StepRecord]: ...

    def commit(
        self,
        lease: Lease,
        number: int,
        body: Any,
        *,
        root_id: str,
        settle: BudgetDelta | None = None,
        reserve_next: int = 0,
        reserve_next_micros: int = 0,
        finish: TaskStatus | None = None,
        result: str | None = None,
        error: dict[str, Any] | None = None,
        lease_until: float | None = None,
        hold_until: float | None = None,
        delivered: int | None = None,
        grade: dict[str, Any] | None = None,
        counted: BudgetDelta | None = None,
    ) -> CommittedStep: ...

    def record_orphan(
        self, lease: Lease, number: int, body: LLMStep | CompactStep, *, reason: OrphanReason = "lease_lost"
    ) -> None: ...


class BudgetLedger(Protocol):
    def get(self, root_id: str) -> BudgetState: ...

    def reserve(
        self, lease: Lease, root_id: str, amount: int, step: int, *, until: float | None = None, micros: int = 0
    ) -> Reservation: ...

    def adopt(self, lease: Lease, held: Reservation, batch: dict[str, Any]) -> None: ...

    def extend_hold(self, lease: Lease, held: Reservation, until: float) -> None: ...

    def set_aside(self, lease: Lease, held: Reservation) -> None: ...

    def spend_lapsed(
        self,
        task_id: str,
        budget_id: str,
        held: Reservation,
        *,
        parent_id: str | None = None,
        ticket: bool = True,
        forget_batch: bool = False,
    ) -> bool: ...

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
    ) -> bool: ...

    def settle_child(self, parent_budget_id: str, child_id: str, *, lease: Lease | None = None) -> None: ...


class TenantWindowsPort(Protocol):
    def limits(self, tenant: str) -> TenantLimits | None: ...

    def hold(
        self, tenant: str, limits: TenantLimits, amount: int, now: float | None = None, *, micros: int = 0
    ) -> Any: ...

    def settle(self, hold: Any, used: int, used_micros: int = 0) -> None: ...

    def with_default(self, default: TenantLimits | None) -> TenantWindowsPort: ...


class ScopeCapsPort(Protocol):
    """The caps of a tenant's users, agents and keys, and their windows (``storage.scope_caps``)."""

    def applicable(self, tenant: str, scopes: dict[Scope, str]) -> list[ScopeCap]: ...

    def hold(
        self,
        caps: list[ScopeCap],
        amount: int,
        *,
        micros: int = 0,
        approved: frozenset[str] = frozenset(),
        now: float | None = None,
        user: str | None = None,
    ) -> Any: ...

    def settle(self, hold: Any, used: int, used_micros: int = 0) -> None: ...

    def usage(self, tenant: str, scope: Scope, name: str, now: float | None = None) -> dict[str, int]: ...


class ApprovalBook(Protocol):
    def get(self, task_id: str, use_id: str) -> ApprovalRecord | None: ...

    def request(
        self,
        lease: Lease,
        use_id: str,
        question: str,
        *,
        credential: dict[str, str] | None = None,
        approver: Approver = "user",
        step: int | None = None,
        tool: str | None = None,
    ) -> None: ...

    def decide(
        self, task_id: str, use_id: str, *, approved: bool, note: str, by: str, by_user: str | None = None
    ) -> None: ...


class VaultBook(Protocol):
    """The vault (``storage.vault``) as the engine reads it: sealed credentials, and the tasks
    waiting for one (``request_credential``)."""

    def get(self, tenant: str, user: str | None, name: str) -> StoredCredential | None: ...

    def get_running(self, tenant: str, user: str | None, name: str, lease: Lease) -> StoredCredential | None:
        """``get``, and the META of ``lease``'s task read in the same round trip: ``LeaseLost``
        (naming why: a stop's mark, its status, another epoch) when the task no longer runs
        under ``lease``, and nothing of the credential returned."""
        ...

    def listing(self, tenant: str, user: str | None) -> list[CredentialInfo]: ...

    def wait(self, tenant: str, user: str | None, name: str, task_id: str, use_id: str) -> None: ...

    def unwait(self, tenant: str, user: str | None, name: str, task_id: str, use_id: str) -> None: ...


class SpawnBook(Protocol):
    def get(self, parent_id: str, spawn_id: str) -> SpawnRecord | None: ...

    def create(
        self,
        lease: Lease,
        parent: Task,
        spawn_id: str,
        children: list[ChildPlan],
        pending: list[ToolOutcome],
        max_concurrency: int,
        step: int | None = None,
    ) -> bool: ...

    def write_children(self, lease: Lease, parent: Task, spawn_id: str, children: list[ChildPlan]) -> None: ...

    def mark(self, parent_id: str, spawn_id: str, *, lease: Lease | None = None, **fields: Any) -> None: ...


class SubtreeTimeout(Protocol):
    """Ends a sub-agent its parent's fan-out gave up on (its deadline passed) ``timed_out``,
    and everything under it: its fan-out executions stopped, its sub-agents ended, their
    budgets folded into it, leaves first, their holds kept counted, the slots of those still
    queued given back. ``control.subtrees.time_out_subagent``, handed in by
    ``agentq.runtime.build_engine`` (the core imports no control). True when the child itself
    was moved; False when it ended by itself first."""

    def __call__(self, child: Task) -> bool: ...


class EffectLog(Protocol):
    def begin(self, lease: Lease, tool_use_id: str, name: str, step: int | None = None) -> EffectRecord | None: ...

    def finish(self, lease: Lease, tool_use_id: str, outcome: ToolOutcome) -> None: ...

    def get(self, task_id: str, tool_use_id: str) -> EffectRecord | None: ...

    def remember(self, lease: Lease, tool_use_id: str, remote: dict[str, Any]) -> None: ...


class QualityBook(Protocol):
    """Online grades counted per agent version and hour (``core.quality``, ``storage.quality``)."""

    def count(self, tally: GradeTally) -> bool: ...


class NoteBook(Protocol):
    def read(self, task_id: str, key: str) -> str | None: ...

    def write(self, lease: Lease, key: str, value: str) -> None: ...


class MemoryBook(Protocol):
    """The memory stores (``core.memory``, ``storage.memory_stores``) as the memory tools use them."""

    def documents_page(
        self, tenant: str, store: str, prefix: str = "/", *, limit: int, after: str | None = None
    ) -> tuple[list[MemoryDocument], str | None]: ...

    def read(self, tenant: str, store: str, path: str) -> MemoryDocument: ...

    def write(
        self,
        tenant: str,
        store: str,
        path: str,
        content: str,
        *,
        author: Author,
        expected_sha256: str | None = None,
        unconditional: bool = False,
        lease: Lease | None = None,
    ) -> tuple[MemoryDocument, bool]: ...

    def search(
        self, tenant: str, store: str, query: str, *, limit: int = 10, view: SearchView | None = None
    ) -> list[MemorySearchHit]: ...


class FlowPort(Protocol):
    """Fleet-wide flow control per provider and model (``core.flow``, ``storage.flow``)."""

    def admit(self, key: str, input_tokens: int, output_tokens: int, now: float | None = None) -> Admission: ...

    def succeeded(self, key: str, admission: Admission) -> None: ...

    def settle(self, key: str, admission: Admission, input_tokens: int, output_tokens: int) -> None: ...

    def failed(self, key: str, admission: Admission, now: float | None = None) -> bool: ...

    def slow_down(self, key: str, seconds: float, now: float | None = None) -> None: ...

    @property
    def cooldown_seconds(self) -> float: ...


class MessageBox(Protocol):
    def waiting(self, task_id: str, *, after: int, upto: int) -> list[UserMessage]: ...

    def go_idle(self, lease: Lease, *, delivered: int) -> Inbox | None: ...


class Readable(Protocol):
    """Bytes read a piece at a time (``read(n)``: at most n, ``b""`` at the end), then closed: a
    workspace file on its way to the bucket, an object on its way to the disk, never held whole."""

    def read(self, size: int = -1, /) -> bytes: ...

    def close(self) -> None: ...


class WorkspaceStore(Protocol):
    """A task's workspace content (``core.workspace``, ``storage.workspaces``): content-addressed
    blobs and manifests, written create-only (``put_blob``: False if one was there); a missing
    one raises a ``LookupError``. Safe to call from several threads. A blob may be put and read
    as a stream (``core.workspace_stream``): ``put_blob`` of a ``Readable`` with a length sends
    it as it reads it (content that does not hash to ``digest`` is refused), ``open_blob``
    returns one to read."""

    def put_blob(self, task_id: str, digest: str, data: bytes | Readable) -> bool: ...

    def get_blob(self, task_id: str, digest: str, lookup: Sequence[str] = ()) -> bytes: ...

    def open_blob(self, task_id: str, digest: str, lookup: Sequence[str] = ()) -> Readable: ...

    def put_manifest(self, task_id: str, digest: str, data: bytes) -> None: ...

    def get_manifest(self, task_id: str, digest: str, lookup: Sequence[str] = ()) -> bytes: ...


class PolicySource(Protocol):
    """A tenant's policy documents (``core.policies``, ``storage.policies``): the current one of
    every scope, in one read."""

    def current(self, tenant: str) -> list[PolicyDocument]: ...


class EngineStorage(Protocol):
    """Everything the engine reads and writes, by aggregate."""

    @property
    def tasks(self) -> TaskLeases: ...

    @property
    def steps(self) -> StepLog: ...

    @property
    def budgets(self) -> BudgetLedger: ...

    @property
    def windows(self) -> TenantWindowsPort: ...

    @property
    def caps(self) -> ScopeCapsPort: ...

    @property
    def approvals(self) -> ApprovalBook: ...

    @property
    def spawns(self) -> SpawnBook: ...

    @property
    def effects(self) -> EffectLog: ...

    @property
    def notes(self) -> NoteBook: ...

    @property
    def quality(self) -> QualityBook: ...

    @property
    def flow(self) -> FlowPort: ...

    @property
    def messages(self) -> MessageBox: ...

    @property
    def memory_stores(self) -> MemoryBook: ...

    @property
    def workspaces(self) -> WorkspaceStore: ...

    @property
    def policies(self) -> PolicySource: ...

    @property
    def vault(self) -> VaultBook: ...
