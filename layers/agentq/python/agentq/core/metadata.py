"""Metadata filters written as ``key=value`` words: what ``agentq list --metadata``, ``agentq
submit --metadata`` and ``GET /tasks?metadata=`` take. One parser, so the CLI and the API agree on
what a pair is (the first ``=`` splits it; the value may hold more, or be empty; the key may not)."""

from __future__ import annotations


class BadPair(ValueError):
    """A word that is not ``key=value``; ``pair`` is the word."""

    def __init__(self, pair: str) -> None:
        super().__init__(f"expected key=value, got {pair[:100]!r}")
        self.pair = pair


def parse_pairs(pairs: list[str]) -> dict[str, str]:
    """``["customer=acme", "run=7"]`` -> ``{"customer": "acme", "run": "7"}``."""
    parsed: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise BadPair(pair)
        parsed[key] = value
    return parsed
