"""The shapes of the HTTP API, shared by the server (``http_api``), the Python client and the CLI.

Request bodies are strict (an unknown field is an error naming it); responses are read
leniently by the client (``extra="ignore"``), so a newer server may add fields without
breaking older clients. The OpenAPI document at ``/openapi.json`` is generated from these.

Every name is importable from here (``from agentq.api.models import TaskView``); each lives in
the module of its resource:

- ``base``: the limits (``MAX_BODY_BYTES``, page sizes, patterns), ``ApiModel``, the error body, ``Health``.
- ``tasks``: a task's action bodies (decision, budget, fork) and its answers (``TaskView``, pages, result).
- ``conversation``: messages to a task, an interrupt, a close.
- ``fleet``: usage per tenant, spend, circuit breakers, dead letters.
- ``trace``: the trace's events and pages, the event stream's pages.
- ``catalogue``: agents, schedules, the webhook secret.
- ``files``: a task's workspace files at a committed step, and the diff between two steps.
- ``compare``: two runs side by side (``GET /tasks/{id}/compare/{other_id}``).
"""

from __future__ import annotations

from agentq.api.models.base import CURSOR_PATTERN as CURSOR_PATTERN
from agentq.api.models.base import DEFAULT_EVENT_PAGE as DEFAULT_EVENT_PAGE
from agentq.api.models.base import DEFAULT_PAGE_SIZE as DEFAULT_PAGE_SIZE
from agentq.api.models.base import DEFAULT_TRACE_PAGE as DEFAULT_TRACE_PAGE
from agentq.api.models.base import GOAL_PREVIEW_CHARS as GOAL_PREVIEW_CHARS
from agentq.api.models.base import IDEMPOTENCY_KEY_PATTERN as IDEMPOTENCY_KEY_PATTERN
from agentq.api.models.base import LISTING_PAGE_BYTES as LISTING_PAGE_BYTES
from agentq.api.models.base import MAX_BODY_BYTES as MAX_BODY_BYTES
from agentq.api.models.base import MAX_CURSOR_CHARS as MAX_CURSOR_CHARS
from agentq.api.models.base import MAX_EVENT_PAGE as MAX_EVENT_PAGE
from agentq.api.models.base import MAX_LISTING_PAGE as MAX_LISTING_PAGE
from agentq.api.models.base import MAX_MESSAGE_PAGE as MAX_MESSAGE_PAGE
from agentq.api.models.base import MAX_NOTE_CHARS as MAX_NOTE_CHARS
from agentq.api.models.base import MAX_PAGE_SIZE as MAX_PAGE_SIZE
from agentq.api.models.base import MAX_TOOL_USE_ID_CHARS as MAX_TOOL_USE_ID_CHARS
from agentq.api.models.base import MAX_TRACE_PAGE as MAX_TRACE_PAGE
from agentq.api.models.base import MESSAGE_PAGE_BYTES as MESSAGE_PAGE_BYTES
from agentq.api.models.base import TASK_ID_PATTERN as TASK_ID_PATTERN
from agentq.api.models.base import TRACE_PAGE_BYTES as TRACE_PAGE_BYTES
from agentq.api.models.base import TRACE_TEXT_CHARS as TRACE_TEXT_CHARS
from agentq.api.models.base import ApiModel as ApiModel
from agentq.api.models.base import ErrorDetail as ErrorDetail
from agentq.api.models.base import ErrorResponse as ErrorResponse
from agentq.api.models.base import Health as Health
from agentq.api.models.base import LivePath as LivePath
from agentq.api.models.catalogue import AgentAliasList as AgentAliasList
from agentq.api.models.catalogue import AgentCreated as AgentCreated
from agentq.api.models.catalogue import AgentList as AgentList
from agentq.api.models.catalogue import AgentQuality as AgentQuality
from agentq.api.models.catalogue import AgentVersions as AgentVersions
from agentq.api.models.catalogue import MoveRequest as MoveRequest
from agentq.api.models.catalogue import ScheduleList as ScheduleList
from agentq.api.models.catalogue import ScheduleView as ScheduleView
from agentq.api.models.catalogue import TaskMoved as TaskMoved
from agentq.api.models.catalogue import WebhookSecret as WebhookSecret
from agentq.api.models.compare import MAX_COMPARED_STEPS as MAX_COMPARED_STEPS
from agentq.api.models.compare import RunDelta as RunDelta
from agentq.api.models.compare import RunStep as RunStep
from agentq.api.models.compare import RunTotals as RunTotals
from agentq.api.models.compare import StepPair as StepPair
from agentq.api.models.compare import TaskComparison as TaskComparison
from agentq.api.models.conversation import CloseResult as CloseResult
from agentq.api.models.conversation import InterruptResult as InterruptResult
from agentq.api.models.conversation import MessageAccepted as MessageAccepted
from agentq.api.models.conversation import MessageList as MessageList
from agentq.api.models.conversation import MessageRequest as MessageRequest
from agentq.api.models.conversation import MessageView as MessageView
from agentq.api.models.files import DEFAULT_FILES_PAGE as DEFAULT_FILES_PAGE
from agentq.api.models.files import MAX_FILES_PAGE as MAX_FILES_PAGE
from agentq.api.models.files import FileDiff as FileDiff
from agentq.api.models.files import FileEntry as FileEntry
from agentq.api.models.files import FileList as FileList
from agentq.api.models.files import WorkspaceUploaded as WorkspaceUploaded
from agentq.api.models.files import WorkspaceUploadRequest as WorkspaceUploadRequest
from agentq.api.models.fleet import MESSAGE_ID_PATTERN as MESSAGE_ID_PATTERN
from agentq.api.models.fleet import BreakersView as BreakersView
from agentq.api.models.fleet import BreakerView as BreakerView
from agentq.api.models.fleet import CallerUsage as CallerUsage
from agentq.api.models.fleet import DeadLetterPage as DeadLetterPage
from agentq.api.models.fleet import DeadLetterView as DeadLetterView
from agentq.api.models.fleet import RedriveRequest as RedriveRequest
from agentq.api.models.fleet import RedriveResult as RedriveResult
from agentq.api.models.fleet import SpendView as SpendView
from agentq.api.models.fleet import TenantsUsage as TenantsUsage
from agentq.api.models.fleet import TenantUsage as TenantUsage
from agentq.api.models.fleet import UserUsage as UserUsage
from agentq.api.models.tasks import BudgetRequest as BudgetRequest
from agentq.api.models.tasks import BudgetView as BudgetView
from agentq.api.models.tasks import CancelResult as CancelResult
from agentq.api.models.tasks import ChildrenSummary as ChildrenSummary
from agentq.api.models.tasks import ConstraintsPatch as ConstraintsPatch
from agentq.api.models.tasks import DecisionRequest as DecisionRequest
from agentq.api.models.tasks import ForkRequest as ForkRequest
from agentq.api.models.tasks import GradeView as GradeView
from agentq.api.models.tasks import LapsedHoldView as LapsedHoldView
from agentq.api.models.tasks import LatencyView as LatencyView
from agentq.api.models.tasks import MoneyView as MoneyView
from agentq.api.models.tasks import PendingCall as PendingCall
from agentq.api.models.tasks import RetryView as RetryView
from agentq.api.models.tasks import TaskAccepted as TaskAccepted
from agentq.api.models.tasks import TaskLinks as TaskLinks
from agentq.api.models.tasks import TaskPage as TaskPage
from agentq.api.models.tasks import TaskResult as TaskResult
from agentq.api.models.tasks import TaskSummary as TaskSummary
from agentq.api.models.tasks import TaskView as TaskView
from agentq.api.models.tasks import TokenUsage as TokenUsage
from agentq.api.models.trace import EventPage as EventPage
from agentq.api.models.trace import GradeEvent as GradeEvent
from agentq.api.models.trace import LLMCallEvent as LLMCallEvent
from agentq.api.models.trace import LLMTokens as LLMTokens
from agentq.api.models.trace import MessageEvent as MessageEvent
from agentq.api.models.trace import TaskEvent as TaskEvent
from agentq.api.models.trace import ToolCallEvent as ToolCallEvent
from agentq.api.models.trace import TraceEvent as TraceEvent
from agentq.api.models.trace import TracePage as TracePage
from agentq.api.models.trace import TransitionEvent as TransitionEvent
from agentq.core.agents import AgentSpec as AgentSpec  # the body of POST /agents, re-exported
from agentq.core.agents import AgentSummary as AgentSummary
from agentq.core.agents import AgentVersion as AgentVersion
from agentq.core.models import TaskSubmission as TaskSubmission  # the body of POST /tasks, re-exported
