"""The storage seam holds: no module outside ``agentq/storage`` (nor a Lambda handler) calls
DynamoDB's data plane. The import direction between layers, and that no module imports itself
through others, are import-linter's contracts (``make layers``, part of ``make lint``, which CI
runs); this test covers what an import graph cannot see, a call on a client handed in from
elsewhere, and shows that the circle contract (``tests/import_cycles.py``) catches a circle."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import grimp
import pytest

from tests.import_cycles import find_cycles

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "layers" / "agentq" / "python" / "agentq"
DATA_PLANE = re.compile(
    r"\.(get_item|put_item|update_item|delete_item|transact_write_items|transact_get_items|batch_write_item|"
    r"batch_get_item|execute_statement|scan)\("
)


def _offenders(files: list[Path]) -> list[str]:
    found = []
    for path in files:
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if DATA_PLANE.search(line):
                found.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    return found


def test_no_dynamodb_data_plane_call_outside_the_storage_package() -> None:
    files = [p for p in PACKAGE.rglob("*.py") if "storage" not in p.relative_to(PACKAGE).parts]
    files += list((ROOT / "functions").rglob("*.py"))
    assert files and _offenders(files) == []


def test_the_check_finds_a_call_where_there_is_one(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("def f(ddb):\n    return ddb.get_item(TableName='t', Key={})\n")
    good = tmp_path / "good.py"
    good.write_text("def f(store):\n    return store.tasks.get('x')\n")
    assert [line for p in (bad, good) for line in p.read_text().splitlines() if DATA_PLANE.search(line)] == [
        "    return ddb.get_item(TableName='t', Key={})"
    ]


CIRCLE = {
    "__init__.py": "",
    "a.py": "from circles import b\n",
    "b.py": "def later():\n    from circles import c\n",  # inside a function
    "c.py": "from typing import TYPE_CHECKING\n\nif TYPE_CHECKING:\n    from circles.a import A\n",
    "d.py": "import circles.a\n",  # imports the circle, is not on it
}


def _package(root: Path, files: dict[str, str]) -> None:
    (root / "circles").mkdir()
    for name, text in files.items():
        (root / "circles" / name).write_text(text)


def test_the_circle_check_finds_a_circle_closed_inside_a_function_and_under_type_checking(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _package(tmp_path, CIRCLE)
    monkeypatch.syspath_prepend(str(tmp_path))
    graph = grimp.build_graph("circles", cache_dir=None)
    imports = {m: graph.find_modules_directly_imported_by(m) for m in graph.modules}
    assert find_cycles(imports) == [("circles.a", "circles.b", "circles.c", "circles.a")]
    del imports["circles.c"]  # without c's import the chain is open
    assert find_cycles(imports) == []


def _lint_imports(root: Path) -> subprocess.CompletedProcess[str]:
    (root / "contracts.ini").write_text(
        "[importlinter]\nroot_package = circles\n"
        "contract_types =\n    acyclic_modules: tests.import_cycles.AcyclicModulesContract\n\n"
        "[importlinter:contract:acyclic]\nname = no circle\ntype = acyclic_modules\ncontainers =\n    circles\n"
    )
    lint_imports = Path(sys.executable).parent / "lint-imports"
    return subprocess.run(
        [str(lint_imports), "--config", "contracts.ini", "--no-cache"],
        check=False,
        cwd=root,
        env={**os.environ, "PYTHONPATH": f"{root}{os.pathsep}{ROOT}", "COLUMNS": "200"},
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_lint_imports_fails_on_a_circle_and_prints_it_as_a_chain_with_each_import_line(tmp_path: Path) -> None:
    _package(tmp_path, CIRCLE)
    broken = _lint_imports(tmp_path)
    assert broken.returncode == 1, broken.stdout + broken.stderr
    assert "circles.a -> circles.b -> circles.c -> circles.a" in broken.stdout
    assert "circles.b -> circles.c (l.2: from circles import c)" in broken.stdout
    (tmp_path / "circles" / "c.py").write_text("")
    kept = _lint_imports(tmp_path)
    assert kept.returncode == 0, kept.stdout + kept.stderr


def _project_lint_imports(root: Path) -> subprocess.CompletedProcess[str]:
    """lint-imports with the project's own contracts (pyproject.toml), on ``root``'s ``infra`` and
    the repository's ``agentq`` and ``agentq_dev``."""
    shutil.copy(ROOT / "pyproject.toml", root / "pyproject.toml")
    path = os.pathsep.join([str(root), str(PACKAGE.parent), str(ROOT / "devstack"), str(ROOT)])
    return subprocess.run(
        [str(Path(sys.executable).parent / "lint-imports"), "--no-cache"],
        check=False,
        cwd=root,
        env={**os.environ, "PYTHONPATH": path, "COLUMNS": "200"},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_project_contracts_hold_of_infra_and_refuse_a_circle_there(tmp_path: Path) -> None:
    """``make lint``'s circle contract covers the CDK app too: the tree as it is keeps every
    contract; one import more (the telemetry module reaching up to the stack, as it once did)
    breaks it, printed as a chain."""
    shutil.copytree(ROOT / "infra", tmp_path / "infra", ignore=shutil.ignore_patterns("__pycache__"))
    kept = _project_lint_imports(tmp_path)
    assert kept.returncode == 0, kept.stdout + kept.stderr
    assert "no import circle among our modules (agentq, agentq_dev, infra) KEPT" in kept.stdout
    telemetry = tmp_path / "infra" / "telemetry.py"
    telemetry.write_text(
        telemetry.read_text()
        + "\n\ndef _stack() -> object:\n    from infra.stack import AgentqStack\n\n    return AgentqStack\n"
    )
    broken = _project_lint_imports(tmp_path)
    assert broken.returncode == 1, broken.stdout + broken.stderr
    assert "infra.telemetry -> infra.stack (l." in broken.stdout
