"""Large and non-ASCII text through the workspace's file tools (review must-fix 10): a read,
listing or search whose answer passes the output limit is cut with a note the model can act on,
never a garbled JSON error, and write_file takes content up to its per-file limit in any script,
not only ASCII."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from agentq.core.engine._workspace import TaskWorkspace
from agentq.core.tools import ToolContext, ToolExecution, default_registry, idempotency_key_for
from agentq.core.workspace import EMPTY, WORKSPACE_TOOLS
from agentq.sandbox.workspace import WorkspaceLimits, WorkspaceSandbox

pytestmark = pytest.mark.skipif(not os.path.exists("/usr/bin/bwrap"), reason="the workspace tools need bubblewrap")


def workspace(tmp_path: Path, limits: WorkspaceLimits) -> TaskWorkspace:
    directory = tmp_path / "ws"
    directory.mkdir()
    return TaskWorkspace("t", directory, EMPTY, set(), WorkspaceSandbox(limits))


def call(ws: TaskWorkspace, name: str, **raw: object) -> ToolExecution:
    ctx = ToolContext("t", "toolu_1", idempotency_key_for("t", "toolu_1"), workspace=ws)
    return default_registry().execute(name, dict(raw), ctx, [*WORKSPACE_TOOLS])


@pytest.mark.parametrize("char", ["a", "\u4e2d", "\U0001f600", '"', "\\", "\x01"], ids=repr)
def test_a_read_past_the_output_limit_is_cut_with_a_note_in_any_script(tmp_path: Path, char: str) -> None:
    ws = workspace(tmp_path, WorkspaceLimits(max_output_chars=60_000))
    (ws.directory / "big.txt").write_text((char * 99 + "\n") * 1000, encoding="utf-8")
    out = call(ws, "read_file", path="big.txt")
    assert not out.is_error, out.content
    assert char * 99 in out.content


@pytest.mark.parametrize("char", ["a", "\u4e2d", "\x01"], ids=repr)
def test_a_listing_and_a_search_past_the_output_limit_are_cut_with_a_note(tmp_path: Path, char: str) -> None:
    ws = workspace(tmp_path, WorkspaceLimits(max_output_chars=2_000))
    name = char * 60 if char != "\x01" else "n" * 60
    for i in range(400):
        (ws.directory / f"{name}{i}").write_text(f"{char * 50} hit\n" * 5, encoding="utf-8")
    for tool, args in (("list_files", {}), ("search_files", {"pattern": "hit"})):
        out = call(ws, tool, **args)
        assert not out.is_error, (tool, out.content)
        assert "not shown" in out.content or "cut" in out.content, (tool, out.content[-300:])


@pytest.mark.parametrize("char", ["\u4e2d", "\\", "\n"], ids=repr)
def test_write_file_takes_content_up_to_its_limit_in_any_script(tmp_path: Path, char: str) -> None:
    limit = 24 * 1024 * 1024
    ws = workspace(tmp_path, WorkspaceLimits(max_file_bytes=limit))
    content = char * min(9_000_000, (limit - 16) // len(char.encode()))
    out = call(ws, "write_file", path="big.txt", content=content)
    assert not out.is_error, out.content[:500]
    assert (ws.directory / "big.txt").read_bytes() == content.encode()


def test_a_listing_and_a_search_name_a_file_whose_name_is_not_utf8_with_its_bytes_escaped(tmp_path: Path) -> None:
    # Such a name lives only until the turn's checkpoint refuses it (core.workspace_disk); until
    # then the other calls of the turn answer with it escaped, not with a UnicodeEncodeError.
    ws = workspace(tmp_path, WorkspaceLimits())
    with open(os.path.join(os.fsencode(ws.directory), b"bad\xffname"), "w") as f:
        f.write("hit\n")
    os.symlink(b"to\xfe", os.path.join(os.fsencode(ws.directory), b"link"))
    listed = call(ws, "list_files")
    assert not listed.is_error and listed.content.splitlines() == ["bad\\xffname  4 bytes", "link -> to\\xfe"]
    found = call(ws, "search_files", pattern="hit")
    assert not found.is_error and found.content == "bad\\xffname:1: hit", found.content
