"""`agentq policy show|history|put SCOPE`: the scope goes in the request's path as one segment,
every reserved character encoded (an agent's scope is ``agent:NAME``), and one no request can
carry (empty, holding a space, or no scope at all: ``tenant`` or ``agent:NAME``) is refused naming
``scope`` with exit 2 before anything is sent; it went into the path as typed (a space:
http.client's InvalidURL traceback). `policy list|history` follow every page of the listing."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests import fake_api
from tests.fake_api import Fake, Ran, Request, not_found, reply

agentq = fake_api.agentq
NOWHERE = "http://127.0.0.1:9"  # nothing answers: a request sent would be "cannot reach", exit 1


def test_a_policy_scope_no_path_segment_can_carry_is_refused_naming_scope_with_exit_2(
    agentq: Callable[..., Ran], tmp_path: Path
) -> None:
    rules = tmp_path / "rules.cedar"
    rules.write_text('@id("x")\nforbid(principal, action, resource);\n')
    for args in (["policy", "show", "my scope"], ["policy", "history", "my scope"],
                 ["policy", "put", "my scope", str(rules)], ["policy", "show", ""],
                 ["policy", "show", "agent:a/b"]):  # fmt: skip
        ran = agentq(NOWHERE, *args)
        assert ran.returncode == 2 and ran.stderr.rstrip().endswith("(scope)"), (args, ran)


def _doc(scope: str, version: int) -> dict[str, object]:
    return {"scope": scope, "version": version, "policies": '@id("x")\nforbid(principal, action, resource);',
            "digest": f"d{version}", "created_at": 1000.0 + version}  # fmt: skip


@pytest.fixture
def policies_in_pages() -> Iterator[Fake]:
    """Three versions of ``agent:shop``'s rules, one a page; every scope's current ones, two pages.
    The scope's path is only its encoded segment's (``%3A``), as the client's other paths are."""

    def handle(h: Request, n: int) -> None:
        if h.path.startswith("/policies/agent%3Ashop/history"):
            version = int(h.path.split("cursor=c")[1]) if "cursor=c" in h.path else 3
            after = f"c{version - 1}" if version > 1 else None
            return reply(h, 200, json.dumps({"policies": [_doc("agent:shop", version)], "next_cursor": after}))
        if h.path.startswith("/policies/agent%3Ashop"):
            return reply(h, 200, json.dumps(_doc("agent:shop", 3)))
        if h.path.startswith("/policies"):
            page = 2 if "cursor=" in h.path else 1
            doc, after = (_doc("tenant", 1), "p2") if page == 1 else (_doc("agent:shop", 3), None)
            return reply(h, 200, json.dumps({"policies": [doc], "next_cursor": after}))
        return not_found(h)

    yield from fake_api.serve(handle)


def test_a_scope_is_sent_encoded_in_one_segment_and_a_listing_is_read_to_its_last_page(
    agentq: Callable[..., Ran], policies_in_pages: Fake
) -> None:
    history = agentq(policies_in_pages.url, "policy", "history", "agent:shop", "--json")
    assert history.returncode == 0, history
    assert [d["version"] for d in json.loads(history.stdout)] == [3, 2, 1]
    shown = agentq(policies_in_pages.url, "policy", "show", "agent:shop")
    assert shown.returncode == 0 and shown.stdout.startswith('@id("x")'), shown
    listed = agentq(policies_in_pages.url, "policy", "list")
    assert listed.returncode == 0 and [line.split()[0] for line in listed.stdout.splitlines()] == [
        "tenant",
        "agent:shop",
    ]
