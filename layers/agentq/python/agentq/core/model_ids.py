"""Model ids as Bedrock spells them: what is the model, under an inference profile or an ARN.

The price table (``core.pricing``) and the Converse provider's per-model features
(``core.providers.bedrock_converse``) both key on the model, not on where it is served from:
``us.amazon.nova-pro-v1:0`` and ``amazon.nova-pro-v1:0`` are one model at one price.
"""

from __future__ import annotations

# The region prefixes of Bedrock's cross-region inference profiles.
PROFILE_PREFIXES = frozenset({"us", "eu", "apac", "global", "us-gov", "jp", "au", "ca"})


def model_family(model: str) -> str:
    """``us.anthropic.claude-...`` -> ``anthropic.claude-...``; an ARN's last path segment."""
    name = model.rsplit("/", maxsplit=1)[-1]
    head, dot, rest = name.partition(".")
    return rest if dot and head in PROFILE_PREFIXES else name
