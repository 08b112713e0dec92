"""Every pattern that validates input matches the whole value, in ASCII (issue 39, item 9).

Python's ``re.match(r"^...$")`` lets one trailing newline through (``$`` matches before a final
``\\n``), and ``\\d`` matches any Unicode digit (``int("\\u0665")`` is 5): ``/fx.md\\n`` was a second
memory document that looked like ``/fx.md``, ``rate(5 minutes)\\n`` a schedule. Each validator
is tried with a value it accepts, then with that value broken each of these ways."""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from typing import Any

import pytest

from agentq.api.views import InvalidCursor, encode_cursor, task_page
from agentq.core.agents import parse_ref
from agentq.core.memory import check_path
from agentq.core.schedules import next_fire
from agentq.core.secrets import Secrets, SecretUnavailable
from agentq.core.tools import tool
from agentq.core.tools.fetch import HostRule
from agentq.core.tools.mcp import McpConfigurationError, McpServers
from agentq.storage.container import memory_storage
from agentq.storage.events import Position

from tests.api_support import ApiStack

# What `$` lets by at the end of a value, and what `\d` takes for a digit.
TRAILERS = ["\n"]
# Arabic-Indic digits: str.isdigit() and int() take them.
UNICODE_DIGITS = {"0": "\u0660", "1": "\u0661", "5": "\u0665", "8": "\u0668"}


def _secret(name: str) -> Any:
    return Secrets(lambda n: "sk-test-value-0001").get(name)


def _tool(name: str) -> Any:
    return tool(name=name)(lambda: "ok")


def _tenant(name: str) -> Any:
    return memory_storage().api_keys.create(name)


def _key_id(key_id: str) -> Any:
    from agentq.storage.api_keys import KeyNotFound

    try:
        return memory_storage().api_keys.revoke(key_id)
    except KeyNotFound:
        return "well-formed"  # the id passed the check; no such key is another matter


def _mcp_server(name: str) -> Any:
    return McpServers.from_env({"AGENTQ_MCP_SERVERS": json.dumps({name: {"url": "https://mcp.example.com/mcp"}})})


def _tasks_cursor(sort_key: str) -> Any:
    return task_page(memory_storage(), "t", limit=1, cursor=encode_cursor("tasks", sort_key), status=None,
                     include_children=False)  # fmt: skip


# (what is checked, a value it accepts, how it refuses)
VALIDATORS: list[tuple[str, Callable[[str], Any], str, type[Exception] | tuple[type[Exception], ...]]] = [
    ("memory path, last segment", check_path, "/customers/fx.md", ValueError),
    ("memory path, first segment", lambda p: check_path(p + "/notes.md"), "/customers", ValueError),
    ("memory path prefix", lambda p: check_path(p, prefix=True), "/customers", ValueError),
    ("schedule rate()", lambda e: next_fire(e, 0.0), "rate(5 minutes)", ValueError),
    ("schedule cron()", lambda e: next_fire(e, 0.0), "cron(0 8 * * ? *)", ValueError),
    ("agent reference", parse_ref, "researcher@18", ValueError),
    ("secret name", _secret, "stripe/key", SecretUnavailable),
    ("tool name", _tool, "lookup_order", ValueError),
    ("API key tenant", _tenant, "team-a", Exception),
    ("API key id", _key_id, "key_0123456789abcdef", Exception),
    ("MCP server name", _mcp_server, "shop", McpConfigurationError),
    ("event position", Position.parse, "18.0.1.0", ValueError),
    ("fetch allowlist host:port", HostRule.parse, "example.com:8080", ValueError),
    ("task list cursor", _tasks_cursor, "000001700000000#task-1", InvalidCursor),
]


def _broken(value: str, *, stripped: bool) -> list[str]:
    """``value`` with a trailing newline (unless the check strips whitespace first, as the fetch
    allowlist's parser does), and with each ASCII digit in it a Unicode digit."""
    out = [] if stripped else [value + t for t in TRAILERS]
    out += [value.replace(d, u) for d, u in UNICODE_DIGITS.items() if d in value]
    return out


@pytest.mark.parametrize(("what", "check", "good", "refusal"), VALIDATORS, ids=[v[0] for v in VALIDATORS])
def test_a_validator_refuses_a_trailing_newline_and_unicode_digits(
    what: str, check: Callable[[str], Any], good: str, refusal: type[Exception]
) -> None:
    check(good)  # accepted as is
    for bad in _broken(good, stripped=what.startswith("fetch")):
        with pytest.raises(refusal):
            check(bad)
            pytest.fail(f"{what}: {bad!r} was accepted")


def test_a_memory_document_path_with_a_trailing_newline_is_a_422_and_nothing_is_written(api_stack: ApiStack) -> None:
    store = f"exact-{base64.b32encode(__name__.encode()).decode()[:8].lower()}"
    status, body, _ = api_stack.http("POST", "/memory-stores", {"name": store})
    assert status in (201, 409), body
    for path in ("/fx.md%0A", "/fx.md%0A/notes.md", "/a/fx.md%0D%0A"):
        status, body, _ = api_stack.http("PUT", f"/memory-stores/{store}/document?path={path}", {"content": "x"})
        assert status == 422 and body["error"]["field"] == "path", (path, status, body)
    status, listing, _ = api_stack.http("GET", f"/memory-stores/{store}/documents")
    assert status == 200 and listing["documents"] == [], listing
