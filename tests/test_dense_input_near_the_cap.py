"""A call near the cap is sized on its input as the provider counts it, where it can: the
Anthropic API's ``POST /v1/messages/count_tokens`` (``core/providers/anthropic_count.py``,
``core/engine/_input_count.py``; ARCHITECTURE 4, "What ``used <= cap`` rests on").

Every hold is sized on the input estimate, three characters a token. A request denser than that
(hex digests, base64, long runs of digits) is billed more; a call whose output allowance the cap
shrank to what is left past the estimate, writing all of it, passed the cap by the difference.
Such a call is now counted first, and goes only with the allowance its counted input leaves.

The engine is real, and so is the ``anthropic`` SDK, against the fake Messages API billing a
dense tokenizer (``dense_input``: one token per one and a half characters, twice the estimate's
rate; with the hidden tool prompt, each request here is billed 29 to 46 % more input than its
estimate) and counting alike (``FakeMessagesAPI(count_input=...)``)."""

from __future__ import annotations

import hashlib
import json
import math
from typing import Any

import pytest

from agentq.control.submit import parse_submission
from agentq.core.engine import Engine, EngineConfig
from agentq.core.engine._input_count import margin
from agentq.core.models import LLMStep, TaskStatus
from agentq.core.tools import ToolRegistry, tool
from agentq.observe import otel
from agentq.storage.container import memory_storage

from tests.fake_messages_api import (
    FakeMessagesAPI,
    RecordedRequest,
    input_tokens,
    message_reply,
    overloaded,
    point_anthropic_at,
    usage_dict,
)
from tests.helpers import wait_for
from tests.otlp_receiver import OtlpReceiver

STORAGE = "memory"
MAX_OUT = 1_000
GOAL = "check these digests against the ledger: " + " ".join(
    hashlib.sha256(str(i).encode()).hexdigest() for i in range(24)
)
FAST_RETRIES = json.dumps({"max_attempts": 3, "base_delay": 0, "max_delay": 0})


def _plain(value: Any) -> Any:
    """``value`` without its cache breakpoints: they bill nothing."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items() if k != "cache_control"}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def dense_input(body: dict[str, Any]) -> int:
    """The input a dense request is billed (the hidden tool prompt aside): one token per one and
    a half characters of the JSON of its system prompt, messages and tools, twice the rate the
    estimate takes (``conversation.ESTIMATE_CHARS_PER_TOKEN``)."""
    text = json.dumps(
        _plain([body.get("system"), body.get("messages"), body.get("tools") or []]), separators=(",", ":")
    )
    return math.ceil(len(text) * 2 / 3)


@tool(name="lookup")
def lookup(query: str) -> str:
    """Look a digest up."""
    return " ".join(hashlib.sha256(f"{query}{i}".encode()).hexdigest() for i in range(6))


def _respond(request: RecordedRequest) -> Any:
    """Two lookups, then an answer; a call whose allowance the cap shrank writes all of it (a
    model that had more to say, cut at ``max_tokens``). Billed ``dense_input``."""
    body = request.body
    usage = usage_dict(input_tokens=dense_input(body), output_tokens=0)
    allowed = int(body["max_tokens"])
    if allowed < MAX_OUT:
        return message_reply([{"type": "text", "text": "w" * (4 * allowed)}], stop_reason="max_tokens",
                             usage={**usage, "output_tokens": allowed})  # fmt: skip
    done = sum(1 for m in body["messages"] if isinstance(m["content"], list)
               for b in m["content"] if b.get("type") == "tool_result")  # fmt: skip
    if done >= 2:
        return message_reply([{"type": "text", "text": "all found"}], usage={**usage, "output_tokens": 3})
    use = {"type": "tool_use", "id": f"toolu_{done + 1:03d}", "name": "lookup", "input": {"query": f"q{done}"}}
    return message_reply([{"type": "text", "text": "looking"}, use], stop_reason="tool_use",
                         usage={**usage, "output_tokens": 20})  # fmt: skip


class Runs:
    """One task a run, each on a fresh store, against one server."""

    def __init__(self, api: FakeMessagesAPI) -> None:
        self.api = api
        self.billed = self.replies = 0  # what the server billed the task so far, in how many replies

    def submit(self, cap: int) -> tuple[Any, Engine]:
        self.billed = self.replies = 0
        store = memory_storage()
        body = {"goal": GOAL, "provider": "anthropic", "model": "claude-sonnet-4-6",
                "constraints": {"tools": ["lookup"], "max_steps": 20, "max_output_tokens": MAX_OUT,
                                "max_tokens": cap}}  # fmt: skip
        task = store.tasks.create(parse_submission(body), tenant="t")
        engine = Engine(store, worker_id="w", tools=ToolRegistry([lookup]), config=EngineConfig(lease_seconds=30))
        return task, engine

    def finish(self, task: Any, engine: Engine) -> tuple[Any, Any, list[LLMStep]]:
        """The task as it ended, its budget and its LLM steps; the ledger charged exactly what
        the server billed, and holds nothing."""
        store = engine.store
        steps = [r.body for r in store.steps.load(task.task_id) if isinstance(r.body, LLMStep)]
        new = len(steps) - self.replies
        wait_for(lambda: len(self.api.delivered_usage) == new, what="the server's record of every reply")
        self.billed += sum(int(u["input_tokens"]) + int(u["output_tokens"]) for u in self.api.delivered_usage)
        self.replies += new
        self.api.delivered_usage.clear()
        budget = store.budgets.get(task.task_id)
        assert budget.used == self.billed and budget.reserved == 0, (budget, self.billed)
        return store.tasks.get(task.task_id), budget, steps

    def run(self, cap: int) -> tuple[Any, Any, list[LLMStep]]:
        task, engine = self.submit(cap)
        engine.run(task.task_id)
        return self.finish(task, engine)


def test_a_dense_call_near_the_cap_that_writes_its_whole_allowance_stays_under_the_cap_at_every_cap(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """At every cap from none of the answering call's hold to all of it, ``used <= cap``, and
    the ledger charged exactly what the server billed. Each request is billed more input than
    its estimate (hex digests at one token per one and a half characters); a call whose hold
    was shrunk is counted once before it goes, a call under its whole hold never is (the run
    without a cap counts nothing), and where the counted input leaves no answer the task ends
    ``cost_exceeded`` naming it. Before, 11 of the 25 caps ended over the cap, by 547 or 760
    tokens: the answering call's estimate held 1,646 tokens of input for a request billed 2,406
    (at the lowest caps, the second call's 1,434 for 1,981), and the model wrote all of an
    allowance sized on it. Now every cap ends 36 to 41 tokens under (the count's margin) or
    further."""
    with FakeMessagesAPI(responder=_respond, bills_tool_prompt=True, count_input=dense_input) as api:
        point_anthropic_at(api, monkeypatch.setenv)
        runs = Runs(api)
        _, _, free = runs.run(1_000_000)
        assert [s.stop_reason for s in free] == ["tool_use", "tool_use", "end_turn"]
        assert api.count_requests == []  # whole holds: no count
        for step in free:  # each request is billed more input than its hold's estimate took
            assert step.usage.input_total > step.reserved_tokens - MAX_OUT, step
        before, whole = sum(s.usage.total for s in free[:2]), free[2].reserved_tokens
        shrunk = refused = 0
        for cap in (before + whole * j // 24 for j in range(1, 26)):  # none of its hold, to all of it
            ended, budget, steps = runs.run(cap)
            assert budget.used <= budget.cap == cap, (cap, budget)
            cut = [s for s, f in zip(steps, free, strict=False) if s.reserved_tokens < f.reserved_tokens]
            counted = (ended.error or {}).get("counted_input_tokens")
            assert len(api.count_requests) == len(cut) + (counted is not None), (cap, steps, ended.error)
            if counted is not None:  # refused on its count: the error names it, and the least it needs
                assert ended.status is TaskStatus.COST_EXCEEDED and ended.error["needed_tokens"] > counted
                assert counted == free[len(steps)].usage.input_total  # what the call would be billed
            api.count_requests.clear()
            shrunk += any(s.stop_reason == "max_tokens" for s in steps)
            refused += counted is not None
    assert shrunk > 0 and refused > 0  # calls went under shrunk holds and wrote all of them; others were refused


def test_a_shrunk_call_whose_input_cannot_be_counted_is_not_sent_and_goes_once_it_can(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The count endpoint answering 500s: the count is retried as a model call is (the
    provider's policy), then the call is not sent on a guess. The turn ends as a model call that
    failed unbilled does (``retry``, ``provider_server_error``, nothing held), the task goes on
    once its input can be counted, and ends under its cap."""
    monkeypatch.setenv("AGENTQ_PROVIDER_RETRY", FAST_RETRIES)
    with FakeMessagesAPI(responder=_respond, bills_tool_prompt=True, count_input=dense_input) as api:
        point_anthropic_at(api, monkeypatch.setenv)
        runs = Runs(api)
        _, _, free = runs.run(1_000_000)
        before, third = sum(s.usage.total for s in free[:2]), free[2]
        cap = before + third.reserved_tokens - 100  # its hold shrunk by 100 tokens
        assert third.reserved_tokens - 100 - third.usage.input_total > 100  # room past its counted input
        api.count_failures = 100
        task, engine = runs.submit(cap)
        result = engine.run(task.task_id)
        assert result.outcome == "retry" and result.error is not None
        assert result.error["code"] == "provider_server_error" and result.error["attempts"] == 3
        assert len(api.count_requests) == 3  # retried as a model call's attempts are
        waiting, budget, steps = runs.finish(task, engine)
        assert not waiting.status.terminal  # tried again later, as after a model call's outage
        assert len(steps) == 2 and budget.reserved == 0  # the shrunk call never went; nothing held
        api.count_failures = 0
        result = engine.run(task.task_id)
        ended, budget, steps = runs.finish(task, engine)
        assert [s.stop_reason for s in steps] == ["tool_use", "tool_use", "max_tokens"], (ended.status, ended.error)
        counted = (
            third.usage.input_total
        )  # what the count said: the call's allowance is the hold less it and its margin
        assert steps[-1].usage.output_tokens == third.reserved_tokens - 100 - counted - margin(counted)
        assert budget.used <= budget.cap == cap and len(api.count_requests) == 4


def test_each_count_is_a_span_of_its_own_beside_the_model_calls(monkeypatch: pytest.MonkeyPatch) -> None:
    """A count is noted in the trace as a call is (``observe.input_count``): a client span
    ``count_tokens <model>`` with the GenAI attributes, the count it got, or the error that
    failed it; it is no ``chat`` span, and no GenAI client metric (it bills nothing)."""
    monkeypatch.setenv("AGENTQ_PROVIDER_RETRY", FAST_RETRIES)
    with (
        OtlpReceiver() as receiver,
        FakeMessagesAPI(responder=_respond, bills_tool_prompt=True, count_input=dense_input) as api,
    ):
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.endpoint)
        otel.reset()
        try:
            point_anthropic_at(api, monkeypatch.setenv)
            runs = Runs(api)
            _, _, free = runs.run(1_000_000)
            before, third = sum(s.usage.total for s in free[:2]), free[2]
            api.count_failures = 3  # the first count fails past its retries; the next run's goes
            task, engine = runs.submit(before + third.reserved_tokens - 100)
            assert engine.run(task.task_id).outcome == "retry"
            engine.run(task.task_id)
            runs.finish(task, engine)
        finally:
            otel.reset()
    counts = [s for s in receiver.spans if s.name.startswith("count_tokens ")]
    assert [s.name for s in counts] == ["count_tokens claude-sonnet-4-6"] * 2 and all(s.kind == 3 for s in counts)
    assert all(s.attributes["gen_ai.operation.name"] == "count_tokens" for s in counts)
    assert all(s.attributes["gen_ai.provider.name"] == "anthropic" for s in counts)
    assert counts[0].attributes["error.type"] == "provider_server_error" and counts[0].status_code == 2
    assert counts[1].attributes["agentq.counted_input_tokens"] == third.usage.input_total
    assert len([s for s in receiver.spans if s.name.startswith("chat ")]) == 3 + 3  # the calls alone


FALLBACK = "claude-haiku-4-5"  # the fallback: its tokenizer reads the request densely, the first model's does not


def _overloaded_or_dense(request: RecordedRequest) -> Any:
    """The task's model is overloaded (529); its fallback answers, billed densely, writing all of
    an allowance the cap shrank."""
    body = request.body
    if body["model"] != FALLBACK:
        return overloaded()
    allowed, usage = int(body["max_tokens"]), usage_dict(input_tokens=dense_input(body), output_tokens=3)
    if allowed < MAX_OUT:
        return message_reply([{"type": "text", "text": "w" * (4 * allowed)}], stop_reason="max_tokens",
                             usage={**usage, "output_tokens": allowed})  # fmt: skip
    return message_reply([{"type": "text", "text": "all found"}], usage=usage)


def _counted_by_model(body: dict[str, Any]) -> int:
    """The fallback counts densely; the task's own model four characters a token (below the estimate)."""
    return dense_input(body) if body["model"] == FALLBACK else input_tokens(body)


def test_a_shrunk_call_that_falls_over_is_sized_on_the_input_its_fallbacks_model_counts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The task's model counts the request below its estimate, is overloaded past its retries,
    and the call falls over to a model that reads it densely: the fallback's provider counts it
    again, and the call goes to it with the allowance that count leaves, or, where it leaves no
    answer, not at all (the turn fails with the first model's overload, its hold back). At every
    cap, ``used <= cap``; before, the fallback's answer went with the allowance sized on the
    estimate and passed the cap."""
    monkeypatch.setenv("AGENTQ_PROVIDER_RETRY", FAST_RETRIES)
    with FakeMessagesAPI(responder=_overloaded_or_dense, count_input=_counted_by_model) as api:
        point_anthropic_at(api, monkeypatch.setenv)

        def run(cap: int) -> tuple[Any, Any, list[LLMStep]]:
            store = memory_storage()
            body = {"goal": GOAL, "provider": "anthropic", "model": "claude-sonnet-4-6",
                    "fallbacks": [{"provider": "anthropic", "model": FALLBACK}],
                    "constraints": {"max_output_tokens": MAX_OUT, "max_tokens": cap}}  # fmt: skip
            task = store.tasks.create(parse_submission(body), tenant="t")
            result = Engine(store, worker_id="w", config=EngineConfig(lease_seconds=30)).run(task.task_id)
            steps = [r.body for r in store.steps.load(task.task_id) if isinstance(r.body, LLMStep)]
            wait_for(lambda: len(api.delivered_usage) == len(steps), what="the server's record of every reply")
            billed = sum(int(u["input_tokens"]) + int(u["output_tokens"]) for u in api.delivered_usage)
            api.delivered_usage.clear()
            budget = store.budgets.get(task.task_id)
            assert budget.used == billed and budget.reserved == 0, (cap, budget, billed)
            return result, budget, steps

        _, _, [free] = run(1_000_000)
        assert free.model == FALLBACK and api.count_requests == []  # a whole hold: nothing counted
        whole = free.reserved_tokens
        assert free.usage.input_total > whole - MAX_OUT  # the fallback is billed more than the estimate
        went = refused = 0
        for cap in (whole * j // 24 for j in range(1, 24)):  # a share of its hold, to nearly all of it
            api.count_requests.clear()
            result, budget, steps = run(cap)
            assert budget.used <= budget.cap == cap, (cap, budget)
            models = [r.body["model"] for r in api.count_requests]
            if steps:  # the fallback answered under a shrunk hold, sized on its own count
                assert models == ["claude-sonnet-4-6", FALLBACK] and steps[0].stop_reason == "max_tokens", (
                    cap,
                    whole,
                    steps,
                )
                went += 1
            elif models == ["claude-sonnet-4-6", FALLBACK]:  # its count left no answer: nothing sent to it
                assert result.outcome == "retry" and result.error is not None and result.error["code"] == "overloaded"
                refused += 1
    assert went > 0 and refused > 0
