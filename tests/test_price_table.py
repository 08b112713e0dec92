"""Every AWS price in a bench or a doc comes from the one price table, ``bench/_prices.py``.

Why: each bench used to carry its own constants, and DynamoDB's on-demand prices of before
November 2024 stayed in four of them (and so in every dollar figure of the docs) a year after
AWS halved them. These checks read the sources and the docs as text (the benches are scripts,
not imported by anything), so a price typed anywhere but the table fails here:

- a bench assigns a number to a name about prices or dollars, gives a price option a literal
  default, prints a literal unit price ("$1.25/M"), or writes a constant expression the size of
  a per-request price (0 < x < 1e-4: ``0.025 / 1_000``, ``1.25e-6``);
- a doc quotes a unit price ("$X/M <unit>", "$X per million", "$X per <unit>") that is not the
  table's price for that unit, word for word as ``_prices.quote`` prints it.
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "bench"
DOCS = [*sorted((ROOT / "docs").glob("*.md")), ROOT / "README.md"]

sys.path.insert(0, str(BENCH))
import _prices  # noqa: E402

PRICE_NAME = re.compile(r"price|usd|dollar", re.IGNORECASE)
# A model's token prices are agentq.core.pricing's table (per million tokens), not AWS's.
LITERAL_UNIT_PRICE = re.compile(r"\$\s?\d[\d.,]*\s*(?:/M|/1e\d|per million|per 1,000)(?!\s*(?:input|output|tok))")
DOC_QUOTE = re.compile(r"\$(\d[\d,]*(?:\.\d+)?)(?:/M| per million) ?([^;()|`]*)")
DOC_HOURLY = re.compile(r"\$(\d[\d,]*(?:\.\d+)?) per ((?:Fargate|GB out)[^;()|`]*)")
EPSILON = 1e-8  # below any price in the table (the smallest is $0.08 per million connection minutes)


def _constant(node: ast.expr) -> float | None:
    """The value of an expression made only of numeric literals (``0.025 / 1_000``), else None."""
    try:
        if not all(isinstance(n, (ast.Constant, ast.BinOp, ast.UnaryOp, ast.operator, ast.unaryop))
                   for n in ast.walk(node)):  # fmt: skip
            return None
        value = eval(compile(ast.Expression(node), "<const>", "eval"), {"__builtins__": {}})
    except Exception:
        return None
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _targets(node: ast.Assign | ast.AnnAssign) -> list[str]:
    names: list[str] = []
    for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
        for n in ast.walk(target):
            if isinstance(n, ast.Name):
                names.append(n.id)
            elif isinstance(n, ast.Attribute):
                names.append(n.attr)
    return names


def _scales_a_literal_to_a_unit(node: ast.BinOp) -> bool:
    """``x * 0.40 / 1_000_000``: a fractional literal divided by a thousand or a million."""
    if not isinstance(node.op, ast.Div) or _constant(node.right) not in (1e3, 1e6):
        return False
    return any(isinstance(n, ast.Constant) and isinstance(n.value, float) and not n.value.is_integer()
               for n in ast.walk(node.left))  # fmt: skip


def price_constants(source: str) -> list[str]:
    """What in this bench source is a price of its own: one line per finding."""
    found: list[str] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
            values = node.value.elts if isinstance(node.value, ast.Tuple) else [node.value]
            if any(PRICE_NAME.search(n) for n in _targets(node)) and any(_constant(v) is not None for v in values):
                found.append(f"line {node.lineno}: {', '.join(_targets(node))} = a literal price")
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "add_argument":
            options = [a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
            default = next((k.value for k in node.keywords if k.arg == "default"), None)
            if any(PRICE_NAME.search(o) for o in options) and default is not None and _constant(default) is not None:
                found.append(f"line {node.lineno}: {options[0]} has a literal default price")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            for match in LITERAL_UNIT_PRICE.finditer(node.value):
                found.append(f"line {node.lineno}: prints the literal price {match.group(0)!r}")
        elif isinstance(node, ast.BinOp) and _scales_a_literal_to_a_unit(node):
            found.append(f"line {node.lineno}: a literal price divided down to a per-request price")
        elif isinstance(node, (ast.BinOp, ast.Constant)):
            value = _constant(node)
            if value is not None and EPSILON < abs(value) < 1e-4:
                found.append(f"line {node.lineno}: the constant {value!r} has the size of a per-request price")
    return found


def _table_quotes() -> dict[str, float]:
    """Unit name as quoted -> the table's price as quoted (per million, or per unit for hourly ones)."""
    return {
        _prices.price(k).unit: (_prices.per_million(k) if _prices.rate(k) < 1e-3 else _prices.rate(k))
        for k in _prices.names()
    }


def wrong_doc_prices(text: str) -> list[str]:
    """Unit prices this doc quotes that are not the table's, or not for a unit the table has."""
    units = _table_quotes()
    found: list[str] = []
    flowing = re.sub(r"[ \t]*\n[ \t>]*", " ", text)  # a quote may wrap across lines
    for match in [*DOC_QUOTE.finditer(flowing), *DOC_HOURLY.finditer(flowing)]:
        amount, rest = float(match.group(1).replace(",", "")), match.group(2)
        unit = next((u for u in units if rest.startswith(u)), None)
        if unit is None:
            found.append(f"{match.group(0)[:60]!r} names no unit of the price table")
        elif abs(units[unit] - amount) > 1e-9 * max(1.0, amount):
            found.append(f"{match.group(0)[:60]!r} but the table says ${units[unit]:g} for {unit}")
    return found


def bench_files() -> list[Path]:
    return sorted(p for p in BENCH.glob("*.py") if p.name != "_prices.py")


def test_every_price_in_the_table_has_its_unit_source_and_date() -> None:
    assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", _prices.READ_ON)
    for name in _prices.names():
        p = _prices.price(name)
        assert p.usd > 0 and p.unit, name
        assert p.source.startswith("https://aws.amazon.com/"), (name, p.source)
    # The correction, pinned: DynamoDB on-demand since November 2024.
    assert _prices.per_million("dynamodb_wru") == pytest.approx(0.625)
    assert _prices.per_million("dynamodb_rru") == pytest.approx(0.125)


@pytest.mark.parametrize("path", bench_files(), ids=lambda p: p.name)
def test_no_bench_carries_a_price_of_its_own(path: Path) -> None:
    assert price_constants(path.read_text()) == [], f"{path.name}: read prices from bench/_prices.py"


@pytest.mark.parametrize("path", DOCS, ids=lambda p: p.name)
def test_every_unit_price_a_doc_quotes_is_the_tables(path: Path) -> None:
    assert wrong_doc_prices(path.read_text()) == [], f"{path.name}: quote prices as bench/_prices.py quote() does"


@pytest.mark.parametrize(
    "source",
    [
        "PRICE_WRU, PRICE_RRU, PRICE_SQS = 1.25e-6, 0.25e-6, 0.40e-6",
        "PRICE_SFN_TRANSITION = 0.025 / 1_000",
        "cost = calls * 0.40 / 1_000_000",
        "ap.add_argument('--wru-usd-per-million', type=float, default=1.25)",
        "print('$ at $0.25 per million read units')",
        "NOTE = '$/1k = x * $0.025/1e3'",
        "hourly_usd = 0.03238",
    ],
)
def test_the_bench_check_finds_every_way_a_price_was_typed(source: str) -> None:
    assert price_constants(source), source


@pytest.mark.parametrize(
    "source",
    [
        "total_usd = sum(costs)",
        "window = max(1e-9, last - first)",
        "usd = micros / 1e6",
        "ap.add_argument('--wru-usd-per-million', type=float, default=per_million('dynamodb_wru'))",
        "doc = '($3/M input tokens at Sonnet list prices)'",
        "print(f'$ at {quote(\"dynamodb_rru\")}')",
    ],
)
def test_the_bench_check_lets_prices_read_from_the_table_through(source: str) -> None:
    assert price_constants(source) == [], source


@pytest.mark.parametrize(
    "text",
    [
        "$ at $0.25/M DynamoDB read request units",
        "dollars at $1.25 per million DynamoDB write request units",
        "a PUT ($5/M) is four write units",
        "$0.04048 per Fargate ARM vCPU-hour",
    ],
)
def test_the_doc_check_finds_a_stale_or_unnamed_unit_price(text: str) -> None:
    assert wrong_doc_prices(text), text


def test_the_doc_check_accepts_what_the_table_quotes() -> None:
    assert wrong_doc_prices(_prices.quote(*_prices.names())) == []
