"""`agentq` against a URL that answers 200 with something other than the API's answer: a web page
(a proxy's, a captive portal's, a URL that is not the API), JSON of another shape (another
version of the API, or another service), or a body cut short. Each is one line on stderr naming
the URL, and exit 1, never a traceback (a JSONDecodeError, pydantic's ValidationError, a
KeyError, http.client's IncompleteRead were each raised out of every remote command)."""

from __future__ import annotations

import socket
from collections.abc import Callable, Iterator

import pytest

from tests import fake_api
from tests.fake_api import Fake, Ran, Request, reply

agentq = fake_api.agentq

# One of each way a remote command reads its answer: a model (status, list, submit's POST, trace's
# pages), a single field (webhook-secret), and the commands that read raw JSON (policy, stops).
COMMANDS = [["status", "t1"], ["list"], ["submit", "hi", "--script", "first_task"], ["trace", "t1"],
            ["webhook-secret"], ["policy", "list"], ["stops"]]  # fmt: skip


@pytest.fixture
def web_page() -> Iterator[Fake]:
    yield from fake_api.serve(lambda h, n: reply(h, 200, "<html><body>Sign in to the Wi-Fi</body></html>", "text/html"))


@pytest.mark.parametrize("args", COMMANDS, ids=" ".join)
def test_a_200_answer_that_is_not_json_is_said_naming_the_url_and_its_content_type_with_exit_1(
    agentq: Callable[..., Ran], web_page: Fake, args: list[str]
) -> None:
    ran = agentq(web_page.url, *args)
    assert ran.returncode == 1, ran
    said = ran.stderr.splitlines()[-1]  # submit's note on the script's tools comes first
    assert said.startswith(f"agentq: the answer from {web_page.url}/") and said.endswith("(url)"), said
    assert "is not JSON (HTTP 200, Content-Type text/html)" in said, said
    assert "Sign in to the Wi-Fi" in said, said  # its first bytes: what answered


@pytest.fixture
def another_shape() -> Iterator[Fake]:
    yield from fake_api.serve(lambda h, n: reply(h, 200, '{"hello": "world"}'))


@pytest.mark.parametrize("args", COMMANDS, ids=" ".join)
def test_a_200_answer_of_another_shape_is_said_naming_the_url_with_exit_1(
    agentq: Callable[..., Ran], another_shape: Fake, args: list[str]
) -> None:
    ran = agentq(another_shape.url, *args)
    assert ran.returncode == 1, ran
    said = ran.stderr.splitlines()[-1]
    assert said.startswith(f"agentq: unexpected answer from {another_shape.url}/"), said
    assert "(another API version?)" in said and said.endswith("(url)"), said


@pytest.fixture
def cut_short() -> Iterator[Fake]:
    """A body that ends (the connection closed) before its Content-Length."""

    def handle(h: Request, n: int) -> None:
        h.send_response(200)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", "1000")
        h.end_headers()
        h.wfile.write(b'{"task_id": "t1"')
        h.wfile.flush()
        h.connection.shutdown(socket.SHUT_RDWR)
        h.close_connection = True

    yield from fake_api.serve(handle)


@pytest.mark.parametrize("args", COMMANDS[:3], ids=" ".join)
def test_a_body_cut_short_is_retried_then_a_failed_connection_with_exit_1(
    agentq: Callable[..., Ran], cut_short: Fake, args: list[str]
) -> None:
    ran = agentq(cut_short.url, *args)
    assert ran.returncode == 1 and "cannot reach" in ran.stderr, ran
    assert len(cut_short.paths) == 3, cut_short.paths  # retried as a refused connection is (a GET, or a submit:
    # its Idempotency-Key makes a second one safe)
