"""Tools: schemas derived from type hints, the registry's never-raising execution, the
built-in tools (http_fetch against a local server, python_exec's results and limits, notes).

What keeps the two outward-facing tools safe is attacked in test_ssrf.py (http_fetch) and
test_sandbox_escape.py (python_exec); here they are checked doing their ordinary job. The
local test server is reached through the deployment allowlist, the one sanctioned way to an
internal address, not through a weakened guard."""

from __future__ import annotations

import hashlib
import http.server
import re
import threading
import time
from collections.abc import Iterator
from typing import Annotated, Any

import pytest
from pydantic import BaseModel, Field

from agentq.core.tools import (
    ToolContext,
    ToolExecution,
    ToolRegistry,
    ToolSpec,
    default_registry,
    idempotency_key_for,
    python_exec,
    tool,
)
from agentq.core.tools.fetch import FetchPolicy, HostRule


class Address(BaseModel):
    street: str = Field(description="street and number")
    city: str


@tool(side_effects=True, timeout_seconds=5)
def send_letter(
    to: Annotated[str, Field(description="recipient name")],
    address: Address,
    ctx: ToolContext,
    copies: int = 1,
    urgent: bool = False,
) -> dict[str, Any]:
    """Send a letter by post.

    Second paragraph that the model does not need.
    """
    return {"to": to, "city": address.city, "copies": copies, "urgent": urgent, "key": ctx.idempotency_key}


@tool
def echo(text: str, title: str = "") -> str:
    """Echo the text back."""
    return f"{title}{text}"


def context(task_id: str = "task-1", tool_use_id: str = "toolu_1", **kw: Any) -> ToolContext:
    return ToolContext(task_id, tool_use_id, idempotency_key_for(task_id, tool_use_id), **kw)


def run(registry: ToolRegistry, name: str, raw: Any, ctx: ToolContext | None = None) -> ToolExecution:
    return registry.execute(name, raw, ctx or context(), registry.names())


# --- declaring tools --------------------------------------------------------------------------


def test_schema_requires_parameters_without_defaults_and_makes_defaulted_ones_optional() -> None:
    schema = send_letter.schema()
    assert schema["name"] == "send_letter"
    input_schema = schema["input_schema"]
    assert input_schema["type"] == "object"
    assert input_schema["required"] == ["to", "address"]
    assert set(input_schema["properties"]) == {"to", "address", "copies", "urgent"}
    assert input_schema["properties"]["copies"] == {"type": "integer", "default": 1}
    assert input_schema["properties"]["urgent"]["type"] == "boolean"


def test_schema_carries_annotated_field_descriptions_and_docstring_first_paragraph() -> None:
    schema = send_letter.schema()
    assert schema["description"] == "Send a letter by post."
    assert schema["input_schema"]["properties"]["to"]["description"] == "recipient name"


def test_schema_of_a_nested_pydantic_model_parameter_is_inlined_with_its_own_required_fields() -> None:
    address = send_letter.schema()["input_schema"]["properties"]["address"]
    assert address["type"] == "object"
    assert address["required"] == ["street", "city"]
    assert address["properties"]["street"] == {"type": "string", "description": "street and number"}
    assert "$defs" not in send_letter.schema()["input_schema"]


def test_schema_drops_pydantic_titles_but_keeps_a_parameter_named_title() -> None:
    input_schema = echo.schema()["input_schema"]
    assert "title" not in input_schema
    assert set(input_schema["properties"]) == {"text", "title"}
    assert input_schema["properties"]["title"] == {"type": "string", "default": ""}
    assert input_schema["required"] == ["text"]


def test_tool_context_parameter_is_left_out_of_the_schema_and_recorded_for_injection() -> None:
    assert "ctx" not in send_letter.schema()["input_schema"]["properties"]
    assert send_letter.wants_context == "ctx"
    assert echo.wants_context is None


def test_optional_tool_context_parameter_is_recognised_too() -> None:
    @tool
    def peek(ctx: ToolContext | None = None) -> str:
        """Show the task id."""
        return ctx.task_id if ctx else "no context"

    assert peek.wants_context == "ctx"
    assert peek.schema()["input_schema"] == {
        "type": "object",
        "properties": {},
        "required": [],
        "additionalProperties": False,
    }
    assert run(ToolRegistry([peek]), "peek", {}, context(task_id="t-9")).content == "t-9"


def test_side_effects_flag_and_timeout_are_recorded_and_default_to_safe_values() -> None:
    assert send_letter.side_effects is True
    assert send_letter.timeout_seconds == 5.0
    assert echo.side_effects is False
    assert echo.timeout_seconds == 30.0


def test_name_and_description_can_be_overridden() -> None:
    spec = tool(name="shout", description="Shout it.")(lambda text: text.upper())
    assert isinstance(spec, ToolSpec)
    assert spec.schema()["name"] == "shout"
    assert spec.schema()["description"] == "Shout it."


def test_decorated_function_can_still_be_called_directly() -> None:
    ctx = context()
    result = send_letter("Ada", Address(street="1 Main St", city="Paris"), ctx, copies=2)
    assert result == {"to": "Ada", "city": "Paris", "copies": 2, "urgent": False, "key": ctx.idempotency_key}
    assert echo("hi", title="> ") == "> hi"


def test_a_tool_name_the_api_would_refuse_is_rejected_at_declaration() -> None:
    with pytest.raises(ValueError, match="must match"):
        tool(name="has space")(lambda: None)


def test_idempotency_key_is_stable_per_tool_use_and_differs_across_tool_uses_and_tasks() -> None:
    key = idempotency_key_for("task-1", "toolu_1")
    assert key == idempotency_key_for("task-1", "toolu_1")
    assert key == hashlib.sha256(b"task-1:toolu_1").hexdigest()[:32]
    assert key != idempotency_key_for("task-1", "toolu_2")
    assert key != idempotency_key_for("task-2", "toolu_1")
    assert ToolContext.create("task-1", "toolu_1").idempotency_key == key


# --- the registry -----------------------------------------------------------------------------


def test_registering_two_tools_with_the_same_name_is_refused() -> None:
    registry = ToolRegistry([echo])
    with pytest.raises(ValueError, match="echo"):
        registry.register(echo)


def test_schemas_lists_only_allowlisted_registered_tools_in_allowlist_order() -> None:
    registry = ToolRegistry([echo, send_letter])
    names = [s["name"] for s in registry.schemas(["send_letter", "missing", "echo"])]
    assert names == ["send_letter", "echo"]
    assert registry.schemas(["echo"])[0]["name"] == "echo"
    assert registry.unknown(["echo", "missing", "other"]) == ["missing", "other"]


def test_execute_injects_the_context_and_renders_a_dict_result_as_json() -> None:
    registry = ToolRegistry([send_letter])
    ctx = context(tool_use_id="toolu_7")
    result = registry.execute(
        "send_letter", {"to": "Ada", "address": {"street": "1 Main St", "city": "Paris"}}, ctx, ["send_letter"]
    )
    assert result.status == "ok" and not result.is_error
    assert result.content == (
        f'{{"to": "Ada", "city": "Paris", "copies": 1, "urgent": false, "key": "{ctx.idempotency_key}"}}'
    )


def test_execute_of_an_unknown_tool_returns_an_error_naming_the_available_tools() -> None:
    registry = ToolRegistry([echo, send_letter])
    result = registry.execute("nope", {}, context(), ["echo", "send_letter"])
    assert result == ToolExecution(
        "unknown tool 'nope'; available: echo, send_letter", True, "error", result.duration_ms
    )


def test_execute_of_a_tool_outside_the_allowlist_returns_an_error_and_does_not_run_it() -> None:
    calls: list[str] = []

    @tool
    def spy(x: int) -> str:
        """Record the call."""
        calls.append("ran")
        return "ran"

    result = ToolRegistry([spy, echo]).execute("spy", {"x": 1}, context(), ["echo"])
    assert result.is_error and result.status == "error"
    assert result.content == "tool 'spy' is not allowed for this task"
    assert calls == []


def test_execute_with_malformed_input_names_each_bad_field_and_does_not_run_the_tool() -> None:
    calls: list[str] = []

    @tool
    def spy(count: int, label: str, address: Address) -> str:
        """Record the call."""
        calls.append("ran")
        return "ran"

    result = run(ToolRegistry([spy]), "spy", {"count": "many", "address": {"street": "x"}, "bogus": 1})
    assert result.is_error and result.status == "error"
    assert result.content.startswith("invalid input for tool 'spy': ")
    assert "count: Input should be a valid integer" in result.content
    assert "label: Field required" in result.content
    assert "address.city: Field required" in result.content
    assert "bogus: Extra inputs are not permitted" in result.content
    assert calls == []


def test_execute_validates_nested_models_and_passes_them_as_model_instances() -> None:
    seen: list[Any] = []

    @tool
    def where(address: Address) -> str:
        """Say the city."""
        seen.append(address)
        return address.city

    assert run(ToolRegistry([where]), "where", {"address": {"street": "1 Main", "city": "Oslo"}}).content == "Oslo"
    assert isinstance(seen[0], Address)


def test_an_exception_in_the_tool_becomes_an_error_result_without_traceback() -> None:
    @tool
    def broken(x: int) -> str:
        """Always fails."""
        raise ValueError(f"bad value {x}")

    result = run(ToolRegistry([broken]), "broken", {"x": 3})
    assert result.is_error and result.status == "error"
    assert result.content == "ToolError: ValueError: bad value 3"
    assert "Traceback" not in result.content


def test_a_tool_raising_its_own_timeout_error_is_an_error_not_a_timeout() -> None:
    @tool
    def flaky() -> str:
        """Times out internally."""
        raise TimeoutError("upstream took too long")

    result = run(ToolRegistry([flaky]), "flaky", {})
    assert result.status == "error"
    assert result.content == "ToolError: TimeoutError: upstream took too long"


def test_a_slow_tool_is_abandoned_with_a_timeout_result_just_after_its_timeout() -> None:
    release = threading.Event()

    @tool(timeout_seconds=0.3)
    def slow() -> str:
        """Waits."""
        release.wait(10)
        return "finished"

    try:
        started = time.monotonic()
        result = run(ToolRegistry([slow]), "slow", {})
        elapsed = time.monotonic() - started
    finally:
        release.set()
    assert result.status == "timeout" and result.is_error
    assert result.content == "tool 'slow' timed out after 0.3s"
    assert 0.3 <= elapsed < 3  # cut at its timeout, not at the tool's own end (10 s); the rest is a busy machine
    assert 300 <= result.duration_ms < 3000


def test_a_task_deadline_sooner_than_the_tool_timeout_cuts_the_call_short() -> None:
    release = threading.Event()

    @tool(timeout_seconds=30)
    def slow() -> str:
        """Waits."""
        release.wait(10)
        return "finished"

    try:
        started = time.monotonic()
        result = run(ToolRegistry([slow]), "slow", {}, context(deadline=time.time() + 0.3))
        elapsed = time.monotonic() - started
        past = run(ToolRegistry([slow]), "slow", {}, context(deadline=time.time() - 1))
    finally:
        release.set()
    assert result.status == "timeout"
    assert re.fullmatch(r"tool 'slow' timed out after 0\.[23]s", result.content)
    assert elapsed < 3  # cut at the deadline, not at the tool's timeout (30 s) or its own end (10 s)
    assert past.status == "timeout" and past.duration_ms < 1000  # a deadline already past: not waited for


def test_return_values_are_rendered_as_text_for_the_model() -> None:
    @tool
    def give(kind: str) -> Any:
        """Return something of the given kind."""
        return {
            "none": None,
            "str": "plain",
            "list": [1, "a"],
            "model": Address(street="s", city="c"),
            "nested": {"when": time.gmtime(0).tm_year, "addr": Address(street="s", city="c")},
            "int": 7,
        }[kind]

    registry = ToolRegistry([give])
    rendered = {
        k: run(registry, "give", {"kind": k}).content for k in ("none", "str", "list", "model", "nested", "int")
    }
    assert rendered == {
        "none": "",
        "str": "plain",
        "list": '[1, "a"]',
        "model": '{"street": "s", "city": "c"}',
        "nested": '{"when": 1970, "addr": {"street": "s", "city": "c"}}',
        "int": "7",
    }


def test_default_registry_holds_the_builtin_tools_and_is_new_on_each_call() -> None:
    first, second = default_registry(), default_registry()
    workspace = ["shell", "read_file", "write_file", "edit_file", "list_files", "search_files"]
    assert first.names() == ["http_fetch", "python_exec", "note_write", "note_read", *workspace]
    assert first is not second
    first.register(echo)
    assert "echo" not in second.names()
    for spec in (first.get(n) for n in ["http_fetch", "python_exec", "note_write", "note_read"]):
        assert spec is not None and spec.side_effects is False
    python = first.get("python_exec")
    assert python is not None and python.timeout_seconds > 60


# --- http_fetch -------------------------------------------------------------------------------


class _Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        if self.path == "/missing":
            self.send_error(404, "Not Found")
            return
        if self.path == "/to-file":
            self.send_response(302)
            self.send_header("Location", "file:///etc/passwd")
            self.end_headers()
            return
        body = "héllo world".encode() if self.path == "/hello" else b"a" * 5000
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def web() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def allowing(web: str) -> ToolRegistry:
    """A registry whose deployment allowlist names the test server's exact address and port."""
    port = int(web.rsplit(":", 1)[1])
    return default_registry(fetch_policy=FetchPolicy(allow=(HostRule("127.0.0.1", port),)))


def test_http_fetch_returns_status_content_type_and_body(web: str) -> None:
    result = run(allowing(web), "http_fetch", {"url": f"{web}/hello"})
    assert result.status == "ok"
    assert result.content == "HTTP 200 text/plain; charset=utf-8\n\nhéllo world"


def test_http_fetch_reads_at_most_max_bytes_and_says_it_truncated(web: str) -> None:
    registry = allowing(web)
    result = run(registry, "http_fetch", {"url": f"{web}/big", "max_bytes": 100})
    head, body = result.content.split("\n\n", 1)
    assert head == "HTTP 200 text/plain; charset=utf-8"
    assert body == "a" * 100 + "\n[truncated at 100 bytes]"
    assert "truncated" not in run(registry, "http_fetch", {"url": f"{web}/big", "max_bytes": 5000}).content


def test_http_fetch_returns_a_404_as_a_status_not_an_error(web: str) -> None:
    result = run(allowing(web), "http_fetch", {"url": f"{web}/missing"})
    assert result.status == "ok" and not result.is_error
    assert result.content.startswith("HTTP 404 text/html")
    assert "Not Found" in result.content


def test_http_fetch_refuses_non_http_schemes_and_redirects_to_them(web: str) -> None:
    registry = allowing(web)
    for url in ["file:///etc/passwd", "ftp://example.com/x", "gopher://127.0.0.1/"]:
        result = run(registry, "http_fetch", {"url": url})
        assert result.is_error and "only fetches http:// and https:// URLs" in result.content, url
        assert "root:" not in result.content
    redirected = run(registry, "http_fetch", {"url": f"{web}/to-file"})
    assert redirected.is_error and "refusing to follow a redirect" in redirected.content


def test_http_fetch_input_limits_are_enforced_by_the_schema() -> None:
    result = run(default_registry(), "http_fetch", {"url": "http://x", "max_bytes": 2_000_000, "timeout_seconds": 31})
    assert result.is_error
    assert "max_bytes: Input should be less than or equal to 1000000" in result.content
    assert "timeout_seconds: Input should be less than or equal to 30" in result.content


# --- python_exec ------------------------------------------------------------------------------


def sections(output: str) -> tuple[str, str, str]:
    match = re.fullmatch(r"(exit code [^\n]*)\n--- stdout ---\n(.*)\n--- stderr ---\n(.*)", output, re.DOTALL)
    assert match, output
    return match.group(1), match.group(2), match.group(3)


def test_python_exec_returns_exit_code_and_captured_output() -> None:
    result = run(
        default_registry(), "python_exec", {"code": "import sys\nprint('hi', 6 * 7)\nprint('oops', file=sys.stderr)"}
    )
    assert result.status == "ok"
    assert sections(result.content) == ("exit code 0", "hi 42\n", "oops\n")


def test_python_exec_reports_a_non_zero_exit_and_the_exception() -> None:
    status, _, stderr = sections(python_exec("x = 1\nraise ValueError('boom')"))
    assert status == "exit code 1"
    assert "ValueError: boom" in stderr and 'File "main.py", line 2' in stderr
    assert sections(python_exec("import sys; sys.exit(3)"))[0] == "exit code 3"


def test_python_exec_kills_an_infinite_loop_at_the_wall_clock_timeout() -> None:
    started = time.monotonic()
    # 3 s: time for the sandbox and Python to start and print on a busy machine, before the loop
    status, stdout, _ = sections(python_exec("print('started', flush=True)\nwhile True:\n    pass", timeout_seconds=3))
    elapsed = time.monotonic() - started
    assert status == "exit code -9 (timed out after 3.0s of wall-clock time; the process was killed)"
    assert stdout == "started\n"  # output printed before the kill survives
    assert elapsed < 10  # killed at its timeout, not left to loop


def test_python_exec_reports_exceeding_the_memory_limit() -> None:
    status, _, stderr = sections(python_exec("x = bytearray(512 * 1024 * 1024)\nprint('allocated')", memory_mb=128))
    assert status == "exit code 1 (memory limit of 128 MB exceeded)"
    assert "MemoryError" in stderr


def test_python_exec_runs_in_an_empty_tmp_that_the_next_call_does_not_see() -> None:
    _, stdout, _ = sections(
        python_exec("import os\nopen('out.txt', 'w').write('x')\nprint(os.getcwd())\nprint(sorted(os.listdir('.')))")
    )
    assert stdout.splitlines() == ["/tmp", "['main.py', 'out.txt']"]
    _, stdout, _ = sections(python_exec("import os\nprint(sorted(os.listdir('/tmp')))"))
    assert stdout == "['main.py']\n"


def test_python_exec_in_a_sandbox_that_cannot_be_set_up_is_refused_with_the_reason() -> None:
    from agentq.sandbox.bwrap import BwrapSandbox

    missing = default_registry(sandbox=BwrapSandbox(bwrap="/nonexistent/bwrap"))
    result = run(missing, "python_exec", {"code": "print('RAN')"})
    assert result.is_error and result.status == "error"
    assert result.content.startswith("ToolError: SandboxUnavailable: cannot start bubblewrap")
    assert "RAN" not in result.content


def test_python_exec_truncates_long_output() -> None:
    _, stdout, _ = sections(python_exec("print('x' * 200_000)"))
    assert stdout.endswith("\n[stdout truncated: first 32768 of 200001 bytes shown]")
    assert len(stdout) < 33_000


# --- notes ------------------------------------------------------------------------------------


class MemoryNotes:
    def __init__(self) -> None:
        self.notes: dict[str, str] = {}

    def read_note(self, key: str) -> str | None:
        return self.notes.get(key)

    def write_note(self, key: str, value: str) -> None:
        self.notes[key] = value


def test_note_write_then_note_read_round_trips_through_the_note_store() -> None:
    registry, notes = default_registry(), MemoryNotes()
    ctx = context(notes=notes)
    written = run(registry, "note_write", {"key": "plan.step:1", "value": "fetch the docs ✓"}, ctx)
    assert written.status == "ok" and "plan.step:1" in written.content
    assert notes.notes == {"plan.step:1": "fetch the docs ✓"}
    assert run(registry, "note_read", {"key": "plan.step:1"}, ctx).content == "fetch the docs ✓"
    assert "note_read" not in str(registry.get("note_read").schema()["input_schema"]["properties"])  # type: ignore[union-attr]


def test_note_read_of_a_missing_key_is_a_plain_answer_not_an_error() -> None:
    result = run(default_registry(), "note_read", {"key": "nothing"}, context(notes=MemoryNotes()))
    assert result == ToolExecution("no note named 'nothing'", False, "ok", result.duration_ms)


def test_note_keys_and_values_are_limited() -> None:
    registry, notes = default_registry(), MemoryNotes()
    ctx = context(notes=notes)
    bad_key = run(registry, "note_write", {"key": "no spaces", "value": "v"}, ctx)
    assert bad_key.is_error and "key: String should match pattern" in bad_key.content
    long_key = run(registry, "note_write", {"key": "k" * 129, "value": "v"}, ctx)
    assert long_key.is_error and "key: String should have at most 128 characters" in long_key.content
    too_big = run(registry, "note_write", {"key": "k", "value": "é" * 20_000}, ctx)  # 40 000 bytes of UTF-8
    assert too_big.is_error and "value: Value error, a note holds at most 32768 bytes" in too_big.content
    assert notes.notes == {}
    no_store = run(registry, "note_read", {"key": "k"}, context())
    assert no_store.is_error and "notes are not available" in no_store.content
