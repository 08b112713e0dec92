"""Mistakes a newcomer makes with `agentq`, each met with a message that says what is wrong and
exit 2, and no request sent (the URL points at nothing: a request would exit 1 "cannot reach")."""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from agentq.core.providers.scripted import load_script

from tests import test_cli
from tests.api_support import ROOT, ApiStack
from tests.helpers import agentq_process
from tests.test_cli import Ran

cli = test_cli.cli
NOWHERE = "http://127.0.0.1:9"


def test_a_misspelt_flag_shows_the_usage_of_the_command_it_was_given_to(cli: Callable[..., Ran]) -> None:
    ran = cli("submit", "x", "--scrpit", "first_task", "--url", NOWHERE)
    assert ran.returncode == 2
    assert "usage: agentq submit" in ran.stderr and "unrecognized arguments: --scrpit first_task" in ran.stderr
    nested = cli("agents", "show", "shop", "--verison", "2", "--url", NOWHERE)
    assert nested.returncode == 2 and "usage: agentq agents show" in nested.stderr


def test_a_url_without_its_scheme_is_named_as_such(cli: Callable[..., Ran]) -> None:
    ran = cli("list", "--url", "127.0.0.1:35829")
    assert ran.returncode == 2
    assert "the API's URL must start with http:// or https:// (got '127.0.0.1:35829')" in ran.stderr


@pytest.mark.parametrize("where", ["/console/", "/console", "/console/explorer"])
def test_an_agentq_url_that_is_the_consoles_is_said_to_be_the_console_not_blamed_on_the_goal(
    api_stack: ApiStack, cli: Callable[..., Ran], where: str
) -> None:
    """`agentq dev` prints the console's URL beside the API's; AGENTQ_URL set to the console's
    made `submit` say "goal: unknown field (this route takes no body) (goal)" and `list` say
    "no console asset 'tasks'": neither named the URL, nor the API's URL to set instead."""
    env = api_stack.cli_env(AGENTQ_URL=api_stack.url + where)
    for args in (("submit", "x", "--script", "first_task"), ("list",)):
        ran = cli(*args, env=env)
        assert ran.returncode == 2, ran.stderr
        assert ran.stderr.rstrip().endswith("(url)") and "the console's" in ran.stderr, ran.stderr
        assert f"the API's is {api_stack.url}" in ran.stderr, ran.stderr


def test_a_script_file_that_is_not_there_is_said_to_be_missing_not_an_unknown_built_in(
    cli: Callable[..., Ran], tmp_path: Path
) -> None:
    missing = cli("submit", "x", "--script", "examples/scripts/frist_task.yaml", "--url", NOWHERE)
    assert missing.returncode == 2 and "--script examples/scripts/frist_task.yaml: no such file" in missing.stderr
    folder = cli("submit", "x", "--script", str(tmp_path), "--url", NOWHERE)
    assert folder.returncode == 2 and "a directory, not a script file" in folder.stderr
    broken = tmp_path / "broken.yaml"
    broken.write_text('turns: [\n  - text: "a\n')
    bad = cli("submit", "x", "--script", str(broken), "--url", NOWHERE)
    assert bad.returncode == 2 and f'in "{broken}", line' in bad.stderr  # the YAML error names the file


def test_the_scripted_provider_tells_a_missing_file_from_an_unknown_built_in(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"no such script file: 'scripts/nope\.yaml'"):
        load_script("scripts/nope.yaml")
    with pytest.raises(ValueError, match="is a directory"):
        load_script(str(tmp_path))
    with pytest.raises(ValueError, match="unknown script 'nope'; built-in scripts: first_task, research"):
        load_script("nope")


@pytest.mark.parametrize(
    ("args", "said"),
    [(["--workers", "-1"], "argument --workers: must be >= 0, not -1"),
     (["token", "--user", "alice", "--ttl", "-5"], "argument --ttl: must be a number of seconds above 0, not -5"),
     (["token", "--user", "alice", "--ttl", "0"], "argument --ttl: must be a number of seconds above 0, not 0"),
     (["token", "--user", "alice", "--ttl", "inf"], "argument --ttl: must be a number of seconds above 0, not inf")],
)  # fmt: skip
def test_agentq_dev_refuses_a_negative_worker_count_or_a_token_life_not_above_0_naming_the_flag(
    args: list[str], said: str, tmp_path: Path
) -> None:
    """Nothing starts and no token is minted: without the check, --workers -1 ran a stack where no
    task ever starts, and --ttl -5 printed a token already expired (the issuer's state is there)."""
    from agentq_dev.oidc_issuer import ISSUER_ENV, LocalIssuer

    issuer = LocalIssuer().start()
    env = {**os.environ, ISSUER_ENV: str(issuer.write_state()), "PYTHONPATH": str(ROOT)}
    proc = agentq_process(["dev", *args], env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        out, err = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGINT)  # a stack started: stop it, then fail
        proc.communicate(timeout=60)
        pytest.fail(f"agentq dev {' '.join(args)} was accepted and started a stack")
    finally:
        issuer.stop()
    assert proc.returncode == 2 and out == "", err
    assert "usage: agentq dev" in err and said in err


NOT_ABOVE_0 = "argument --wait-timeout: must be a number of seconds above 0, not "
WITHOUT_WAIT = "--wait-timeout needs --wait: without it nothing waits (wait_timeout)"


@pytest.mark.parametrize(
    ("args", "said"),
    [pytest.param(["submit", "x", "--script", "first_task", "--wait-timeout", "-1"], NOT_ABOVE_0 + "-1", id="submit-negative"),
     pytest.param(["submit", "x", "--script", "first_task", "--wait", "--wait-timeout", "-1"], NOT_ABOVE_0 + "-1",
                  id="submit-wait-negative"),
     pytest.param(["result", "some-task", "--wait", "--wait-timeout", "nan"], NOT_ABOVE_0 + "nan", id="result-wait-nan"),
     pytest.param(["submit", "x", "--script", "first_task", "--wait-timeout", "30"], WITHOUT_WAIT, id="submit-no-wait"),
     pytest.param(["send", "some-task", "hello", "--wait-timeout", "30"], WITHOUT_WAIT, id="send-no-wait"),
     pytest.param(["result", "some-task", "--wait-timeout", "30"], WITHOUT_WAIT, id="result-no-wait")],
)  # fmt: skip
def test_a_wait_timeout_not_above_0_or_without_wait_is_refused_naming_it_before_anything_is_sent(
    cli: Callable[..., Ran], args: list[str], said: str
) -> None:
    ran = cli(*args, "--url", NOWHERE)  # a request would exit 1: cannot reach
    assert ran.returncode == 2 and said in ran.stderr, ran.stderr


@pytest.mark.parametrize(
    ("args", "said"),
    [pytest.param(["worker", "--concurrency", "0"], "argument --concurrency: must be >= 1, not 0", id="concurrency-0"),
     pytest.param(["worker", "--concurrency", "-4"], "argument --concurrency: must be >= 1, not -4", id="concurrency-neg"),
     pytest.param(["worker", "--lease", "-3"], "argument --lease: must be a number of seconds above 0", id="lease-neg"),
     pytest.param(["worker", "--heartbeat", "inf"], "argument --heartbeat: must be a number of seconds above 0",
                  id="heartbeat-inf"),
     pytest.param(["worker", "--visibility", "0"], "argument --visibility: must be >= 1, not 0", id="visibility-0"),
     pytest.param(["worker", "--max-receive-count", "0"], "argument --max-receive-count: must be >= 1", id="receives-0"),
     pytest.param(["worker", "--beat-threads", "0"], "argument --beat-threads: must be >= 1", id="beat-threads-0"),
     pytest.param(["worker", "--admission-safety", "1.5"], "argument --admission-safety: must be above 0 and at most 1",
                  id="safety-1.5"),
     pytest.param(["worker", "--admission-safety", "nan"], "argument --admission-safety: must be above 0 and at most 1",
                  id="safety-nan"),
     pytest.param(["worker", "--admission-floor", "-1"], "argument --admission-floor: must be >= 0", id="floor-neg"),
     pytest.param(["worker", "--lease", "3", "--heartbeat", "3"], "--heartbeat (3 s) must be below --lease (3 s)",
                  id="heartbeat-not-below-lease"),
     pytest.param(["worker", "--lease", "9", "--heartbeat", "4"], "--visibility (4 s) must be above --heartbeat (4 s)",
                  id="visibility-not-above-heartbeat"),
     pytest.param(["run-task", "t-1", "--lease", "0"], "argument --lease: must be a number of seconds above 0",
                  id="run-task-lease-0"),
     pytest.param(["run-task", "t-1", "--wait", "-1"], "argument --wait: must be a number of seconds above 0",
                  id="run-task-wait-neg")],
)  # fmt: skip
def test_a_worker_or_run_task_setting_out_of_its_range_is_refused_naming_it_before_anything_runs(
    cli: Callable[..., Ran], args: list[str], said: str
) -> None:
    """No worker starts: without the checks a concurrency of -4, a lease of -3 s, a heartbeat
    as long as the lease or a message's visibility no longer than a heartbeat (a received
    message not yet claimed showed to the other workers between beats) were taken as they
    came, and the worker ran with them."""
    ran = cli(*args, env={"AWS_ENDPOINT_URL": NOWHERE})  # were anything to start, AWS would not answer
    assert ran.returncode == 2 and said in ran.stderr, ran.stderr


NOT_UTF8 = {
    "binary": b"\x00\xff\xfe\x89PNG\x00",
    "utf16": '{"goal": "x", "turns": [{"text": "done"}]}'.encode("utf-16"),  # a BOM first: how some editors save
}


@pytest.mark.parametrize("content", NOT_UTF8, ids=list(NOT_UTF8))
@pytest.mark.parametrize(
    ("command", "field"),
    [pytest.param(("submit", "x", "--provider", "scripted", "--script", "{file}"), "script", id="submit-script"),
     pytest.param(("submit", "--file", "{file}"), "file", id="submit-file"),
     pytest.param(("agents", "create", "-f", "{file}"), "file", id="agents-create"),
     pytest.param(("schedules", "create", "-f", "{file}"), "file", id="schedules-create"),
     pytest.param(("policy", "put", "tenant", "{file}"), "file", id="policy-put"),
     pytest.param(("memory", "put", "notes", "/a.md", "-f", "{file}"), "file", id="memory-put")],
)  # fmt: skip
def test_a_file_that_is_not_utf8_is_named_with_exit_2_and_no_traceback(
    cli: Callable[..., Ran], tmp_path: Path, command: tuple[str, ...], field: str, content: str
) -> None:
    """Without the check a binary (or a UTF-16 export) raised UnicodeDecodeError out of main()."""
    path = tmp_path / "thing.yaml"
    path.write_bytes(NOT_UTF8[content])
    ran = cli(*(part.format(file=path) for part in command), "--url", NOWHERE)  # a request would exit 1
    assert ran.returncode == 2, ran.stderr
    assert f"from {path}: not UTF-8 text" in ran.stderr and f"save it as UTF-8 ({field})" in ran.stderr, ran.stderr
    assert ("UTF-16 byte-order mark" in ran.stderr) is (content == "utf16")


def test_a_profiles_file_that_is_not_utf8_is_named_with_exit_2(cli: Callable[..., Ran], tmp_path: Path) -> None:
    profiles = tmp_path / "profiles.toml"
    profiles.write_bytes(b'[default]\nurl = "\xff"\n')
    ran = cli("status", "t1", "--profile", "default", env={"AGENTQ_PROFILES": str(profiles)})
    assert ran.returncode == 2, ran.stderr
    assert f"cannot read profiles from {profiles}: not UTF-8 text" in ran.stderr and "(profile)" in ran.stderr


def test_a_script_too_large_for_a_request_is_refused_before_it_is_parsed_or_sent(
    cli: Callable[..., Ran], tmp_path: Path
) -> None:
    """A file over four request bodies is refused unread past the limit (a 30 MB script took
    minutes to parse first); one that parses but makes a body over the limit is the API's 413
    naming ``body``, said before sending (sent, the server cut it off: "cannot reach", exit 1)."""
    import json
    import time

    from agentq.api.models.base import MAX_BODY_BYTES
    from agentq.cli.args import FILE_BODIES

    huge = tmp_path / "huge.yaml"
    huge.write_text("turns:\n" + '  - text: "done"\n' * (FILE_BODIES * MAX_BODY_BYTES // 16 + 1))
    started = time.monotonic()
    ran = cli("submit", "x", "--script", str(huge), "--url", NOWHERE)
    assert ran.returncode == 2, ran.stderr
    assert f"cannot read the script from {huge}: over {FILE_BODIES * MAX_BODY_BYTES} bytes" in ran.stderr
    assert ran.stderr.rstrip().endswith("(script)") and time.monotonic() - started < 5

    big = tmp_path / "big.json"
    big.write_text(json.dumps({"turns": [{"text": "x" * MAX_BODY_BYTES}]}))
    ran = cli("submit", "x", "--script", str(big), "--url", NOWHERE)
    assert ran.returncode == 2, ran.stderr
    assert f"the limit is {MAX_BODY_BYTES} (nothing was sent) (body)" in ran.stderr


@pytest.mark.parametrize(
    ("setting", "value", "field"),
    [("AGENTQ_API_KEY", "aq_abc\n", "api_key"),  # a key pasted with its line's end
     ("AGENTQ_URL", NOWHERE + "\n", "url"),
     ("AGENTQ_URL", "http://[::1", "url")],
)  # fmt: skip
def test_a_key_or_url_that_cannot_go_in_a_request_is_named_with_exit_2(
    cli: Callable[..., Ran], setting: str, value: str, field: str
) -> None:
    ran = cli("status", "t1", env={"AGENTQ_URL": NOWHERE, "AGENTQ_API_KEY": "aq_x", setting: value})
    assert ran.returncode == 2, ran.stderr
    assert ran.stderr.rstrip().endswith(f"({field})") and "Traceback" not in ran.stderr, ran.stderr
