"""Your own tools (issue 13.1): a module of ``@tool`` functions named with ``--tools`` (or
``AGENTQ_TOOL_MODULES``) or declared by an installed package's ``agentq.tools`` entry point is
loaded by the API and the workers alike; ``agentq dev --tools`` serves them end to end; a
module that cannot be imported is one error line naming it, exit code 2, nothing started."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import textwrap
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from agentq.control.defaults import ConfigurationError
from agentq.tool_modules import ENTRY_POINT_GROUP, installed_tool_modules, load_tool_modules

from tests.helpers import agentq_process, run_agentq

ROOT = Path(__file__).resolve().parent.parent


def _package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, module: str, source: str, *, entry_point: bool) -> None:
    """A module on sys.path and, with ``entry_point``, an installed distribution declaring it."""
    (tmp_path / f"{module}.py").write_text(textwrap.dedent(source))
    if entry_point:
        dist = tmp_path / f"{module.replace('_', '-')}-1.0.dist-info"
        dist.mkdir()
        (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {module}\nVersion: 1.0\n")
        (dist / "entry_points.txt").write_text(f"[{ENTRY_POINT_GROUP}]\n{module} = {module}\n")
    monkeypatch.syspath_prepend(str(tmp_path))


TOOLS_SOURCE = """
    from agentq.core.tools import tool

    @tool
    def weather(city: str) -> str:
        \"\"\"Today's weather in a city.\"\"\"
        return f"sunny in {city}"

    @tool(side_effects=True)
    def book_table(restaurant: str, seats: int) -> str:
        \"\"\"Book a table.\"\"\"
        return f"booked {seats} at {restaurant}"
"""


def test_a_module_without_a_tools_list_offers_its_top_level_tool_functions(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _package(tmp_path, monkeypatch, "my_weather_tools", TOOLS_SOURCE, entry_point=False)
    specs = load_tool_modules(["my_weather_tools"])
    assert [s.name for s in specs] == ["weather", "book_table"]
    assert specs[1].side_effects and not specs[0].side_effects
    assert specs[0].schema()["input_schema"]["properties"]["city"]["type"] == "string"


def test_an_installed_package_is_found_through_its_entry_point_without_configuration(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _package(tmp_path, monkeypatch, "installed_weather_tools", TOOLS_SOURCE, entry_point=True)
    assert "installed_weather_tools" in installed_tool_modules()
    assert {"weather", "book_table"} <= {s.name for s in load_tool_modules([])}


def test_a_module_that_cannot_be_imported_is_a_configuration_error_naming_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(ConfigurationError, match="tool module 'no_such_tools' cannot be imported: ModuleNotFoundError"):
        load_tool_modules(["no_such_tools"])
    _package(tmp_path, monkeypatch, "wrong_tools", "TOOLS = ['not a tool']\n", entry_point=False)
    with pytest.raises(ConfigurationError, match="TOOLS holds 'not a tool', not @tool functions"):
        load_tool_modules(["wrong_tools"])


def _env(**extra: str) -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    env.pop("AGENTQ_TOOL_MODULES", None)
    return {**env, **extra}


@pytest.mark.parametrize("command", [["dev"], ["worker"], ["run", "a goal"]])
def test_a_tools_flag_naming_a_missing_module_stops_with_one_line_and_exit_code_2(command: list[str]) -> None:
    done = run_agentq([*command, "--tools", "no_such_tools"], _env(), timeout=60)
    assert done.returncode == 2, done.stderr
    assert (
        done.stderr.startswith("agentq: tool module 'no_such_tools' cannot be imported")
        and "Traceback" not in done.stderr
    )


def test_agentq_dev_with_tools_serves_them_through_the_api_and_runs_them_on_its_workers(tmp_path: Path) -> None:
    ledger = tmp_path / "ledger.jsonl"
    proc = agentq_process(
        ["dev", "--workers", "1", "--tools", "tests.effect_tools"],
        _env(AGENTQ_TEST_LEDGER=str(ledger)), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        lines: list[str] = []
        assert proc.stdout is not None
        while not any("Ctrl-C" in line for line in lines):
            line = proc.stdout.readline()
            assert line, "".join(lines)
            lines.append(line)
        tools_line = next(line for line in lines if line.strip().startswith("tools"))
        assert "charge_card" in tools_line and "send_report" in tools_line
        url = next(line.split("=", 1)[1].strip() for line in lines if "export AGENTQ_URL=" in line)
        body = {
            "goal": "charge once",
            "provider": "scripted",
            "script": {"turns": [
                {"text": "", "tool_calls": [{"name": "charge_card", "input": {"amount_cents": 7, "memo": "dev"}}]},
                {"text": "charged"},
            ]},
            "constraints": {"tools": ["charge_card"]},
        }  # fmt: skip
        request = urllib.request.Request(
            f"{url}/tasks", data=json.dumps(body).encode(), method="POST", headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(request, timeout=30) as resp:
            task_id = json.loads(resp.read())["task_id"]
        view = _finished(url, task_id)
        assert view["status"] == "succeeded" and view["result"] == "charged"
        assert [json.loads(line)["amount"] for line in ledger.read_text().splitlines()] == [7]
    finally:
        os.killpg(proc.pid, signal.SIGINT)
        proc.wait(timeout=60)


def _post(url: str, body: dict[str, object]) -> str:
    request = urllib.request.Request(
        f"{url}/tasks", data=json.dumps(body).encode(), method="POST", headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as resp:
            return str(json.loads(resp.read())["task_id"])
    except urllib.error.HTTPError as err:
        return f"{err.code}: {err.read().decode()}"


def _finished(url: str, task_id: str) -> dict[str, object]:
    """The task once it has ended, read every 0.1 s for up to 90 s (a fresh ``agentq dev``
    worker on a busy machine can take many seconds to get going)."""
    import time

    for _ in range(900):
        with urllib.request.urlopen(f"{url}/tasks/{task_id}", timeout=30) as resp:
            view = json.loads(resp.read())
        if view["status"] in ("succeeded", "failed"):
            return dict(view)
        time.sleep(0.1)
    raise AssertionError(f"task {task_id} did not finish: {view}")


def test_agentq_dev_reload_restarts_the_workers_on_a_changed_tool_module_and_keeps_them_on_a_broken_one(
    tmp_path: Path,
) -> None:
    module = tmp_path / "shop_tools.py"
    module.write_text(
        'from agentq import tool\n\n@tool\ndef price(sku: str) -> str:\n    """A price."""\n    return "v1 " + sku\n'
    )
    proc = agentq_process(
        ["dev", "--workers", "1", "--tools", "shop_tools", "--reload"],
        _env(PYTHONPATH=os.pathsep.join([str(ROOT), str(tmp_path)])),
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=tmp_path,
    )  # fmt: skip
    assert proc.stdout is not None
    lines: list[str] = []

    def read_until(marker: str) -> str:
        while True:
            line = proc.stdout.readline()  # type: ignore[union-attr]
            assert line, "".join(lines)
            lines.append(line)
            if marker in line:
                return line

    def task(tool: str) -> dict[str, object]:
        task_id = _post(url, {"goal": "price it", "provider": "scripted", "constraints": {"tools": [tool]},
                              "script": {"turns": [{"text": "", "tool_calls": [{"name": tool, "input": {"sku": "a1"}}]},
                                                   {"text": "priced"}]}})  # fmt: skip
        assert len(task_id) == 32, task_id
        return _finished(url, task_id)

    try:
        read_until("Ctrl-C")
        url = next(line.split("=", 1)[1].strip() for line in lines if "export AGENTQ_URL=" in line)
        assert task("price")["status"] == "succeeded"

        module.write_text(
            module.read_text().replace('"v1 "', '"v2 "')
            + '\n@tool\ndef stock(sku: str) -> str:\n    """Stock."""\n    return "3 of " + sku\n'
        )
        assert "stock" in read_until("tools ") and "restarted" in "".join(lines[-3:])
        view = task("stock")  # the API knows the new tool, and the new workers run it
        assert view["status"] == "succeeded"

        module.write_text("def broken(:\n")
        assert "workers kept" in read_until("does not load")
        assert proc.poll() is None and task("price")["status"] == "succeeded"  # the last good code still runs
    finally:
        os.killpg(proc.pid, signal.SIGINT)
        proc.wait(timeout=60)
