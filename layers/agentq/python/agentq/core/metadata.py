"""Metadata filters written as ``key=value`` words: what ``agentq list --metadata``, ``agentq
submit --metadata`` and ``GET /tasks?metadata=`` take. One parser, so the CLI and the API agree on
what a pair is (the first ``=`` splits it; the value may hold more, or be empty; the key may not)."""

from __future__ import annotations


class BadPair(ValueError):
    """A word that is not ``key=value``, or whose key an earlier word named (``twice``); ``pair`` is the word."""

    def __init__(self, pair: str, twice: bool = False) -> None:
        key = pair.partition("=")[0]
        said = f"key {key[:100]!r} given twice" if twice else f"expected key=value, got {pair[:100]!r}"
        super().__init__(said)
        self.pair = pair
        self.twice = twice


def parse_pairs(pairs: list[str]) -> dict[str, str]:
    """``["customer=acme", "run=7"]`` -> ``{"customer": "acme", "run": "7"}``. A key named twice
    is refused, never the last kept: a task has one value a key, so as a filter ``team=blue`` and
    ``team=red`` listed a team-red task (the order of the words decided), and as labels one was
    dropped without a word."""
    parsed: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise BadPair(pair)
        if key in parsed:
            raise BadPair(pair, twice=True)
        parsed[key] = value
    return parsed
