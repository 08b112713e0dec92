"""A local OIDC issuer for ``agentq dev --auth``: an RSA key, its JWKS served over HTTP on
loopback, and test tokens minted with it, so the JWT path of the API is exercised end to end on
the local stack by the very code the Lambda authorizer runs (``agentq.api.oidc``: PyJWT fetching
this JWKS as it fetches a real issuer's).

The issuer's state (its URL, audience, claims and private key) is written to a file only its
owner can read (``state_file``); ``agentq dev token --user U --tenant T`` reads it through
``AGENTQ_DEV_ISSUER`` and mints a token from another shell. Development only: never shipped to AWS.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import tempfile
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from agentq.api.oidc import OidcSettings

ISSUER_ENV = "AGENTQ_DEV_ISSUER"  # the state file's path, in `agentq dev --auth`'s env for other shells
AUDIENCE = "agentq-local"


def _private_key() -> Any:
    from cryptography.hazmat.primitives.asymmetric import rsa

    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


def mint(private_pem: bytes, settings: OidcSettings, kid: str, *, user: str, tenant: str, ttl: float = 3600,
         claims: dict[str, Any] | None = None) -> str:  # fmt: skip
    """A token of ``settings``' issuer for ``user`` of ``tenant``; ``claims`` override any (``exp``,
    ``aud``, ``iss``; None leaves a claim out: the tests' bad tokens)."""
    import jwt

    now = int(time.time())
    body = {"iss": settings.issuer, "aud": settings.audience, "iat": now, "exp": int(now + ttl),
            settings.tenant_claim: tenant, settings.user_claim: user, **(claims or {})}  # fmt: skip
    return jwt.encode({k: v for k, v in body.items() if v is not None}, private_pem, algorithm="RS256",
                      headers={"kid": kid})  # fmt: skip


@dataclass
class LocalIssuer:
    audience: str = AUDIENCE
    tenant_claim: str = "tenant"
    user_claim: str = "sub"
    kid: str = field(default_factory=lambda: "local-" + secrets.token_hex(4))
    jwks_fetches: int = 0  # how often the JWKS was served (the verifier caches it)

    def __post_init__(self) -> None:
        from cryptography.hazmat.primitives import serialization

        self._key = _private_key()
        self.private_pem = self._key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
        self._server: ThreadingHTTPServer | None = None
        self.state_file: Path | None = None

    def jwks(self) -> dict[str, Any]:
        import jwt

        public = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(self._key.public_key()))
        return {"keys": [{**public, "kid": self.kid, "use": "sig", "alg": "RS256"}]}

    @property
    def settings(self) -> OidcSettings:
        assert self._server is not None, "start() the issuer first"
        port = self._server.server_address[1]
        return OidcSettings(issuer=f"http://127.0.0.1:{port}", audience=self.audience,
                            tenant_claim=self.tenant_claim, user_claim=self.user_claim)  # fmt: skip

    def start(self) -> LocalIssuer:
        issuer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if self.path == "/.well-known/jwks.json":
                    issuer.jwks_fetches += 1
                    body = issuer.jwks()
                elif self.path == "/.well-known/openid-configuration":
                    s = issuer.settings
                    body = {"issuer": s.issuer, "jwks_uri": s.jwks, "id_token_signing_alg_values_supported": ["RS256"]}
                else:
                    self.send_error(404)
                    return
                payload = json.dumps(body).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, name="agentq-oidc-issuer", daemon=True).start()
        return self

    def mint(self, *, user: str, tenant: str, ttl: float = 3600, claims: dict[str, Any] | None = None) -> str:
        return mint(self.private_pem, self.settings, self.kid, user=user, tenant=tenant, ttl=ttl, claims=claims)

    def write_state(self) -> Path:
        """The file ``agentq dev token`` mints from (owner-only: it holds the private key)."""
        folder = Path(tempfile.mkdtemp(prefix="agentq-dev-issuer-"))
        path = folder / "issuer.json"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        state = {
            "settings": json.loads(self.settings.to_env()),
            "kid": self.kid,
            "private_key": self.private_pem.decode(),
        }
        with os.fdopen(fd, "w") as out:
            json.dump(state, out)
        self.state_file = path
        return path

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self.state_file is not None:
            self.state_file.unlink(missing_ok=True)
            with contextlib.suppress(FileNotFoundError):
                self.state_file.parent.rmdir()


def mint_from_state(path: str | Path, *, user: str, tenant: str, ttl: float = 3600) -> str:
    """A token minted from a running ``agentq dev --auth``'s issuer state file."""
    state = json.loads(Path(path).read_text())
    settings = OidcSettings(**state["settings"])
    return mint(state["private_key"].encode(), settings, state["kid"], user=user, tenant=tenant, ttl=ttl)
