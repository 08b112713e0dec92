"""Vaults: named credentials a task uses for its end user, which never reach the model.

A credential belongs to a tenant, and to one of its users or to the whole tenant (``user``
None: every user's tasks may use it, a user's own of the same name wins). It is an API key, a
bearer token or basic auth, and it is *bound to the hosts it may be sent to* (``HostBinding``:
exact hosts, or one narrow ``*.domain`` pattern; a pattern that matches everything is refused).
It is written through the API (``control.vault``), stored only encrypted
(``core.vault_crypto``), never read back (a listing gives names, hosts and dates), and used
by reference only, at egress:

- ``http_fetch`` and MCP servers' headers hold ``${vault:NAME}``, expanded on the worker for a
  request to a bound host only (``TaskCredentials.expand``);
- a tool asks ``ctx.credential("github")`` and gets a ``CredentialHandle``, a client that sends
  the credential to its hosts and nowhere else (it has no way to read the value);
- a workspace's processes reach a bound host through the egress proxy, which adds it to plain
  HTTP requests (``core.tools.egress``; a ``CONNECT`` tunnel is passed without it).

A value that comes back anyway (an API that echoes its ``Authorization`` header) is redacted
before anything stores it (``observe.redaction``). A credential the task's user does not have
is ``CredentialUnavailable``: a tool error that names it and the host, after which the model may
call ``request_credential`` and the task pauses until the user adds it (``core.engine._approvals``).
"""

from __future__ import annotations

import base64
import ipaddress
import re
from dataclasses import dataclass, field
from typing import Annotated, Literal, Protocol

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, SecretStr, model_validator

from agentq.core.endusers import MAX_USER_CHARS, USER_PATTERN, USER_RULE
from agentq.core.errors import AgentqError
from agentq.core.secrets import MIN_DISTINCT_CHARS, SecretSource, held
from agentq.core.secrets import REFERENCE as SECRET_REFERENCE

NAME_PATTERN = r"^[a-z0-9][a-z0-9_-]{0,63}$"
_NAME = re.compile(NAME_PATTERN[1:-1])  # fullmatch
NAME_RULE = "1-64 characters: a lowercase letter or digit, then lowercase letters, digits, - or _"
MIN_VALUE_CHARS = 8  # shorter values cannot be redacted without redacting ordinary text too
# Nor can one of fewer different characters (``core.secrets.MIN_DISTINCT_CHARS``): redacting one
# would rewrite its user's own results and files wherever that run of characters appears.
MAX_VALUE_BYTES = 4096
MAX_HOSTS = 10
MAX_REFERENCES = 16  # ``${vault:NAME}`` references in one value that ``expand`` fills
HEADER_PATTERN = r"^[A-Za-z0-9-]{1,64}$"
DEFAULT_API_KEY_HEADER = "X-Api-Key"
# The header names an api_key may not be sent under (lower case; and every name with a prefix of
# RESERVED_PREFIXES): a hop's own and a body's framing, which the client (http.client, httpx, the
# egress proxy) sets itself, and every one a shared front end may route by. The egress proxy
# drops the process's copies of these (``core.tools.egress.DROPPED_HEADERS``) and frames the body
# itself, then adds the credential's header: one named here would give the upstream a second
# ``Host``, a ``Transfer-Encoding`` beside the proxy's ``Content-Length``, or an
# ``X-Forwarded-Host`` that steers a front end past the task's allowed hosts.
RESERVED_HEADERS = frozenset(
    {
        "host", "connection", "keep-alive", "upgrade", "http2-settings", "te", "trailer", "transfer-encoding",
        "content-length", "expect", "forwarded", "x-host", "x-original-host", "x-http-host-override",
        "x-original-url", "x-rewrite-url", "via", "max-forwards",
    }
)  # fmt: skip
RESERVED_PREFIXES = ("proxy-", "x-forwarded-")
# What a request a credential is added to does not send (lower case): each asks the server to
# transform its answer (compress it, send a piece of it, recode it) past what the redactor reads;
# a range of an echo holds a piece of the value that no spelling of it matches. One list for every
# path: the egress proxy drops a process's (``core.tools.egress_answer``), ``core.tools.fetch``
# the model's or a tool's (``http_fetch``'s headers, a ``CredentialHandle``'s).
TRANSFORMING_HEADERS = frozenset({"accept-encoding", "te", "range", "if-range", "accept-charset"})
# What a bearer token or an API key may hold: visible ASCII (RFC 9110's VCHAR), which every server
# reads as it was sent. A space around it is dropped by the reader (a field value excludes it, RFC
# 9110 5.5; httpbin, Go, Node and nginx strip it), one inside may end the token for a server that
# splits on it, and a letter outside ASCII goes as Latin-1 bytes that a UTF-8 reader echoes as
# U+FFFD: each echo spells the value otherwise, so no redaction of the stored value finds it.
_VISIBLE = re.compile(r"[\x21-\x7e]+")
DEFAULT_PORTS = (80, 443)  # what a binding without a port allows (as the egress proxy's rules)
REFERENCE = re.compile(r"\$\{vault:([^}]*)\}")
TEMPLATE = re.compile(f"{REFERENCE.pattern}|{SECRET_REFERENCE.pattern}")  # a vault reference or a secret's
REQUEST_CREDENTIAL_TOOL = "request_credential"

Kind = Literal["bearer", "api_key", "basic"]

_LABEL = re.compile(r"[a-z0-9_]([a-z0-9_-]{0,61}[a-z0-9_])?")


class CredentialUnavailable(AgentqError):
    """The task's user has no credential of that name (or none bound to that host)."""

    code = "credential_unavailable"


class CredentialRefused(AgentqError):
    """A credential asked to go where it is not bound: never sent."""

    code = "credential_refused"


class VaultUnavailable(AgentqError):
    """This deployment has no vault key (``AGENTQ_VAULT_KMS_KEY`` or ``AGENTQ_VAULT_KEY_FILE``)."""

    code = "vault_unavailable"


def valid_name(value: object) -> bool:
    return isinstance(value, str) and _NAME.fullmatch(value) is not None


# --- hosts ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class HostBinding:
    """Where a credential may go: ``host``, ``host:port``, ``*.domain[:port]``, an IP literal.

    A pattern is one leading ``*.`` label over a domain of at least two labels
    (``*.github.example.com``, ``*.example.com``); ``*``, ``*.com`` and a ``*`` anywhere else are
    refused: a credential that may go anywhere is not bound. Without a port, ports 80 and 443."""

    host: str  # lower case, no brackets, no leading "*."
    wildcard: bool = False
    port: int | None = None

    @classmethod
    def parse(cls, text: str) -> HostBinding:
        raw = text.strip().lower()
        if not raw:
            raise ValueError("a host may not be empty")
        if "://" in raw or "/" in raw:  # a URL, where its host is meant: say so, not "the port ..."
            raise ValueError(f"{text!r}: a host, not a URL: name only the host (and a port), e.g. api.github.com")
        if raw.startswith("["):  # [v6] or [v6]:port
            end = raw.find("]")
            if end < 0:
                raise ValueError(f"{text!r}: unclosed '['")
            host, rest = raw[1:end], raw[end + 1 :]
            if rest and not rest.startswith(":"):
                raise ValueError(f"{text!r} is not host, host:port or [v6]:port")
            return cls(_literal(host, text), False, _port(rest[1:], text) if rest else None)
        if raw.count(":") > 1:  # a bare IPv6 address
            return cls(_literal(raw, text))
        host, _, port = raw.partition(":")
        bound_port = _port(port, text) if port else None
        try:
            return cls(str(ipaddress.ip_address(host)), False, bound_port)
        except ValueError:
            pass
        wildcard = host.startswith("*.")
        name = host[2:] if wildcard else host
        if "*" in name or host == "*":
            raise ValueError(f"{text!r}: a pattern is one leading '*.' label over a domain, e.g. *.example.com")
        labels = name.rstrip(".").split(".")
        if not all(_LABEL.fullmatch(label) for label in labels) or len(name) > 253:
            raise ValueError(f"{text!r} is not a host name")
        if wildcard and len(labels) < 2:
            raise ValueError(f"{text!r} matches every host of a top-level domain: bind a narrower pattern")
        return cls(name.rstrip("."), wildcard, bound_port)

    def matches(self, host: str, port: int) -> bool:
        host = host.lower().rstrip(".").strip("[]")
        if self.port is not None and port != self.port:
            return False
        if self.port is None and port not in DEFAULT_PORTS:
            return False
        if self.wildcard:
            return host.endswith("." + self.host)
        return host == self.host

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return ("*." if self.wildcard else "") + host + (f":{self.port}" if self.port is not None else "")


def _literal(host: str, text: str) -> str:
    try:
        return str(ipaddress.ip_address(host))
    except ValueError:
        raise ValueError(f"{text!r} is not a valid IP address") from None


def _port(port: str, text: str) -> int:
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"{text!r}: the port must be 1..65535")
    return int(port)


def _bindings(hosts: list[str]) -> list[str]:
    out = []
    for i, text in enumerate(hosts):
        try:
            out.append(str(HostBinding.parse(text)))
        except ValueError as exc:
            raise ValueError(f"hosts[{i}]: {exc}") from None
    if len(set(out)) != len(out):
        raise ValueError("hosts: a host is named twice")
    return out


Hosts = Annotated[
    list[str],
    Field(min_length=1, max_length=MAX_HOSTS, description="the hosts it may be sent to: host, host:port or *.domain"),
    AfterValidator(_bindings),
]


# --- what a caller writes, what it reads back -------------------------------------------------


EndUser = Annotated[
    str, Field(min_length=1, max_length=MAX_USER_CHARS, pattern=USER_PATTERN, description=f"an end user ({USER_RULE})")
]


class StrictModel(BaseModel):
    """``core.models.strict.StrictModel``'s rule (an unknown field is refused), without importing
    ``core.models``, which imports the tools that import this module."""

    model_config = ConfigDict(extra="forbid")


def reserved_header(name: str) -> bool:
    """Whether a credential may not be sent under header ``name`` (``RESERVED_HEADERS``)."""
    return name.lower() in RESERVED_HEADERS or name.lower().startswith(RESERVED_PREFIXES)


def _not_reserved(name: str | None) -> str | None:
    if name is not None and reserved_header(name):
        raise ValueError(
            f"{name!r} frames or routes the request (the client sets it): name the header the API reads the key from"
        )
    return name


def _fits(value: SecretStr) -> SecretStr:
    raw = value.get_secret_value()
    if len(raw) < MIN_VALUE_CHARS:
        raise ValueError(f"at least {MIN_VALUE_CHARS} characters")
    if len({c for c in raw if not c.isspace()}) < MIN_DISTINCT_CHARS:
        raise ValueError(
            f"at least {MIN_DISTINCT_CHARS} different characters besides spaces: a value like this is ordinary text, "
            "which redacting would rewrite in its user's own results and files"
        )
    if len(raw.encode("utf-8")) > MAX_VALUE_BYTES:
        raise ValueError(f"at most {MAX_VALUE_BYTES} bytes")
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in raw):
        raise ValueError("no control characters (it goes into an HTTP header)")
    return value


def sendable(kind: str, value: str) -> bool:
    """Whether a ``kind`` credential's ``value`` goes into a header as it is read (``_VISIBLE``);
    basic auth's goes base64-encoded, whatever it holds."""
    return kind == "basic" or _VISIBLE.fullmatch(value) is not None


class CredentialWrite(StrictModel):
    """A credential as the API takes it. ``value`` is a ``SecretStr`` and errors hide their
    input: no repr, log line or validation error shows it."""

    model_config = ConfigDict(extra="forbid", hide_input_in_errors=True)

    user: EndUser | None = Field(default=None, description="the end user it belongs to; none: the whole tenant")
    kind: Kind = "bearer"
    value: Annotated[SecretStr, AfterValidator(_fits)] = Field(
        description=f"the secret ({MIN_VALUE_CHARS}-{MAX_VALUE_BYTES} bytes, {MIN_DISTINCT_CHARS} different "
        "characters or more besides spaces; a bearer token or an api_key visible ASCII only, so no whitespace "
        "around or inside it; a basic password any letter, spaces too); never readable back",
    )
    hosts: Hosts
    header: Annotated[str | None, AfterValidator(_not_reserved)] = Field(
        default=None, pattern=HEADER_PATTERN, description=f"api_key only: the header that carries it "
        f"(default {DEFAULT_API_KEY_HEADER}; not one that frames or routes a request: Host, Content-Length, "
        "Transfer-Encoding, Connection, Forwarded, X-Forwarded-*, Proxy-*, ...)"
    )  # fmt: skip
    username: str | None = Field(default=None, min_length=1, max_length=256, description="basic only")

    @model_validator(mode="after")
    def _kind_fields(self) -> CredentialWrite:
        if self.kind == "basic" and not self.username:
            raise ValueError("username: basic auth needs a username")
        if self.kind != "basic" and self.username is not None:
            raise ValueError("username: only basic auth has a username")
        if self.kind != "api_key" and self.header is not None:
            raise ValueError("header: only an api_key names its header")
        if self.username is not None and ":" in self.username:
            raise ValueError("username: basic auth's username may not hold ':'")
        raw = self.value.get_secret_value()
        if self.kind != "basic" and raw != raw.strip():
            # A bearer token or an API key is a header's value as it is, which a server reads
            # without the whitespace around it: its echo would spell the value otherwise, past
            # its redaction. A basic password goes inside base64, decoded whole: not refused.
            raise ValueError(
                f"value: no space or other whitespace before or after a {self.kind}: a server reads a header "
                "without it, so an echo would spell the value otherwise, past its redaction; send the value without it"
            )
        if not sendable(self.kind, raw):
            raise ValueError(
                f"value: a {self.kind} goes into a header as it is: letters, digits and ASCII punctuation only "
                "(no space, no letter outside ASCII), which every server reads as it was sent, so its echo is "
                "redacted; a value with others goes as basic auth's password (base64-encoded) or not at all"
            )
        return self


class CredentialInfo(StrictModel):
    """A credential as anyone may read it back: never its value."""

    name: str
    user: str | None = None
    kind: Kind
    hosts: list[str]
    header: str | None = None
    created_at: float
    updated_at: float


@dataclass(frozen=True)
class Sealed:
    """A credential's secret part as stored: AES-GCM ciphertext under a data key that is itself
    stored only wrapped (by KMS, or locally by the key file's key)."""

    ciphertext: bytes
    nonce: bytes
    wrapped_key: bytes
    key_id: str


def context_for(tenant: str, user: str | None, name: str) -> dict[str, str]:
    """The encryption context of a sealed credential: whose it is, and its name."""
    return {"agentq:tenant": tenant, "agentq:user": user or "-", "agentq:credential": name}


class Cipher(Protocol):
    """Seals and opens credentials (``core.vault_crypto.EnvelopeCipher``)."""

    def seal(self, secret: bytes, context: dict[str, str]) -> Sealed: ...

    def open(self, sealed: Sealed, context: dict[str, str]) -> bytes: ...


@dataclass(frozen=True)
class StoredCredential:
    info: CredentialInfo
    sealed: Sealed


# --- a credential in use ----------------------------------------------------------------------


@dataclass(frozen=True)
class Credential:
    """A decrypted credential, on the worker only. Its repr shows no secret."""

    name: str
    kind: Kind
    hosts: tuple[HostBinding, ...]
    secret: str = field(repr=False)
    username: str | None = field(default=None, repr=False)
    header_name: str | None = None

    def allows(self, host: str, port: int) -> bool:
        return any(b.matches(host, port) for b in self.hosts)

    def reference_value(self) -> str:
        """What ``${vault:NAME}`` stands for: the token or key; for basic auth, the base64 of
        ``username:password`` (so ``Authorization: Basic ${vault:NAME}``). A token or key that is
        not visible ASCII (stored before writes refused it) raises ``CredentialRefused``."""
        if self.kind == "basic":
            return self._basic()
        return self._sendable()

    def _basic(self) -> str:
        return base64.b64encode(f"{self.username}:{self.secret}".encode()).decode()

    def _sendable(self) -> str:
        """The token or key, if a server reads it as it is sent (``sendable``); else, a value
        stored before writes refused it, ``CredentialRefused`` in fixed words that quote nothing
        of it: a trimmed or re-decoded echo of it would be no spelling the redactor knows, and
        an encoding error would name its character and offset."""
        if not sendable(self.kind, self.secret):
            raise CredentialRefused(
                f"credential {self.name!r} holds a space around it or a character outside visible ASCII, which a "
                "server reads otherwise than it is stored: not sent; write it again without them",
                field="credential",
            )
        return self.secret

    def header(self) -> tuple[str, str]:
        """The header a client or the egress proxy adds. A name that frames or routes a request
        (``RESERVED_HEADERS``: a write refuses it; one stored before that rule) raises
        ``CredentialRefused``: the request is not sent, rather than sent with a second ``Host``;
        so does a token or key that is not visible ASCII (``reference_value``)."""
        if self.kind == "bearer":
            return "Authorization", f"Bearer {self._sendable()}"
        if self.kind == "basic":
            return "Authorization", f"Basic {self._basic()}"
        name = self.header_name or DEFAULT_API_KEY_HEADER
        if reserved_header(name):
            raise CredentialRefused(
                f"credential {self.name!r} names the header {name!r}, which frames or routes a request: not sent; "
                "write it again with the header its API reads the key from",
                field="credential",
            )
        return name, self._sendable()

    def secret_forms(self) -> list[str]:
        """Every text that carries the secret, for the redactor: and, for a value with whitespace
        around it (a basic password; a token or key stored before writes refused that), the value
        as a reader that trims it echoes it."""
        forms = [self.secret, self._basic() if self.kind == "basic" else self.secret]
        if self.username is not None:
            forms.append(f"{self.username}:{self.secret}")
        return forms + [f.strip() for f in forms if f != f.strip()]

    def where(self) -> str:
        return ", ".join(str(b) for b in self.hosts)


class CredentialSource(Protocol):
    """The credentials of one task's user, as its tools reach them (``core.engine._credentials``)."""

    def get(self, name: str, host: str | None = None, *, to: tuple[str, int] | None = None) -> Credential:
        """``to``: the request's host and port; a credential not bound there is refused before
        it is opened."""
        ...

    def for_host(self, host: str, port: int) -> Credential | None:
        """The credential to add to a request to ``host:port``, read as it is now; None: none is bound."""
        ...

    def bound_to(self, host: str, port: int) -> str | None:
        """The name of the credential bound to ``host:port``, from what the run listed: nothing
        read or opened (a ``CONNECT`` tunnel's note)."""
        ...


def unavailable(name: str, user: str | None, host: str | None) -> CredentialUnavailable:
    who = f"user {user!r}" if user else "this task (it acts for no user) and its tenant"
    at = f" for {host}" if host else ""
    return CredentialUnavailable(
        f"credential_unavailable: {who} has no credential {name!r}{at}. Ask for it with "
        f"{REQUEST_CREDENTIAL_TOOL}(name={name!r}{f', host={host!r}' if host else ''}) if you may, "
        "or go on without it",
        field="credential",
        credential=name,
        host=host,
    )


def refused(credential: Credential, host: str, port: int) -> CredentialRefused:
    return CredentialRefused(
        f"credential {credential.name!r} is bound to {credential.where()}, not {host}:{port}: not sent",
        field="credential",
    )


def expand(text: str, source: CredentialSource, host: str, port: int, *, secrets: SecretSource | None = None) -> str:
    """``text`` with every ``${vault:NAME}`` replaced by the credential's value, for a request
    to ``host:port`` only: a credential not bound there raises ``CredentialRefused`` (before it
    is opened), and so does a text of more than ``MAX_REFERENCES`` references (each credential
    opened is held in the redactor for the run: a value is not a way to open hundreds).

    ``secrets``: every ``${secret:NAME}`` too (an MCP server's headers), in the same pass. What a
    reference is replaced by is never read for references again: a credential's value is its end
    user's text, and a value ``${secret:billing-key}`` expanded a second time would send the
    deployment's secret (meant for another server or tool) wherever the credential goes."""
    if len(REFERENCE.findall(text)) > MAX_REFERENCES:
        raise CredentialRefused(
            f"more than {MAX_REFERENCES} credential references in one value: not sent", field="credential"
        )

    def one(match: re.Match[str]) -> str:
        name = match.group(1)
        if name is None:  # ${secret:NAME}
            assert secrets is not None
            return held(match.group(2), secrets.get(match.group(2)))
        if not valid_name(name):
            raise CredentialUnavailable(f"{name!r} is not a credential name ({NAME_RULE})", field="credential")
        credential = source.get(name, host if port in DEFAULT_PORTS else f"{host}:{port}", to=(host, port))
        if not credential.allows(host, port):
            raise refused(credential, host, port)
        return credential.reference_value()

    return (REFERENCE if secrets is None else TEMPLATE).sub(one, text)


def references(text: str) -> list[str]:
    return REFERENCE.findall(text)
