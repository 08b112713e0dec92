"""`agentq events ID | head -1`: a reader that closes the pipe once it has what it wanted is not a
failure, and `agentq` exits 0 without a word, as a command whose print() met the closed pipe
did. The text lines went through rich, whose own handler of the closed pipe exited 1 ("did not
succeed"); the JSON lines exited 120 with "Exception ignored ... BrokenPipeError", Python's flush
of stdout at exit meeting the closed pipe again."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator

import pytest

from tests import fake_api
from tests.api_support import ROOT
from tests.fake_api import END, Fake, Request, not_found, sse


@pytest.fixture
def long_stream() -> Iterator[Fake]:
    """A stream of 3,000 events (well over a pipe's 64 KiB), then its end."""

    def handle(h: Request, n: int) -> None:
        if not h.path.startswith("/tasks/t1/events"):
            return not_found(h)
        h.send_response(200)
        h.send_header("Content-Type", "text/event-stream")
        h.send_header("Connection", "close")
        h.end_headers()
        try:
            for i in range(1, 3000):
                h.wfile.write(sse(i))
            h.wfile.write(sse(3000, "succeeded") + END)
        except OSError:
            pass  # the command has gone
        h.close_connection = True

    yield from fake_api.serve(handle)


@pytest.mark.parametrize("json_flag", [[], ["--json"]], ids=["text", "json"])
def test_events_into_a_pipe_closed_after_the_first_line_exit_0_quietly(long_stream: Fake, json_flag: list[str]) -> None:
    env = {"AGENTQ_URL": long_stream.url, "PYTHONPATH": os.pathsep.join([str(ROOT / "layers/agentq/python"), str(ROOT)]),
           "PATH": os.environ.get("PATH", "/usr/bin:/bin")}  # fmt: skip
    # A program of its own, not one forked from the tests' fork server: what is under test ends in
    # the interpreter's own exit (its flush of stdout), which a forked child does not run.
    proc = subprocess.Popen([sys.executable, "-m", "agentq", "events", "t1", *json_flag], env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT)  # fmt: skip
    assert proc.stdout is not None and proc.stderr is not None
    assert proc.stdout.readline()
    proc.stdout.close()  # as `head -1` does
    err = proc.stderr.read()
    assert proc.wait(timeout=60) == 0, err
    assert err == "", err
