"""`--json` is offered where it does something: `webhook-secret --json` prints JSON, and the
commands with nothing to print as JSON (watch, a live view; download, files on disk; chat, a
conversation) do not offer it, so a script asking for it is told at once (usage, exit 2) rather
than parsing text it did not ask for. Every remote command used to offer it; these ignored it."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator

import pytest

from agentq.cli.main import build_parser

from tests import fake_api
from tests.fake_api import Fake, Ran, reply

agentq = fake_api.agentq


@pytest.fixture
def secret_api() -> Iterator[Fake]:
    yield from fake_api.serve(lambda h, n: reply(h, 200, json.dumps({"secret": "whsec_0123"})))


def test_webhook_secret_json_prints_json(agentq: Callable[..., Ran], secret_api: Fake) -> None:
    ran = agentq(secret_api.url, "webhook-secret", "--json")
    assert ran.returncode == 0, ran
    assert json.loads(ran.stdout) == {"secret": "whsec_0123"}, ran.stdout
    text = agentq(secret_api.url, "webhook-secret")
    assert text.stdout == "whsec_0123\n", text


@pytest.mark.parametrize("args", [["watch", "t1"], ["download", "t1", "out"], ["chat", "t1"]], ids=lambda a: a[0])
def test_a_command_with_nothing_to_print_as_json_does_not_offer_json(
    agentq: Callable[..., Ran], args: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    ran = agentq("http://127.0.0.1:9", *args, "--json")
    assert ran.returncode == 2 and "unrecognized arguments: --json" in ran.stderr, ran
    assert f"usage: agentq {args[0]}" in ran.stderr, ran.stderr
    with pytest.raises(SystemExit):
        build_parser().parse_args([args[0], "--help"])
    assert "--json" not in capsys.readouterr().out
