"""JWTs from the deployment's OIDC issuer: a token -> (tenant, user), or ``Unauthorized`` naming why.

Besides API keys (``api.auth``), a deployment may accept the ID or access tokens of one OIDC
issuer (its ``cdk.json`` ``oidc`` settings, or ``agentq dev --auth``'s local issuer), so a
product's own sign-in is what authenticates its end users to agentq: the token names the
tenant (``tenant_claim``) and the user (``user_claim``), and the request acts as that user.

Checked with PyJWT, a maintained library, and nothing of our own making: the signature against
the issuer's JWKS (``PyJWKClient``: keys fetched over HTTP on first use and on an unknown
``kid``, cached ``JWKS_CACHE_SECONDS``), ``exp`` (required), ``aud`` and ``iss`` (required,
exact), asymmetric algorithms only (``ALGORITHMS``: never ``none`` nor a shared secret). The
claims are read unverified first only to say *why* a token is refused (a foreign issuer is
named as such, not as "key not found"); nothing is believed before the signature holds.

Each refusal is ``Unauthorized`` with a public reason (``public=True``): malformed, expired,
wrong audience, foreign issuer, bad signature, unknown key, a claim missing or not a valid
tenant/user. Unlike a key's refusal (which must say nothing of which keys exist), a token's
reason tells its holder only about the token they hold, in our own words: it never quotes the
token (its ``alg``, a claim) nor PyJWT's message about it, because API Gateway puts the reason
as is between the quotes of the 401's JSON body and of the access log line (``infra/api.py``;
``api.auth.token_authorizer`` also strips what could break out of them).

Light at import, as the authorizer Lambda is (``bench/import_time.py``): PyJWT and cryptography
load when the first verifier is built, only in a deployment that configures an issuer.
"""

from __future__ import annotations

import json
import os
import threading
from dataclasses import dataclass
from typing import Any

from agentq.api.auth import Unauthorized, looks_like_jwt
from agentq.core.endusers import valid_user
from agentq.storage.api_keys import TENANT_PATTERN

OIDC_ENV = "AGENTQ_OIDC"  # JSON of OidcSettings: what the stack (from cdk.json) and `agentq dev --auth` set
ALGORITHMS = ["RS256", "RS384", "RS512", "ES256", "ES384", "PS256"]
JWKS_CACHE_SECONDS = 300
LEEWAY_SECONDS = 30  # clock skew between the issuer and us


@dataclass(frozen=True)
class OidcSettings:
    issuer: str  # exactly the tokens' `iss`
    audience: str  # a token's `aud` must be (or hold) it
    tenant_claim: str = "tenant"  # the claim naming the agentq tenant
    user_claim: str = "sub"  # the claim naming the end user
    jwks_url: str | None = None  # default: <issuer>/.well-known/jwks.json

    @property
    def jwks(self) -> str:
        return self.jwks_url or self.issuer.rstrip("/") + "/.well-known/jwks.json"

    def to_env(self) -> str:
        return json.dumps({k: v for k, v in self.__dict__.items() if v is not None})

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None) -> OidcSettings | None:
        raw = (os.environ if environ is None else environ).get(OIDC_ENV)
        return cls(**json.loads(raw)) if raw else None


class OidcVerifier:
    """Verifies bearer JWTs of one issuer; safe to share between threads (the JWKS client is)."""

    def __init__(self, settings: OidcSettings) -> None:
        import jwt

        self.settings = settings
        self._jwt = jwt
        self._keys = jwt.PyJWKClient(settings.jwks, cache_keys=True, lifespan=JWKS_CACHE_SECONDS, timeout=5)
        self._lock = threading.Lock()

    def verify(self, token: str) -> dict[str, str]:
        """The (tenant, user) a valid token names, as ``{"tenant", "user"}``; else ``Unauthorized``."""
        jwt, s = self._jwt, self.settings
        if not looks_like_jwt(token):
            raise Unauthorized("malformed token: not a JWT", public=True)
        try:
            header = jwt.get_unverified_header(token)
            unverified = jwt.decode(token, options={"verify_signature": False})
        except jwt.PyJWTError:
            raise Unauthorized("malformed token: its header or claims are not base64url JSON", public=True) from None
        if header.get("alg") not in ALGORITHMS:  # named as ours: the token's own alg is the caller's text
            raise Unauthorized(f"token algorithm not accepted: alg must be one of {', '.join(ALGORITHMS)}",
                               public=True)  # fmt: skip
        if unverified.get("iss") != s.issuer:
            raise Unauthorized(f"foreign issuer: the token's iss is not {s.issuer}", public=True)
        try:
            with self._lock:  # one fetch of a rotated JWKS, not one per concurrent request
                key = self._keys.get_signing_key_from_jwt(token)
        except jwt.PyJWKClientConnectionError:
            raise Unauthorized("the issuer's keys could not be fetched", public=True) from None
        except jwt.PyJWKClientError:
            raise Unauthorized("bad signature: no key of the issuer signed this token", public=True) from None
        try:
            claims: dict[str, Any] = jwt.decode(
                token,
                key.key,
                algorithms=ALGORITHMS,
                audience=s.audience,
                issuer=s.issuer,
                leeway=LEEWAY_SECONDS,
                options={"require": ["exp", "iss", "aud"]},
            )
        except jwt.ExpiredSignatureError:
            raise Unauthorized("token expired", public=True) from None
        except jwt.InvalidAudienceError:
            raise Unauthorized(f"wrong audience: the token is not for {s.audience}", public=True) from None
        except jwt.InvalidIssuerError:
            raise Unauthorized(f"foreign issuer: the token's iss is not {s.issuer}", public=True) from None
        except jwt.InvalidSignatureError:
            raise Unauthorized("bad signature", public=True) from None
        except jwt.MissingRequiredClaimError as exc:
            raise Unauthorized(f"token lacks the {exc.claim!r} claim", public=True) from None
        except jwt.ImmatureSignatureError:
            raise Unauthorized("token not valid yet", public=True) from None
        except jwt.PyJWTError as exc:  # the library's class name, never its text (which may quote the token)
            raise Unauthorized(f"invalid token ({type(exc).__name__})", public=True) from None
        tenant, user = claims.get(s.tenant_claim), claims.get(s.user_claim)
        refused = refused_identity(tenant, user)
        if refused == "tenant":
            raise Unauthorized(f"the token's {s.tenant_claim!r} claim is not a tenant ({TENANT_RULE})", public=True)
        if refused == "user":
            raise Unauthorized(f"the token's {s.user_claim!r} claim is not a user name (docs/API.md#end-users)",
                               public=True)  # fmt: skip
        return {"tenant": str(tenant), "user": str(user)}


TENANT_RULE = "1-64 of A-Za-z0-9._-"


def refused_identity(tenant: object, user: object) -> str | None:
    """Which of a token's tenant and user the verifier refuses, ``"tenant"`` (checked first) or
    ``"user"``, or None when it takes both: asked by ``verify`` and by ``agentq dev token``
    before it mints, so a token the CLI mints is one the API takes."""
    if not isinstance(tenant, str) or not TENANT_PATTERN.fullmatch(tenant):
        return "tenant"
    if not valid_user(user):
        return "user"
    return None
