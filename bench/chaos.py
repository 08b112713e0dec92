"""agentq's chaos suite: the local stack under random worker faults and a faulty model server,
then every invariant checked (``make chaos``; a smaller seeded run is part of ``make test``).

    python bench/chaos.py                                # 200 tasks, 4 workers, 90 s of chaos
    python bench/chaos.py --tasks 24 --workers 3 --chaos-seconds 20 --seed 7 --json
    python bench/chaos.py --scenario zombies --seed 3    # zombies only (issue 40's run)

What runs: the local stack (moto server, the HTTP API with API keys, the sweeper thread) and
``--workers`` worker processes; a Messages API server that answers as a model would from each
task's plan (encoded in its goal) and injects faults into ``--fault-rate`` of the requests:
429 with retry-after, 529, 500, a connection reset, a slow reply, a 200 that is not JSON. Tasks go
in through the HTTP API: multi-tool turns of a read-only tool (``lookup``) and a side-effecting
one (``charge_card``, which appends a line per execution to a ledger file no worker can take
back), tight budgets that must end ``cost_exceeded``, fan-outs of sub-agents, and conversations:
tasks that people send messages to while they run (and after they answer), some of them
interrupted mid-run and then told to go on. Meanwhile a chaos loop SIGKILLs (and replaces) or
SIGSTOPs/SIGCONTs a random worker every 1-3 s.

``--scenario zombies`` is the run of issue 40: no SIGKILL; every 1-3 s a running worker is
SIGSTOPped for 4.5-7 s, past its 3 s lease (never the last two running), so each of the four
workers, holding many of the 30 tasks, wakes as a zombie of all of them; a hold's deadline is
15 s (``AGENTQ_MAX_CALL_SECONDS`` 13); the model server adds two faults: a reply cut in the
middle (the 200's headers and half its body, or half a stream's events, then a reset: billed,
its usage unknown to the client) and a stall then a reset before any byte; half the tasks'
calls are streamed (1,000 output tokens allowed, above ``AGENTQ_STREAM_ABOVE_TOKENS`` 150, so
a hold is the input and 1,000), half not (100).

Checked at the end, each a line of the table and a non-zero exit if broken (naming tasks):
every task ended, with the status and result its plan implies; each side effect ran at most
once, and exactly once when its committed step says it ran; each message accepted is delivered
into its conversation exactly once, in the order accepted, and the last answer came after all of
them (a conversation's answer says how many messages it heard); ``used <= cap`` and
``reserved == 0`` on every budget, each task's of every tree (it checked the roots' only, and a
sub-agent left holding its share went unseen); the ledger equals the usage the model server delivered whole
for every tree that no SIGKILL touched (a worker killed with a call in flight never reports it:
its hold is counted as spent at its deadline, whether or not the call was answered, so such a
tree's ledger may exceed the delivered usage by that hold, and it is reported, not failed); no
task of such a tree ended ``cost_exceeded`` while the cap less everything the servers billed
its tree still covered its next call (a false ``cost_exceeded``; the call's least hold as the
task's error names it, ``needed_tokens``); no task stranded (the
sweeper's count is a figure); no DLQ holds a message (no task in the plan really fails); no
worker logged a traceback. Per tree (``bench/_chaos_ledger.py``): the usage delivered whole and
cut mid-reply, in tokens and dollars, the ledger's charge and the difference, the holds
counted in full at their deadline and never corrected, and the false ``cost_exceeded``; every
request the servers saw, with what it got, is kept in the run's directory (requests.jsonl).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from _benchlib import log, table  # noqa: E402
from _chaos_ledger import ANSWERED, TREE_HEADERS, ProviderLedger, ledger_by_tree, tree_rows  # noqa: E402
from _chaos_wires import (  # noqa: E402
    Turn,
    chat_reply,
    chat_turns,
    converse_reply_of,
    converse_turns,
    delivered_usage,
)
from _plot import Panel, add_plot_args  # noqa: E402
from _report import report  # noqa: E402
from agentq.api.client import ApiError, Client  # noqa: E402
from agentq.control.subtrees import subtree  # noqa: E402
from agentq.core.models import MessageStep, TaskStatus, ToolsStep  # noqa: E402
from agentq.resources import TIERS, QueueSettings  # noqa: E402
from agentq.worker import WorkerConfig  # noqa: E402
from agentq_dev.stack import LocalStack  # noqa: E402

from tests.fake_messages_api import (  # noqa: E402
    FakeMessagesAPI,
    FakeReply,
    RecordedRequest,
    error_reply,
    malformed_json,
    message_reply,
    overloaded,
    rate_limited,
    usage_dict,
)
from tests.fake_model_servers import FakeChatCompletions, FakeConverse, Recorded, chat_error, converse_error  # noqa: E402
from tests.fake_model_servers import FakeReply as WireReply  # noqa: E402

# The model each provider's tasks name (bench/_chaos_wires.py plays them on their own wires).
MODELS = {"anthropic": "claude-haiku-4-5", "openai": "gpt-4.1-mini", "bedrock-converse": "us.amazon.nova-pro-v1:0"}
OUTPUT_TOKENS = 40
# The model server's faults: the default run's, and the zombies scenario's, which adds a reply
# cut in the middle (200 headers and half the body, or half a stream's events, then a reset)
# and a stall then a reset before any byte.
FAULTS = ("429", "529", "500", "reset", "slow", "malformed")
ZOMBIE_FAULTS = (*FAULTS, "cut", "stall")


@dataclass
class Plan:
    """What one task's model does, turn by turn: decided by the runner, played by the server."""

    tag: str
    kind: str  # tools | budget | fanout | child | talk
    turns: int  # tool-calling turns before the final answer
    children: list[str] = field(default_factory=list)
    provider: str = "anthropic"  # a root's; its sub-agents run on their parent's model

    @property
    def final(self) -> str:
        return f"done {self.tag}"


class ChaosModel:
    """The model server's brain: a reply from the task's plan and its conversation so far, and
    a fault instead of it for ``fault_rate`` of the requests (of ``kinds``). Counts what it
    billed per task (``ledger``: replies delivered whole, and cut mid-reply), and the faults it
    injected."""

    def __init__(self, plans: dict[str, Plan], fault_rate: float, seed: int, kinds: tuple[str, ...] = FAULTS) -> None:
        self.plans = plans
        self.fault_rate = fault_rate
        self.kinds = list(kinds)
        self.rng = random.Random(seed)
        self.lock = threading.Lock()
        self.faults: Counter[str] = Counter()
        self.ledger = ProviderLedger()

    @property
    def delivered(self) -> Counter[str]:
        """Tree tag -> tokens delivered in whole replies."""
        trees: Counter[str] = Counter()
        for tag, tokens in self.ledger.delivered.items():
            trees[tag.split(".", 1)[0]] += tokens
        return trees

    def play(self, messages: list[dict[str, Any]], body: Any = None, *, cuts: bool = True) -> Turn | None:
        """The model's turn for a conversation in Messages API shape (any wire's, read back by
        bench/_chaos_wires.py); None when no plan's goal starts it. ``body``: the request as
        sent, logged with what it got; ``cuts``: whether the wire's server plays a cut reply
        and a stall (else they are a reset)."""
        plan = self.plans.get(_tag_of(messages))
        if plan is None:
            return None
        with self.lock:
            roll, kind = self.rng.random(), self.rng.choice(self.kinds)
            slow = self.rng.uniform(0.5, 2.0)
            if roll < self.fault_rate:
                self.faults[kind] += 1
        fault = kind if roll < self.fault_rate else None
        seen = ANSWERED if fault in (None, "slow") else "reset" if fault in ("cut", "stall") and not cuts else fault
        self.ledger.saw(plan.tag, messages, str(seen), body)
        if fault is not None and fault not in ("slow", "cut"):
            return Turn(fault=fault, slow=slow)
        content = self._answer(plan, messages)
        return Turn("cut" if fault == "cut" else None, slow if fault == "slow" else 0.0, content,
                    max(1, len(json.dumps(messages)) // 4), OUTPUT_TOKENS)  # fmt: skip

    def __call__(self, request: RecordedRequest) -> FakeReply | None:
        """The Messages API's reply (provider anthropic); None drops the connection."""
        body = request.body if isinstance(request.body, dict) else {}
        turn = self.play(body.get("messages") or [], body)
        if turn is None:
            return error_reply(400, "invalid_request_error", "chaos model: no plan for this goal")
        if turn.fault == "stall":  # nothing for a while, then a reset before any byte
            return FakeReply(0, None, delay_seconds=turn.slow, cut_at=0.0)
        if turn.fault not in (None, "cut"):
            return {
                "429": rate_limited(retry_after=0.2),
                "529": overloaded(),
                "500": error_reply(500, "api_error", "chaos: internal error"),
                "malformed": malformed_json(),
            }.get(str(turn.fault))  # "reset": None, the handler drops the connection
        usage = usage_dict(input_tokens=turn.input_tokens, output_tokens=turn.output_tokens)
        # "cut": the 200's headers and half its body (or half a stream's events), then a reset.
        cut = 0.5 if turn.fault == "cut" else None
        return dataclasses.replace(message_reply(turn.content, usage=usage), delay_seconds=turn.slow, cut_at=cut)

    def chat(self, request: Recorded) -> WireReply:
        """The Chat Completions reply (provider openai)."""
        turn = self.play(chat_turns(request.body), request.body, cuts=False)
        return chat_reply(turn) if turn is not None else chat_error(400, "invalid_request_error", "chaos: no plan")

    def converse(self, request: Recorded) -> WireReply:
        """The Converse reply (provider bedrock-converse)."""
        turn = self.play(converse_turns(request.body), request.body, cuts=False)
        return converse_reply_of(turn) if turn is not None else converse_error(400, "ValidationException", "no plan")

    def delivered_reply(self, request: RecordedRequest, usage: dict[str, Any]) -> None:
        messages = request.body.get("messages") if isinstance(request.body, dict) else []
        self._billed(messages or [], (int(usage["input_tokens"]), int(usage["output_tokens"])), whole=True)

    def cut_reply(self, request: RecordedRequest, usage: dict[str, Any]) -> None:
        """A reply cut after its headers: billed, but its usage is unknown to the client, save
        what a stream's first event told it (its input, and one output token) before the cut."""
        messages = request.body.get("messages") if isinstance(request.body, dict) else []
        self._billed(messages or [], (int(usage["input_tokens"]), int(usage["output_tokens"])), whole=False)
        if isinstance(request.body, dict) and request.body.get("stream"):
            self.ledger.told[_tag_of(messages or [])] += int(usage["input_tokens"]) + 1

    def delivered_chat(self, request: Recorded, reply: WireReply) -> None:
        self._billed(chat_turns(request.body), delivered_usage(reply), whole=True)

    def delivered_converse(self, request: Recorded, reply: WireReply) -> None:
        self._billed(converse_turns(request.body), delivered_usage(reply), whole=True)

    def _billed(self, messages: list[dict[str, Any]], usage: tuple[int, int], *, whole: bool) -> None:
        tag = _tag_of(messages)
        plan = self.plans.get(tag)
        model = MODELS[plan.provider] if plan is not None else ""
        self.ledger.billed(tag, model, *usage, whole=whole)

    def _answer(self, plan: Plan, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        done = sum(1 for m in messages if m.get("role") == "assistant")
        if plan.kind == "talk" and done >= plan.turns:
            return [{"type": "text", "text": heard(plan, _said(messages))}]
        if plan.kind == "fanout" and done == 0:
            spawn = {
                "subagents": [{"goal": f"chaos [{c}] child of {plan.tag}", "tools": ["lookup", "charge_card"]}
                              for c in plan.children]
            }  # fmt: skip
            content = [_tool_use(plan.tag, done, 0, "spawn_subagents", spawn)]
        elif done < plan.turns:
            content = [
                {"type": "text", "text": f"turn {done} of {plan.tag}"},
                _tool_use(plan.tag, done, 0, "lookup", {"query": f"{plan.tag}-{done}", "size": 300}),
                _tool_use(plan.tag, done, 1, "charge_card", {"amount_cents": done + 1, "memo": plan.tag}),
            ]
        else:
            content = [{"type": "text", "text": plan.final}]
        return content


def _tool_use(tag: str, turn: int, n: int, name: str, tool_input: dict[str, Any]) -> dict[str, Any]:
    return {"type": "tool_use", "id": f"toolu_{tag.replace('.', '_')}_{turn}_{n}", "name": name, "input": tool_input}


def heard(plan: Plan, messages: int) -> str:
    """A conversation's answer: it names how many of the person's messages it has read."""
    return f"{plan.final} heard {messages}"


def _said(messages: list[dict[str, Any]]) -> int:
    """The person's messages in a conversation: the text blocks of user turns, less the goal."""
    texts = 0
    for m in messages:
        if m.get("role") != "user":
            continue
        content = m.get("content")
        texts += 1 if isinstance(content, str) else sum(1 for b in content or [] if b.get("type") == "text")
    return max(0, texts - 1)


def _tag_of(messages: list[dict[str, Any]]) -> str:
    """The plan's tag from the task's goal, the first user message: ``chaos [<tag>] ...``."""
    if not messages:
        return ""
    content = messages[0].get("content")
    text = content if isinstance(content, str) else " ".join(b.get("text", "") for b in content or [])
    start = text.find("chaos [")
    end = text.find("]", start)
    return text[start + 7 : end] if start >= 0 and end > start else ""


def make_plans(n: int, rng: random.Random, providers: tuple[str, ...] = ("anthropic",)) -> dict[str, Plan]:
    """``n`` root plans of random kinds, their providers taken in turn from ``providers``."""
    plans: dict[str, Plan] = {}
    for i in range(n):
        tag = f"t{i}"
        provider = providers[i % len(providers)]
        kind = rng.choices(["tools", "budget", "fanout", "talk"], weights=[5, 2, 2, 3])[0]
        if kind == "fanout":
            children = [f"{tag}.c{j}" for j in range(rng.randint(2, 3))]
            plans[tag] = Plan(tag, kind, turns=1, children=children, provider=provider)
            for child in children:
                plans[child] = Plan(child, "child", turns=rng.randint(1, 2), provider=provider)
        else:
            turns = rng.randint(2, 5) if kind in ("tools", "talk") else 12
            plans[tag] = Plan(tag, kind, turns=turns, provider=provider)
    return plans


def submission(plan: Plan, max_output_tokens: int = 200) -> dict[str, Any]:
    body: dict[str, Any] = {
        "goal": f"chaos [{plan.tag}] {plan.kind}",
        "provider": plan.provider,
        "model": MODELS[plan.provider],
        "constraints": {"tools": ["lookup", "charge_card"], "max_output_tokens": max_output_tokens},
    }
    if plan.kind == "talk":
        body["constraints"]["max_tokens"] = 200_000
        body["constraints"]["max_steps"] = 200
    if plan.kind == "fanout":
        body["constraints"]["tools"].append("spawn_subagents")
        body["constraints"]["max_tokens"] = 200_000
    elif plan.kind == "budget":
        body["constraints"]["max_tokens"] = 5_000  # a handful of turns: it must end cost_exceeded
    elif plan.kind != "talk":
        body["constraints"]["max_tokens"] = 60_000
    return body


@dataclass
class People:
    """People talking to the conversations while the chaos runs: a message now and then (retried
    with its Idempotency-Key, as a client would), and an interrupt to some; after the chaos,
    a last message to each conversation left idle by an interrupt, so that every one ends."""

    client: Client
    tasks: dict[str, str]  # tag -> task id, the talk plans only
    rng: random.Random
    accepted: Counter[str] = field(default_factory=Counter)  # task id -> messages it took
    interrupts: int = 0
    raised: set[str] = field(default_factory=set)  # tasks whose budget was raised for unknown usage
    raised_for_unknown: int = 0  # budget raises for tasks held back by calls of unknown outcome
    refused: Counter[str] = field(default_factory=Counter)  # why a send or an interrupt was refused
    _stop: threading.Event = field(default_factory=threading.Event)

    def talk(self, until: float) -> None:
        while time.monotonic() < until and not self._stop.is_set() and self.tasks:
            task_id = self.rng.choice(list(self.tasks.values()))
            if self.rng.random() < 0.25:
                self.interrupt(task_id)
            else:
                self.send(task_id)
            time.sleep(self.rng.uniform(0.05, 0.4))

    def send(self, task_id: str) -> None:
        key = f"chaos-{task_id}-{self.accepted[task_id] + 1}-{self.rng.random()}"
        try:
            sent = self.client.send(task_id, f"message {self.accepted[task_id] + 1}", idempotency_key=key)
        except ApiError as err:
            self.refused[err.code] += 1
            return
        if not sent.replayed:
            self.accepted[task_id] += 1

    def interrupt(self, task_id: str) -> None:
        try:
            self.client.interrupt(task_id)
            self.interrupts += 1
        except ApiError as err:
            self.refused[err.code] += 1

    def wake_the_idle(self, store: Any) -> None:
        for task in store.tasks.get_many(list(self.tasks.values())):
            if task.status is TaskStatus.IDLE:
                self.send(task.task_id)

    def settle_the_unknown(self, roots: list[str]) -> None:
        """A task held back only by calls of unknown outcome (a killed worker's call: its retry
        says ``unknown_usage``) waits for a person: here the person raises its budget by the
        unknown part, as one who treats it as unbilled would (issue 40, part 3)."""
        for task_id in roots:
            try:
                view = self.client.get(task_id)
                if view.status.terminal or view.retry is None or view.retry.error.get("code") != "unknown_usage":
                    continue
                budget = view.budget
                if budget is None or not budget.unknown:
                    continue
                money = budget.money.unknown_usd if budget.money is not None else None
                self.client.raise_budget(task_id, add_tokens=budget.unknown, add_usd=money)
                self.raised_for_unknown += 1
                self.raised.add(task_id)
            except ApiError as err:
                self.refused[err.code] += 1


@dataclass
class Chaos:
    """Worker processes under a fault loop: SIGKILL (and a replacement), SIGSTOP, SIGCONT;
    or, in the zombies scenario (``pause``), SIGSTOP alone, each for a drawn time past the lease,
    then SIGCONT: every worker paused wakes as a zombie of the tasks it held."""

    stack: LocalStack
    logs: Path
    rng: random.Random
    workers: list[subprocess.Popen[bytes]] = field(default_factory=list)
    stopped: set[int] = field(default_factory=set)
    kills: int = 0
    stops: int = 0
    kill_times: list[float] = field(default_factory=list)
    wake_at: dict[int, float] = field(default_factory=dict)  # pid -> when its SIGCONT is due
    paused_seconds: list[float] = field(default_factory=list)

    def spawn(self) -> None:
        out = (self.logs / f"worker-{len(self.workers)}.log").open("wb")
        self.workers.append(self.stack.worker_process(stdout=out, stderr=out))

    def live(self) -> list[subprocess.Popen[bytes]]:
        return [w for w in self.workers if w.poll() is None]

    def fault(self) -> None:
        victim = self.rng.choice(self.live())
        if victim.pid in self.stopped:
            os.kill(victim.pid, signal.SIGCONT)
            self.stopped.discard(victim.pid)
        elif self.rng.random() < 0.5:
            victim.kill()
            victim.wait()
            self.kills += 1
            self.kill_times.append(time.time())
            self.spawn()
        else:
            os.kill(victim.pid, signal.SIGSTOP)
            self.stopped.add(victim.pid)
            self.stops += 1
            if len([w for w in self.live() if w.pid not in self.stopped]) < 2:
                self.spawn()

    def pause(self, low: float, high: float) -> None:
        """SIGSTOP a running worker for ``low``-``high`` seconds (its SIGCONT is ``wake``'s),
        never one of the last two running: the others take its tasks over meanwhile."""
        running = [w for w in self.live() if w.pid not in self.stopped]
        if len(running) <= 2:
            return
        victim = self.rng.choice(running)
        os.kill(victim.pid, signal.SIGSTOP)
        self.stopped.add(victim.pid)
        self.stops += 1
        seconds = self.rng.uniform(low, high)
        self.paused_seconds.append(seconds)
        self.wake_at[victim.pid] = time.monotonic() + seconds

    def wake(self) -> None:
        """SIGCONT the paused workers whose time is up."""
        now = time.monotonic()
        for pid, due in list(self.wake_at.items()):
            if now >= due:
                os.kill(pid, signal.SIGCONT)
                self.stopped.discard(pid)
                del self.wake_at[pid]

    def calm(self) -> None:
        for pid in list(self.stopped):
            os.kill(pid, signal.SIGCONT)
        self.stopped.clear()
        self.wake_at.clear()

    def stop(self) -> None:
        self.calm()
        for w in self.live():
            w.terminate()
        for w in self.workers:
            try:
                w.wait(timeout=30)
            except subprocess.TimeoutExpired:
                w.kill()


def run(args: argparse.Namespace) -> dict[str, Any]:
    rng = random.Random(args.seed)
    plans = make_plans(args.tasks, rng, tuple(args.providers.split(",")))
    roots = [p for p in plans.values() if p.kind != "child"]
    zombies = args.scenario == "zombies"
    model = ChaosModel(plans, args.fault_rate, args.seed, ZOMBIE_FAULTS if zombies else FAULTS)
    work = Path(tempfile.mkdtemp(prefix="agentq-chaos-"))
    ledger = work / "ledger.jsonl"
    began = time.monotonic()
    chat = FakeChatCompletions(responder=model.chat, on_delivered=model.delivered_chat)
    converse = FakeConverse(responder=model.converse, on_delivered=model.delivered_converse)
    with (
        FakeMessagesAPI(
            within_max_tokens=True, responder=model, on_delivered=model.delivered_reply, on_cut=model.cut_reply
        ) as server,
        chat,
        converse,
    ):
        stack = LocalStack(
            prefix=f"chaos{os.getpid()}",
            workers=0,
            auth=True,
            worker_config=WorkerConfig(
                lease_seconds=args.lease_seconds, heartbeat_seconds=0.5, visibility_seconds=3, concurrency=32
            ),
            queue_settings=QueueSettings(visibility_timeout=3, max_receive_count=3),
            tool_modules=("agentq.core.tools.examples", "tests.effect_tools"),
            extra_env={
                "ANTHROPIC_BASE_URL": server.base_url,
                "ANTHROPIC_API_KEY": "chaos",
                "OPENAI_BASE_URL": chat.openai_base_url,
                "OPENAI_API_KEY": "chaos",
                "AWS_ENDPOINT_URL_BEDROCK_RUNTIME": converse.base_url,
                "AGENTQ_TEST_LEDGER": str(ledger),
                "AGENTQ_MAX_CALL_SECONDS": str(args.max_call_seconds),
                "AGENTQ_UNKNOWN_RECHECK_SECONDS": "3",  # a task held back by unknown usage looks again soon
                "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
                # Zombies: the calls of a 1,000-token task streamed, those of a 100-token one not.
                **({"AGENTQ_STREAM_ABOVE_TOKENS": "150"} if zombies else {}),
            },
            sweep_every=2.0,
            sweep_stale_after=20.0,
        )
        os.environ["AGENTQ_MAX_CALL_SECONDS"] = str(args.max_call_seconds)  # the API's and the sweeper's view
        chaos = Chaos(stack, work, random.Random(args.seed + 1))
        stack.start()
        try:
            assert stack.api_server is not None
            client = Client(stack.api_server.url, stack.create_api_key("chaos"))
            for _ in range(args.workers):
                chaos.spawn()
            ids = {p.tag: client.submit(submission(p, (100 if i % 2 else 1000) if zombies else 200)).task_id
                   for i, p in enumerate(roots)}  # fmt: skip
            log(f"submitted {len(ids)} tasks; chaos for {args.chaos_seconds:g}s")
            until = time.monotonic() + args.chaos_seconds
            people = People(
                client, {p.tag: ids[p.tag] for p in roots if p.kind == "talk"}, random.Random(args.seed + 2)
            )
            talking = threading.Thread(target=people.talk, args=(until,), daemon=True)
            talking.start()
            if zombies:  # SIGSTOP only, each past the lease; no SIGKILL
                low, high = args.pause_seconds
                next_pause = time.monotonic() + chaos.rng.uniform(1, 3)
                while time.monotonic() < until:
                    chaos.wake()
                    if time.monotonic() >= next_pause:
                        chaos.pause(low, high)
                        next_pause = time.monotonic() + chaos.rng.uniform(1, 3)
                    time.sleep(0.05)
            else:
                while time.monotonic() < until:
                    time.sleep(chaos.rng.uniform(1, 3))
                    chaos.fault()
            chaos.calm()
            talking.join()
            log(f"chaos over ({chaos.kills} kills, {chaos.stops} stops); draining")
            store = stack.store()
            drain_began = time.monotonic()
            drain(store, ids, people, args.drain_seconds)
            drained = time.monotonic() - drain_began
            # Lapsed holds' deadlines (the slack + the longest call) pass; release_holds messages land.
            time.sleep(2 + args.max_call_seconds)
            result = check(stack, store, plans, ids, model, ledger, chaos, people)
            result["figures"]["drain seconds"] = round(drained, 1)
            # Every request the model servers saw, with what it got: to trace a hold to its call.
            with (work / "requests.jsonl").open("w") as seen:
                seen.writelines(json.dumps(dataclasses.asdict(s)) + "\n" for s in model.ledger.seen)
            result["figures"]["run directory (worker logs, requests.jsonl)"] = str(work)
            if not result["ok"]:
                log(f"tasks that did not end, with their items: {dump_unended(store, ids, work)}")
        finally:
            chaos.stop()
            stack.stop()
    result["wall_seconds"] = round(time.monotonic() - began, 1)
    result["settings"] = {k: v for k, v in vars(args).items() if k not in ("json", "plot", "no_plot")}
    return result


def _progress(store: Any, ids: dict[str, str]) -> tuple[bool, set[tuple[str, str, int, int]]]:
    """Whether every root ended, and where every task stands (roots and their sub-agents):
    status, steps committed, claims. Any change between two looks is progress."""
    roots = store.tasks.get_many(list(ids.values()))
    children = [c for t in roots for spawn in store.spawns.list(t.task_id) for c in spawn.children]
    every = roots + (store.tasks.get_many(children) if children else [])
    return all(t.status.terminal for t in roots), {(t.task_id, t.status.value, t.step, t.claim_count) for t in every}


def drain(store: Any, ids: dict[str, str], people: People, quiet_seconds: float) -> None:
    """Wait until every root task ended, or until no task progressed (a status changed, a step
    committed, a claim) for ``quiet_seconds``: how long the tasks take depends on the machine's
    load (a loaded one's drain took 33 s at load 16 and 131-202 s at load 45-50), while a
    task that nothing moves any more stays as it is however long one waits."""
    last, quiet_since = None, time.monotonic()
    while time.monotonic() - quiet_since < quiet_seconds:
        people.wake_the_idle(store)  # an interrupted conversation ends when it is told to go on
        people.settle_the_unknown(list(ids.values()))
        ended, now = _progress(store, ids)
        if ended:
            return
        if now != last:
            last, quiet_since = now, time.monotonic()
        time.sleep(1)


def dump_unended(store: Any, ids: dict[str, str], work: Path) -> str | None:
    """Every item of each root task that did not end and of its sub-agents, to a file of the
    run's directory (what the test prints when a task did not end): its path, or None."""
    from agentq.storage import keys

    unended = [t for t in store.tasks.get_many(list(ids.values())) if not t.status.terminal]
    if not unended:
        return None
    out = {
        f"{_tag(t)} {t.task_id}": {
            pk: store.table.query(keys.task_pk(pk))
            for pk in [t.task_id, *(c for spawn in store.spawns.list(t.task_id) for c in spawn.children)]
        }
        for t in unended
    }
    path = work / "unended.json"
    path.write_text(json.dumps(out, default=str, indent=1))
    return str(path)


def check(
    stack: LocalStack, store: Any, plans: dict[str, Plan], ids: dict[str, str], model: ChaosModel,
    ledger: Path, chaos: Chaos, people: People,
) -> dict[str, Any]:  # fmt: skip
    broken: dict[str, list[str]] = defaultdict(list)
    roots = store.tasks.get_many(list(ids.values()))
    by_tag = {_tag(t): t for t in roots}
    every = [t for root in roots for t in subtree(store, root)]  # each tree whole, at any depth
    charges: Counter[str] = Counter()
    if ledger.exists():
        charges.update(json.loads(line)["tool_use_id"] for line in ledger.read_text().splitlines())
    steps_committed = orphans = claims_beyond_first = messages_sent = messages_delivered = 0
    for t in every:
        plan = plans[_tag(t)]
        if not t.status.terminal:
            broken["every task ended"].append(f"{t.task_id} ({plan.tag}) is {t.status.value}")
            continue
        want = TaskStatus.COST_EXCEEDED if plan.kind == "budget" else TaskStatus.SUCCEEDED
        if plan.kind == "budget" and t.task_id in people.raised and t.status is TaskStatus.SUCCEEDED:
            want = TaskStatus.SUCCEEDED  # its budget was raised by the unknown: it may have been enough
        answer = heard(plan, people.accepted[t.task_id]) if plan.kind == "talk" else plan.final
        if t.status is not want or (want is TaskStatus.SUCCEEDED and t.result != answer):
            broken["status and result as planned"].append(
                f"{t.task_id} ({plan.tag}): {t.status.value} {t.error} {t.result!r} (want {answer!r})"
            )
        steps = store.steps.load(t.task_id)
        in_conversation = [m.seq for s in steps if isinstance(s.body, MessageStep) for m in s.body.messages]
        messages_sent += people.accepted[t.task_id]
        messages_delivered += len(in_conversation)
        expected = list(range(1, t.messages_received + 1))
        if in_conversation != expected or t.messages_received != people.accepted[t.task_id]:
            broken["each message delivered once, in order"].append(
                f"{t.task_id} ({plan.tag}): accepted {people.accepted[t.task_id]}, META {t.messages_received}, "
                f"delivered {in_conversation}"
            )
        steps_committed += len(steps)
        orphans += len(store.steps.orphans(t.task_id))
        claims_beyond_first += max(0, t.claim_count - 1)
        for s in steps:
            if isinstance(s.body, ToolsStep):
                for r in s.body.results:
                    if r.name == "charge_card" and r.status == "ok" and charges[r.tool_use_id] != 1:
                        broken["a done side effect ran exactly once"].append(f"{t.task_id} {r.tool_use_id}")
    for use_id, n in charges.items():
        if n > 1:
            broken["each side effect at most once"].append(f"{use_id} ran {n} times")
    for t in every:  # every budget of every tree: a sub-agent's left holding kept its parent's share out
        own = store.budgets.get(t.task_id)
        if own.used > own.cap:
            broken["used <= cap"].append(f"{t.task_id} ({_tag(t)}): used {own.used} > cap {own.cap}")
        if own.reserved != 0:
            broken["reserved == 0 at the end"].append(f"{t.task_id} ({_tag(t)}): reserved {own.reserved}")
    kill_touched = 0
    trees, became = ledger_by_tree(store, every, _tag, model.ledger)
    for tag, root in by_tag.items():
        budget = store.budgets.get(root.task_id)
        delivered = model.delivered[tag]
        touched = any(root.created_at <= k <= (root.finished_at or time.time()) for k in chaos.kill_times)
        row = trees[tag]
        if touched and budget.used > delivered:
            kill_touched += 1
        # Known usage is what the provider reported: every reply read whole, whoever read it, and
        # at most what a cut stream's first event told (counted when the worker that saw it spent
        # its hold). A SIGKILL can take a reply read whole before anyone reported it (unknown then).
        told = row["told_tokens"]
        if not (delivered <= budget.known <= delivered + told) and not (touched and budget.known < delivered):
            broken["delivered <= known <= delivered + told"].append(
                f"{root.task_id} ({tag}): known {budget.known}, delivered {delivered}, told {told} (unknown"
                f" {budget.unknown})"
            )
        # Whatever the servers billed (whole or cut) is counted, known or not: the cap is real.
        billed = row["delivered_tokens"] + row["cut_tokens"]
        if billed > budget.used:
            broken["billed <= used (nothing billed goes uncounted)"].append(
                f"{root.task_id} ({tag}): billed {billed} (cut {row['cut_tokens']}), used {budget.used}"
            )
        if row["false_cost_exceeded"]:
            broken["no false cost_exceeded"].append(
                f"{root.task_id} ({tag}): {', '.join(row['false_cost_exceeded'])} ended cost_exceeded"
                f" at used {budget.used} (known {budget.known}) of cap {budget.cap}, delivered {delivered}"
            )
    queues = stack.queues()
    for tier in TIERS:
        attrs = queues.sqs.get_queue_attributes(QueueUrl=queues.dlq_url(tier), AttributeNames=["All"])["Attributes"]
        depth = int(attrs["ApproximateNumberOfMessages"]) + int(attrs["ApproximateNumberOfMessagesNotVisible"])
        if depth:
            broken["DLQs hold nothing"].append(f"{tier}: {depth}")
    for path in sorted(chaos.logs.glob("worker-*.log")):
        text = path.read_text(errors="replace")
        if "Traceback" in text:
            broken["no worker traceback"].append(f"{path.name}: {text[text.index('Traceback') :][:400]}")
    unknown = sum(r["unknown_tokens"] for r in trees.values())
    failed_attempts = unknown - sum(v["unknown_tokens"] for v in became.values())
    figures = {
        "plans by kind": dict(Counter(p.kind for p in plans.values())),
        "plans by provider": dict(Counter(p.provider for p in plans.values())),
        "tasks": len(every),
        "roots": len(roots),
        "by status": dict(Counter(t.status.value for t in every)),
        "kills": chaos.kills,
        "stops": chaos.stops,
        "model faults": dict(model.faults),
        "claims beyond the first": claims_beyond_first,
        "orphaned calls (zombies' answered calls)": orphans,
        "steps committed": steps_committed,
        "side effects run": sum(charges.values()),
        "messages sent (accepted)": messages_sent,
        "messages delivered": messages_delivered,
        "interrupts recorded": people.interrupts,
        "budgets raised for unknown usage": people.raised_for_unknown,
        "sends or interrupts refused": dict(people.refused),
        "trees charged a SIGKILLed call's full hold": kill_touched,
        "trees charged more than delivered": sum(1 for r in trees.values() if r["over_tokens"] > 0),
        "tokens charged beyond delivered (sum)": sum(max(0, r["over_tokens"]) for r in trees.values()),
        "tokens billed in replies cut mid-reply": sum(r["cut_tokens"] for r in trees.values()),
        "unknown tokens (sum)": sum(r["unknown_tokens"] for r in trees.values()),
        "unknown / delivered": _share(
            sum(r["unknown_tokens"] for r in trees.values()), sum(r["delivered_tokens"] for r in trees.values())
        ),
        "false cost_exceeded": sum(len(r["false_cost_exceeded"]) for r in trees.values()),
        "holds counted spent, never corrected": sum(r["holds_spent_uncorrected"] for r in trees.values()),
        "those holds by what became of their call": became,
        # The holds of attempts that failed after they may have been billed (spent before a retry,
        # or when the call gave up) leave no ticket: the unknown the tickets do not account for.
        "unknown of failed attempts (no ticket left)": failed_attempts,
        # Issue 40's open question: the malformed fault is a Message's first bytes framed as a
        # whole body, which the engine counts as possibly billed (a proxy may have cut a billed
        # reply); were it counted as not billed, this would be the unknown. Its holds are those of
        # the failed attempts (in the default run the one fault of an attempt that may have been
        # billed; the zombie scenario's cut replies are another) and the spent holds whose turn met
        # it and no other fault that may have been billed.
        "unknown / delivered, the malformed fault's holds aside": _share(
            unknown - failed_attempts - sum(v["unknown_tokens"] for k, v in became.items() if _malformed_alone(k)),
            sum(r["delivered_tokens"] for r in trees.values()),
        ),
        "tasks swept": len(stack.swept),
    }
    if chaos.paused_seconds:
        figures["SIGSTOP seconds (min-max)"] = f"{min(chaos.paused_seconds):.1f}-{max(chaos.paused_seconds):.1f}"
    invariants = [
        "every task ended", "status and result as planned", "each side effect at most once",
        "a done side effect ran exactly once", "each message delivered once, in order", "used <= cap",
        "reserved == 0 at the end",
        "delivered <= known <= delivered + told", "billed <= used (nothing billed goes uncounted)", "no false cost_exceeded",
        "DLQs hold nothing", "no worker traceback",
    ]  # fmt: skip
    return {
        "figures": figures,
        "trees": trees,
        "invariants": {name: (not broken[name], broken[name][:10]) for name in invariants},
        "ok": not any(broken.values()),
    }


def _malformed_alone(became: str) -> bool:
    """Whether a hold's turn met the malformed fault and, of the faults that may have been
    billed, that one alone (``what_became``'s "turn met 529+malformed", not "...+cut")."""
    faults = became.removeprefix("turn met ").split("+") if became.startswith("turn met ") else []
    return "malformed" in faults and "cut" not in faults


def _share(part: int, whole: int) -> str:
    return f"{100 * part / whole:.2f} %" if whole else "-"


def _tag(task: Any) -> str:
    goal = str(task.submission.goal)
    return goal[goal.index("[") + 1 : goal.index("]")]


def render(result: dict[str, Any]) -> str:
    rows = [
        [name, "ok" if ok else "BROKEN", "; ".join(detail)[:200]] for name, (ok, detail) in result["invariants"].items()
    ]
    figures = [[k, json.dumps(v) if isinstance(v, dict) else v] for k, v in result["figures"].items()]
    return "\n".join([
        f"agentq chaos run: {result['settings']}",
        "",
        table(["invariant", "", "where"], rows),
        "",
        table(["figure", "value"], [*figures, ["wall seconds", result["wall_seconds"]]]),
        "",
        "the ledger per tree (tokens; delivered: replies sent whole; cut: billed, cut mid-reply;"
        " over: ledger - delivered; holds spent: counted in full at their deadline, never corrected)",
        table(TREE_HEADERS, tree_rows(result["trees"], every_tree=len(result["trees"]) <= 40)),
    ])  # fmt: skip


def panels(result: dict[str, Any]) -> list[Panel]:
    """What the chaos did (faults by kind), how the tasks ended (by status), and what recovery
    took next to what broke (a clean run's last bar is zero)."""
    figures = result["figures"]
    faults = {"SIGKILL": figures["kills"], "SIGSTOP": figures["stops"], **figures["model faults"]}
    statuses = figures["by status"]
    recovery = {
        "re-claims": figures["claims beyond the first"],
        "orphan calls": figures["orphaned calls (zombies' answered calls)"],
        "full hold\ncharged": figures["trees charged a SIGKILLed call's full hold"],
        "swept": figures["tasks swept"],
        "invariants\nbroken": sum(not ok for ok, _ in result["invariants"].values()),
    }
    return [
        Panel(kind="bar", title="faults injected", ylabel="count", x=list(faults), series={"faults": list(faults.values())}),
        Panel(kind="bar", title=f"{figures['tasks']} tasks by end status", ylabel="tasks", x=list(statuses),
              series={"tasks": list(statuses.values())}),
        Panel(kind="bar", title="recovery, and what broke", ylabel="count", x=list(recovery),
              series={"count": list(recovery.values())}),
    ]  # fmt: skip


# Each scenario's settings, where the command line leaves them out. zombies: the run of issue 40
# (workers SIGSTOPped for 4.5-7 s past a 3 s lease, no SIGKILL, a hold deadline of 15 s, 30
# tasks on the Messages API, several workers each holding many tasks).
SCENARIOS: dict[str, dict[str, Any]] = {
    "mixed": {"tasks": 200, "chaos_seconds": 90, "lease_seconds": 2, "max_call_seconds": 10,
              "pause_seconds": (0.0, 0.0), "providers": "anthropic,openai,bedrock-converse"},
    "zombies": {"tasks": 30, "chaos_seconds": 45, "lease_seconds": 3, "max_call_seconds": 13,
                "pause_seconds": (4.5, 7.0), "providers": "anthropic"},
}  # fmt: skip


def _pair(text: str) -> tuple[float, float]:
    low, _, high = text.partition(",")
    return float(low), float(high or low)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--scenario",
        choices=sorted(SCENARIOS),
        default="mixed",
        help="mixed: SIGKILL and SIGSTOP, the model's usual faults; zombies: SIGSTOP alone, each past the lease, "
        "and replies cut mid-reply and stalls too (its defaults: " + ", ".join(
            f"--{k.replace('_', '-')} {v}" for k, v in SCENARIOS["zombies"].items()) + ")",
    )  # fmt: skip
    ap.add_argument("--tasks", type=int, help="root tasks (fan-outs add their children); 200")
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--chaos-seconds", type=float, help="90")
    ap.add_argument("--lease-seconds", type=float, help="a worker's liveness lease: 2")
    ap.add_argument("--max-call-seconds", type=float, help="AGENTQ_MAX_CALL_SECONDS (a hold's deadline: 2 s more): 10")
    ap.add_argument("--pause-seconds", type=_pair, help="zombies: how long each SIGSTOP lasts, LOW,HIGH")
    ap.add_argument(
        "--drain-seconds",
        type=float,
        default=300,
        help="after the chaos, how long the drain waits with no task progressing before it gives up",
    )
    ap.add_argument("--fault-rate", type=float, default=0.1, help="share of model requests answered with a fault")
    ap.add_argument("--seed", type=int, default=12)
    ap.add_argument(
        "--providers",
        help="the root tasks' providers, taken in turn (comma-separated; fake servers for each): "
        "anthropic,openai,bedrock-converse",
    )
    ap.add_argument("--json", action="store_true")
    add_plot_args(ap, "chaos")
    args = ap.parse_args(argv)
    for name, value in SCENARIOS[args.scenario].items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    result = report(args, "agentq chaos run: faults in, ends out, invariants", run, render, panels)
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
