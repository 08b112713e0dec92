"""The redactor (``observe.redaction``) under load: what adding values costs, and that what it
finds is redacted whole. The spellings of one value are tested in tests/test_vault.py."""

from __future__ import annotations

import re
import types
import uuid
from typing import Any

import pytest

from agentq.observe import redaction
from agentq.observe.redaction import REDACTED, Redactor, spellings

PER_SPELLING = 12  # dictionary updates one spelling may cost to file, whatever is filed already


class Budget(Exception):
    pass


def _counting_re(budget: list[int]) -> Any:
    """``re`` as the redactor module sees it, the characters of every pattern it compiles
    spent from ``budget`` (a pattern rebuilt on each add spends it quadratically)."""

    def compile(pattern: Any, flags: int = 0) -> Any:
        budget[0] -= len(pattern)
        if budget[0] < 0:
            raise Budget("adding values compiled more pattern than the linear budget")
        return re.compile(pattern, flags)

    names = {k: getattr(re, k) for k in dir(re) if not k.startswith("__")}
    return types.SimpleNamespace(**{**names, "compile": compile})


def _work(count: int, monkeypatch: pytest.MonkeyPatch) -> tuple[int, int]:
    """The work spent adding ``count`` values one by one (as runs open them), and their spellings."""
    values = [uuid.uuid4().hex + uuid.uuid4().hex for _ in range(count)]
    filed = sum(len(spellings(v)) for v in values)
    budget = [PER_SPELLING * filed * 64]  # 64 characters a spelling, the longest here
    monkeypatch.setattr(redaction, "re", _counting_re(budget))
    redactor = Redactor()
    for value in values:
        redactor.add(value)
    spent = PER_SPELLING * filed * 64 - budget[0]
    return getattr(redactor, "work", 0) + spent, filed


def test_adding_values_costs_work_linear_in_their_number_whatever_the_redactor_holds(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    small, filed_small = _work(1000, monkeypatch)
    large, filed_large = _work(4000, monkeypatch)
    assert small <= PER_SPELLING * filed_small and large <= PER_SPELLING * filed_large
    # Four times the values: at most four times the work, twice over (past MAX_VALUES each
    # spelling filed is unfiled once), not sixteen times.
    assert large / filed_large <= 2 * small / filed_small


def test_values_whose_echoes_overlap_are_both_redacted_whole() -> None:
    redactor = Redactor()
    first, second = "abcdefgh12", "h12345678xyz"  # in the text, the second starts inside the first
    redactor.add(first, second)
    cleaned = redactor.redact(f"echo: abcdefgh12345678xyz and {second} and {first}.")
    assert cleaned == f"echo: {REDACTED} and {REDACTED} and {REDACTED}."
    assert redactor.redact_bytes(b"-abcdefgh12345678xyz-") == f"-{REDACTED}-".encode()


def test_a_value_at_any_offset_and_at_either_end_of_a_text_is_redacted() -> None:
    redactor = Redactor()
    value = "Zq9/+=wJalrXUtnFEMI"
    redactor.add(value)
    for before in range(9):
        for after in ("", "x", "xyz"):
            text = "." * before + value + after
            assert redactor.redact(text) == "." * before + REDACTED + after, text
            assert redactor.redact_bytes(text.encode()) == ("." * before + REDACTED + after).encode()
    accented = "clé-secrète-de-test"
    redactor.add(accented)
    assert redactor.redact_bytes(f"[{accented}]".encode()) == f"[{REDACTED}]".encode()
    assert redactor.redact("nothing to hide here") == "nothing to hide here"
