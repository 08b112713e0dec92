"""``Storage``: the repositories of one table, wired together. Consumers take the repository
they need (``storage.tasks``, ``storage.steps``, ...); which backend is underneath
(``DynamoTable`` or ``MemoryTable``) is the caller's choice, made once."""

from __future__ import annotations

from agentq.core.tenancy import TenantLimits
from agentq.storage.a2a_push import PushConfigs
from agentq.storage.agent_aliases import AgentAliases
from agentq.storage.agents import Agents
from agentq.storage.api_keys import KeyStore
from agentq.storage.approvals import Approvals
from agentq.storage.budgets import Budgets
from agentq.storage.effects import Effects
from agentq.storage.events import EventLog
from agentq.storage.flow import FlowControl
from agentq.storage.memory_stores import MemoryStores
from agentq.storage.messages import Messages
from agentq.storage.notes import Notes
from agentq.storage.policies import Policies
from agentq.storage.purge import Purge
from agentq.storage.quality import Quality
from agentq.storage.running_slots import RunningSlots
from agentq.storage.schedules import Schedules
from agentq.storage.scope_caps import ScopeCaps
from agentq.storage.serdes import Payloads
from agentq.storage.spawns import Spawns
from agentq.storage.steps import Steps
from agentq.storage.stops import Stops
from agentq.storage.table import Table
from agentq.storage.task_items import DAY_SECONDS, DEFAULT_TASK_RETENTION_DAYS
from agentq.storage.tasks import Tasks
from agentq.storage.tenant_windows import TenantWindows
from agentq.storage.vault import Vault
from agentq.storage.webhooks import WebhookSecrets
from agentq.storage.workspaces import WorkspaceObjects


class Storage:
    def __init__(
        self,
        table: Table,
        payloads: Payloads,
        *,
        retention_seconds: int = DEFAULT_TASK_RETENTION_DAYS * DAY_SECONDS,
        default_tenant_limits: TenantLimits | None = None,
    ) -> None:
        self.table = table
        self.payloads = payloads
        self.tasks = Tasks(table, payloads, retention_seconds=retention_seconds)
        self.budgets = Budgets(table)
        self.steps = Steps(table, payloads, self.tasks)
        self.messages = Messages(table, retention_seconds=retention_seconds)
        self.effects = Effects(table, payloads)
        self.events = EventLog(table, self.steps.record)
        self.spawns = Spawns(table, payloads, self.tasks, self.budgets)
        self.approvals = Approvals(table, self.tasks)
        self.notes = Notes(table)
        self.windows = TenantWindows(table, default_tenant_limits)
        self.caps = ScopeCaps(table)
        self.slots = RunningSlots(table)
        self.purge = Purge(table, payloads)
        self.api_keys = KeyStore(table)
        self.agents = Agents(table)
        self.aliases = AgentAliases(table, self.agents)
        self.policies = Policies(table)
        self.flow = FlowControl(table)
        self.webhook_secrets = WebhookSecrets(table)
        self.a2a_push = PushConfigs(table, retention_seconds=retention_seconds)
        self.schedules = Schedules(table)
        self.memory_stores = MemoryStores(table)
        self.workspaces = WorkspaceObjects(payloads)
        self.vault = Vault(table)
        self.stops = Stops(table)
        self.quality = Quality(table)


def memory_storage(**kwargs: object) -> Storage:
    """A Storage over an in-memory table and payload store (tests, no AWS)."""
    from agentq.storage.memory import MemoryPayloads, MemoryTable

    return Storage(MemoryTable(), MemoryPayloads(), **kwargs)  # type: ignore[arg-type]
