"""Issue 40, part 1: a zombie whose call failed unbilled gives its hold back.

A worker whose attempt fails with an HTTP error status (or cannot connect) learns, when it
reports the retry, that its lease is gone. Every attempt it made was refused before any reply,
so the provider billed nothing: the hold goes back at once, whatever the successor did with it
meanwhile (nothing yet, set it aside while the call might still complete, or already counted
it as spent at its deadline). Before, the hold stayed counted and was spent at its deadline with
nothing to correct it: the chaos run's phantom spend (bench/chaos.py --scenario zombies). A
failure that may have been billed (a 200 cut in the middle of its body) keeps the hold counted,
as the unknown it is.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import time
from typing import Any

import pytest

from agentq.core.engine import Engine, EngineConfig
from agentq.core.models import LLMStep, TaskStatus, TaskSubmission
from agentq.runtime import build_registry, build_store
from agentq.storage import keys
from agentq.storage.budget_items import SPENT_PREFIX
from agentq_dev.moto_server import MotoServer

from tests.fake_messages_api import (
    FakeMessagesAPI,
    FakeReply,
    error_reply,
    malformed_json,
    message_reply,
    point_anthropic_at,
    usage_dict,
    wrong_shape,
)
from tests.helpers import deployment

LEASE = 1.0


def _submission() -> TaskSubmission:
    return TaskSubmission.model_validate(
        {
            "goal": "answer in one turn",
            "provider": "anthropic",
            "constraints": {"max_tokens": 5_000, "max_output_tokens": 400, "tools": []},
        }
    )


def _answer() -> FakeReply:
    return message_reply([{"type": "text", "text": "late"}], usage=usage_dict(input_tokens=10, output_tokens=5))


def _page() -> FakeReply:
    return dataclasses.replace(malformed_json(), raw=b"<html><title>Sign in</title></html>", content_type="text/html")


def cloudflare(status: int) -> FakeReply:
    """Cloudflare's own page for a 52x, as it answers in front of api.anthropic.com, api.openai.com
    and many gateways."""
    page = f"<html><head><title>api.anthropic.com | {status}: Cloudflare</title></head></html>".encode()
    return FakeReply(status, None, raw=page, content_type="text/html")


LITELLM_TIMEOUT = {"error": {"message": "litellm.Timeout: APITimeoutError - Request timed out.", "type": None,
                             "param": None, "code": "408"}}  # fmt: skip


def _point_the_provider_at(fake: FakeMessagesAPI, monkeypatch: pytest.MonkeyPatch, *, streamed: bool = False) -> None:
    """The anthropic provider talks to ``fake``, retrying at once. Not streamed unless asked:
    a whole reply tells nothing before it ends, as OpenAI's and Converse's calls do, so what
    may have been billed is the whole hold; a stream's first event narrows it (below)."""
    monkeypatch.setenv("AGENTQ_STREAM_ABOVE_TOKENS", "0" if streamed else "8192")
    point_anthropic_at(fake, monkeypatch.setenv)
    monkeypatch.setenv("AGENTQ_PROVIDER_RETRY", '{"base_delay": 0.01, "max_delay": 0.01}')


def _run_zombie(
    moto_server: MotoServer, monkeypatch: pytest.MonkeyPatch, first: FakeReply, successor: str
) -> tuple[Any, str]:
    """The first attempt gets ``first`` once a successor has claimed the task (its lease lapsed
    meanwhile) and treated the hold as ``successor`` says. Returns (the budget, the outcome)."""
    settings = deployment(moto_server)
    store = build_store(settings)
    task = store.tasks.create(_submission(), tenant="t")
    seen: list[Any] = []

    def answer(request: Any) -> FakeReply:
        """The model: the first attempt is answered only once the successor has the task."""
        seen.append(request)
        if len(seen) > 1:
            return _answer()
        deadline = time.monotonic() + 30
        while (claim := store.tasks.claim(task.task_id, "successor", 30)) is None:
            assert time.monotonic() < deadline, "the zombie's lease never lapsed"
            time.sleep(0.05)
        lease, current = claim
        held = current.inflight
        assert held is not None and held.epoch == 1
        if successor in ("set_aside", "spent"):
            store.budgets.set_aside(lease, held)
        if successor == "spent":
            store.budgets.spend_lapsed(task.task_id, task.task_id, held)
        return first

    with FakeMessagesAPI() as fake:
        fake.responder = answer
        _point_the_provider_at(fake, monkeypatch)
        config = EngineConfig(lease_seconds=LEASE)
        engine = Engine(store, worker_id="zombie", tools=build_registry(settings), config=config)
        result = engine.run(task.task_id, keeper=lambda session: contextlib.nullcontext())  # paused: no heartbeat
    assert len(seen) == 1  # no attempt after the lease was found lost
    return store.budgets.get(task.task_id), result.outcome


@pytest.mark.parametrize("successor", ["claimed", "set_aside", "spent"])
@pytest.mark.parametrize(
    "refusal",
    [error_reply(500, "api_error", "boom"), error_reply(529, "overloaded_error", "busy"),
     error_reply(429, "rate_limit_error", "slow down", {"retry-after": "0"})],
    ids=["500", "529", "429"],
)  # fmt: skip
def test_a_zombie_whose_attempt_was_refused_with_an_error_status_gives_its_hold_back_wherever_it_is(
    moto_server: MotoServer, monkeypatch: pytest.MonkeyPatch, refusal: FakeReply, successor: str
) -> None:
    budget, outcome = _run_zombie(moto_server, monkeypatch, refusal, successor)
    assert outcome == "lease_lost"
    assert (budget.used, budget.reserved, budget.available) == (0, 0, budget.cap)


def test_a_zombie_whose_reply_was_cut_midway_keeps_its_hold_counted(
    moto_server: MotoServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same, but the 200's body is cut halfway: the provider may have billed it, so the
    hold stays counted (set aside here) until its deadline, as the unknown it is."""
    cut = dataclasses.replace(_answer(), cut_at=0.5)
    budget, outcome = _run_zombie(moto_server, monkeypatch, cut, "set_aside")
    assert outcome == "lease_lost"
    assert budget.used == 0 and budget.reserved > 0 and budget.available == budget.cap - budget.reserved


def test_the_sdks_failures_say_unbilled_only_when_no_reply_can_have_been_billed() -> None:
    """Through the real SDKs: a refused connection, an error status and a connection reset before
    any byte of a reply are unbilled; a 200 cut in its body is not known unbilled."""
    import anthropic
    import openai

    from agentq.core.providers.anthropic_provider import anthropic_failure
    from agentq.core.providers.openai_provider import openai_failure
    from agentq_dev.moto_server import free_port

    def failure_of(call: Any, classify: Any) -> Any:
        try:
            call()
        except Exception as exc:
            return classify(exc)
        raise AssertionError("the call did not fail")

    closed = f"http://127.0.0.1:{free_port()}"
    a = anthropic.Anthropic(api_key="k", base_url=closed, max_retries=0, timeout=5)
    ask: dict[str, Any] = {
        "model": "claude-sonnet-4-6",
        "max_tokens": 5,
        "messages": [{"role": "user", "content": "hi"}],
    }
    assert failure_of(lambda: a.messages.create(**ask), anthropic_failure).unbilled
    o = openai.OpenAI(api_key="k", base_url=closed, max_retries=0, timeout=5)
    chat: dict[str, Any] = {"model": "gpt-4.1", "messages": [{"role": "user", "content": "hi"}]}
    assert failure_of(lambda: o.chat.completions.create(**chat), openai_failure).unbilled
    with FakeMessagesAPI() as fake:
        fake.enqueue(
            error_reply(500, "api_error", "boom"),
            dataclasses.replace(_answer(), cut_at=0.5),
            dataclasses.replace(_answer(), cut_at=0),
        )
        a = anthropic.Anthropic(api_key="k", base_url=fake.base_url, max_retries=0, timeout=5)
        outcomes = [failure_of(lambda: a.messages.create(**ask), anthropic_failure) for _ in range(3)]
    # A reset before any byte of a reply (a stall then a reset) is unbilled: no answer began.
    assert [(f.kind, f.unbilled) for f in outcomes] == [("status", True), ("connection", False), ("connection", True)]


def test_converse_calls_say_maybe_billed_only_when_a_reply_can_have_been_billed() -> None:
    """Through the provider and the real boto3 against a local Converse server, as the httpx
    SDKs above: a refused connection, an error status and a connection closed before any byte of
    a reply are not maybe billed (Converse's chaos run counted each such reset as a whole unknown
    hold); a 200 cut in its body (botocore alone would read it as an empty reply) and a read
    timeout may have been."""
    import boto3
    import botocore.config
    import botocore.exceptions

    from agentq.core.errors import ProviderError
    from agentq.core.providers import LLMRequest
    from agentq.core.providers.bedrock_converse import BedrockConverseProvider
    from agentq.core.providers.botocore_replies import botocore_failure
    from agentq.core.providers.retry import RetryPolicy
    from agentq_dev.moto_server import free_port

    from tests.fake_model_servers import FakeConverse, converse_error, converse_reply
    from tests.fake_model_servers import FakeReply as WireReply

    def failed(endpoint: str, timeout: float = 5) -> tuple[str | None, bool]:
        config = botocore.config.Config(retries={"total_max_attempts": 1}, read_timeout=timeout, connect_timeout=5)
        client = boto3.client("bedrock-runtime", region_name="us-east-1", endpoint_url=endpoint, config=config,
                              aws_access_key_id="k", aws_secret_access_key="s")  # fmt: skip
        provider = BedrockConverseProvider(client, retry=RetryPolicy(max_attempts=1))
        ask = LLMRequest(model="us.amazon.nova-pro-v1:0", messages=[{"role": "user", "content": "hi"}], max_tokens=5)
        with pytest.raises(ProviderError) as failure:
            provider.complete(ask)
        return failure.value.code, failure.value.maybe_billed

    refused = failed(f"http://127.0.0.1:{free_port()}")
    with FakeConverse() as fake:
        fake.enqueue(
            converse_error(500, "InternalServerException", "boom"),
            WireReply(0, reset=True),
            dataclasses.replace(converse_reply("whole"), cut_at=0.5),
            dataclasses.replace(converse_reply("late"), delay_seconds=2),
        )
        error, reset, cut = (failed(fake.base_url) for _ in range(3))
        slow = failed(fake.base_url, timeout=0.5)
    assert [maybe for _, maybe in (refused, error, reset)] == [False, False, False], (refused, error, reset)
    assert [maybe for _, maybe in (cut, slow)] == [True, True], (cut, slow)
    # A connect timeout (no route here to make one) never sent the request: unbilled, as httpx's.
    timed_out = botocore_failure(botocore.exceptions.ConnectTimeoutError(endpoint_url="http://10.255.255.1"))
    assert timed_out is not None and timed_out.unbilled


def test_a_lease_lost_at_a_step_boundary_gives_back_the_next_calls_hold_which_never_went_out(
    moto_server: MotoServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The tools commit reserves the next call's tokens; the heartbeat then learns the lease is
    gone, before that call starts. The call was never sent, so its hold goes back at once (it
    stayed counted, then was spent at its deadline: the second path of issue 40's phantom spend)."""
    from agentq.core.engine import _tool_turn

    from tests.helpers import call, scripted

    settings = deployment(moto_server)
    store = build_store(settings)
    turns = [{"text": "looking", "tool_calls": [call("lookup", query="q")]}, {"text": "never asked"}]
    task = store.tasks.create(scripted(turns), tenant="t")
    leases: list[Any] = []  # the run's LeaseState, which its keeper (the heartbeat) is given

    def lose_the_lease_after_the_tools_commit(name: str) -> None:
        if name != "after_tools_commit":
            return
        deadline = time.monotonic() + 30
        while store.tasks.claim(task.task_id, "successor", 30) is None:
            assert time.monotonic() < deadline, "the lease never lapsed"
            time.sleep(0.05)
        leases[0].lost.set()  # what the heartbeat does when its extension is refused

    def keeper(held: Any) -> Any:
        leases.append(held)
        return contextlib.nullcontext()

    monkeypatch.setattr(_tool_turn, "crash_point", lose_the_lease_after_the_tools_commit)
    engine = Engine(store, worker_id="w", tools=build_registry(settings), config=EngineConfig(lease_seconds=LEASE))
    result = engine.run(task.task_id, keeper=keeper)

    assert result.outcome == "lease_lost"
    budget = store.budgets.get(task.task_id)
    assert budget.reserved == 0 and budget.used > 0 and budget.available == budget.cap - budget.used
    assert store.tasks.get(task.task_id).inflight is None


def test_a_call_sent_under_a_hold_a_message_made_older_keeps_it_counted_when_the_lease_is_lost(
    moto_server: MotoServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The tools commit reserves the next call's hold for step 3; a message arrives meanwhile and
    is delivered as step 3, so the call goes out as step 4 under the hold of step 3. Its reply is
    cut midway (perhaps billed) and the zombie then learns its lease is gone: the hold must stay
    counted. (Matched by the call's step, the step-boundary release gave it back.)"""
    from agentq.control.conversations import send_message
    from agentq.core.engine import _tool_call
    from agentq.runtime import build_queues

    from tests.fake_messages_api import tool_use_reply

    settings = deployment(moto_server)
    store, queues = build_store(settings), build_queues(settings)
    sub = _submission().model_copy(
        update={"constraints": _submission().constraints.model_copy(update={"tools": ["lookup"]})}
    )
    task = store.tasks.create(sub, tenant="t")
    seen: list[Any] = []

    def model(request: Any) -> FakeReply:
        seen.append(request)
        if len(seen) == 1:
            return tool_use_reply("lookup", {"query": "q"}, text="looking")
        deadline = time.monotonic() + 30
        while store.tasks.claim(task.task_id, "successor", 30) is None:
            assert time.monotonic() < deadline, "the zombie's lease never lapsed"
            time.sleep(0.05)
        return dataclasses.replace(_answer(), cut_at=0.5)

    def a_message_while_the_tool_runs(name: str) -> None:
        if name == "after_tool_run":
            send_message(store, queues, task.task_id, "also this")

    monkeypatch.setattr(_tool_call, "crash_point", a_message_while_the_tool_runs)
    with FakeMessagesAPI() as fake:
        fake.responder = model
        _point_the_provider_at(fake, monkeypatch)
        engine = Engine(
            store, worker_id="zombie", tools=build_registry(settings), config=EngineConfig(lease_seconds=LEASE)
        )
        result = engine.run(task.task_id, keeper=lambda held: contextlib.nullcontext())

    assert result.outcome == "lease_lost" and len(seen) == 2
    steps = store.steps.load(task.task_id, upto=10)
    assert [type(r.body).__name__ for r in steps][:3] == ["LLMStep", "ToolsStep", "MessageStep"]
    budget = store.budgets.get(task.task_id)
    assert budget.reserved > 0  # the cut call's hold, counted until its deadline


@pytest.mark.parametrize(
    ("failure", "maybe_billed"),
    [
        (error_reply(500, "api_error", "boom"), False),
        (error_reply(529, "overloaded_error", "busy"), False),
        (dataclasses.replace(_answer(), cut_at=0.5), True),  # a 200 cut in its body
        (dataclasses.replace(_answer(), cut_at=0), False),  # reset before any byte of a reply: no answer began
        (error_reply(502, "api_error", "bad gateway"), True),  # a gateway's: the upstream may have run
        # A front that sent the call on and gave up on it: the origin took it and did not answer in
        # time (Cloudflare's 524, LiteLLM's 408 for the upstream call it forwarded), or answered
        # something the front could not read (520). The model may have run and billed.
        (cloudflare(520), True),
        (cloudflare(524), True),
        (FakeReply(408, LITELLM_TIMEOUT), True),
        # A front that never reached the origin (Cloudflare's 522: no connection; 523: no route).
        (cloudflare(522), False),
        (cloudflare(523), False),
        (_page(), False),  # a gateway's page read to its declared end: no reply began (providers/pages.py)
        (malformed_json(), True),  # a Message's first bytes framed whole: a proxy may have cut a reply
        (wrong_shape(), True),  # JSON of another shape may still be a billed reply
    ],
    ids=["500", "529", "cut_midway", "reset_before_any_byte", "502", "cloudflare_520", "cloudflare_524",
         "litellm_408", "cloudflare_522", "cloudflare_523", "page", "a_replys_prefix", "another_shape"],
)  # fmt: skip
def test_a_run_that_spends_its_retries_returns_the_hold_only_when_no_attempt_can_have_been_billed(
    moto_server: MotoServer, monkeypatch: pytest.MonkeyPatch, failure: FakeReply, maybe_billed: bool
) -> None:
    """The worker keeps its lease and every attempt fails the same way. Unbilled (an error
    status) the hold goes back; possibly billed, it is counted as spent and as unknown, never
    returned on a guess, never counted as known usage."""
    settings = deployment(moto_server)
    store = build_store(settings)
    task = store.tasks.create(_submission(), tenant="t")
    with FakeMessagesAPI() as fake:
        fake.responder = lambda _request: failure
        _point_the_provider_at(fake, monkeypatch)
        engine = Engine(store, worker_id="w", tools=build_registry(settings), config=EngineConfig(lease_seconds=30))
        result = engine.run(task.task_id)
    if failure.status == 200 and failure.cut_at is None:  # a reply that is not a Message, to the end: no retry fixes it
        assert (result.outcome, result.status) == ("finished", TaskStatus.FAILED), result
    else:
        assert result.outcome in ("retry", "deferred"), result
    budget = store.budgets.get(task.task_id)
    assert budget.reserved == 0 and budget.known == 0 and store.tasks.get(task.task_id).inflight is None
    if maybe_billed:
        assert budget.used == budget.unknown > 0
    else:
        assert (budget.used, budget.unknown, budget.available) == (0, 0, budget.cap)


def test_an_attempt_that_may_have_been_billed_keeps_its_hold_and_the_retry_gets_a_hold_of_its_own(
    moto_server: MotoServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A 200 cut in its body, then an answer: the cut attempt may have been billed, so its hold
    stays counted as unknown and the retry is made under a second hold; the answer settles that
    one. What the provider can have billed (the cut reply and the answer) never passes the cap."""
    settings = deployment(moto_server)
    store = build_store(settings)
    task = store.tasks.create(_submission(), tenant="t")
    with FakeMessagesAPI() as fake:
        fake.enqueue(dataclasses.replace(_answer(), cut_at=0.5), _answer())
        _point_the_provider_at(fake, monkeypatch)
        engine = Engine(store, worker_id="w", tools=build_registry(settings), config=EngineConfig(lease_seconds=30))
        result = engine.run(task.task_id)
    assert result.status is not None and result.status.value == "succeeded", result
    budget = store.budgets.get(task.task_id)
    first_hold = budget.unknown
    assert first_hold > 0 and budget.known == 15 and budget.used == first_hold + 15 and budget.reserved == 0
    # The cut attempt can never be reported: no ticket is left for a later settlement to match.
    meta = store.table.get(keys.meta_key(task.task_id)) or {}
    assert not [name for name in meta if name.startswith(SPENT_PREFIX)], sorted(meta)


def test_a_stream_cut_in_the_middle_counts_what_its_first_event_told_as_known_and_only_the_rest_unknown(
    moto_server: MotoServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The default for the Anthropic API: the call streams, its first event tells the input
    billed (10) and one output token, then the reply is cut. That much is known; the rest of
    the hold stays unknown; the retry's answer (15) is known too."""
    settings = deployment(moto_server)
    store = build_store(settings)
    task = store.tasks.create(_submission(), tenant="t")
    with FakeMessagesAPI() as fake:
        fake.enqueue(dataclasses.replace(_answer(), cut_at=0.5), _answer())
        _point_the_provider_at(fake, monkeypatch, streamed=True)
        engine = Engine(store, worker_id="w", tools=build_registry(settings), config=EngineConfig(lease_seconds=30))
        result = engine.run(task.task_id)
        assert all(r.body.get("stream") is True for r in fake.requests) and len(fake.requests) == 2
    assert result.status is not None and result.status.value == "succeeded", result
    budget = store.budgets.get(task.task_id)
    assert budget.known == 11 + 15, budget  # told by the cut stream, then the whole answer
    assert budget.unknown == budget.used - budget.known > 0 and budget.reserved == 0


def test_a_retry_the_budget_cannot_cover_after_a_possibly_billed_attempt_is_not_made(
    moto_server: MotoServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The cap covers one hold: after a cut reply there is no budget for a second attempt, so
    none is sent; the cut attempt's hold stays counted as unknown."""
    settings = deployment(moto_server)
    store = build_store(settings)
    sub = _submission().model_copy(deep=True)
    sub.constraints.max_tokens = 700  # one hold (input estimate + 400 output), not two
    task = store.tasks.create(sub, tenant="t")
    with FakeMessagesAPI() as fake:
        fake.enqueue(dataclasses.replace(_answer(), cut_at=0.5), _answer())
        _point_the_provider_at(fake, monkeypatch)
        engine = Engine(store, worker_id="w", tools=build_registry(settings), config=EngineConfig(lease_seconds=30))
        result = engine.run(task.task_id)
        asked = len(fake.requests)
    assert asked == 1 and result.outcome in ("retry", "deferred"), (asked, result)
    budget = store.budgets.get(task.task_id)
    assert budget.used == budget.unknown > 0 and budget.known == 0 and budget.reserved == 0


@pytest.mark.parametrize(
    ("failure", "maybe_billed"),
    [(error_reply(500, "api_error", "boom"), False), (dataclasses.replace(_answer(), cut_at=0.5), True)],
    ids=["unbilled_500", "cut_midway"],
)
def test_a_timeout_that_cuts_a_retrys_wait_counts_only_what_may_have_been_billed(
    moto_server: MotoServer, monkeypatch: pytest.MonkeyPatch, failure: FakeReply, maybe_billed: bool
) -> None:
    """The task times out while the call waits to try again: no attempt is on the wire. After an
    unbilled failure nothing is charged; after one that may have been billed, that attempt's hold
    stays counted as unknown, and the retry's own hold, never sent, goes back."""
    importlib.import_module("agentq.core.providers.anthropic_provider")  # before the clock starts: a cold
    # import (the SDK's) can take seconds on a loaded machine, and the first attempt must be made in time.
    settings = deployment(moto_server)
    store = build_store(settings)
    sub = _submission().model_copy(deep=True)
    sub.constraints.timeout_seconds = 10  # the first attempt fails within it; the 30 s wait is cut at it
    task = store.tasks.create(sub, tenant="t")
    asked: list[Any] = []

    def answer(request: Any) -> FakeReply:
        asked.append(request)
        return failure

    with FakeMessagesAPI() as fake:
        fake.responder = answer
        _point_the_provider_at(fake, monkeypatch)
        # The wait outlasts the task (no jitter: a drawn short wait would make a second attempt).
        monkeypatch.setenv("AGENTQ_PROVIDER_RETRY", '{"base_delay": 30, "max_delay": 30, "jitter": "none"}')
        engine = Engine(store, worker_id="w", tools=build_registry(settings), config=EngineConfig(lease_seconds=30))
        result = engine.run(task.task_id)
    assert len(asked) == 1 and result.status is not None and result.status.value == "timed_out", (asked, result)
    budget = store.budgets.get(task.task_id)
    assert budget.reserved == 0 and budget.known == 0
    if maybe_billed:
        assert budget.used == budget.unknown > 0
    else:
        assert (budget.used, budget.unknown) == (0, 0)


def test_a_retry_after_a_possibly_billed_attempt_is_held_at_the_first_holds_size_or_not_made(
    moto_server: MotoServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The request on the wire asks for as much output as before, so the retry's hold is the
    first one's size, never a shrunk one: with room for half a hold left after the cut attempt,
    no retry goes out, and nothing stays reserved (a shrunk hold settled as the first would
    leave the difference reserved, or let the answer pass the cap)."""
    settings = deployment(moto_server)
    store = build_store(settings)
    engine = Engine(store, worker_id="w", tools=build_registry(settings), config=EngineConfig(lease_seconds=30))
    with FakeMessagesAPI() as fake:
        _point_the_provider_at(fake, monkeypatch)
        probe = store.tasks.create(_submission(), tenant="t")
        fake.enqueue(_answer())
        assert engine.run(probe.task_id).status is not None
        (step,) = store.steps.load(probe.task_id)
        assert isinstance(step.body, LLMStep)
        hold = step.body.reserved_tokens  # the size of this call's hold
        sub = _submission().model_copy(deep=True)
        sub.constraints.max_tokens = hold + hold // 2
        task = store.tasks.create(sub, tenant="t")
        fake.enqueue(dataclasses.replace(_answer(), cut_at=0.5), _answer())
        result = engine.run(task.task_id)
        left = fake.pending
    assert left == 1 and result.outcome in ("retry", "deferred"), (left, result)
    budget = store.budgets.get(task.task_id)
    assert (budget.used, budget.unknown, budget.reserved) == (hold, hold, 0)
