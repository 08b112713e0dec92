"""MCP servers as tool sources, through the ``mcp`` package's client.

The deployment registers the servers (``AGENTQ_MCP_SERVERS``: JSON, or a JSON/YAML file of
``{name: {url, headers, timeout_seconds}}`` for streamable HTTP, ``{name: {command, env}}``
for stdio); an agent version names the ones it uses. Registering is the operator's act, not a
caller's: a server is a command the worker starts or a URL it connects to with credentials,
and neither may be chosen by whoever can create an agent (or by the model). Header and
environment values may hold ``${secret:NAME}``, read on the worker from the deployment's
secrets (``core.secrets``), never stored with the agent, and held by the redactor as it is
read (``core.secrets.held``): a server that echoes one, in a result, an error or its listing,
shows the model none of it. A header value may also hold
``${vault:NAME}``: the credential of the user the calling task acts for (``core.vault``), added
only if it is bound to the server's host (a stdio server's environment may not: it has no host
to bind one to); both kinds are filled in one pass, so a credential's value, its end user's text,
is never read for a ``${secret:NAME}``. Listing a server's tools (an agent's creation) acts for no user: headers that
refer to the vault are left out of it.

A server's tools are listed when an agent version is created and pinned in it
(``McpToolPin``). A call opens a session, calls, closes: no connection outlives a call, so
nothing is lost when a worker dies, and each call is one effect for the engine. A pin's
``read_only`` (the server's ``readOnlyHint``) decides how: a read-only tool may run again on
resume; any other is side-effecting, at most once, and *outcome unknown* after a crash. A
server that is down, answers an error, or drops the call gives the model a tool error that
says which (and, for a call that may have run, that its outcome is unknown).

A server's reply is untrusted as its content is: each is refused as it is read once over
``core.tools.mcp_http.MAX_REPLY_BYTES`` (4 MB), in a worker's call and in the API's listing,
never held whole. Over HTTP it is asked for unencoded (the ``mcp`` package would read a JSON
reply whole, and httpx inflate a gzipped one); over stdio each line is bounded by agentq's own
transport (``core.tools.mcp_stdio``: the package's joins a line's chunks without a bound). The
call was sent by then: a side-effecting tool's outcome is "ran, result refused", finished as
such and never run again; a read-only one is a tool error the model reads.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from agentq.core.errors import AgentqError
from agentq.core.models import MCP_SERVER_RULE, McpToolPin, usable_mcp_server_name
from agentq.core.secrets import Secrets
from agentq.core.tools._context import ToolContext
from agentq.core.tools._core import MAX_RESULT_CHARS, TOOL_NAME_PATTERN, ToolSpec
from agentq.core.tools.fetch import parse_target
from agentq.core.vault import CredentialSource, expand
from agentq.core.vault import references as vault_references
from agentq.observe.redaction import redact

if TYPE_CHECKING:
    from agentq.core.tools.mcp_http import ReplyBound

DEFAULT_TIMEOUT_SECONDS = 60.0
LIST_TIMEOUT_SECONDS = 20.0


class McpError(AgentqError):
    code = "mcp_error"


class McpConfigurationError(McpError):
    """The deployment's ``AGENTQ_MCP_SERVERS`` is unusable (fails at start, naming it)."""

    code = "configuration_error"


class McpUnreachable(McpError):
    """No session could be opened: nothing was sent."""

    code = "mcp_unreachable"
    backend_down = True  # the tool's circuit counts it (core.tools._core.backend_down)


class McpCallFailed(McpError):
    """The server answered the call with an error (``isError``), or dropped it."""

    code = "mcp_call_failed"


class McpServerConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    url: str | None = Field(default=None, pattern=r"^https?://")
    headers: dict[str, str] = Field(default_factory=dict)
    command: list[str] | None = Field(default=None, min_length=1)
    env: dict[str, str] = Field(default_factory=dict)
    timeout_seconds: float = Field(default=DEFAULT_TIMEOUT_SECONDS, gt=0, le=900)

    @model_validator(mode="after")
    def _one_transport(self) -> McpServerConfig:
        if (self.url is None) == (self.command is None):
            raise ValueError("give url (streamable HTTP) or command (stdio), not both")
        if any(vault_references(v) for v in self.env.values()):
            raise ValueError("env: ${vault:...} only in an http server's headers (a credential is bound to hosts)")
        return self

    @property
    def transport(self) -> str:
        return "streamable-http" if self.url else "stdio"


class McpServers:
    """The deployment's MCP servers by name."""

    def __init__(self, servers: Mapping[str, McpServerConfig], secrets: Secrets | None = None) -> None:
        self.servers = dict(servers)
        self.secrets = secrets or Secrets.from_env()

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ, secrets: Secrets | None = None) -> McpServers:
        """The servers of ``AGENTQ_MCP_SERVERS`` (JSON, or the path of a JSON or YAML file)."""
        raw = environ.get("AGENTQ_MCP_SERVERS", "").strip()
        if not raw:
            return cls({}, secrets)
        try:
            if raw.startswith("{"):
                data = json.loads(raw)
            else:
                import yaml

                data = yaml.safe_load(Path(raw).read_text())
            if not isinstance(data, dict):
                raise ValueError("expected a mapping of server name to settings")
            servers = {}
            for name, settings in data.items():
                if not isinstance(name, str) or not usable_mcp_server_name(name):
                    raise ValueError(f"server name {name!r}: {MCP_SERVER_RULE}")
                servers[name] = McpServerConfig.model_validate(settings)
        except Exception as exc:
            raise McpConfigurationError(f"AGENTQ_MCP_SERVERS: {exc}", field="AGENTQ_MCP_SERVERS") from None
        return cls(servers, secrets)

    def names(self) -> list[str]:
        return sorted(self.servers)

    def get(self, name: str) -> McpServerConfig:
        config = self.servers.get(name)
        if config is None:
            raise McpUnreachable(
                f"no MCP server {name!r} in this deployment; registered: {', '.join(self.names()) or '(none)'}",
                field="mcp_servers",
            )
        return config

    # ------------------------------------------------------------ calls

    def list_tools(self, name: str) -> list[McpToolPin]:
        """The server's tools now, as pins (every page of the listing). What the server says of
        them is offered to every model that uses them: redacted whole, before any cut, of the
        secrets its headers or environment were given (``core.secrets.held``), as a call's result is
        (a tool named after one can no longer be called, and is refused as a name). Each reply
        is bounded (``core.tools.mcp_http``), and so is what all the pages' pins hold: this runs
        in the API process, when an agent version is created."""
        from agentq.core.tools.mcp_http import MAX_REPLY_BYTES

        config = self.get(name)

        async def listing(client: Any) -> list[McpToolPin]:
            pins, cursor, held = [], None, 0
            while True:
                page = await client.list_tools(cursor=cursor)
                for t in page.tools:
                    hints = t.annotations
                    schema = redact(json.dumps(dict(t.input_schema or {"type": "object"})))
                    pins.append(
                        McpToolPin(
                            server=name,
                            name=redact(t.name),
                            description=redact(t.description or "")[:8000],
                            input_schema=json.loads(schema),
                            read_only=bool(hints is not None and hints.read_only_hint),
                        )
                    )
                    held += len(t.name) + len(pins[-1].description) + len(schema)
                if held > MAX_REPLY_BYTES:  # each page is bounded; so are the pages together
                    raise McpCallFailed(f"MCP server {name!r} lists over {MAX_REPLY_BYTES} bytes of tools")
                cursor = page.next_cursor
                if not cursor:
                    return pins

        pins: list[McpToolPin] = self._session(
            name, config, listing, min(config.timeout_seconds, LIST_TIMEOUT_SECONDS), False
        )
        return pins

    def call(
        self,
        name: str,
        tool: str,
        arguments: dict[str, Any],
        *,
        may_have_run: bool,
        credentials: CredentialSource | None = None,
    ) -> str:
        """Call ``tool`` and return its text; an error result or a dropped call raises.
        ``credentials``: the calling task's vault, for headers that refer to it."""
        config = self.get(name)
        headers = self._headers(config, credentials, for_call=True)

        async def calling(client: Any) -> str:
            result = await client.call_tool(tool, arguments, read_timeout_seconds=config.timeout_seconds)
            text = _render(result.content, result.structured_content)
            if result.is_error:
                raise McpCallFailed(f"MCP server {name!r} answered {tool} with an error: {text or '(no detail)'}")
            return text

        text: str = self._session(name, config, calling, config.timeout_seconds, may_have_run, headers)
        return text

    def _headers(
        self, config: McpServerConfig, credentials: CredentialSource | None, *, for_call: bool
    ) -> dict[str, str]:
        """The server's headers, secrets expanded; vault references expanded for the server's
        host (a call), or left out (a listing, which acts for no user). Both kinds in one pass
        over the operator's value (``core.vault.expand``): a credential's value is its end user's
        text, never read for ``${secret:...}`` references."""
        out = {}
        for key, raw in config.headers.items():
            if not vault_references(raw):
                out[key] = self.secrets.expand(raw)
                continue
            if not for_call:
                continue
            if credentials is None:
                from agentq.core.vault import unavailable

                raise unavailable(vault_references(raw)[0], None, None)
            assert config.url is not None
            target = parse_target(config.url)
            out[key] = expand(raw, credentials, target.host, target.port, secrets=self.secrets)
        return out

    def _session(
        self,
        name: str,
        config: McpServerConfig,
        work: Callable[[Any], Any],
        timeout: float,
        may_have_run: bool,
        headers: dict[str, str] | None = None,
    ) -> Any:
        import anyio

        from agentq.core.tools.mcp_http import ReplyBound

        opened, bound = False, ReplyBound()

        async def run() -> Any:
            nonlocal opened
            from mcp import Client

            with anyio.fail_after(timeout + 5):
                transport = self._transport(config, bound, headers)
                async with Client(transport, read_timeout_seconds=timeout, mode="legacy") as client:
                    opened = True
                    return await work(client)

        try:
            return anyio.run(run)
        except McpError:
            raise
        except BaseException as exc:  # anyio wraps the cause in exception groups
            if isinstance(exc, (KeyboardInterrupt, SystemExit)):
                raise
            if bound.refused is not None:  # whatever the mcp package made of it
                raise McpCallFailed(_refused(name, str(bound.refused), opened, may_have_run)) from None
            cause = _root_cause(exc)
            detail = redact(f"{type(cause).__name__}: {cause}".rstrip(": "))[:500]  # whole, then cut
            if isinstance(cause, McpError):
                raise cause from None
            if not opened:
                raise McpUnreachable(f"cannot reach MCP server {name!r} ({config.transport}): {detail}") from None
            if may_have_run:
                raise McpCallFailed(
                    f"MCP server {name!r} dropped the call ({detail}); it may or may not have run: outcome unknown"
                ) from None
            raise McpCallFailed(f"MCP server {name!r} failed: {detail}") from None

    def _transport(self, config: McpServerConfig, bound: ReplyBound, headers: dict[str, str] | None = None) -> Any:
        if config.url is not None:
            from mcp.client.streamable_http import streamable_http_client

            from agentq.core.tools.mcp_http import MAX_REPLY_BYTES, http_client

            if headers is None:
                headers = self._headers(config, None, for_call=False)
            return streamable_http_client(
                config.url, http_client=http_client(headers, bound), max_sse_event_size=MAX_REPLY_BYTES
            )
        from agentq.core.tools.mcp_stdio import bounded_stdio_client

        assert config.command is not None
        env = {k: self.secrets.expand(v) for k, v in config.env.items()}
        return bounded_stdio_client(config.command, env, bound, errlog=sys.stderr)


def mcp_tool_specs(pins: Iterable[McpToolPin], servers: McpServers | None) -> list[ToolSpec]:
    """Registry entries for a task's pinned MCP tools (calls go to ``servers``)."""
    from pydantic import create_model

    specs = []
    for pin in pins:

        def call(arguments: dict[str, Any], ctx: ToolContext | None = None, _pin: McpToolPin = pin) -> str:
            if servers is None:
                raise McpUnreachable("this worker has no MCP servers configured")
            credentials = ctx.credentials if ctx is not None else None
            return servers.call(
                _pin.server, _pin.name, arguments, may_have_run=not _pin.read_only, credentials=credentials
            )

        timeout = (servers.servers[pin.server].timeout_seconds if servers and pin.server in servers.servers
                   else DEFAULT_TIMEOUT_SECONDS)  # fmt: skip
        specs.append(
            ToolSpec(
                name=pin.qualified,
                description=pin.description or f"{pin.name} (MCP server {pin.server})",
                side_effects=not pin.read_only,
                timeout_seconds=timeout + 10,  # the session's own deadline comes first
                fn=call,
                input_model=create_model(f"{pin.server}_{pin.name}_input"),
                wants_context="ctx",
                raw_schema=pin.input_schema,
            )
        )
    return specs


def valid_tool_name(pin: McpToolPin) -> bool:
    return bool(TOOL_NAME_PATTERN.fullmatch(pin.qualified))


def _refused(name: str, why: str, opened: bool, may_have_run: bool) -> str:
    """What is read of a reply refused unread (``core.tools.mcp_http``). Past the session's
    opening, the call was sent before its reply came: a side-effecting tool ran, or may have, and
    is not run again (the engine finishes its effect record with this text, which a resumed task
    replays); a read-only one fails as a tool error the model reads, and may be asked for less."""
    said = f"MCP server {name!r} sent {why}: refused unread"
    if not opened:
        return f"{said}, as the session opened (nothing was called)"
    if may_have_run:
        return f"{said}. The call was sent: it ran, or may have, and is not run again; its result is unknown"
    return f"{said} (a tool result keeps {MAX_RESULT_CHARS} characters)"


def _root_cause(exc: BaseException) -> BaseException:
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return exc


def _render(content: list[Any], structured: Any) -> str:
    """The call's content as text: text blocks as they are, anything else as JSON."""
    parts = []
    for block in content or []:
        if getattr(block, "type", None) == "text":
            parts.append(block.text)
        else:
            dump = block.model_dump(mode="json") if hasattr(block, "model_dump") else block
            if isinstance(dump, dict) and "data" in dump:
                dump = {**dump, "data": f"({len(str(dump['data']))} characters of {dump.get('mimeType', 'data')})"}
            parts.append(json.dumps(dump, ensure_ascii=False))
    if not parts and structured is not None:
        parts.append(json.dumps(structured, ensure_ascii=False))
    return "\n".join(parts)
