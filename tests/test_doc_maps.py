"""The maps of the code stay true: docs/HOW_IT_WORKS.md's module tables name every package and
top-level module there is and nothing that is not, and what docs/ARCHITECTURE.md cites as the
proof of an invariant (a test file, a test) and as where code lives (a path) exists.

Why: the module table had fallen behind (it never named fair share, the event stream,
conversations, the MCP server, memory stores or OpenTelemetry, and named ``local/`` after it
split in two), and a test or module renamed leaves ARCHITECTURE pointing a newcomer at nothing.
A package added, moved or removed, a test renamed, now fails here until the page says so.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "layers" / "agentq" / "python" / "agentq"
DEV_STACK = ROOT / "devstack" / "agentq_dev"
HOW_IT_WORKS = ROOT / "docs" / "HOW_IT_WORKS.md"
ARCHITECTURE = ROOT / "docs" / "ARCHITECTURE.md"
TESTS = ROOT / "tests"

CODE = re.compile(r"`([^`]+)`")
FENCE = re.compile(r"^\s*(```|~~~)")
# Where a path ARCHITECTURE names lives: the package root unless it starts with one of these.
REPO_DIRS = ("functions/", "infra/", "tests/", "bench/", "docs/", "layers/", "requirements/", "examples/", "devstack/")


def _table_names(page: Path) -> list[str]:
    """The code spans in the first column of every table row of ``page``."""
    names = []
    for line in page.read_text(encoding="utf-8").splitlines():
        if line.startswith("| `"):
            names += CODE.findall(line.split("|")[1])
    return names


def _where(name: str) -> Path:
    """A name in the map, as a path: ``agentq_dev/...`` in devstack/, the rest in the package."""
    if name.startswith("agentq_dev/") or name == "agentq_dev":
        return DEV_STACK.parent / name
    return PACKAGE / name


def _exists(name: str) -> bool:
    path = _where(name.rstrip("/"))
    return path.is_dir() if name.endswith("/") else path.with_suffix(".py").is_file() or path.is_dir()


def _packages_and_top_modules() -> list[str]:
    """What needs a row: each package of agentq (``core/``, ``core/engine/``, ...), each of its
    top-level modules (``runtime``), and the development stack and each of its modules."""
    packages = sorted(f"{p.parent.relative_to(PACKAGE).as_posix()}/" for p in PACKAGE.rglob("__init__.py"))
    top = sorted(p.stem for p in PACKAGE.glob("*.py") if not p.stem.startswith("__"))
    dev = ["agentq_dev/", *sorted(f"agentq_dev/{p.stem}" for p in DEV_STACK.glob("*.py") if p.stem != "__init__")]
    return [p for p in packages if p != "./"] + top + dev


def test_every_package_and_top_level_module_has_a_row_in_the_module_map() -> None:
    named = set(_table_names(HOW_IT_WORKS))
    wanted = _packages_and_top_modules()
    assert {"core/", "core/engine/", "api/routes/", "runtime", "agentq_dev/", "agentq_dev/moto_app"} <= set(wanted)
    assert [w for w in wanted if w not in named and w.rstrip("/") not in named] == []


def test_every_module_the_map_names_exists() -> None:
    names = _table_names(HOW_IT_WORKS)
    assert len(names) > 80
    assert [n for n in names if not _exists(n)] == []


def test_the_map_checks_would_catch_a_missing_row_and_a_stale_one() -> None:
    """The checks above can fail: a package the table does not name is found, and so is a name
    in the table that is not a module."""
    named = set(_table_names(HOW_IT_WORKS)) - {"observe/"}
    assert [w for w in _packages_and_top_modules() if w not in named and w.rstrip("/") not in named] == ["observe/"]
    assert [n for n in ("local/", "local/moto_app", "api/http_server", "api/routes/") if not _exists(n)] == [
        "local/",
        "local/moto_app",
    ]


def _architecture_text() -> list[tuple[int, str]]:
    lines, fenced = [], False
    for number, line in enumerate(ARCHITECTURE.read_text(encoding="utf-8").splitlines(), start=1):
        if FENCE.match(line):
            fenced = not fenced
        elif not fenced:
            lines.append((number, line))
    return lines


def _test_names() -> tuple[set[str], set[str]]:
    """Every test file's stem under tests/, and every test function defined there."""
    files = {p.stem for p in TESTS.rglob("test_*.py")}
    defs: set[str] = set()
    for path in TESTS.rglob("*.py"):
        defs |= set(re.findall(r"^\s*(?:async\s+)?def (test_\w+)", path.read_text(encoding="utf-8"), re.M))
    return files, defs


def stale_test_citations(lines: list[tuple[int, str]]) -> list[str]:
    """Each test file (``tests/...py``) and test (``test_...``; ``test_prefix_*`` for a family)
    cited in ``lines`` that tests/ does not hold, as ``line: citation``."""
    files, defs = _test_names()
    stale = []
    for number, line in lines:
        stale += [f"{number}: {m}" for m in re.findall(r"\btests/[\w/]+\.py\b", line) if not (ROOT / m).is_file()]
        for match in re.finditer(r"(?<![/\w])(test_\w+)(\*?)", line):
            name, family = match.groups()
            if name in files or name in defs:
                continue
            if (family or name.endswith("_")) and any(d.startswith(name) for d in defs):
                continue
            stale.append(f"{number}: {match.group(0)}")
    return stale


def test_every_test_file_and_test_architecture_cites_exists() -> None:
    lines = _architecture_text()
    cited = sum(len(re.findall(r"\btest_\w+", line)) for _, line in lines)
    assert cited > 100
    assert stale_test_citations(lines) == []


def test_a_renamed_test_or_test_file_is_reported() -> None:
    files, defs = _test_names()
    assert "test_live_lease_blocks_a_second_worker" in defs and "test_zombie_worker" in files
    lines = [
        (1, "proved by `test_live_lease_blocks_a_second_worker` in `tests/test_zombie_worker.py`"),
        (2, "and by `test_live_lease_blocks_a_third_worker` in `tests/test_zombie_workers.py`"),
        (3, "every `test_a_deleted_submission_*`, and no `test_a_deleted_thing_*`"),
    ]
    assert stale_test_citations(lines) == [
        "2: tests/test_zombie_workers.py",
        "2: test_live_lease_blocks_a_third_worker",
        "3: test_a_deleted_thing_*",
    ]


def test_every_path_architecture_names_exists() -> None:
    """A code span with a ``/`` that ends in a file name or ``/`` is a path: from the repository
    root when it starts with one of its folders, else from the package root (as the page says)."""
    stale = []
    for number, line in _architecture_text():
        for span in CODE.findall(line):
            if "/" not in span or span.startswith(("/", "http")) or " " in span or "*" in span:
                continue
            if not re.fullmatch(r"[\w./-]+(\.(py|json|md|sh|txt|toml|yaml|png|html|js|css)|/)", span):
                continue
            base = ROOT if span.startswith(REPO_DIRS) else PACKAGE
            if not (base / span).exists():
                stale.append(f"{number}: {span}")
    assert stale == []
