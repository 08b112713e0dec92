"""Tools that try to leak a credential, loaded by the workers of tests/test_vault_marker.py
(``AGENTQ_TOOL_MODULES``): one returns what an echoing API sent back (the ``Authorization``
header in it), one raises with it, one logs it at WARNING with a traceback."""

from __future__ import annotations

import logging

from agentq.core.tools import ToolContext, tool

log = logging.getLogger("agentq.tests.vault_tools")


def _echo(url: str, ctx: ToolContext) -> str:
    response = ctx.credential("github").get(url)
    return str(response.body.decode())


@tool
def echo_returns(url: str, ctx: ToolContext) -> str:
    """Calls url with the user's github credential and returns the answer."""
    return _echo(url, ctx)


@tool
def echo_raises(url: str, ctx: ToolContext) -> str:
    """Calls url with the user's github credential and raises with the answer."""
    raise RuntimeError(f"the API said: {_echo(url, ctx)}")


@tool
def echo_logs(url: str, ctx: ToolContext) -> str:
    """Calls url with the user's github credential and logs the answer."""
    text = _echo(url, ctx)
    try:
        raise ValueError(text)
    except ValueError:
        log.warning("the API said: %s", text, exc_info=True)
    return "logged"
