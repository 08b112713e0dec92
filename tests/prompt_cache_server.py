"""A Messages API server with Anthropic's documented prompt-cache accounting, for the tests and
``bench/agent_cost.py``: a ``FakeMessagesAPI`` responder that bills each request as the API
would and answers from a plan.

The accounting (docs: "Prompt caching"): a request is its blocks in order (tools, system, then
each message's content blocks). A ``cache_control`` breakpoint asks that the prefix ending at
its block be cached. A request reads the longest cached prefix that ends at one of its
breakpoints or at one of the 20 blocks before each (the API's lookback), if that entry has not
expired; the read refreshes its TTL. Every breakpoint past the read is written (its prefix
becomes an entry with the breakpoint's TTL: 5 minutes, or 1 hour with ``"ttl": "1h"``). So:
``cache_read_input_tokens`` = the read prefix, ``cache_creation_input_tokens`` = from there to
the last breakpoint, ``input_tokens`` = the rest. A prefix under ``min_cacheable`` tokens is
never cached (1,024 for Sonnet). Tokens are counted as one per four characters of a block's
JSON, the same rule for every mode, so comparisons hold though absolute counts are not a
tokenizer's. A request over ``context_window`` tokens gets the API's 400 ("prompt is too long").
Time is simulated (``clock``), so TTLs can be exercised without waiting.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tests.fake_messages_api import (
    FakeReply,
    RecordedRequest,
    blocks_of,
    error_reply,
    message_reply,
    tokens,
    usage_dict,
)

LOOKBACK_BLOCKS = 20
TTL_SECONDS = {"5m": 300.0, "1h": 3600.0}


@dataclass
class CacheAccounting:
    """The cache of one organisation: prefix hash -> expiry (simulated seconds)."""

    min_cacheable: int = 1024
    context_window: int = 200_000
    clock: float = 0.0
    entries: dict[str, tuple[float, str]] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def bill(self, body: dict[str, Any]) -> dict[str, Any] | None:
        """The usage of ``body`` (None: it is longer than the context window)."""
        blocks = blocks_of(body)
        counts = [tokens({k: v for k, v in b.items() if k != "cache_control"}) for b in blocks]
        if sum(counts) > self.context_window:
            return None
        prefix_hashes, running, cumulative = [], hashlib.sha256(), []
        total = 0
        for block, count in zip(blocks, counts, strict=True):
            clean = {k: v for k, v in block.items() if k != "cache_control"}
            running.update(json.dumps(clean, sort_keys=True).encode())
            prefix_hashes.append(running.hexdigest())
            total += count
            cumulative.append(total)
        breakpoints = [i for i, b in enumerate(blocks) if "cache_control" in b]
        with self.lock:
            read_end = -1
            for bp in breakpoints:
                for i in range(bp, max(-1, bp - LOOKBACK_BLOCKS - 1), -1):
                    entry = self.entries.get(prefix_hashes[i])
                    if entry and entry[0] > self.clock and i > read_end:
                        read_end = i
                        break
            if read_end >= 0:
                _, ttl = self.entries[prefix_hashes[read_end]]
                self.entries[prefix_hashes[read_end]] = (self.clock + TTL_SECONDS[ttl], ttl)
            write_end = read_end
            for bp in breakpoints:
                if bp > read_end and cumulative[bp] >= self.min_cacheable:
                    ttl = blocks[bp]["cache_control"].get("ttl", "5m")
                    self.entries[prefix_hashes[bp]] = (self.clock + TTL_SECONDS[ttl], ttl)
                    write_end = max(write_end, bp)
        read = cumulative[read_end] if read_end >= 0 else 0
        written = (cumulative[write_end] if write_end >= 0 else 0) - read
        usage = usage_dict(input_tokens=total - read - written, output_tokens=0,
                           cache_creation_input_tokens=written, cache_read_input_tokens=read)  # fmt: skip
        ttls = [blocks[bp]["cache_control"].get("ttl", "5m") for bp in breakpoints if read_end < bp <= write_end]
        one_hour = written if ttls and all(t == "1h" for t in ttls) else 0
        usage["cache_creation"] = {
            "ephemeral_5m_input_tokens": written - one_hour,
            "ephemeral_1h_input_tokens": one_hour,
        }
        return usage


Plan = Callable[[dict[str, Any]], tuple[list[dict[str, Any]], str, int]]


def responder(
    accounting: CacheAccounting, plan: Plan, *, seconds_per_call: float = 20.0
) -> Callable[[RecordedRequest], FakeReply]:
    """A ``FakeMessagesAPI`` responder: ``plan(body)`` gives (content, stop_reason, output
    tokens) of the next answer; usage is billed by ``accounting``, whose clock each call moves."""

    def respond(request: RecordedRequest) -> FakeReply:
        body = request.body
        usage = accounting.bill(body)
        accounting.clock += seconds_per_call
        if usage is None:
            return error_reply(400, "invalid_request_error", "prompt is too long")
        content, stop_reason, output_tokens = plan(body)
        usage["output_tokens"] = output_tokens
        return message_reply(content, stop_reason=stop_reason, usage=usage)

    return respond
