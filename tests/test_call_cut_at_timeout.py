"""A task's timeout cuts the model call in flight (issue 39, item 4: ``--timeout 3`` on a call
that took 35 s ended ``timed_out`` only after 35 s; with a timeout of 1 s it even succeeded).

For every provider, through the real SDKs against the local wire-protocol servers (the scripted
provider needs none): the model is held mid-answer by a ``Gate`` the test opens only once the run
has returned, so the run ending ``timed_out`` at all proves it did not wait for the answer (no
clock is read). Then the ledger: the call's hold is counted as spent, since whether the provider
billed what it was cut from is unknown, nothing stays reserved, no step is committed; a call
that answers after it was cut (botocore's ``converse`` cannot be cut mid-read, so its thread
gets the answer) corrects the hold to the usage it reports, once (no double charge).
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from agentq.control.submit import parse_submission
from agentq.core.engine import Engine, EngineConfig, RunResult
from agentq.core.models import TaskStatus
from agentq.core.providers import anthropic_provider, bedrock_converse, openai_provider
from agentq.core.tools import ToolRegistry, tool
from agentq.storage.container import Storage

from tests.fake_messages_api import FakeMessagesAPI, text_reply, usage_dict
from tests.fake_model_servers import (
    FakeChatCompletions,
    FakeConverse,
    chat_completion,
    converse_reply,
    point_boto3_at,
)
from tests.helpers import call, scripted, wait_for
from tests.model_server import Gate

STORAGE = "memory"
SHORT, LONG = 1024, 32_000  # max_output_tokens: a plain call; a streamed one (past the threshold below)
LATE_USAGE = (700, 40)  # what the model reports when it answers after all (input, output)
TIMEOUT = 5  # seconds: time for the call to reach its server (the SDKs are imported above) on a busy machine
# Imported here for their SDKs: importing one in the run would count against the task's timeout.
PROVIDER_MODULES = (anthropic_provider, bedrock_converse, openai_provider)


@pytest.fixture(autouse=True)
def _settings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGENTQ_STREAM_ABOVE_TOKENS", "8192")
    for name, value in (("ANTHROPIC_API_KEY", "test-key"), ("OPENAI_API_KEY", "sk-test"),
                        ("AWS_ACCESS_KEY_ID", "testing"), ("AWS_SECRET_ACCESS_KEY", "testing"),
                        ("AWS_DEFAULT_REGION", "us-east-1"), ("AWS_REGION", "us-east-1")):  # fmt: skip
        monkeypatch.setenv(name, value)


@dataclass(frozen=True)
class Case:
    provider: str
    model: str
    streamed: bool
    hangs_up: bool  # the SDK closes the connection at the deadline (an attempt's timeout): cut on the wire
    answers_late: bool  # the cut call's thread still gets the answer once the model gives it


CASES = [
    Case("anthropic", "claude-sonnet-4-5", False, hangs_up=True, answers_late=False),
    Case("anthropic", "claude-sonnet-4-5", True, hangs_up=True, answers_late=False),
    Case("bedrock", "us.anthropic.claude-sonnet-4-5-20250929-v1:0", False, hangs_up=True, answers_late=False),
    Case("openai", "gpt-4.1-mini", False, hangs_up=True, answers_late=False),
    Case("openai", "gpt-4.1-mini", True, hangs_up=True, answers_late=False),
    # botocore reads with its client's read timeout: the plain call is abandoned, not cut, and its
    # answer is charged when it comes; a stream is closed at its first event after the deadline.
    Case("bedrock-converse", "us.amazon.nova-pro-v1:0", False, hangs_up=False, answers_late=True),
    Case("bedrock-converse", "us.amazon.nova-pro-v1:0", True, hangs_up=False, answers_late=False),
]


@contextlib.contextmanager
def model_server(case: Case, monkeypatch: pytest.MonkeyPatch, gate: Gate) -> Iterator[Callable[[], int]]:
    """The case's wire-protocol server, its one reply held by ``gate``; yields the count of the
    requests it received."""
    late_in, late_out = LATE_USAGE
    if case.provider in ("anthropic", "bedrock"):
        with FakeMessagesAPI() as api:
            monkeypatch.setenv("ANTHROPIC_BASE_URL" if case.provider == "anthropic" else "AGENTQ_BEDROCK_BASE_URL",
                               api.base_url)  # fmt: skip
            api.enqueue(dataclasses.replace(text_reply("too late", usage=usage_dict(late_in, late_out)), gate=gate))
            yield lambda: len(api.requests)
    elif case.provider == "openai":
        with FakeChatCompletions() as chat:
            monkeypatch.setenv("OPENAI_BASE_URL", chat.openai_base_url)
            reply = chat_completion("too late", prompt_tokens=late_in, completion_tokens=late_out)
            chat.enqueue(dataclasses.replace(reply, gate=gate))
            yield lambda: len(chat.requests)
    else:
        with FakeConverse() as converse:
            point_boto3_at(converse, monkeypatch.setenv)
            reply = converse_reply("too late", input_tokens=late_in, output_tokens=late_out)
            converse.enqueue(dataclasses.replace(reply, gate=gate))
            yield lambda: len(converse.requests)


class Running:
    """``engine.run(task_id)`` on a thread, so the test can watch the call it makes."""

    def __init__(self, engine: Engine, task_id: str) -> None:
        self._out: list[RunResult] = []
        self._thread = threading.Thread(target=lambda: self._out.append(engine.run(task_id)), daemon=True)
        self._thread.start()

    def result(self) -> RunResult:
        self._thread.join(60)
        assert self._out, "the run did not return"
        return self._out[0]


def calls_in_flight() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name == "model-call"}


def engine(store: Storage, registry: ToolRegistry) -> Engine:
    return Engine(store, worker_id="w", tools=registry, config=EngineConfig(lease_seconds=5))


def held(store: Storage, task_id: str) -> Any:
    """The call's hold, read while the call is in flight (None before it is taken)."""
    return store.tasks.get(task_id).inflight


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.provider + ("-stream" if c.streamed else ""))
def test_a_task_timeout_cuts_the_model_call_in_flight_and_its_hold_is_counted_once(
    case: Case, store: Storage, registry: ToolRegistry, monkeypatch: pytest.MonkeyPatch
) -> None:
    gate = Gate()
    before = calls_in_flight()
    with model_server(case, monkeypatch, gate) as received:
        body = {"goal": "weather?", "provider": case.provider, "model": case.model,
                "constraints": {"timeout_seconds": TIMEOUT, "max_output_tokens": LONG if case.streamed else SHORT}}  # fmt: skip
        task = store.tasks.create(parse_submission(body), tenant="t")
        run = Running(engine(store, registry), task.task_id)
        try:
            hold = wait_for(lambda: received() == 1 and held(store, task.task_id), what="the call on the wire")
            result = run.result()
            # The model cannot have answered: the gate opens below. The run ended all the same.
            assert (result.status, gate.expired) == (TaskStatus.TIMED_OUT, False), result
            if case.hangs_up:  # cut on the wire, not only given up on
                wait_for(gate.hung_up.is_set, what="the client closing the connection")
        finally:
            gate.open()
        wait_for(lambda: not calls_in_flight() - before, what="the cut call's thread to end")
        assert received() == 1  # no attempt after the cut

    final = store.tasks.get(task.task_id)
    assert final.status is TaskStatus.TIMED_OUT and final.error is not None and final.error["code"] == "timeout"
    assert "cut" in final.error["message"] and final.inflight is None
    assert store.steps.load(task.task_id) == []  # the answer, if any, never became a step
    budget = store.budgets.get(task.task_id)
    assert (budget.reserved, budget.reserved_micros) == (0, 0)
    assert budget.available == budget.cap - budget.used
    orphans = store.steps.orphans(task.task_id)
    if case.answers_late:  # the hold counted as spent is corrected to the usage reported, once
        assert [o.call.usage.total for o in orphans] == [sum(LATE_USAGE)] == [budget.used]
        assert [o.reason for o in orphans] == ["timed_out"]  # not a lost lease: the trace says why
    else:  # the outcome is unknown: the hold is counted in full, once
        assert orphans == [] and budget.used == hold.amount


def test_a_task_timeout_cuts_a_scripted_models_latency(store: Storage, registry: ToolRegistry) -> None:
    """The issue's own case: ``latency_seconds`` far past the task's timeout."""
    latency = 30
    task = store.tasks.create(
        scripted([{"text": "too late", "latency_seconds": latency}], timeout_seconds=TIMEOUT), tenant="t"
    )
    started = time.monotonic()
    run = Running(engine(store, registry), task.task_id)
    hold = wait_for(lambda: held(store, task.task_id), what="the call under its hold")
    result = run.result()
    assert result.status is TaskStatus.TIMED_OUT and time.monotonic() - started < latency
    budget = store.budgets.get(task.task_id)
    assert (budget.reserved, budget.used) == (0, hold.amount) and store.steps.load(task.task_id) == []


def test_a_tool_call_running_past_the_task_timeout_is_abandoned_and_the_task_ends_timed_out(
    store: Storage,
) -> None:
    """What a long tool call does (checked, not changed): the registry stops waiting for it at
    the task's deadline (``ToolContext.deadline``), its result is a timeout, and the commit of
    the tools step ends the task; the next call's hold is never taken."""
    release = threading.Event()

    @tool(timeout_seconds=60)
    def slow_backend() -> str:
        """Waits for a backend."""
        release.wait(60)
        return "answered"

    turns = [{"text": "", "tool_calls": [call("slow_backend")]}, {"text": "never reached"}]
    task = store.tasks.create(scripted(turns, tools=["slow_backend"], timeout_seconds=1), tenant="t")
    try:
        result = engine(store, ToolRegistry([slow_backend])).run(task.task_id)
        assert result.status is TaskStatus.TIMED_OUT and not release.is_set()
    finally:
        release.set()
    first, tools = store.steps.load(task.task_id)
    assert [r.status for r in tools.body.results] == ["timeout"]  # type: ignore[union-attr]
    budget = store.budgets.get(task.task_id)
    assert (budget.reserved, budget.used) == (0, first.body.usage.total)  # type: ignore[union-attr]
