"""Secrets a tool (or an MCP server's headers) may read: named by the deployment, read by
the worker, never part of a task's input.

A tool asks its ``ToolContext`` for ``ctx.secret("stripe-key")``; the model never names a
secret and never sees one unless a tool returns it. Which names exist is the deployment's
list (``AGENTQ_SECRET_NAMES``, from cdk.json's ``secrets``); a name not on it is refused
even if the backend has it, so a tool cannot be talked into reading another team's secret.
Locally the value is the environment variable ``AGENTQ_SECRET_<NAME>`` (upper case, ``-``
and ``.`` as ``_``); in AWS it is the Secrets Manager secret of that name
(``agentq.aws.SecretsManagerSecrets``, chosen with ``AGENTQ_SECRETS_BACKEND=secretsmanager``).

Every place a secret goes answers to the model: a tool returns what it made with one, an MCP
server's result is the model's to read, and either may echo it. So a value is handed to the
redactor the moment it is read (``held``: ``observe.redaction.keep_secret``), before anything
sends it, and from then on no run's results, tool errors, fetched bodies or files, and no log
line, hold it, whichever run (or none) read it. A value the redactor could not find without
finding ordinary text too (under ``MIN_CHARS`` characters, or of fewer than
``MIN_DISTINCT_CHARS`` different ones besides spaces) is refused (``SecretRefused``), never
sent: it could not be kept out of what comes back, and redacting it would rewrite every
tenant's results wherever they hold it.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping
from typing import Protocol

from agentq.core.errors import AgentqError
from agentq.observe.redaction import MIN_CHARS, keep_secret

# Nor can a value of fewer different characters than this, whitespace aside (eight spaces,
# ``--------``, ``abababab``), be redacted: no secret looks so, and redacting one would rewrite
# text wherever that run of characters appears (indentation, a rule line). The vault's rule too.
MIN_DISTINCT_CHARS = 5
NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/-]{0,127}")  # fullmatch
REFERENCE = re.compile(r"\$\{secret:([^}]+)\}")


class SecretUnavailable(AgentqError):
    """A secret that is not on the deployment's list, or that the backend does not have."""

    code = "secret_unavailable"


class SecretRefused(SecretUnavailable):
    """A secret whose value could not be redacted from what comes back without redacting
    ordinary text: never used."""

    code = "secret_refused"


class SecretSource(Protocol):
    def get(self, name: str) -> str: ...


def env_var_for(name: str) -> str:
    return "AGENTQ_SECRET_" + re.sub(r"[^A-Za-z0-9]", "_", name).upper()


class Secrets:
    """The deployment's secrets: ``allowed`` names (None: any), values from ``read``."""

    def __init__(self, read: Callable[[str], str | None], allowed: frozenset[str] | None = None) -> None:
        self._read = read
        self.allowed = allowed

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ) -> Secrets:
        """Environment-backed secrets with the deployment's list, if it gives one."""
        names = [n.strip() for n in environ.get("AGENTQ_SECRET_NAMES", "").split(",") if n.strip()]
        return cls(lambda name: environ.get(env_var_for(name)), frozenset(names) if names else None)

    def get(self, name: str) -> str:
        if not NAME_PATTERN.fullmatch(name or ""):
            raise SecretUnavailable(f"{name!r} is not a secret name", field="secret")
        if self.allowed is not None and name not in self.allowed:
            raise SecretUnavailable(f"secret {name!r} is not one this deployment grants its tools", field="secret")
        value = self._read(name)
        if value is None:
            raise SecretUnavailable(f"secret {name!r} is not set (locally: ${env_var_for(name)})", field="secret")
        return held(name, value)

    def expand(self, text: str) -> str:
        """``text`` with every ``${secret:NAME}`` replaced by the secret's value."""
        return REFERENCE.sub(lambda m: self.get(m.group(1)), text)


def redactable(value: str) -> bool:
    """Whether the redactor can find ``value`` without finding ordinary text too: at least
    ``MIN_CHARS`` characters, of at least ``MIN_DISTINCT_CHARS`` different ones besides spaces."""
    return len(value) >= MIN_CHARS and len({c for c in value if not c.isspace()}) >= MIN_DISTINCT_CHARS


def held(name: str, value: str) -> str:
    """``value``, the secret ``name`` just read, once the redactor has it (``keep_secret``: every
    run's output and every log line are redacted of it from now on); ``SecretRefused`` if no
    redactor could find it without finding ordinary text too. Whatever ``SecretSource`` a value
    comes from, whoever reads it calls this before sending it (``Secrets.get``,
    ``ToolContext.secret``, ``core.vault.expand``)."""
    if not redactable(value):
        raise SecretRefused(
            f"secret {name!r} is not used: a value of fewer than {MIN_CHARS} characters, or of fewer than "
            f"{MIN_DISTINCT_CHARS} different ones besides spaces, cannot be redacted from what a tool or a "
            "server sends back to the model without redacting ordinary text; store a longer, random value",
            field="secret",
        )
    keep_secret(value)
    return value
